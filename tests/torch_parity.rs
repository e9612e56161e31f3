//! ddptrain against PyTorch itself (scripts/torch_parity.py): the seed
//! ConvNet from the same init, on the same digits in ddptrain's shuffled
//! order, for 20 SGD and 20 AdamW steps on the CPU and 20 SGD steps on the
//! GPU; every step checked from ddptrain's previous checkpoint, the
//! free-running end state, and the final checkpoint scored in PyTorch after
//! `load_state_dict(strict=True)` (the script says why each tolerance is what
//! it is). Needs a python with torch, numpy and safetensors:
//! `DDPTRAIN_TORCH_PYTHON` (scripts/test.sh installs them into .venv/ and
//! sets it), else `python3`. Without one the tests print why they were
//! skipped, except under CI=true, where they fail.

mod common;
use common::*;
use ddptrain::data::{idx, DistributedSampler};
use std::path::Path;
use std::process::{Command, Output};

/// The python that has torch, numpy and safetensors, or `None` when the test
/// is skipped.
fn torch_python(test: &str) -> Option<String> {
    let python = std::env::var("DDPTRAIN_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import torch, numpy, safetensors"]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    let why = format!("{python} cannot import torch, numpy and safetensors");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "{test}: {why}, and CI=true forbids skipping the PyTorch oracle: scripts/test.sh installs them \
             into .venv/ and sets DDPTRAIN_TORCH_PYTHON"
        );
    }
    println!("{test}: skipped: {why} (set DDPTRAIN_TORCH_PYTHON)");
    None
}

/// The training-set indices ddptrain visits in its first epoch, as its
/// trainer builds the sampler for the seed config at world size 1, written
/// as JSON into `dir`.
fn first_epoch_order(dir: &Path) -> std::path::PathBuf {
    let cfg = ddptrain::config::load(&repo_root().join("configs/mnist_o0.toml"), &[]).expect("seed config");
    let labels = idx::find(&mnist_dir(), "train-labels-idx1-ubyte").expect("MNIST train labels");
    let len = idx::read_labels(&labels).expect("read MNIST train labels").labels.len();
    let sampler = DistributedSampler {
        len,
        num_replicas: 1,
        rank: 0,
        shuffle: true,
        seed: cfg.run.seed,
        drop_last: cfg.data.drop_last,
    };
    let path = dir.join("order.json");
    std::fs::write(&path, serde_json::to_string(&sampler.indices(0)).expect("indices as JSON"))
        .expect("write the order file");
    path
}

/// Runs scripts/torch_parity.py with `args` after the binary, data and
/// order. ddptrain trains on the CPU unless `args` say `--device cuda`; the
/// script keeps PyTorch on the CPU either way.
fn parity(python: &str, args: &[&str]) -> Output {
    let tmp = tempfile::tempdir().expect("temp dir");
    let order = first_epoch_order(tmp.path());
    let mut cmd = Command::new(python);
    cmd.arg("scripts/torch_parity.py")
        .arg("--bin")
        .arg(ddptrain_bin())
        .arg("--data")
        .arg(mnist_dir())
        .arg("--order")
        .arg(&order)
        .args(args)
        .current_dir(repo_root());
    if !args.contains(&"cuda") {
        cmd.env(HIDE_GPUS.0, HIDE_GPUS.1);
    }
    cmd.output().expect("run scripts/torch_parity.py")
}

fn matches_pytorch(test: &str, optimizer: &str, device: &str) {
    let Some(python) = torch_python(test) else { return };
    let o = parity(&python, &["--optimizer", optimizer, "--steps", "20", "--device", device]);
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success(), "ddptrain and PyTorch disagree:\n{t}");
    assert!(t.contains("check 3: test set: ddptrain"), "no accuracy comparison in:\n{t}");
}

#[test]
fn twenty_sgd_steps_match_pytorch() {
    matches_pytorch("twenty_sgd_steps_match_pytorch", "sgd", "cpu");
}

#[test]
fn twenty_adamw_steps_match_pytorch() {
    matches_pytorch("twenty_adamw_steps_match_pytorch", "adamw", "cpu");
}

/// The GPU path (on the emulated device in CI) against PyTorch on the CPU,
/// held to the same tolerances as the CPU path.
#[test]
fn twenty_sgd_steps_on_the_gpu_match_pytorch() {
    let test = "twenty_sgd_steps_on_the_gpu_match_pytorch";
    if ddptrain::cuda::test_gpu(test).is_none() {
        return;
    }
    matches_pytorch(test, "sgd", "cuda");
}

/// The oracle is sharp enough to see a 1% learning-rate difference in one
/// step: PyTorch's updates then differ by 1e-2 of their size, ten times the
/// tolerance.
#[test]
fn a_one_percent_learning_rate_difference_fails_the_oracle() {
    let test = "a_one_percent_learning_rate_difference_fails_the_oracle";
    let Some(python) = torch_python(test) else { return };
    let o = parity(&python, &["--optimizer", "sgd", "--steps", "2", "--lr-scale", "1.01"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "the perturbed run passed:\n{t}");
    assert!(
        t.contains("MISMATCH step 1: fc.weight differs by 9.9"),
        "expected step 1's fc.weight update to differ by ~1e-2:\n{t}"
    );
}
