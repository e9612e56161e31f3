//! Rank 0 serves a small TCP store on MASTER_ADDR:MASTER_PORT; every other rank
//! connects (retrying until the timeout), introduces itself, and is told the
//! data address of every rank once all have joined.
//!
//! Handshake (client -> rank 0): magic, protocol version, world size, rank,
//! config fingerprint, the fingerprinted config as JSON (so a refusal names the
//! keys that differ), job token, and the port of the client's data listener.
//! Rank 0 answers WELCOME (session id + address table) or REJECT (reason).
//! A wrong world size, fingerprint, version or a duplicate rank fails the whole
//! job, on both sides, naming both values. A wrong or missing token and
//! garbage are a stranger's: rank 0 turns them away and keeps waiting.

use super::junk::JunkLog;
use super::wire::{self, Dec, Enc, MAGIC, MAX_CONTROL_FRAME, PROTOCOL_VERSION};
use super::{DistEnv, JOB_TOKEN_VAR};
use crate::error::{Error, Result};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const HELLO: u32 = 1;
const WELCOME: u32 = 2;
const REJECT: u32 = 3;
/// A connection that has not said who it is within this long is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A config larger than this as JSON is not sent: the refusal then names only
/// the fingerprints, and the handshake stays well under `MAX_CONTROL_FRAME`.
const MAX_CONFIG_JSON: usize = 256 << 10;

/// What every rank must agree on, and how long to wait for the others.
#[derive(Debug, Clone)]
pub struct RendezvousOpts {
    /// `Config::fingerprint()`: ranks with different configs are refused.
    pub fingerprint: String,
    /// `Config::fingerprint_json()`, what the fingerprint hashes: a refusal
    /// compares it key by key (`Null`: the refusal names the fingerprints only).
    pub config: serde_json::Value,
    /// `DDPTRAIN_JOB_TOKEN`: when rank 0 has one, joiners must present the same.
    pub job_token: Option<String>,
    pub timeout: Duration,
}

impl RendezvousOpts {
    /// What a rank running `cfg` presents at the rendezvous.
    pub fn for_config(cfg: &crate::config::Config, job_token: Option<String>, timeout: Duration) -> Self {
        RendezvousOpts { fingerprint: cfg.fingerprint(), config: cfg.fingerprint_json(), job_token, timeout }
    }

    /// The config as sent in the handshake: empty when there is none or it is too large.
    pub(crate) fn config_text(&self) -> String {
        if self.config.is_null() {
            return String::new();
        }
        let text = self.config.to_string();
        if text.len() > MAX_CONFIG_JSON {
            String::new()
        } else {
            text
        }
    }
}

/// The job after rendezvous: every rank's data address and this rank's data listener.
#[derive(Debug)]
pub struct Membership {
    pub rank: usize,
    pub world_size: usize,
    /// Data endpoint of each rank, indexed by rank (this rank's own entry included).
    pub peers: Vec<SocketAddr>,
    /// Where the higher ranks will connect to this one.
    pub listener: TcpListener,
    /// Chosen by rank 0; mesh connections must carry it, so a stray from another job is refused.
    pub session: u64,
    /// Same as the rendezvous' (the mesh handshake reuses it).
    pub job_token: Option<String>,
}

/// Runs the rendezvous for `env`: rank 0 listens on the master endpoint, the others join it.
pub fn rendezvous(env: &DistEnv, opts: &RendezvousOpts) -> Result<Membership> {
    if env.rank == 0 {
        let endpoint = env.master_endpoint();
        let listener = match TcpListener::bind(&endpoint) {
            Ok(l) => l,
            // MASTER_ADDR may name this machine by an address it cannot bind (NAT, DNS alias).
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, env.master_port))
                    .map_err(|e| Error::io(format!("rank 0 cannot listen on port {}", env.master_port), e))?
            }
            Err(e) => {
                return Err(Error::io(
                    format!("rank 0 cannot listen on {endpoint} (MASTER_ADDR/MASTER_PORT; is another job using the port?)"),
                    e,
                ))
            }
        };
        serve(listener, env.world_size, opts)
    } else {
        join(&env.master_endpoint(), env.rank, env.world_size, opts)
    }
}

pub(super) struct Hello {
    version: u32,
    world: usize,
    rank: usize,
    fingerprint: String,
    /// The joiner's config as JSON; empty when it sent none.
    config: String,
    token: String,
    data_port: u16,
}

