//! One run per `run.out_dir`: a run in progress holds the directory, a second
//! run into it is refused naming the holder's PID and host, and the hold ends
//! with the process however it ends (a normal exit, a SIGKILL).

mod common;
use common::*;
use ddptrain::checkpoint::{read_holder, LockHolder, LOCK_FILE};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A run that pauses `pause_ms` inside every checkpoint save, so it is still
/// running when the test looks.
fn spawn_slow(out: &Path, cwd: &Path, pause_ms: u64) -> Child {
    let mut a = ckpt_args(out, &[]);
    a.push(format!("--debug-save-pause-ms={pause_ms}"));
    Command::new(ddptrain_bin())
        .args(&a)
        .current_dir(cwd)
        .env_remove("WORLD_SIZE")
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot run the ddptrain binary")
}

/// Waits until `child` has locked `out` (its PID is in the lock file).
fn wait_for_hold(child: &mut Child, out: &Path) {
    let t0 = Instant::now();
    loop {
        if read_holder(&out.join(LOCK_FILE)).is_some_and(|h| h.pid == child.id()) {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the first run ended before it was seen holding the lock"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the first run never recorded itself in {LOCK_FILE}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_run_into_a_busy_out_dir_is_refused_naming_the_holder_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut first = spawn_slow(&out, dir.path(), 3000);
    wait_for_hold(&mut first, &out);

    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    let holder = LockHolder { pid: first.id(), host: LockHolder::current().host };
    assert!(
        t.contains(&format!("run.out_dir {} is in use by another ddptrain run ({holder})", out.display())),
        "{t}"
    );
    assert!(!t.contains("resuming from") && !t.contains("ddptrain: "), "refused before the resume: {t}");
    // `eval` only reads: it runs beside the training run.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run must still be running for the eval check to mean anything"
    );
    let mut e = vec!["eval".to_string()];
    e.extend(ckpt_args(&out, &[]));
    e.extend(["--checkpoint".into(), out.join("ckpt/latest").display().to_string()]);
    let t0 = Instant::now();
    while !out.join("ckpt/latest").exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no first checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, t) = run_args(&e, dir.path());
    assert_eq!(code, Some(0), "{t}");

    assert!(first.wait().unwrap().success());
    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "a run after the first ended is allowed: {t}");
}

#[test]
fn a_killed_run_leaves_no_lock_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut first = spawn_slow(&out, dir.path(), 1500);
    wait_for_hold(&mut first, &out);
    // Killed after its first checkpoint, so the next run continues it (a
    // killed run with none is another run's files, refused: out_dir_reuse.rs).
    let t0 = Instant::now();
    while !out.join("ckpt/latest").exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended before its first checkpoint");
        assert!(t0.elapsed() < Duration::from_secs(120), "no first checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no destructor runs; the kernel drops the flock with the process.
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(out.join(LOCK_FILE).exists(), "the lock file stays; only the hold goes");
    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming from"), "{t}");
}
