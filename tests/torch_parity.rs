//! ddptrain against PyTorch itself (scripts/torch_parity.py): same init, same
//! digits, one SGD step, every state_dict tensor within 1e-5 relative. Runs where
//! a python with torch, numpy and safetensors is found ($DDPTRAIN_TORCH_PYTHON,
//! else python3); elsewhere it prints why it was skipped.

mod common;
use common::*;
use std::process::Command;

#[test]
fn one_sgd_step_matches_pytorch() {
    let python = std::env::var("DDPTRAIN_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import torch, numpy, safetensors"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("skipped: {python} cannot import torch, numpy and safetensors (set DDPTRAIN_TORCH_PYTHON)");
        return;
    }
    let data = mnist_dir();
    let o = Command::new(&python)
        .args(["scripts/torch_parity.py", "--bin", env!("CARGO_BIN_EXE_ddptrain"), "--data"])
        .arg(&data)
        .current_dir(repo_root())
        .output()
        .expect("run torch_parity.py");
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success(), "ddptrain and PyTorch disagree:\n{t}");
}
