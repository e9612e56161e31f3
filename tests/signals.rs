//! A run is never lost to a signal (src/train/stop.rs): a SIGTERM sent mid-run
//! to one rank, to `ddptrain launch` of two, or to one of those two alone, on
//! the CPU and on the (emulated) GPU, ends the run after an agreed step with a
//! checkpoint of it, a summary marked interrupted and exit code 143 (a
//! Ctrl-C on launch: 130); resumed with
//! `checkpoint.resume = "auto"`, the run ends bit for bit as the
//! uninterrupted one (one rank: the concatenated `--record-trace` equals
//! the straight run's; two ranks: the final weights and every
//! rank's final-state digest). A second SIGINT exits at once with 130.
//!
//! The GPU tests run under scripts/emulated-gpu.sh (or on a GPU): without a
//! device they skip, and under CI=true they fail instead.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const TOTAL_STEPS: u64 = 16;
/// Each step of the interrupted runs pauses this long (a hidden test hook),
/// so that the signal lands while steps remain.
const PAUSE_MS: &str = "250";

const LAUNCHER_VARS: [&str; 6] =
    ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// tests/common's small O2 conv net for this file's runs.
fn config(dir: &Path, device: &str, train_size: usize) -> PathBuf {
    stop_config(dir, device, train_size, TOTAL_STEPS)
}

/// `ddptrain` (through `launch` of `world` ranks when > 1) on `cfg` into `out`.
fn command(cfg: &Path, out: &Path, device: &str, world: usize, extra: &[String]) -> Command {
    let mut c = Command::new(ddptrain_bin());
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    if device == "cpu" {
        c.env(HIDE_GPUS.0, HIDE_GPUS.1);
    }
    if world > 1 {
        let port = free_port().to_string();
        c.args(["launch", "--nproc-per-node", &world.to_string(), "--master-port", &port, "--"]);
    }
    c.arg("--config").arg(cfg).args(["--set", &format!("run.out_dir={}", out.display())]);
    c.args(extra).stdin(Stdio::null());
    c
}

/// A run in flight, its stdout and stderr lines arriving on `lines`.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: String,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start ddptrain");
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for r in [Box::new(out) as Box<dyn std::io::Read + Send>, Box::new(err)] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
        }
        Running { child, lines, seen: String::new() }
    }

    /// Waits (at most `limit`) for a line that `want` accepts and returns it.
    fn wait_line(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push_str(&l);
                    self.seen.push('\n');
                    if want(&l) {
                        return l;
                    }
                }
                Err(_) => panic!("no such line within {limit:?}; output so far:\n{}", self.seen),
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits (at most `limit`) for the exit; returns its code and all output.
    fn finish(mut self, limit: Duration) -> (Option<i32>, String) {
        let until = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("still running after {limit:?}; output so far:\n{}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipes close with the process: the rest of its lines are queued.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.seen.push_str(&l);
            self.seen.push('\n');
        }
        (status.code(), self.seen)
    }
}

fn run_to_end(cmd: Command, limit: Duration) -> String {
    let (code, t) = Running::start(cmd).finish(limit);
    assert_eq!(code, Some(0), "{t}");
    t
}

fn json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// A step line of rank 0 ("step      3/16 | ..."), as the loop prints it.
fn step_of(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("[rank 0] ").unwrap_or(line).trim_start().strip_prefix("step")?;
    rest.trim_start().split('/').next()?.trim().parse().ok()
}

/// The "rank R: final state sha256 X | ..." lines of a run's ranks, sorted
/// (each rank's own: BatchNorm running statistics differ between ranks).
fn final_digests(t: &str) -> Vec<String> {
    let mut d: Vec<String> =
        t.lines().filter(|l| l.contains("final state sha256")).map(|l| l.trim().to_string()).collect();
    d.sort();
    d
}

/// Who gets the SIGTERM.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// The process started: the one rank, or `launch`, which forwards it.
    Started,
    /// Rank 1 of a launch alone: rank 0 stops after the same step only
    /// because the step's all-reduce told it.
    Rank1,
    /// SIGINT to launch's whole process group, as a terminal's Ctrl-C: the
    /// ranks (in a group of their own) get it once, from launch.
    CtrlC,
}

/// Straight, then SIGTERM after step 2 and resumed: see the file's doc.
fn stop_then_resume_is_bitwise(device: &str, world: usize, target: Target, limit: Duration) {
    stop_at(device, world, target, limit, (192, 2), None);
}

