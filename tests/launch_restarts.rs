//! `ddptrain launch` running real training: a 2-rank tcp job under
//! `--max-restarts 2` whose rank 1 is killed with SIGKILL twice, each time
//! after a new checkpoint, ends with the same `model.safetensors`, byte for
//! byte, as the same job left alone; the launcher exits with the ranks' own
//! code (2 for a config error, 3 for a failed gate, 143 after SIGTERM); and
//! only rank 0 prints the closing `done` and `PASS`/`FAIL` lines.

mod common;
use common::{collect, ddptrain_bin, repo_root, Lines, HIDE_GPUS};

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `ddptrain launch --nproc-per-node 2 <flags> -- <args>` on a free port,
/// the CPU trainer even where a (possibly emulated) GPU is visible, in an
/// environment without another launcher's variables (a rank would read them).
fn launch(flags: &[&str], args: &[String]) -> Command {
    let mut c = Command::new(ddptrain_bin());
    let launcher =
        ["RANK", "WORLD_SIZE", "LOCAL_", "GROUP_RANK", "MASTER_", "TORCHELASTIC_", "DDPTRAIN_JOB_TOKEN"];
    let theirs = ["OMPI_", "PMI_", "SLURM_", "OMP_NUM_THREADS", "RAYON_NUM_THREADS"];
    for (k, _) in std::env::vars_os() {
        if launcher.iter().chain(&theirs).any(|p| k.to_string_lossy().starts_with(p)) {
            c.env_remove(k);
        }
    }
    c.env(HIDE_GPUS.0, HIDE_GPUS.1);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    c.args(["launch", "--nproc-per-node", "2", "--master-port", &port, "--stop-grace-s", "20"]);
    c.args(flags).arg("--").args(args);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn streams(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// configs/mnist_o2.toml (the seed ConvNet under O2: dynamic loss scaling,
/// fp32 masters, momentum) on synthetic digits: 10 steps an epoch at 2 ranks
/// of 20, 40 steps, a checkpoint every 4; `extra` are more `--set`s.
fn train_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let cfg = repo_root().join("configs/mnist_o2.toml");
    let mut a = vec!["--config".to_string(), cfg.display().to_string()];
    let out_set = format!("run.out_dir={}", out.display());
    let sets = [
        out_set.as_str(),
        "data.dataset=synthetic",
        "data.synthetic_train_size=400",
        "data.synthetic_test_size=100",
        "data.batch_size=20",
        "train.max_steps=40",
        "train.grad_clip_norm=1.0",
        "scheduler.warmup_steps=5",
        "checkpoint.every_steps=4",
        "checkpoint.every_epochs=0",
        "checkpoint.resume=auto",
        "logging.every_steps=4",
        "logging.progress=never",
        "logging.tensorboard=false",
        "expect.min_test_accuracy=0.0",
    ];
    for s in sets.iter().chain(extra) {
        a.extend(["--set".to_string(), s.to_string()]);
    }
    a
}

/// Waits until `what` of the text seen so far is `Some`, failing after `within`.
fn wait_until<T>(seen: &Lines, within: Duration, why: &str, mut what: impl FnMut(&str) -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = what(&seen.lock().unwrap()) {
            return v;
        }
        assert!(t.elapsed() < within, "{why} within {within:?}; launch said:\n{}", seen.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid of the `n`th start (from 1) of rank 1, as launch reports it.
fn rank1_pid(err: &str, n: usize) -> Option<i32> {
    let line = err.lines().filter(|l| l.starts_with("launch: started rank 1 ")).nth(n - 1)?;
    line.rsplit("pid ").next()?.trim_end_matches(')').parse().ok()
}

/// The newest complete checkpoint's step (the one `ckpt/latest` names).
fn latest_step(out: &Path) -> Option<u64> {
    let l = std::fs::read_link(out.join("ckpt/latest")).ok()?;
    l.to_str()?.strip_prefix("step_")?.parse().ok()
}

fn wait_for_checkpoint_after(out: &Path, step: u64, within: Duration) -> u64 {
    let t = Instant::now();
    loop {
        if let Some(s) = latest_step(out).filter(|&s| s > step) {
            return s;
        }
        assert!(
            t.elapsed() < within,
            "no checkpoint after step {step} within {within:?} in {}",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn sigkill(pid: i32) {
    // SAFETY: kill(2) of a rank our own launcher started; it is its child, so
    // the pid is not reused before launch reaps it.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
}

#[test]
fn a_rank_killed_twice_restarts_to_the_unbroken_runs_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, broken) = (dir.path().join("whole"), dir.path().join("broken"));
    let o = launch(&["--max-restarts", "2"], &train_args(&whole, &[])).output().unwrap();
    let (out, err) = streams(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");

    // Each step 150 ms longer, so a checkpoint is seen before the next one.
    let mut args = train_args(&broken, &[]);
    args.extend(["--debug-step-pause-ms".to_string(), "150".to_string()]);
    let mut l = launch(&["--max-restarts", "2"], &args).spawn().unwrap();
    let err = collect(l.stderr.take().unwrap());
    let out = collect(l.stdout.take().unwrap());
    let long = Duration::from_secs(120);
    let mut killed_after = Vec::new();
    // The first kill after a checkpoint in the first epoch (steps 1-10), the
    // second after one the restarted job wrote in the second (step 12 on):
    // both resume mid-epoch, the second past an epoch's reshuffle.
    for (n, after) in [(1, 3), (2, 11)] {
        let pid = wait_until(&err, long, &format!("start {n} of rank 1"), |e| rank1_pid(e, n));
        let step = wait_for_checkpoint_after(&broken, after, long);
        sigkill(pid);
        println!("killed rank 1 (pid {pid}) after the checkpoint of step {step}");
        killed_after.push(step);
        let restart = format!("restarting all 2 local ranks (restart {n} of 2)");
        wait_until(&err, long, &restart, |e| e.contains(&restart).then_some(()));
    }
    let status = l.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (out, err) = (out.lock().unwrap().clone(), err.lock().unwrap().clone());
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(killed_after[1] < 40, "the second kill came after the last checkpoint: {err}");
    // The last start resumed from the checkpoint the second kill came after
    // (or a later one, if the ranks wrote it before they noticed).
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(broken.join("summary.json")).unwrap()).unwrap();
    let from = summary["resumed_from"].as_str().unwrap_or_else(|| panic!("not resumed: {summary}"));
    let from_step: u64 = from.rsplit("step_").next().and_then(|s| s.parse().ok()).unwrap();
    assert!(from_step >= killed_after[1] && from_step < 40, "resumed from {from} after {killed_after:?}");
    assert_eq!(err.matches("launch: rank 1 (pid ").count(), 2, "{err}");
    assert!(err.contains("failed with signal 9"), "{err}");
    assert_eq!(out.matches("] done: 40 steps").count(), 1, "{out}");
    let a = std::fs::read(whole.join("model.safetensors")).unwrap();
    let b = std::fs::read(broken.join("model.safetensors")).unwrap();
    assert!(a == b, "model.safetensors differs from the unbroken run's ({} and {} bytes)", a.len(), b.len());
}

/// Counts the lines of rank `r` in `out` that start with `what`.
fn lines_of(out: &str, r: usize, what: &str) -> usize {
    out.lines().filter(|l| l.starts_with(&format!("[rank {r}] {what}"))).count()
}

#[test]
fn only_rank_zero_prints_the_closing_lines_and_a_failed_gate_is_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    // A synthetic run's loss stays far above this gate.
    let args = train_args(&out_dir, &["train.max_steps=8", "expect.max_final_loss=0.0001"]);
    let o = launch(&[], &args).output().unwrap();
    let (out, err) = streams(&o);
    assert_eq!(o.status.code(), Some(3), "{out}\n{err}");
    assert!(err.contains("(a failed gate); not restarted"), "{err}");
    assert_eq!(lines_of(&out, 0, "done: 8 steps"), 1, "{out}");
    assert_eq!(lines_of(&out, 0, "PASS expect.min_test_accuracy"), 1, "{out}");
    assert_eq!(lines_of(&out, 0, "FAIL expect.max_final_loss"), 1, "{out}");
    for what in ["done", "PASS", "FAIL"] {
        assert_eq!(lines_of(&out, 1, what) + lines_of(&err, 1, what), 0, "{out}\n{err}");
    }
    assert_eq!(out.matches(&format!("wrote {}", out_dir.display())).count(), 1, "{out}");

    // Passed, the same: one `done` and one `PASS`, both rank 0's.
    let out_dir = dir.path().join("passed");
    let o = launch(&[], &train_args(&out_dir, &["train.max_steps=8"])).output().unwrap();
    let (out, err) = streams(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert_eq!((lines_of(&out, 0, "done: 8 steps"), lines_of(&out, 1, "done")), (1, 0), "{out}");
    assert_eq!((lines_of(&out, 0, "PASS "), out.matches("PASS ").count()), (1, 1), "{out}");
}

#[test]
fn a_config_error_is_exit_2_and_not_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let args = train_args(&dir.path().join("out"), &["optimizer.lr=-1"]);
    let o = launch(&["--max-restarts", "2"], &args).output().unwrap();
    let (out, err) = streams(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(err.contains("(a config error); not restarted"), "{err}");
    assert!(!err.contains("restart 1 of 2"), "{err}");
    assert!(err.contains("optimizer.lr"), "the rank's own message is passed on: {err}");
}

#[test]
fn sigterm_to_launch_checkpoints_the_ranks_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut args = train_args(&out_dir, &[]);
    args.extend(["--debug-step-pause-ms".to_string(), "150".to_string()]);
    let mut l: Child = launch(&["--max-restarts", "2"], &args).spawn().unwrap();
    let err = collect(l.stderr.take().unwrap());
    let out = collect(l.stdout.take().unwrap());
    let first = wait_for_checkpoint_after(&out_dir, 0, Duration::from_secs(120));
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(l.id() as i32, libc::SIGTERM) }, 0);
    let status = l.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (out, err) = (out.lock().unwrap().clone(), err.lock().unwrap().clone());
    assert_eq!(status.code(), Some(143), "{out}\n{err}");
    assert!(!err.contains("restart 1 of 2"), "a stopped job is not restarted: {err}");
    let stopped = latest_step(&out_dir).unwrap();
    assert!(stopped >= first && stopped < 40, "stopped at {stopped}: {out}");
    for r in 0..2 {
        let said = format!("[rank {r}] interrupted by SIGTERM after step {stopped}: checkpoint written");
        assert!(out.contains(&said), "missing `{said}` in:\n{out}\n{err}");
    }
    assert!(!out.contains("done:"), "{out}");
}

/// A rank killed by a signal has no code of its own: launch exits 1 once
/// the restarts (here none) are spent, naming the signal.
#[test]
fn a_rank_killed_without_restarts_left_is_exit_1() {
    let hang = ["dist-selftest", "--fail-rank", "9", "--hang-s", "60"].map(String::from);
    let mut l = launch(&[], &hang).spawn().unwrap();
    let err = collect(l.stderr.take().unwrap());
    let _out = collect(l.stdout.take().unwrap());
    let pid = wait_until(&err, Duration::from_secs(30), "rank 1's start", |e| rank1_pid(e, 1));
    sigkill(pid);
    let status = l.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let err = err.lock().unwrap().clone();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("error: launch: rank 1 failed with signal 9"), "{err}");
}
