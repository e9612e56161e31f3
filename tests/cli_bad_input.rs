//! Inputs that used to panic or abort the binary: sizes that overflow,
//! models too large for the machine, a GPU that is not there, a misspelled
//! variable. Each is now exit 2, a message naming the key and the file, and
//! nothing written.

mod common;
use common::*;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

/// configs/ci_smoke.toml: its layers are one inline list, easy to edit.
fn smoke() -> String {
    std::fs::read_to_string(repo_root().join("configs/ci_smoke.toml")).expect("read ci_smoke.toml")
}

/// Runs `ddptrain <sub> --config bad.toml --set run.out_dir=...` on synthetic
/// data; returns the output and whether out_dir exists afterwards.
fn run(body: &str, sub: &[&str], sets: &[&str], env: &[(&str, &str)]) -> (Output, String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "bad.toml", body);
    let out_dir = dir.path().join("out");
    let out = format!("run.out_dir={}", out_dir.display());
    let mut args: Vec<&str> = sub.to_vec();
    args.extend(["--config", cfg.to_str().unwrap(), "--set", &out, "--set", "data.dataset=\"synthetic\""]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let mut cmd = Command::new(ddptrain_bin());
    cmd.args(&args).current_dir(dir.path()).env(HIDE_GPUS.0, HIDE_GPUS.1).env_remove("WORLD_SIZE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run ddptrain");
    let t = text(&o);
    let written = out_dir.exists();
    (o, t, written)
}

/// Both `check` and training refuse `body` with exit 2, naming each of `needles`.
fn refused(body: &str, sets: &[&str], needles: &[&str]) {
    for sub in [&["check"][..], &[][..]] {
        let (o, t, written) = run(body, sub, sets, &[]);
        assert_eq!(o.status.code(), Some(2), "{sub:?}: signal {:?}\n{t}", o.status.signal());
        for n in needles {
            assert!(t.contains(n), "{sub:?}: message should contain {n:?}:\n{t}");
        }
        assert!(t.contains("bad.toml"), "{t}");
        assert!(!written, "{sub:?}: a config error wrote out_dir");
    }
}

#[test]
fn a_padding_that_overflows_is_a_config_error_not_a_panic() {
    let body = smoke().replacen("padding = 2 }", "padding = 9223372036854775807 }", 1);
    refused(&body, &[], &["`model.layers[0].layers[0].padding`", "does not fit in 64 bits"]);
}

#[test]
fn models_too_large_for_the_machine_are_refused_before_allocating() {
    let conv = |c: &str| {
        format!(
            r#"model.layers=[{{type="conv2d", kernel_size=3, {c}}}, {{type="flatten"}}, {{type="linear", out_features=10}}]"#
        )
    };
    for sets in [
        vec!["model.input_shape=[1, 100000, 100000]".to_owned()],
        vec![conv("out_channels=1099511627776")],
        vec![conv("out_channels=4, padding=1000000")],
    ] {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        refused(
            &smoke(),
            &sets,
            &["the run needs an estimated", "of host memory but", "the largest layer is"],
        );
    }
    // A model that fits the machine but not run.max_memory_gb.
    refused(&smoke(), &["run.max_memory_gb=0.01"], &["are available (run.max_memory_gb = 0.01)"]);
}

#[test]
fn epochs_whose_steps_overflow_are_refused() {
    let sets = ["data.synthetic_train_size=6400", "train.epochs=9223372036854775807"];
    refused(&smoke(), &sets, &["`train.epochs`", "more steps than fit in 64 bits"]);
}

#[test]
fn check_prints_the_memory_estimate() {
    let (o, t, _) = run(&smoke(), &["check"], &[], &[]);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let line = t.lines().find(|l| l.starts_with("memory estimate: ")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains(" MiB host (process ") && line.contains("activations"), "{line}");
}

#[test]
fn cuda_without_a_gpu_names_the_file_and_the_key() {
    let (o, t, written) = run(&smoke(), &[], &["run.device=\"cuda\""], &[]);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("config error in ")
            && t.contains("bad.toml: `run.device`: run.device = \"cuda\" but no CUDA device"),
        "{t}"
    );
    assert!(!written);
}

#[test]
fn a_single_underscore_variable_is_refused() {
    let (o, t, written) = run(&smoke(), &[], &[], &[("DDPTRAIN_TRAIN_EPOCHS", "1")]);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("environment variable DDPTRAIN_TRAIN_EPOCHS: `train.epochs`"), "{t}");
    assert!(t.contains("did you mean `DDPTRAIN_TRAIN__EPOCHS`?"), "{t}");
    assert!(!written);
}
