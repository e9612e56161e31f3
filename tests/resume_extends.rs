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

fn records(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A run resumed from an older checkpoint (the newest is corrupt) records
/// each evaluation once, numbers epochs alike across record kinds, and its
/// summary tells the whole run from the last segment.
#[test]
fn a_resumed_run_keeps_one_record_per_evaluation_and_reports_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sets = ["logging.every_steps=1", "train.max_steps=10"];
    assert_eq!(run_args(&ckpt_args(&out, &sets), dir.path()).0, Some(0));
    let first = summary(&out);
    assert_eq!((first["eval_step"].as_u64(), first.get("resumed_from_step")), (Some(10), None), "{first}");
    let newest = out.join("ckpt/step_00000010/model.safetensors");
    let mut b = std::fs::read(&newest).unwrap();
    let n = b.len();
    b[n - 3] ^= 0x40;
    std::fs::write(&newest, b).unwrap();
    let (code, t) = run_args(&ckpt_args(&out, &sets), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming from the previous good checkpoint"), "{t}");

    let recs = records(&out);
    let at = |kind: &str| -> Vec<(u64, u64)> {
        recs.iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| (r["step"].as_u64().unwrap(), r["epoch"].as_u64().unwrap()))
            .collect()
    };
    // 4 steps an epoch: evaluations at epoch 0's and 1's ends and at the
    // run's; the resume from step 8 (saved before its epoch's evaluation)
    // evaluated step 8 again.
    assert_eq!(at("eval"), [(4, 0), (8, 1), (10, 2)], "{recs:?}");
    let train = at("train");
    assert_eq!(train.iter().map(|t| t.0).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>(), "{recs:?}");
    let saves = at("checkpoint");
    assert_eq!(saves.iter().map(|t| t.0).collect::<Vec<_>>(), [2, 4, 6, 8, 10], "{recs:?}");
    for (step, epoch) in at("eval").into_iter().chain(saves) {
        assert!(train.contains(&(step, epoch)), "the record of step {step} says epoch {epoch}: {train:?}");
    }

    let s = summary(&out);
    assert_eq!(s["resumed_from_step"], 8, "{s}");
    assert_eq!(
        (s["last_segment"]["from_step"].as_u64(), s["last_segment"]["steps"].as_u64()),
        (Some(8), Some(2))
    );
    assert_eq!(s["eval_step"], 10, "{s}");
    let (whole, last) = (s["wall_s"].as_f64().unwrap(), s["last_segment"]["wall_s"].as_f64().unwrap());
    assert!(whole > last && last > 0.0, "{s}");
    assert!(s["last_segment"]["images_per_s"].as_f64().unwrap() > 0.0, "{s}");
    let gates = s["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 1, "{s}");
    assert_eq!(
        (gates[0]["gate"].as_str(), gates[0]["passed"].as_bool()),
        (Some("min_test_accuracy"), Some(true))
    );
    assert!(gates[0]["line"].as_str().unwrap().starts_with("expect.min_test_accuracy: expected >= 0.0000"));
}

/// A one-process run resumed by two ranks with `resume_changes = "allow"`:
/// the rest of its epoch is dealt to the two, and its length recounted.
#[test]
fn another_world_size_is_refused_or_allowed_and_reshards_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // 200 samples at batch 50: 4 steps an epoch alone; step 6 is 2 batches into epoch 1.
    let (code, t) = run_args(&ckpt_args(&out, &["train.epochs=3"]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let two = |extra: &[&str]| {
        let mut a: Vec<String> = ["launch", "--nproc-per-node", "2", "--master-port", &port, "--"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(ckpt_args(&out, &[&["train.epochs=3", "train.max_steps=100"], extra].concat()));
        run_args(&a, dir.path())
    };
    let (code, t) = two(&[]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("the world size: checkpoint 1 processes, this run 2"), "{t}");
    let (code, t) = two(&["checkpoint.resume_changes=allow"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.contains("warning: checkpoint.resume_changes = \"allow\"") && t.contains("the world size"),
        "{t}"
    );
    // Two ranks: 100 samples left of epoch 1 is one step of 2 x 50, then
    // epoch 2 is 2 steps: 6 + 1 + 2.
    let s = summary(&out);
    assert_eq!(
        (s["steps"].as_u64(), s["world_size"].as_u64(), s["resumed_from_step"].as_u64()),
        (Some(9), Some(2), Some(6)),
        "{s}"
    );
    assert_eq!(s["epochs"], 3, "{s}");
    assert!(t.contains("done: 9 steps, 3 epochs"), "{t}");
}
