//! `ddptrain launch`: torchrun for this binary. Starts the node's local ranks
//! with torchrun's environment contract, prefixes their output with `[rank k]`,
//! forwards SIGINT/SIGTERM, and when a rank fails stops the others (SIGTERM,
//! then SIGKILL after a grace period) and exits non-zero naming it — or, with
//! `--max-restarts K`, starts all local ranks again, up to K times.
//!
//! A forwarded signal makes the ranks finish their step, checkpoint and exit
//! 128 + the signal (src/train/stop.rs) within `--stop-grace-s`; launch then
//! exits with their code, and a rank that stopped so is never restarted.
//! Ranks run in their own process group, so a terminal's Ctrl-C reaches them
//! once, through launch (twice would make them exit at once); a second signal
//! to launch is forwarded too.
//!
//! Ranks are started from the launcher's main thread and die with it (Linux
//! parent-death signal), so a killed launcher leaves no orphans.

mod job;

use crate::error::{Error, Result};
use crate::train::stop::StopSignal;
use job::Job;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `launch`'s flags take torchrun's names; torchrun's underscore spellings
/// are accepted too and shown in `--help`, so a torchrun command line carries over.
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Each rank gets torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, \
GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (and OMP_NUM_THREADS / RAYON_NUM_THREADS \
when unset: the cores split evenly). Exit code: 0 when every rank succeeded; else the failing rank's own code \
(2 for a config error and 3 for a failed gate, neither restarted; 1 for a rank killed by a signal), after \
the restarts; 2 for a bad flag; the ranks' 128+N after forwarding signal N."
)]
pub struct LaunchArgs {
    /// Ranks to start on this node: a number, `gpu` (one per visible GPU), `cpu` (one per
    /// core) or `auto` (gpu when a GPU is visible, else cpu) (torchrun --nproc-per-node).
    #[arg(long, visible_alias = "nproc_per_node", value_name = "N|auto|gpu|cpu", default_value = "1")]
    pub nproc_per_node: String,
    /// Nodes in the job, N or MIN:MAX with MIN = MAX (no elastic resizing); WORLD_SIZE is
    /// nnodes x nproc-per-node (torchrun --nnodes).
    #[arg(long, value_name = "N", default_value = "1")]
    pub nnodes: String,
    /// One node, rendezvous on a free local port: --nnodes 1, --master-addr 127.0.0.1
    /// (torchrun --standalone).
    #[arg(long)]
    pub standalone: bool,
    /// Rendezvous at HOST:PORT, the same as --master-addr HOST --master-port PORT
    /// (torchrun --rdzv-endpoint).
    #[arg(long, visible_alias = "rdzv_endpoint", value_name = "HOST:PORT")]
    pub rdzv_endpoint: Option<String>,
    /// The job's id, given to every rank as TORCHELASTIC_RUN_ID (torchrun --rdzv-id).
    #[arg(long, visible_alias = "rdzv_id", value_name = "ID", default_value = "none")]
    pub rdzv_id: String,
    /// The rendezvous backend: `c10d` or `static` both mean rank 0's TCP rendezvous at
    /// --master-addr/--master-port (torchrun --rdzv-backend).
    #[arg(long, visible_alias = "rdzv_backend", value_name = "NAME", default_value = "static")]
    pub rdzv_backend: String,
    /// This node's index among the `--nnodes`, GROUP_RANK (torchrun --node-rank).
    #[arg(long, visible_alias = "node_rank", value_name = "I", default_value_t = 0)]
    pub node_rank: usize,
    /// Where rank 0's rendezvous listens, MASTER_ADDR (torchrun --master-addr).
    #[arg(long, visible_alias = "master_addr", value_name = "HOST", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of rank 0's rendezvous, MASTER_PORT (torchrun --master-port).
    #[arg(long, visible_alias = "master_port", value_name = "PORT", default_value_t = 29500)]
    pub master_port: u16,
    /// Restart all local ranks up to this many times after a failure (torchrun --max-restarts).
    #[arg(long, visible_alias = "max_restarts", value_name = "K", default_value_t = 0)]
    pub max_restarts: u32,
    /// Seconds between looks at the ranks' state (torchrun --monitor-interval).
    #[arg(long, visible_alias = "monitor_interval", value_name = "SECONDS", default_value_t = 0.1)]
    pub monitor_interval: f64,
    /// Seconds a rank has to exit after a forwarded SIGINT/SIGTERM (time to
    /// finish its step and write a checkpoint) or after a peer failed, before
    /// it is killed (no torchrun equivalent).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub stop_grace_s: f64,
    /// Arguments for each rank's `ddptrain`, after `--`.
    #[arg(last = true, required = true, value_name = "DDPTRAIN_ARGS")]
    pub args: Vec<String>,
}

