//! The run's lines as a user sees them wherever stdout goes: every step and
//! evaluation line reaches a redirected stdout whatever `logging.progress`
//! says, the same lines are appended to `out_dir/train.log`, and a stdout
//! closed under the run (`ddptrain ... | head`) loses lines, not the run.

mod common;
use common::*;
use std::process::Command;

/// The seed config on synthetic digits for 4 steps, a line every 2, no gate.
fn args(out: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut a: Vec<String> = ["--config", cfg.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    for s in SYNTH.iter().copied().chain(["logging.every_steps=2", "expect.min_test_accuracy=0.0"]) {
        if s != "--set" {
            a.extend(["--set".to_owned(), s.to_owned()]);
        }
    }
    a.extend(["--set".to_owned(), format!("run.out_dir={}", out.display())]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// `ddptrain args` with stdout's reader gone before the run writes a byte
/// (`| head -0`), so every line it prints meets a broken pipe.
fn with_closed_stdout(args: &[String], cwd: &std::path::Path) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(ddptrain_bin())
        .args(args)
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .current_dir(cwd)
        .stdout(writer)
        .output()
        .unwrap()
}

fn step_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("step ")).collect()
}

#[test]
fn every_line_reaches_a_redirected_stdout_and_the_train_log_whatever_progress_says() {
    for progress in ["always", "auto", "never"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let setting = format!("logging.progress=\"{progress}\"");
        let a = args(&out, &["--set", &setting]);
        let o = ddptrain(&a.iter().map(String::as_str).collect::<Vec<_>>(), dir.path());
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert_eq!(o.status.code(), Some(0), "{progress}: {}", text(&o));
        assert!(stdout.starts_with("ddptrain: mnist_o0 |"), "{progress}: no header on stdout:\n{stdout}");
        assert_eq!(step_lines(&stdout).len(), 2, "{progress}: steps 2 and 4 on stdout:\n{stdout}");
        assert!(stdout.contains("| test accuracy "), "{progress}: no evaluation line:\n{stdout}");
        let log = std::fs::read_to_string(out.join("train.log")).unwrap();
        assert_eq!(step_lines(&log), step_lines(&stdout), "{progress}: train.log holds other lines");
        assert!(log.contains("| test accuracy "), "{progress}: no evaluation line in train.log:\n{log}");
    }
}

#[test]
fn a_stdout_closed_under_the_run_loses_lines_not_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = with_closed_stdout(&args(&out, &[]), dir.path());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.join("model.safetensors").exists() && out.join("summary.json").exists());
    let log = std::fs::read_to_string(out.join("train.log")).unwrap();
    assert_eq!(step_lines(&log).len(), 2, "train.log still gets every line:\n{log}");
}

#[test]
fn check_into_a_closed_pipe_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = repo_root().join("configs/mnist_o0.toml");
    // check opens the data: the config's data.path is relative to the repository.
    let data = format!("data.path={}", mnist_dir().display());
    let check = ["check", "--config", cfg.to_str().unwrap(), "--set", &data].map(String::from);
    let o = with_closed_stdout(&check, dir.path());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