fn encode_hello(world: usize, rank: usize, opts: &RendezvousOpts, data_port: u16) -> Vec<u8> {
    Enc::default()
        .bytes(&MAGIC)
        .u32(PROTOCOL_VERSION)
        .u32(HELLO)
        .u32(world as u32)
        .u32(rank as u32)
        .str(&opts.fingerprint)
        .str(&opts.config_text())
        .str(opts.job_token.as_deref().unwrap_or(""))
        .u32(u32::from(data_port))
        .0
}

/// Reads and parses one HELLO; anything else is an error saying what was wrong.
pub(super) fn read_hello(stream: &mut TcpStream) -> io::Result<Hello> {
    let frame = wire::read_frame(stream, MAX_CONTROL_FRAME)?;
    let mut d = Dec::new(&frame);
    if d.take(4)? != MAGIC {
        return Err(wire::invalid("bad magic: not a ddptrain rank".into()));
    }
    let version = d.u32()?;
    if version != PROTOCOL_VERSION {
        // Fields after the version may differ in shape; report what we know.
        return Ok(Hello {
            version,
            world: 0,
            rank: 0,
            fingerprint: String::new(),
            config: String::new(),
            token: String::new(),
            data_port: 0,
        });
    }
    if d.u32()? != HELLO {
        return Err(wire::invalid("expected a HELLO message".into()));
    }
    let world = d.u32()? as usize;
    let rank = d.u32()? as usize;
    let fingerprint = d.str()?;
    let config = d.str()?;
    let token = d.str()?;
    let data_port = u16::try_from(d.u32()?).map_err(|_| wire::invalid("data port out of range".into()))?;
    d.finish()?;
    Ok(Hello { version, world, rank, fingerprint, config, token, data_port })
}

fn send_reject(stream: &mut TcpStream, key: &str, reason: &str) {
    // Best effort: the peer may already be gone, and rank 0's own error says it all.
    let _ = wire::write_frame(stream, &Enc::default().bytes(&MAGIC).u32(REJECT).str(key).str(reason).0);
}

fn refuse(key: &str, msg: String) -> Error {
    Error::config("the rendezvous", key, msg)
}

/// The keys whose values differ between rank 0's config and a joiner's, or,
/// when either side has no config to compare, where to look.
fn config_differences(opts: &RendezvousOpts, h: &Hello) -> String {
    describe_config_differences(&opts.config, &h.config, h.rank)
}

/// [`config_differences`] from rank 0's config and rank `joiner`'s as sent
/// (JSON, empty when it sent none); shared with the MPI backend's check.
pub(crate) fn describe_config_differences(ours: &serde_json::Value, theirs: &str, joiner: usize) -> String {
    let theirs = serde_json::from_str::<serde_json::Value>(theirs).ok();
    let ours = Some(ours).filter(|c| !c.is_null());
    let joiner = format!("rank {joiner}");
    match (ours, theirs) {
        (Some(ours), Some(theirs)) => {
            match crate::config::describe_diff(ours, &theirs, ("rank 0", &joiner)) {
                Some(keys) => format!("the keys that differ: {keys}"),
                None => {
                    "their configs match key by key, so the fingerprints come from different builds".into()
                }
            }
        }
        _ => "compare `ddptrain check` on both".into(),
    }
}

