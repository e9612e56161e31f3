//! Checkpoints by default: `checkpoint.every_minutes` (10 unless set, 0 off)
//! saves on rank 0's clock at a step every rank agrees on, and a run that
//! checkpoints ends with its final state, so `kill -9` loses at most that
//! much and a finished run says it is complete when run again.
//! `every_minutes = 0.0001` (6 ms) with a step pause longer than that makes
//! every check due: a timed save then happens as soon as the vote allows.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Six synthetic steps saved on the clock only (`ckpt_args` less its
/// every_steps), each step `pause_ms` longer than the clock's 6 ms.
fn timed_args(out: &Path, pause_ms: u64) -> Vec<String> {
    let mut a = ckpt_args(out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0.0001"]);
    a.extend(["--debug-step-pause-ms".into(), pause_ms.to_string()]);
    a
}

/// The steps of the run's `checkpoint` records, in order.
fn saved_steps(out: &Path) -> Vec<u64> {
    common::resume::metrics(out)
        .iter()
        .filter(|r| r["kind"] == "checkpoint")
        .map(|r| r["step"].as_u64().unwrap())
        .collect()
}

fn latest(out: &Path) -> PathBuf {
    std::fs::read_link(out.join("ckpt/latest")).unwrap()
}

/// The step `ckpt/latest` names, if any yet.
fn latest_step(out: &Path) -> Option<u64> {
    let l = std::fs::read_link(out.join("ckpt/latest")).ok()?;
    l.to_str()?.strip_prefix("step_")?.parse().ok()
}

#[test]
fn a_run_with_only_every_minutes_saves_during_the_run_and_its_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) = run_args(&timed_args(&out, 20), dir.path());
    assert_eq!(code, Some(0), "{t}");
    // At world size 1 the clock is read after every step but the last, which
    // `finish` saves after the final evaluation.
    assert_eq!(saved_steps(&out), vec![1, 2, 3, 4, 5, 6], "{t}");
    assert_eq!(latest(&out), Path::new("step_00000006"));
    let mut kept = names_in(&out.join("ckpt"));
    kept.retain(|n| n.starts_with("step_"));
    assert_eq!(
        kept,
        ["step_00000004", "step_00000005", "step_00000006"],
        "keep_last = 3 prunes timed saves too"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["checkpoints"].as_array().map(Vec::len), Some(3), "{summary}");
}

#[test]
fn by_default_a_run_ends_with_its_final_checkpoint_and_run_again_it_is_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // The default 10 minutes never come due in 6 steps: only the final save.
    let a = ckpt_args(&out, &["checkpoint.every_steps=0"]);
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(saved_steps(&out), vec![6], "{t}");
    assert_eq!(latest(&out), Path::new("step_00000006"));
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("is complete (6 of 6 steps"), "{t}");
}

#[test]
fn every_minutes_0_writes_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) =
        run_args(&ckpt_args(&out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(!out.join("ckpt").exists(), "{t}");
    assert!(saved_steps(&out).is_empty(), "{t}");
    assert!(out.join("model.safetensors").exists());
}

#[test]
fn a_negative_every_minutes_is_a_config_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for bad in ["checkpoint.every_minutes=-1", "checkpoint.every_minutes=nan"] {
        let (code, t) = run_args(&ckpt_args(&out, &[bad]), dir.path());
        assert_eq!(code, Some(2), "{bad}: {t}");
        assert!(t.contains("checkpoint.every_minutes") && t.contains("0 or more"), "{bad}: {t}");
        assert!(!out.exists(), "{bad}: a refused config writes nothing");
    }
}

#[test]
fn kill_9_mid_run_then_resume_continues_from_the_latest_timed_checkpoint_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (straight, out) = (dir.path().join("straight"), dir.path().join("killed"));
    let (code, t) = run_args(&ckpt_args(&straight, &["checkpoint.every_steps=0"]), dir.path());
    assert_eq!(code, Some(0), "{t}");

    // Slow steps (the pause is wall time, the clock's 6 ms pass in each), so
    // the kill lands between saves.
    let a = timed_args(&out, 400);
    let mut child = Command::new(ddptrain_bin())
        .args(&a)
        .current_dir(dir.path())
        .env_remove("WORLD_SIZE")
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while latest_step(&out).is_none_or(|s| s < 2) {
        assert!(t0.elapsed() < Duration::from_secs(120), "no timed checkpoint of step 2 came");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no handler, no final save, as in an OOM kill or a lost node.
    child.kill().unwrap();
    child.wait().unwrap();
    let at = latest(&out);
    assert!(latest_step(&out).is_some_and(|s| s < 6), "the kill came after the run ended: {}", at.display());

    let (code, t) = run_args(&timed_args(&out, 20), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming from") && t.contains(&*at.to_string_lossy()), "{}: {t}", at.display());
    assert_eq!(latest(&out), Path::new("step_00000006"));
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        std::fs::read(straight.join("model.safetensors")).unwrap(),
        "a run resumed from a timed checkpoint ends as an unbroken one"
    );
}

#[test]
fn two_ranks_save_on_rank_0s_clock_at_the_same_step_and_train_as_without() {
    let dir = tempfile::tempdir().unwrap();
    let (timed, off) = (dir.path().join("timed"), dir.path().join("off"));
    // A save is collective (rank 0 gathers every rank's loss accumulators):
    // ranks that disagreed on its step would fail or hang in it.
    let (code, t) = run_args(&launch2(&timed_args(&timed, 20)), dir.path());
    assert_eq!(code, Some(0), "{t}");
    let steps = saved_steps(&timed);
    assert!(steps.len() >= 2 && steps.last() == Some(&6), "timed saves and the final one: {steps:?}\n{t}");
    let (code, t) = run_args(
        &launch2(&ckpt_args(&off, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"])),
        dir.path(),
    );
    assert_eq!(code, Some(0), "{t}");
    assert!(!off.join("ckpt").exists());
    assert_eq!(
        std::fs::read(timed.join("model.safetensors")).unwrap(),
        std::fs::read(off.join("model.safetensors")).unwrap(),
        "timed saves leave the training alone"
    );
}
