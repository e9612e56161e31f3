//! No silent overwrite: a run into an out_dir that holds another run's files
//! (finished, unfinished, another config's) is refused with exit 2 before it
//! writes anything, naming what is there and the choices; `run.overwrite =
//! true` removes the old run's files (TensorBoard's and the checkpoints too,
//! never a user's) and trains from step 0; a finished run run again with
//! `resume = "auto"` still says it is complete and writes nothing.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file and symlink under `dir` with its bytes (a symlink: its
/// target), `.lock` included unless `lock` is false.
fn snapshot(dir: &Path, lock: bool) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let ty = std::fs::symlink_metadata(&p).unwrap().file_type();
            if ty.is_dir() {
                stack.push(p);
            } else if ty.is_symlink() {
                files
                    .insert(p.clone(), std::fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes());
            } else if lock || p.file_name().is_some_and(|n| n != ".lock") {
                files.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// [`ckpt_args`] (6 synthetic steps, a checkpoint every 2) with TensorBoard on.
fn args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut sets = vec!["logging.tensorboard=true"];
    sets.extend(extra);
    ckpt_args(out, &sets)
}

fn trained(dir: &Path, out: &Path, extra: &[&str]) -> String {
    let (code, t) = run_args(&args(out, extra), dir);
    assert_eq!(code, Some(0), "{t}");
    t
}

fn events(out: &Path) -> Vec<String> {
    names_in(&out.join("tb")).into_iter().filter(|n| n.starts_with("events.out.tfevents.")).collect()
}

const CHOICES: &str = "Nothing was written. To keep it, continue it with checkpoint.resume = \"auto\", train \
                       into another run.out_dir; to replace it, set run.overwrite = true (--set \
                       run.overwrite=true), which removes its files first (TensorBoard's too) and trains from \
                       step 0";

