//! configs/ci_smoke.toml, as CI runs it: a few hundred steps on the real digits
//! that must pass their gates, checkpointing and TensorBoard on.

mod common;
use common::*;

#[test]
fn ci_smoke_config_passes_its_gates() {
    let data = mnist_dir();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let data_set = format!("data.path={}", data.display());
    let cfg = repo_root().join("configs/ci_smoke.toml");
    let o = ddptrain(&["--config", cfg.to_str().unwrap(), "--set", &out_set, "--set", &data_set], dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("PASS expect.min_test_accuracy") && t.contains("PASS expect.max_final_loss"), "{t}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["steps"], 200);
    let ckpts: Vec<&str> = s["checkpoints"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert!(ckpts.len() == 2 && ckpts[1].ends_with("step_00000200"), "{s}");
    assert!(out.join("tb").read_dir().unwrap().next().is_some(), "no TensorBoard events");
    println!(
        "ci_smoke: test accuracy {}, final loss {}, {}s",
        s["test_accuracy"], s["final_loss"], s["wall_s"]
    );
}
