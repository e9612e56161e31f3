//! A disk that fills up mid-run, through the binary: a checkpoint save or
//! the run's closing writes fail with exit 1 and a message naming the path
//! and the bytes needed, leave nothing half-written, keep the previous
//! checkpoint as `latest`, and a rerun resumes from it. The full disk is
//! the test-only hook `DDPTRAIN_TEST_FAULT_ENOSPC` (src/checkpoint/disk.rs):
//! a small tmpfs would need root.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const FAULT: &str = "DDPTRAIN_TEST_FAULT_ENOSPC";

/// Runs the binary with `a`, the N-th write of a file named as `fault` says failing with ENOSPC.
fn run_full(a: &[String], cwd: &Path, fault: &str) -> (Option<i32>, String) {
    let o = Command::new(ddptrain_bin())
        .args(a)
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .env(FAULT, fault)
        .env_remove("WORLD_SIZE")
        .current_dir(cwd)
        .output()
        .expect("cannot run the ddptrain binary");
    (o.status.code(), text(&o))
}

/// What a failed save must not leave in `ckpt`: its temporary directory or link.
fn leftovers(ckpt: &Path) -> Vec<String> {
    names_in(ckpt).into_iter().filter(|n| n.starts_with(".tmp-") || n.starts_with(".latest.")).collect()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// The N in the message's "the checkpoint needs N bytes".
fn needed(t: &str) -> u64 {
    let rest = t.split("the checkpoint needs ").nth(1).unwrap_or_else(|| panic!("no size in: {t}"));
    rest.split(' ').next().unwrap().parse().unwrap_or_else(|e| panic!("{e}: {t}"))
}

/// The run stopped at the save of step 4 (the second): exit 1, the message,
/// nothing left of that save, `latest` still step 2 and loadable, and the
/// rerun resumes from it.
fn assert_failed_second_save(out: &Path, code: Option<i32>, t: &str) {
    let ckpt = out.join("ckpt");
    assert_eq!(code, Some(1), "{t}");
    let step4 = ckpt.join("step_00000004");
    assert!(
        t.contains(&format!("cannot write {}: writing optim.safetensors failed", step4.display())),
        "{t}"
    );
    assert!(t.contains("No space left on device"), "{t}");
    assert!(
        t.contains(&format!("and the filesystem of {} has ", ckpt.display())) && t.contains(" bytes free"),
        "{t}"
    );
    assert!(t.contains("ckpt/latest still names step_00000002, which is complete"), "{t}");
    assert!(t.contains("resume with checkpoint.resume = \"auto\""), "{t}");
    // Same model, same optimizer: the failed save is the first one's size
    // but for state.json, whose numbers (and rank records) differ.
    let first = ckpt.join("step_00000002");
    let state = std::fs::metadata(first.join("state.json")).unwrap().len();
    let (n, rest) = (needed(t), dir_bytes(&first) - state);
    assert!(n > rest && n < rest + 2 * state, "needs {n} bytes, step 2 has {rest} + state.json {state}: {t}");
    assert!(leftovers(&ckpt).is_empty(), "{:?}", names_in(&ckpt));
    assert!(!step4.exists());
    assert_eq!(std::fs::read_link(ckpt.join("latest")).unwrap(), Path::new("step_00000002"));
    ddptrain::checkpoint::read_checkpoint(&ckpt.join("latest")).expect("latest must be complete");
}

#[test]
fn a_save_that_meets_a_full_disk_removes_itself_keeps_latest_and_the_rerun_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) = run_full(&ckpt_args(&out, &[]), dir.path(), "optim.safetensors:2");
    assert_failed_second_save(&out, code, &t);
    assert!(!out.join("summary.json").exists(), "a failed run writes no summary");

    let (code, t) = run_args(&ckpt_args(&out, &["checkpoint.resume=\"auto\""]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming from") && t.contains("step_00000002"), "{t}");
    assert_eq!(std::fs::read_link(out.join("ckpt/latest")).unwrap(), Path::new("step_00000006"));
}

#[test]
fn the_first_save_meeting_a_full_disk_says_no_checkpoint_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) = run_full(&ckpt_args(&out, &[]), dir.path(), "state.json:1");
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("writing state.json failed") && t.contains("no earlier checkpoint of this run is kept"),
        "{t}"
    );
    let ckpt = out.join("ckpt");
    assert!(leftovers(&ckpt).is_empty() && !ckpt.join("latest").exists(), "{:?}", names_in(&ckpt));
}

