//! Resume that extends a run, through the binary: a finished run goes on
//! for more steps when resumed with a larger `train.max_steps`, each change
//! listed; what would change its math so far is refused naming the keys,
//! unless `checkpoint.resume_changes = "allow"`.

mod common;
use common::*;
use std::path::Path;

fn lr_by_step(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "train")
        .map(|r| (r["step"].as_u64().unwrap(), r["lr"].as_f64().unwrap()))
        .collect()
}

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn a_finished_run_resumed_with_more_steps_goes_on_as_the_longer_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let (out, whole) = (dir.path().join("out"), dir.path().join("whole"));
    let sets = ["logging.every_steps=1", "scheduler.name=constant", "scheduler.warmup_steps=2"];
    let (code, t) = run_args(&ckpt_args(&out, &sets), dir.path());
    assert_eq!(code, Some(0), "{t}");
    let longer: Vec<&str> = sets.iter().copied().chain(["train.max_steps=10"]).collect();
    let (code, t) = run_args(&ckpt_args(&out, &longer), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming with changed settings: train.max_steps: checkpoint 6, this run 10"), "{t}");
    assert!(!t.contains("resume_changes"), "{t}");
    assert_eq!(summary(&out)["steps"], 10);
    let (code, t) = run_args(&ckpt_args(&whole, &longer), dir.path());
    assert_eq!(code, Some(0), "{t}");
    // A constant schedule does not depend on the run's length: the extended
    // run is the longer run, bit for bit.
    let weights = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(weights(&out) == weights(&whole), "the extended run's weights differ from the longer run's");
    assert_eq!(lr_by_step(&out), lr_by_step(&whole));

    // A cosine schedule decays over the new length from the resume on.
    let (cos, cos_whole) = (dir.path().join("cos"), dir.path().join("cos_whole"));
    let cosine = ["logging.every_steps=1", "scheduler.name=cosine", "scheduler.warmup_steps=2"];
    assert_eq!(run_args(&ckpt_args(&cos, &cosine), dir.path()).0, Some(0));
    let longer: Vec<&str> = cosine.iter().copied().chain(["train.max_steps=10"]).collect();
    assert_eq!(run_args(&ckpt_args(&cos, &longer), dir.path()).0, Some(0));
    assert_eq!(run_args(&ckpt_args(&cos_whole, &longer), dir.path()).0, Some(0));
    let (ext, full) = (lr_by_step(&cos), lr_by_step(&cos_whole));
    assert_eq!(ext.len(), 10, "{ext:?}");
    assert_eq!(ext[6..], full[6..], "steps 7..10 take the 10-step schedule's LR");
    assert!(ext[5].1 < ext[6].1, "the 6-step cosine ended lower than the 10-step one resumes: {ext:?}");
}

#[test]
fn a_change_to_the_math_so_far_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_args(&ckpt_args(&out, &[]), dir.path()).0, Some(0));
    let changed = ["train.max_steps=8", "optimizer.lr=0.1", "data.batch_size=40"];
    let (code, t) = run_args(&ckpt_args(&out, &changed), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(
            "the config differs from the checkpoint's in what the run computed so far: data.batch_size: \
             checkpoint 50, this run 40; optimizer.lr: checkpoint 0.05, this run 0.1"
        ) && t.contains("set checkpoint.resume_changes = \"allow\""),
        "{t}"
    );
    let allow: Vec<&str> = changed.iter().copied().chain(["checkpoint.resume_changes=allow"]).collect();
    let (code, t) = run_args(&ckpt_args(&out, &allow), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.contains("warning: checkpoint.resume_changes = \"allow\": resuming with settings that change")
            && t.contains("optimizer.lr: checkpoint 0.05, this run 0.1")
            && t.contains("no longer continues bitwise"),
        "{t}"
    );
    assert!(
        t.contains("resuming with changed settings: ")
            && t.contains("train.max_steps: checkpoint 6, this run 8"),
        "{t}"
    );
    assert_eq!(summary(&out)["steps"], 8);
}