/// [`stop_then_resume_is_bitwise`] on `train_size` images, signalled once
/// step `after` is logged; the run must stop after step `want`, if given.
fn stop_at(
    device: &str,
    world: usize,
    target: Target,
    limit: Duration,
    (train_size, after): (usize, u64),
    want: Option<u64>,
) {
    let (sig, name, code) =
        if target == Target::CtrlC { (libc::SIGINT, "SIGINT", 130) } else { (libc::SIGTERM, "SIGTERM", 143) };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), device, train_size);
    let (a, b) = (dir.path().join("straight"), dir.path().join("stopped"));
    let trace = |n: &str| dir.path().join(format!("{n}.trace"));
    // Every rank writes the trace it is given: one rank only.
    let traced = world == 1;
    let with_trace = |n: &str| {
        if traced {
            vec!["--record-trace".to_string(), trace(n).display().to_string()]
        } else {
            vec![]
        }
    };

    let straight = run_to_end(command(&cfg, &a, device, world, &with_trace("straight")), limit);
    let on = json(&a.join("summary.json"))["device"].as_str().unwrap_or_default().to_string();
    assert!(on.starts_with(if device == "cpu" { "cpu" } else { "cuda:" }), "{on}");

    let mut extra = with_trace("stopped");
    extra.extend(["--debug-step-pause-ms".to_string(), PAUSE_MS.to_string()]);
    let mut cmd = command(&cfg, &b, device, world, &extra);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut r = Running::start(cmd);
    let rank1 = if target == Target::Rank1 {
        let l = r.wait_line(limit, |l| l.starts_with("launch: started rank 1 "));
        let pid = l.rsplit("pid ").next().and_then(|p| p.trim_end_matches(')').parse::<i32>().ok());
        Some(pid.unwrap_or_else(|| panic!("no pid in {l:?}")))
    } else {
        None
    };
    r.wait_line(limit, |l| step_of(l).is_some_and(|s| s >= after));
    let to = match (rank1, target) {
        (Some(pid), _) => pid,
        // The whole group: launch's pid is its id.
        (None, Target::CtrlC) => -(r.child.id() as i32),
        (None, _) => r.child.id() as i32,
    };
    // SAFETY: kill(2) on our child (or its group), or on launch's child, still
    // running (launch reaps it).
    assert_eq!(unsafe { libc::kill(to, sig) }, 0);
    let (got, t) = r.finish(limit);
    assert_eq!(got, Some(code), "{t}");
    let s = json(&b.join("summary.json"));
    assert_eq!(s["interrupted"], name, "{s}");
    let stopped = s["steps"].as_u64().unwrap();
    assert!((after..TOTAL_STEPS).contains(&stopped), "{s}");
    if let Some(want) = want {
        assert_eq!(stopped, want, "{s}");
    }
    let latest = std::fs::read_link(b.join("ckpt/latest")).unwrap();
    assert_eq!(latest, Path::new(&format!("step_{stopped:08}")), "{t}");
    assert_eq!(json(&b.join("ckpt/latest/state.json"))["step"], stopped);
    let line = format!("{name}: stopping after step {stopped} ");
    let at = t.find(&line).unwrap_or_else(|| panic!("no line {line:?}:\n{t}"));
    assert!(!t[at..].contains("test accuracy"), "an evaluation ran on the way out:\n{t}");
    if world > 1 {
        let forwarded = t.contains(&format!("launch: got signal {sig}; forwarding it to the ranks"));
        assert_eq!(forwarded, target != Target::Rank1, "{t}");
        // Every rank stopped after the same step.
        for rank in 0..world {
            let done = format!("[rank {rank}] interrupted by {name} after step {stopped}:");
            assert!(t.contains(&done), "no line {done:?}:\n{t}");
        }
    }

    let resumed = run_to_end(command(&cfg, &b, device, world, &with_trace("resumed")), limit);
    let s = json(&b.join("summary.json"));
    assert!(s.get("interrupted").is_none() && s["steps"] == TOTAL_STEPS, "{s}");
    assert!(s["resumed_from"].as_str().unwrap().ends_with(&format!("step_{stopped:08}")), "{s}");
    assert!(
        std::fs::read(a.join("model.safetensors")).unwrap()
            == std::fs::read(b.join("model.safetensors")).unwrap(),
        "final weights differ"
    );
    if traced {
        let read = |n: &str| std::fs::read_to_string(trace(n)).unwrap();
        let joined = format!("{}{}", read("stopped"), read("resumed"));
        let want = read("straight");
        assert_eq!(want.lines().count() as u64, TOTAL_STEPS);
        for (i, (got, want)) in joined.lines().zip(want.lines()).enumerate() {
            assert_eq!(got, want, "trace line {} differs", i + 1);
        }
        assert_eq!(joined.lines().count(), want.lines().count());
    } else {
        let want = final_digests(&straight);
        assert_eq!(want.len(), world, "{straight}");
        assert_eq!(want, final_digests(&resumed), "the ranks' final states differ");
    }
}