#[test]
fn a_finished_run_is_not_trained_over_and_resume_auto_still_finds_it_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    trained(dir.path(), &out, &[]);
    let before = snapshot(&out, true);

    let (code, t) = run_args(&args(&out, &["checkpoint.resume=never"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    let what = format!(
        "error: run.out_dir {} holds another run's files: a finished run \"mnist_o0\" (6 steps), trained with \
         this run's config: summary.json, model.safetensors, metrics.jsonl, train.log, config.toml, tb/ (1 \
         events file), ckpt/ (3 checkpoints). This run would not continue it: checkpoint.resume = \"never\". ",
        out.display()
    );
    assert!(t.contains(&format!("{what}{CHOICES}")), "{t}");
    assert!(!t.contains("ddptrain: mnist_o0"), "refused before the run's header: {t}");
    assert!(snapshot(&out, true) == before, "a refused run changed a file, .lock included:\n{t}");

    // What already worked: "auto" finds the final checkpoint, says so, exits 0, writes nothing.
    let (code, t) = run_args(&args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("is complete (6 of 6 steps") && t.contains("set run.overwrite = true"), "{t}");
    // The resume locks the out_dir, so only .lock's record (its PID) may change.
    let after = snapshot(&out, false);
    assert!(before.iter().filter(|(p, _)| !p.ends_with(".lock")).eq(after.iter()), "{t}");
}

#[test]
fn a_run_without_checkpoints_run_again_is_refused_without_offering_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Checkpoints off: nothing to resume.
    trained(dir.path(), &out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"]);
    let before = snapshot(&out, true);
    let (code, t) =
        run_args(&args(&out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "run.out_dir {} holds another run's files: a finished run \"mnist_o0\" (6 steps), trained with this \
             run's config: summary.json, model.safetensors, metrics.jsonl, train.log, config.toml, tb/ (1 events \
             file). This run would not continue it: it has no checkpoint (ckpt/) to resume. Nothing was written. \
             To keep it, train into another run.out_dir; to replace it, set run.overwrite = true",
            out.display()
        )),
        "{t}"
    );
    assert!(snapshot(&out, true) == before, "{t}");
}

#[test]
fn another_config_into_a_runs_out_dir_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    trained(dir.path(), &out, &["run.name=first", "checkpoint.every_steps=0", "checkpoint.every_minutes=0"]);
    let before = snapshot(&out, true);
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let (code, t) = run_args(&args(&out, &["run.name=second", "optimizer.lr=0.1"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(
            "a finished run \"first\" (6 steps), trained with another config than this run \"second\" \
             (optimizer.lr: its config 0.05, this run 0.1): summary.json"
        ),
        "{t}"
    );
    assert!(!t.contains("continue it with"), "another config cannot continue it: {t}");
    assert!(snapshot(&out, true) == before, "{t}");
    assert_eq!(std::fs::read_to_string(out.join("metrics.jsonl")).unwrap(), metrics);

    // With checkpoints, "auto" tries them, and refuses as it names why none fits.
    let other = dir.path().join("other");
    trained(dir.path(), &other, &["run.name=first"]);
    let before = snapshot(&other, false);
    let (code, t) = run_args(&args(&other, &["run.name=second", "optimizer.lr=0.1"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("trained with another config than this run \"second\""), "{t}");
    assert!(
        t.contains(
            "This run would not continue it: none of its checkpoints can be resumed: checkpoint error in"
        ) && t.contains("optimizer.lr: checkpoint 0.05, this run 0.1"),
        "{t}"
    );
    assert!(!t.contains("continue it with") && t.contains("set run.overwrite = true"), "{t}");
    assert!(snapshot(&other, false) == before, "{t}");

    // A checkpoint from elsewhere, even a copy of its own, does not continue the run that is here.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(other.join("ckpt/latest")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    let resume = format!("checkpoint.resume={}", copy.display());
    let (code, t) = run_args(&args(&other, &["run.name=first", &resume]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "This run would not continue it: checkpoint.resume names {}, not one of its checkpoints. {CHOICES}",
            copy.display()
        )),
        "{t}"
    );
    assert!(snapshot(&other, false) == before, "{t}");
}

#[test]
fn overwrite_removes_the_old_run_first_and_trains_afresh_keeping_a_users_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    trained(dir.path(), &out, &[]);
    let old_events = events(&out);
    assert_eq!(old_events.len(), 1);
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    std::fs::write(out.join("tb/mine.txt"), "mine").unwrap();

    // "auto" would find the finished run complete: overwrite wins and starts from step 0.
    let t = trained(dir.path(), &out, &["run.overwrite=true", "train.max_steps=4"]);
    let removed = format!(
        "run.overwrite = true: removed the previous run's files from {}: summary.json, model.safetensors, \
         metrics.jsonl, train.log, config.toml, tb/ (1 events file), ckpt/ (3 checkpoints)",
        out.display()
    );
    assert!(t.contains(&removed), "{t}");
    assert!(!t.contains("resuming from") && !t.contains("is complete"), "{t}");
    let now = events(&out);
    assert_eq!(now.len(), 1, "one TensorBoard history: {now:?}");
    assert_ne!(now, old_events);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps: Vec<u64> =
        lines.iter().filter(|r| r["kind"] == "train").map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps.last(), Some(&4), "{lines:?}");
    assert!(lines.iter().all(|r| r["step"].as_u64() <= Some(4)), "only the new run's records: {lines:?}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["steps"], 4);
    assert!(s.get("resumed_from").is_none(), "{s}");
    assert_eq!(names_in(&out.join("ckpt")), ["latest", "step_00000002", "step_00000004"]);
    let log = std::fs::read_to_string(out.join("train.log")).unwrap();
    assert!(log.starts_with(&removed), "the new log says what went: {log}");
    assert_eq!(log.matches("ddptrain: mnist_o0 |").count(), 1, "the old run's log went: {log}");
    assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
    assert_eq!(std::fs::read_to_string(out.join("tb/mine.txt")).unwrap(), "mine");
}

#[test]
fn an_out_dir_with_only_a_users_files_is_trained_into() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("tb")).unwrap();
    std::fs::write(out.join("README"), "notes").unwrap();
    let t = trained(dir.path(), &out, &[]);
    assert!(!t.contains("removed"), "{t}");
    assert_eq!(std::fs::read_to_string(out.join("README")).unwrap(), "notes");
    assert_eq!(events(&out).len(), 1);
}