/// Rank 0's side: waits for ranks 1..world on `listener`, then hands out the address table.
pub fn serve(listener: TcpListener, world: usize, opts: &RendezvousOpts) -> Result<Membership> {
    let deadline = Instant::now() + opts.timeout;
    let local = listener.local_addr().map_err(|e| Error::io("rendezvous listener", e))?;
    // The data listener lives on the interface the rendezvous does: whoever reaches one reaches the other.
    let data = TcpListener::bind((local.ip(), 0))
        .map_err(|e| Error::io("rank 0 cannot open its data listener", e))?;
    let data_port = data.local_addr().map_err(|e| Error::io("data listener", e))?.port();
    let session: u64 = rand::random();
    if world == 1 {
        return Ok(Membership {
            rank: 0,
            world_size: 1,
            peers: vec![SocketAddr::new(local.ip(), data_port)],
            listener: data,
            session,
            job_token: opts.job_token.clone(),
        });
    }
    listener.set_nonblocking(true).map_err(|e| Error::io("rendezvous listener", e))?;

    // Handshakes are read on their own threads, so a silent stranger cannot stall the others.
    let (tx, rx) = mpsc::channel::<(TcpStream, SocketAddr, io::Result<Hello>)>();
    let mut joined: Vec<Option<(TcpStream, SocketAddr, u16)>> = (0..world).map(|_| None).collect();
    let mut count = 1;
    // Strangers are reported a few at a time; its summary line comes when this function returns.
    let mut junk = JunkLog::stderr("rendezvous (rank 0)".into());

    // Ranks already in are told at once, rather than left to time out.
    let fail = |joined: &mut Vec<Option<(TcpStream, SocketAddr, u16)>>, key: &str, why: &str| {
        for (s, _, _) in joined.iter_mut().flatten() {
            send_reject(s, key, &format!("rank 0 aborted the rendezvous: {why}"));
        }
    };

    while count < world {
        if Instant::now() >= deadline {
            let missing: Vec<usize> = (1..world).filter(|&r| joined[r].is_none()).collect();
            let err = Error::io(
                format!(
                    "rendezvous on {local}: ranks {missing:?} of WORLD_SIZE={world} did not join within {}s (parallel.timeout_s)",
                    opts.timeout.as_secs_f64()
                ),
                io::Error::new(io::ErrorKind::TimedOut, "timed out"),
            );
            fail(&mut joined, "parallel.timeout_s", &err.to_string());
            return Err(err);
        }
        // Every connection waiting is taken, so a flood cannot fill the backlog ahead of a real rank.
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let tx = tx.clone();
                    std::thread::spawn(move || {
                        let mut stream = stream;
                        let res = stream
                            .set_nonblocking(false)
                            .and_then(|_| stream.set_read_timeout(Some(HELLO_TIMEOUT)))
                            .and_then(|_| read_hello(&mut stream));
                        let _ = tx.send((stream, peer, res));
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    junk.note(&format!("accept failed: {e}"));
                    break;
                }
            }
        }
        let Ok((mut stream, peer, hello)) = rx.recv_timeout(Duration::from_millis(10)) else { continue };
        let h = match hello {
            Ok(h) => h,
            Err(e) => {
                junk.note(&format!("ignored a connection from {peer}: {e}"));
                continue;
            }
        };
        if let Some(tok) = &opts.job_token {
            if h.token != *tok {
                let why = if h.token.is_empty() { "no job token" } else { "a wrong job token" };
                junk.note(&format!("refused a connection from {peer} presenting {why} (DDPTRAIN_JOB_TOKEN)"));
                send_reject(
                    &mut stream,
                    JOB_TOKEN_VAR,
                    &format!("it presented {why}; set the same DDPTRAIN_JOB_TOKEN on every rank"),
                );
                continue;
            }
        }
        let err = if h.version != PROTOCOL_VERSION {
            Some(("protocol version", format!("rank 0 speaks protocol {PROTOCOL_VERSION}, the rank at {peer} speaks {}: run the same ddptrain build everywhere", h.version)))
        } else if h.world != world {
            Some(("WORLD_SIZE", format!("world size differs: rank 0 has WORLD_SIZE={world}, rank {} (at {peer}) has WORLD_SIZE={}", h.rank, h.world)))
        } else if h.rank == 0 || h.rank >= world {
            Some(("RANK", format!("the rank at {peer} claims rank {}, which is not in 1..{world}", h.rank)))
        } else if let Some((_, first, _)) = &joined[h.rank] {
            Some(("RANK", format!("rank {} joined twice: from {first} and from {peer}", h.rank)))
        } else if h.fingerprint != opts.fingerprint {
            Some((
                "config fingerprint",
                format!(
                    "config differs: rank 0 has fingerprint {}, rank {} (at {peer}) has {}; {}",
                    opts.fingerprint,
                    h.rank,
                    h.fingerprint,
                    config_differences(opts, &h)
                ),
            ))
        } else {
            None
        };
        if let Some((key, msg)) = err {
            send_reject(&mut stream, key, &msg);
            fail(&mut joined, key, &msg);
            return Err(refuse(key, msg));
        }
        joined[h.rank] = Some((stream, peer, h.data_port));
        count += 1;
    }

    let mut peers = vec![SocketAddr::new(local.ip(), data_port)];
    for (_, addr, port) in joined.iter().skip(1).flatten() {
        peers.push(SocketAddr::new(addr.ip(), *port));
    }
    for (stream, _, _) in joined.iter_mut().flatten() {
        // Rank 0's entry as this client reached it: the right interface for that client.
        let me = stream.local_addr().map(|a| a.ip()).unwrap_or(local.ip());
        let mut enc = Enc::default().bytes(&MAGIC).u32(WELCOME).u64(session).u32(world as u32);
        for (r, p) in peers.iter().enumerate() {
            let addr = if r == 0 { SocketAddr::new(me, data_port) } else { *p };
            enc = enc.str(&addr.to_string());
        }
        let _ = stream.set_nonblocking(false);
        // A joiner gone already will fail the mesh step and be named there.
        let _ = stream.set_write_timeout(Some(opts.timeout));
        let _ = wire::write_frame(stream, &enc.0);
    }
    Ok(Membership {
        rank: 0,
        world_size: world,
        peers,
        listener: data,
        session,
        job_token: opts.job_token.clone(),
    })
}

