//! What a run reports about itself, through the binary on the CPU: images/s
//! that count training time only, a summary whose fields mean what their
//! names say, a finished run that is not re-run, and traces with DDP.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn cfg() -> String {
    repo_root().join("configs/mnist_o0.toml").display().to_string()
}

fn json_lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn summary(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

/// Runs the seed ConvNet on synthetic digits with `sets` on top of [`SYNTH`].
fn train(dir: &Path, out: &Path, sets: &[&str], extra: &[&str]) -> String {
    let c = cfg();
    let out_set = format!("run.out_dir={}", out.display());
    let mut args = vec!["--config", c.as_str(), "--set", &out_set, "--set", "expect.min_test_accuracy=0"];
    args.extend_from_slice(SYNTH);
    for s in sets {
        args.extend_from_slice(&["--set", s]);
    }
    args.extend_from_slice(extra);
    let o = ddptrain(&args, dir);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    t
}

#[test]
fn a_logging_window_that_holds_an_evaluation_counts_training_time_only() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // 15 steps per epoch, a log line every 8: the window of steps 9..=16
    // holds the evaluation after step 15, which scores 20,000 samples (many
    // times the time of a step). Counting the window from the evaluation's
    // end, as a wall clock does, would credit 8 steps' images to one step.
    train(
        dir.path(),
        &out,
        &[
            "data.synthetic_train_size=750",
            "data.batch_size=50",
            "data.synthetic_test_size=20000",
            "train.max_steps=24",
            "train.epochs=2",
            "logging.every_steps=8",
        ],
        &[],
    );
    let ips: Vec<(u64, f64)> = json_lines(&out.join("metrics.jsonl"))
        .iter()
        .filter(|r| r["kind"] == "train")
        .map(|r| (r["step"].as_u64().unwrap(), r["images_per_s"].as_f64().unwrap()))
        .collect();
    let whole = summary(&out)["images_per_s"].as_f64().unwrap();
    let (_, with_eval) = ips.iter().copied().find(|(s, _)| *s == 16).expect("a line at step 16");
    assert!(
        with_eval < 3.0 * whole,
        "window with the evaluation: {with_eval:.0} images/s, run {whole:.0}: {ips:?}"
    );
}

#[test]
fn the_summary_counts_full_epochs_and_starts_from_the_first_steps_loss() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let trace = dir.path().join("trace.jsonl");
    // 10 steps per epoch; 15 steps are one full epoch and half of another.
    train(
        dir.path(),
        &out,
        &["train.max_steps=15", "train.epochs=2", "logging.every_steps=5", "data.batch_size=40"],
        &["--record-trace", trace.to_str().unwrap()],
    );
    let s = summary(&out);
    assert_eq!(s["steps"], 15);
    assert_eq!(s["epochs"], 1, "{s}");
    let first: f64 = json_lines(&trace)[0]["loss"].as_str().unwrap().parse().unwrap();
    assert_eq!(s["initial_loss"].as_f64().unwrap(), first, "initial_loss is step 1's loss: {s}");
}

#[test]
fn a_finished_run_says_so_and_rewrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sets = ["checkpoint.every_steps=2", "checkpoint.resume=auto", "logging.tensorboard=true"];
    train(dir.path(), &out, &sets, &[]);
    let snapshot = |out: &Path| -> Vec<(String, Vec<u8>, std::time::SystemTime)> {
        let mut files = Vec::new();
        let mut stack = vec![out.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.file_name().is_some_and(|n| n != ".lock") {
                    let m = std::fs::metadata(&p).unwrap().modified().unwrap();
                    files.push((p.display().to_string(), std::fs::read(&p).unwrap(), m));
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&out);
    let t = train(dir.path(), &out, &sets, &[]);
    assert!(t.contains("is complete (4 of 4 steps") && t.contains("nothing to train"), "{t}");
    assert!(t.contains("done: 4 steps"), "{t}");
    assert!(snapshot(&out) == before, "a finished run's files changed on a re-run:\n{t}");
}

#[test]
fn two_ranks_record_one_readable_trace_and_check_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let trace = dir.path().join("trace.jsonl");
    let launch = |out: &Path, trace_args: [&str; 2]| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = cfg();
        let out_set = format!("run.out_dir={}", out.display());
        let mut cmd = Command::new(ddptrain_bin());
        cmd.env(HIDE_GPUS.0, HIDE_GPUS.1).env_remove("WORLD_SIZE").current_dir(dir.path());
        cmd.args(["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"]);
        cmd.args(["--config", &c, "--set", &out_set, "--set", "expect.min_test_accuracy=0"]);
        cmd.args(SYNTH).args(["--set", "train.max_steps=6"]).args(trace_args);
        cmd.output().unwrap()
    };
    let o = launch(&out, ["--record-trace", trace.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines = json_lines(&trace);
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "one line per step, written by rank 0 alone");
    let o = launch(&dir.path().join("again"), ["--check-trace", trace.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "both ranks reproduce the trace:\n{}", text(&o));
}