struct Rank {
    global: usize,
    child: Child,
    status: Option<ExitStatus>,
}

fn describe(s: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => s.to_string(),
    }
}

/// Copies `from` to the launcher's stdout or stderr, `[rank k] ` before each line.
fn pump(from: impl Read + Send + 'static, rank: usize, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let mut out = Vec::with_capacity(line.len() + 12);
            out.extend_from_slice(format!("[rank {rank}] ").as_bytes());
            out.extend_from_slice(&line);
            // One write per line, so lines of different ranks never interleave mid-line.
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&out)
            } else {
                std::io::stdout().lock().write_all(&out)
            };
        }
    })
}

fn signal(child: &Child, sig: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; it is reaped only by us, so the pid is not reused.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// `sig` (none: 0) to every rank still running, SIGKILL to those still
/// running after `grace`; reaps all. Signals launch catches meanwhile (in
/// `caught`) are forwarded too: a second Ctrl-C stops the ranks at once.
fn stop_all(ranks: &mut [Rank], sig: i32, grace: Duration, caught: Option<&AtomicUsize>) {
    let forward = |ranks: &[Rank], sig: i32| {
        for r in ranks.iter().filter(|r| r.status.is_none()) {
            signal(&r.child, sig);
        }
    };
    if sig != 0 {
        forward(ranks, sig);
    }
    let until = Instant::now() + grace;
    loop {
        if let Some(again) = caught.map(|c| c.swap(0, Ordering::SeqCst)).filter(|&s| s != 0) {
            crate::errln!("launch: got signal {again} again; forwarding it to the ranks");
            forward(ranks, again as i32);
        }
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Ok(Some(s)) = r.child.try_wait() {
                r.status = Some(s);
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) || Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        crate::errln!(
            "launch: rank {} did not stop within {:.1}s of signal {sig}; killing it",
            r.global,
            grace.as_secs_f64()
        );
        let _ = r.child.kill();
        r.status = r.child.wait().ok();
    }
}

/// The exit codes of a rank stopped by a signal after its checkpoint.
fn is_stop_code(code: i32) -> bool {
    [StopSignal::Int, StopSignal::Term].iter().any(|s| i32::from(s.exit_code()) == code)
}

/// The code every rank exited with, when they agree (a stopped job's 130 or
/// 143; 0 when they finished first); else each other ending is named.
fn stopped_code(ranks: &[Rank]) -> Option<u8> {
    let code = |r: &Rank| r.status.and_then(|s| s.code()).and_then(|c| u8::try_from(c).ok());
    let first = ranks.first().and_then(code)?;
    if ranks.iter().all(|r| code(r) == Some(first)) {
        return Some(first);
    }
    for r in ranks.iter().filter(|r| code(r) != Some(first)) {
        let how = r.status.as_ref().map_or_else(|| "no status".to_string(), describe);
        crate::errln!(
            "launch: rank {} ended with {how}, rank {} with exit code {first}",
            r.global,
            ranks[0].global
        );
    }
    None
}

pub fn run(a: &LaunchArgs) -> Result<u8> {
    let j = Job::of(a)?;
    let bad = |key: &str, msg: String| Error::config("the command line", key, msg);
    if !(a.stop_grace_s >= 0.0 && a.stop_grace_s.is_finite()) {
        return Err(bad("--stop-grace-s", format!("{} is not a number of seconds", a.stop_grace_s)));
    }
    if a.args.first().is_some_and(|s| s == "launch") {
        return Err(bad("DDPTRAIN_ARGS", "a rank cannot itself be `launch`".into()));
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("cannot find the ddptrain executable", e))?;
    let world = j.nnodes * j.nproc_per_node;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / j.nproc_per_node).max(1).to_string();
    let grace = Duration::from_secs_f64(a.stop_grace_s);
    let poll = Duration::from_secs_f64(a.monitor_interval);

    let caught = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_usize(sig, caught.clone(), sig as usize)
            .map_err(|e| Error::io("cannot install the signal handlers", e))?;
    }

    for attempt in 0..=a.max_restarts {
        let mut ranks = Vec::with_capacity(j.nproc_per_node);
        let mut pumps = Vec::new();
        for local in 0..j.nproc_per_node {
            let global = a.node_rank * j.nproc_per_node + local;
            let mut cmd = Command::new(&exe);
            cmd.args(&a.args)
                .env("RANK", global.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("LOCAL_WORLD_SIZE", j.nproc_per_node.to_string())
                .env("GROUP_RANK", a.node_rank.to_string())
                .env("MASTER_ADDR", &j.master_addr)
                .env("MASTER_PORT", j.master_port.to_string())
                .env("TORCHELASTIC_RESTART_COUNT", attempt.to_string())
                .env("TORCHELASTIC_MAX_RESTARTS", a.max_restarts.to_string())
                .env("TORCHELASTIC_RUN_ID", &a.rdzv_id)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            // As torchrun: the user's explicit thread count wins over the even split.
            for var in ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"] {
                if std::env::var_os(var).is_none() {
                    cmd.env(var, &threads);
                }
            }
            #[cfg(target_os = "linux")]
            {
                use std::os::unix::process::CommandExt;
                // SAFETY: prctl and setpgid are async-signal-safe and touch only the new process.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        libc::setpgid(0, 0);
                        Ok(())
                    });
                }
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    stop_all(&mut ranks, libc::SIGTERM, grace, None);
                    return Err(Error::io(format!("cannot start rank {global} ({})", exe.display()), e));
                }
            };
            crate::errln!("launch: started rank {global} (local rank {local}, pid {})", child.id());
            if let Some(o) = child.stdout.take() {
                pumps.push(pump(o, global, false));
            }
            if let Some(e) = child.stderr.take() {
                pumps.push(pump(e, global, true));
            }
            ranks.push(Rank { global, child, status: None });
        }

        let failed = loop {
            let sig = caught.swap(0, Ordering::SeqCst);
            if sig != 0 {
                crate::errln!("launch: got signal {sig}; forwarding it to the ranks");
                stop_all(&mut ranks, sig as i32, grace, Some(&caught));
                pumps.into_iter().for_each(|p| drop(p.join()));
                return Ok(stopped_code(&ranks).unwrap_or_else(|| 128u8.saturating_add(sig as u8)));
            }
            let mut failed = None;
            let mut stopped = None;
            for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
                if let Ok(Some(s)) = r.child.try_wait() {
                    r.status = Some(s);
                    if s.code().is_some_and(is_stop_code) {
                        stopped.get_or_insert((r.global, s));
                    } else if !s.success() && failed.is_none() {
                        failed = Some((r.global, r.child.id(), s));
                    }
                }
            }
            if let (None, Some((rank, s))) = (failed, stopped) {
                // Signalled without launch: the ranks agreed on a step and
                // checkpointed it; they are not restarted.
                crate::errln!(
                    "launch: rank {rank} stopped after a signal ({}); waiting for the others",
                    describe(&s)
                );
                stop_all(&mut ranks, 0, grace, Some(&caught));
                pumps.into_iter().for_each(|p| drop(p.join()));
                return Ok(stopped_code(&ranks).unwrap_or(1));
            }
            if failed.is_some() || ranks.iter().all(|r| r.status.is_some()) {
                break failed;
            }
            std::thread::sleep(poll);
        };
        let Some((rank, pid, status)) = failed else {
            pumps.into_iter().for_each(|p| drop(p.join()));
            return Ok(0);
        };
        crate::errln!(
            "launch: rank {rank} (pid {pid}) failed with {}; stopping the other ranks",
            describe(&status)
        );
        stop_all(&mut ranks, libc::SIGTERM, grace, None);
        pumps.into_iter().for_each(|p| drop(p.join()));
        // The rank's own code goes back to the caller, as a single process
        // would have exited; a config error (2) or a failed gate (3) would
        // fail the same way again (a restart retrains, or resumes the
        // finished run and judges it again), so it is not restarted.
        let code = status.code().and_then(|c| u8::try_from(c).ok()).filter(|&c| c != 0);
        if let Some(c @ (crate::error::EXIT_CONFIG | crate::error::EXIT_EXPECT)) = code {
            let what = if c == crate::error::EXIT_CONFIG { "a config error" } else { "a failed gate" };
            crate::errln!("error: launch: rank {rank} failed with exit code {c} ({what}); not restarted");
            return Ok(c);
        }
        if attempt < a.max_restarts {
            crate::errln!(
                "launch: restarting all {} local ranks (restart {} of {})",
                j.nproc_per_node,
                attempt + 1,
                a.max_restarts
            );
            continue;
        }
        let tried =
            if a.max_restarts > 0 { format!(" after {} restarts", a.max_restarts) } else { String::new() };
        crate::errln!("error: launch: rank {rank} failed with {}{tried}", describe(&status));
        return Ok(code.unwrap_or(1));
    }
    Ok(1)
}