fn connect_until(endpoint: &str, deadline: Instant) -> Result<TcpStream> {
    let mut last = String::from("no address");
    loop {
        match endpoint.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    let left =
                        deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
                    match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(2))) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            Err(e) => last = format!("cannot resolve: {e}"),
        }
        if Instant::now() >= deadline {
            return Err(Error::io(
                format!("could not reach rank 0 at {endpoint} (MASTER_ADDR:MASTER_PORT) before the timeout (parallel.timeout_s)"),
                io::Error::new(io::ErrorKind::TimedOut, last),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A non-zero rank's side: connects to rank 0 at `endpoint` (host:port), retrying until the timeout.
pub fn join(endpoint: &str, rank: usize, world: usize, opts: &RendezvousOpts) -> Result<Membership> {
    let deadline = Instant::now() + opts.timeout;
    let mut stream = connect_until(endpoint, deadline)?;
    let my_ip: IpAddr = stream.local_addr().map_err(|e| Error::io("rendezvous socket", e))?.ip();
    let data = TcpListener::bind((my_ip, 0))
        .map_err(|e| Error::io(format!("rank {rank} cannot open its data listener"), e))?;
    let data_port = data.local_addr().map_err(|e| Error::io("data listener", e))?.port();
    let ctx = |what: &str| format!("rank {rank}: rendezvous with rank 0 at {endpoint}: {what}");
    wire::write_frame(&mut stream, &encode_hello(world, rank, opts, data_port))
        .map_err(|e| Error::io(ctx("sending the handshake"), e))?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
    stream.set_read_timeout(Some(left)).map_err(|e| Error::io(ctx("socket"), e))?;
    let frame = wire::read_frame(&mut stream, MAX_CONTROL_FRAME).map_err(|e| {
        let what = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!(
                    "the other ranks did not all join within {}s (parallel.timeout_s)",
                    opts.timeout.as_secs_f64()
                )
            }
            io::ErrorKind::UnexpectedEof => "rank 0 closed the connection".into(),
            _ => "waiting for the address table".into(),
        };
        Error::io(ctx(&what), e)
    })?;
    let bad = |e: io::Error| Error::io(ctx("malformed reply"), e);
    let mut d = Dec::new(&frame);
    if d.take(4).map_err(bad)? != MAGIC {
        return Err(bad(wire::invalid("bad magic".into())));
    }
    match d.u32().map_err(bad)? {
        REJECT => {
            let key = d.str().map_err(bad)?;
            let reason = d.str().map_err(bad)?;
            Err(refuse(&key, format!("rank 0 refused rank {rank}: {reason}")))
        }
        WELCOME => {
            let session = d.u64().map_err(bad)?;
            let n = d.u32().map_err(bad)? as usize;
            if n != world {
                return Err(bad(wire::invalid(format!(
                    "address table has {n} entries for WORLD_SIZE={world}"
                ))));
            }
            let mut peers = Vec::with_capacity(n);
            for _ in 0..n {
                let s = d.str().map_err(bad)?;
                peers.push(
                    s.parse::<SocketAddr>().map_err(|_| bad(wire::invalid(format!("bad address `{s}`"))))?,
                );
            }
            d.finish().map_err(bad)?;
            Ok(Membership {
                rank,
                world_size: world,
                peers,
                listener: data,
                session,
                job_token: opts.job_token.clone(),
            })
        }
        k => Err(bad(wire::invalid(format!("unknown message kind {k}")))),
    }
}