#[test]
fn an_out_dir_that_is_a_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, "not a directory").unwrap();
    let (code, t) = run_args(&args(&file, &[]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "error: run.out_dir {} is a file, not a directory: set run.out_dir to a new or empty directory (or \
             move the file away)",
            file.display()
        )),
        "{t}"
    );
    assert!(!t.contains("os error"), "{t}");
    let (code, t) = run_args(&args(&file.join("sub"), &[]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(&format!(
            "error: run.out_dir {} cannot be created: {} is a file, not a directory; set run.out_dir to a path \
             whose folders are directories",
            file.join("sub").display(),
            file.display()
        )),
        "{t}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a directory");
}

#[test]
fn run_overwrite_is_a_boolean_and_cannot_remove_the_checkpoint_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) = run_args(&args(&out, &["run.overwrite=yes"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("`run.overwrite`: expected true or false, found string \"yes\""), "{t}");
    let resume = format!("checkpoint.resume={}", out.join("ckpt/latest").display());
    let (code, t) = run_args(&args(&out, &["run.overwrite=true", &resume]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains(
            "`run.overwrite`: is true, which removes run.out_dir's checkpoints first, and checkpoint.resume names \
             one of them"
        ) && t.contains("leave out one of the two"),
        "{t}"
    );
    assert!(!out.exists(), "a config error writes nothing");
}

#[test]
fn under_launch_the_refusal_is_the_jobs_exit_2_and_no_rank_waits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    trained(dir.path(), &out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"]);
    let before = snapshot(&out, true);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut a: Vec<String> = ["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"]
        .map(String::from)
        .to_vec();
    a.extend(args(
        &out,
        &["checkpoint.every_steps=0", "checkpoint.every_minutes=0", "parallel.timeout_s=60"],
    ));
    let t0 = std::time::Instant::now();
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(2), "a rank's exit 2 is the job's: {t}");
    assert!(
        t.lines()
            .any(|l| l.starts_with("[rank 0] error: run.out_dir") && l.contains("holds another run's files")),
        "{t}"
    );
    // Rank 1 gets rank 0's refusal as its own error (src/checkpoint/tests_share.rs),
    // unless launch stopped it first, once rank 0 had failed.
    for l in t.lines().filter(|l| l.starts_with("[rank 1] error:")) {
        assert!(l.contains("holds another run's files"), "rank 1 fails with rank 0's reason: {t}");
    }
    assert!(t0.elapsed() < std::time::Duration::from_secs(50), "no rank waits for the timeout: {t}");
    assert!(snapshot(&out, true) == before, "{t}");
}

/// `args` run with `TORCHELASTIC_RESTART_COUNT` set, as `launch --max-restarts` starts a rank again.
fn run_restarted(a: &[String], dir: &Path, count: &str) -> (Option<i32>, String) {
    let o = std::process::Command::new(ddptrain_bin())
        .args(a)
        .current_dir(dir)
        .env_remove("WORLD_SIZE")
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .env("TORCHELASTIC_RESTART_COUNT", count)
        .output()
        .unwrap();
    (o.status.code(), text(&o))
}

#[test]
fn a_restarted_job_starts_over_what_its_failed_attempt_left_without_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let a = args(&out, &["checkpoint.every_steps=0", "checkpoint.every_minutes=0"]);
    // The first attempt fails after step 3 and leaves its logs, no checkpoint.
    let mut failed = a.clone();
    failed.push("--halt-after-steps=3".into());
    let (code, t) = run_restarted(&failed, dir.path(), "0");
    assert_eq!(code, Some(1), "{t}");
    let (code, t) = run_restarted(&a, dir.path(), "0");
    assert_eq!(code, Some(2), "a first attempt does not train over it: {t}");
    assert!(
        t.contains("holds another run's files: an unfinished run (no config.toml records its config)"),
        "{t}"
    );
    let (code, t) = run_restarted(&a, dir.path(), "1");
    assert_eq!(code, Some(0), "a restart of the job goes on: {t}");
    // A finished run is no failed attempt's: a restart does not train over it either.
    let (code, t) = run_restarted(&a, dir.path(), "2");
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("a finished run \"mnist_o0\" (6 steps)"), "{t}");
}