/// The final checkpoint was written before the closing writes, so the
/// trained weights survive them: `latest` names it, complete.
#[test]
fn the_closing_writes_meeting_a_full_disk_leave_no_partial_file_and_the_final_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    for (fault, file) in [("model.safetensors:4", "model.safetensors"), ("summary.json:1", "summary.json")] {
        let out = dir.path().join(file);
        // Saves at steps 2, 4 and 6 write three model.safetensors; the run's own is the fourth.
        let (code, t) = run_full(&ckpt_args(&out, &[]), dir.path(), fault);
        assert_eq!(code, Some(1), "{fault}: {t}");
        let path = out.join(file);
        assert!(t.contains(&format!("cannot write {}: No space left on device", path.display())), "{t}");
        assert!(
            t.contains(" bytes and the filesystem of ") && t.contains("nothing of it was left behind"),
            "{t}"
        );
        assert!(!path.exists() && !out.join(format!("{file}.tmp")).exists(), "{:?}", names_in(&out));
        assert!(!out.join("summary.json").exists());
        assert_eq!(std::fs::read_link(out.join("ckpt/latest")).unwrap(), Path::new("step_00000006"));
        ddptrain::checkpoint::read_checkpoint(&out.join("ckpt/latest"))
            .expect("the final checkpoint is complete");
        // Run again with room: the finished run gets the files it lacked.
        let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
        assert_eq!(code, Some(0), "{t}");
        assert!(t.contains("nothing to train") && t.contains("which the run's end had not"), "{t}");
        assert!(out.join("model.safetensors").is_file() && out.join("summary.json").is_file(), "{t}");
        let saved = ddptrain::checkpoint::load_safetensors(&out.join("model.safetensors")).unwrap();
        let ckpt = ddptrain::checkpoint::read_checkpoint(&out.join("ckpt/latest")).unwrap();
        assert!(max_abs_diff(&saved, &ckpt.model) == 0.0, "the weights are the final checkpoint's");
    }
}

#[test]
fn two_ranks_stop_together_when_rank_0s_save_meets_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("out");
    let t0 = Instant::now();
    let (code, t) = run_full(&launch2(&ckpt_args(&out, &[])), dir.path(), "optim.safetensors:2");
    assert_failed_second_save(&out, code, &t);
    assert!(t.contains("[rank 0]") && t.contains("[rank 1]"), "{t}");
    assert!(t.contains("rank 0 could not write the checkpoint of step 4, so rank 1 stops too"), "{t}");
    assert!(t0.elapsed() < Duration::from_secs(90), "took {:?}: {t}", t0.elapsed());

    // Rank 0's closing write fails while rank 1 waits at the last barrier: it learns at once.
    let out = dir.path().join("closing");
    let t0 = Instant::now();
    let (code, t) = run_full(&launch2(&ckpt_args(&out, &[])), dir.path(), "summary.json:1");
    assert_eq!(code, Some(1), "{t}");
    let summary = out.join("summary.json");
    assert!(t.contains(&format!("[rank 0] error: cannot write {}: No space left", summary.display())), "{t}");
    assert!(t.contains("[rank 1] error: rank 0 lost during barrier"), "{t}");
    assert!(!summary.exists() && !out.join("summary.json.tmp").exists(), "{:?}", names_in(&out));
    assert!(t0.elapsed() < Duration::from_secs(90), "took {:?}: {t}", t0.elapsed());
}
