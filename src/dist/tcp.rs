//! The CPU transport: a full TCP mesh between the ranks and one communication
//! thread per rank that runs collectives in issue order.
//!
//! Every data frame carries a header (operation, sequence number, dtype, element
//! count, payload length) that the receiver checks against what it expects, so
//! ranks that issue different collectives fail with an error, not a wrong sum.
//! When a rank fails an operation (a peer closed, reset, or went silent past
//! `parallel.timeout_s`), it sends ABORT with the reason to every peer and closes
//! its sockets, so the failure, naming the lost rank, reaches every rank
//! instead of leaving some of them waiting.

use super::junk::JunkLog;
use super::queue::{Job, OpKind, Queue, Queued};
use super::rendezvous::Membership;
use super::wire::{self, Dec, Enc, MAGIC, MAX_CONTROL_FRAME, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod collectives;

/// All-reduces of at most this many bytes exchange whole buffers in one round
/// (latency-bound); larger ones use the ring (bandwidth-bound).
pub const RING_MIN_BYTES: usize = 64 * 1024;
const MESH_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// An ABORT is a courtesy to the peers; it must not delay the failing rank's exit.
const ABORT_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why an operation failed, kept so later operations can report it too.
#[derive(Debug, Clone)]
pub(crate) struct Fail {
    context: String,
    kind: io::ErrorKind,
    detail: String,
}

impl Fail {
    fn to_error(&self) -> Error {
        Error::io(self.context.clone(), io::Error::new(self.kind, self.detail.clone()))
    }
}

/// The TCP transport, as [`Queued`]'s marker.
pub enum Tcp {}

/// Collectives over TCP; see the module docs.
pub type TcpCommunicator = Queued<Tcp>;

impl Queued<Tcp> {
    /// Connects the mesh after a rendezvous: each rank dials the lower ranks and
    /// accepts the higher ones. `timeout` bounds this and every later receive.
    pub fn connect(m: Membership, timeout: Duration) -> Result<TcpCommunicator> {
        let (rank, world) = (m.rank, m.world_size);
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let hello = Enc::default()
            .bytes(&MAGIC)
            .u32(PROTOCOL_VERSION)
            .u64(m.session)
            .u32(rank as u32)
            .str(m.job_token.as_deref().unwrap_or(""))
            .0;
        for (j, slot) in peers.iter_mut().enumerate().take(rank) {
            let addr = m.peers[j];
            let mut s = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(Error::io(
                            format!("rank {rank}: cannot connect to rank {j} at {addr} (data mesh)"),
                            e,
                        ))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            wire::write_frame(&mut s, &hello)
                .map_err(|e| Error::io(format!("rank {rank}: mesh handshake with rank {j} at {addr}"), e))?;
            *slot = Some(s);
        }
        m.listener.set_nonblocking(true).map_err(|e| Error::io("data listener", e))?;
        let mut junk = JunkLog::stderr(format!("rank {rank}"));
        while peers.iter().skip(rank + 1).any(Option::is_none) {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (rank + 1..world).filter(|&j| peers[j].is_none()).collect();
                return Err(Error::io(
                    format!("rank {rank}: ranks {missing:?} did not connect to the data mesh within {}s (parallel.timeout_s)", timeout.as_secs_f64()),
                    io::Error::new(io::ErrorKind::TimedOut, "timed out"),
                ));
            }
            let (mut s, from) = match m.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) => return Err(Error::io(format!("rank {rank}: data listener"), e)),
            };
            let check = |s: &mut TcpStream| -> io::Result<usize> {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(MESH_HELLO_TIMEOUT.min(timeout)))?;
                let f = wire::read_frame(s, MAX_CONTROL_FRAME)?;
                let mut d = Dec::new(&f);
                if d.take(4)? != MAGIC || d.u32()? != PROTOCOL_VERSION {
                    return Err(wire::invalid("not a ddptrain rank of this protocol".into()));
                }
                if d.u64()? != m.session {
                    return Err(wire::invalid("belongs to another job (session id differs)".into()));
                }
                let j = d.u32()? as usize;
                let token = d.str()?;
                d.finish()?;
                if token != m.job_token.as_deref().unwrap_or("") {
                    return Err(wire::invalid("wrong job token".into()));
                }
                if j <= rank || j >= world {
                    return Err(wire::invalid(format!("claims rank {j}, which should not dial rank {rank}")));
                }
                Ok(j)
            };
            match check(&mut s) {
                Ok(j) if peers[j].is_none() => peers[j] = Some(s),
                Ok(j) => {
                    junk.note(&format!("ignored a second mesh connection claiming rank {j} from {from}"))
                }
                Err(e) => junk.note(&format!("ignored a data-mesh connection from {from}: {e}")),
            }
        }
        for s in peers.iter().flatten() {
            let setup = s
                .set_nodelay(true)
                .and_then(|_| s.set_read_timeout(Some(timeout)))
                .and_then(|_| s.set_write_timeout(Some(timeout)));
            setup.map_err(|e| Error::io(format!("rank {rank}: mesh socket"), e))?;
        }
        let queue =
            Queue::spawn(format!("ddp-comm-{rank}"), move |rx| comm_thread(rank, world, peers, timeout, rx))?;
        Ok(Queued::new(rank, world, queue))
    }
}

fn comm_thread(
    rank: usize,
    world: usize,
    peers: Vec<Option<TcpStream>>,
    timeout: Duration,
    rx: mpsc::Receiver<Job>,
) {
    let mut seq: u64 = 0;
    let mut failed: Option<Fail> = None;
    while let Ok(job) = rx.recv() {
        seq += 1;
        let desc = job.describe(seq);
        job.done.start();
        if let Some(f) = &failed {
            let e = Error::io(
                format!("{desc} not run, an earlier collective failed: {}", f.context),
                io::Error::new(f.kind, f.detail.clone()),
            );
            job.done.complete(Err(e));
            continue;
        }
        let ctx = collectives::Ctx { rank, world, peers: &peers, seq, kind: job.kind, desc: &desc, timeout };
        match ctx.run(job.buf) {
            Ok(out) => job.done.complete(Ok(out)),
            Err(f) => {
                abort_peers(&peers, &f);
                job.done.complete(Err(f.to_error()));
                failed = Some(f);
            }
        }
    }
}

/// Tells every peer why this rank gives up, then closes the sockets so a peer
/// that misses the message still sees EOF at once rather than at its timeout.
fn abort_peers(peers: &[Option<TcpStream>], f: &Fail) {
    let msg = format!("{}: {}", f.context, f.detail);
    let frame = collectives::abort_frame(&msg);
    for s in peers.iter().flatten() {
        let _ = s.set_write_timeout(Some(ABORT_WRITE_TIMEOUT));
        let _ = io::Write::write_all(&mut &*s, &frame);
        let _ = s.shutdown(Shutdown::Both);
    }
}