fn have_gpu(test: &str) -> bool {
    if ddptrain::cuda::device_count() == 0 {
        ddptrain::cuda::skip_or_fail(test, "no CUDA device");
        return false;
    }
    true
}

#[test]
fn sigterm_one_cpu_rank_checkpoints_and_resumes_bitwise() {
    stop_then_resume_is_bitwise("cpu", 1, Target::Started, Duration::from_secs(120));
}

#[test]
fn sigterm_to_launch_of_two_cpu_ranks_checkpoints_and_resumes_bitwise() {
    stop_then_resume_is_bitwise("cpu", 2, Target::Started, Duration::from_secs(120));
}

#[test]
fn sigterm_to_one_of_two_cpu_ranks_stops_both_after_the_same_step() {
    stop_then_resume_is_bitwise("cpu", 2, Target::Rank1, Duration::from_secs(120));
}

#[test]
fn ctrl_c_on_launch_of_two_cpu_ranks_checkpoints_and_exits_130() {
    stop_then_resume_is_bitwise("cpu", 2, Target::CtrlC, Duration::from_secs(120));
}

#[test]
fn sigterm_one_gpu_rank_checkpoints_and_resumes_bitwise() {
    if have_gpu("sigterm_one_gpu_rank_checkpoints_and_resumes_bitwise") {
        stop_then_resume_is_bitwise("cuda", 1, Target::Started, Duration::from_secs(400));
    }
}

/// Rank 1 alone is signalled: rank 0 learns of it from the device's
/// loss-scaler snapshot, one step late, as rank 1 does.
#[test]
fn sigterm_to_one_of_two_gpu_ranks_stops_both_after_the_same_step() {
    if have_gpu("sigterm_to_one_of_two_gpu_ranks_stops_both_after_the_same_step") {
        stop_then_resume_is_bitwise("cuda", 2, Target::Rank1, Duration::from_secs(400));
    }
}

/// Whether `sig` is still pending for process `pid` (not yet handled).
fn pending(pid: u32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:")).any(|l| {
        let mask = u64::from_str_radix(l.split_whitespace().nth(1).unwrap_or("0"), 16).unwrap_or(0);
        mask & (1u64 << (sig - 1)) != 0
    })
}

#[test]
fn a_second_sigint_exits_at_once_with_130() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "cpu", 192);
    let out = dir.path().join("out");
    // Each step pauses a minute: only an immediate exit ends the run in time.
    let pause = ["--debug-step-pause-ms".to_string(), "60000".to_string()];
    let mut r = Running::start(command(&cfg, &out, "cpu", 1, &pause));
    r.wait_line(Duration::from_secs(60), |l| step_of(l) == Some(1));
    let t0 = Instant::now();
    r.signal(libc::SIGINT);
    let pid = r.child.id();
    // Two SIGINTs pending at once would be delivered as one.
    while pending(pid, libc::SIGINT) {
        assert!(t0.elapsed() < Duration::from_secs(30), "the first SIGINT was never handled");
        std::thread::yield_now();
    }
    r.signal(libc::SIGINT);
    let (code, t) = r.finish(Duration::from_secs(30));
    assert_eq!(code, Some(130), "{t}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{t}");
    assert!(!out.join("summary.json").exists() && !out.join("ckpt").exists(), "{t}");
}

/// Two steps per epoch: rank 1's vote rides step 4, the last of epoch 1,
/// and the host hears of it only at the epoch's end (one step late would be
/// after the evaluation): it settles the vote there, so both ranks stop
/// after step 4 without evaluating epoch 1.
#[test]
fn sigterm_in_an_epochs_last_step_stops_two_gpu_ranks_before_its_evaluation() {
    if have_gpu("sigterm_in_an_epochs_last_step_stops_two_gpu_ranks_before_its_evaluation") {
        stop_at("cuda", 2, Target::Rank1, Duration::from_secs(400), (64, 3), Some(4));
    }
}
