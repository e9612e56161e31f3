//! Mixed precision through the binary: the shortened O2 MNIST run CI relies
//! on, the amp metrics, and a nonsense [amp] override refused by `check`.

mod common;
use common::*;

fn read_json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn o2_mnist_config_learns_in_one_epoch_with_loss_scale_metrics() {
    let data = mnist_dir();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let data_set = format!("data.path={}", data.display());
    let cfg = repo_root().join("configs/mnist_o2.toml");
    let o = ddptrain(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--set",
            &out_set,
            "--set",
            &data_set,
            "--set",
            "train.epochs=1",
            "--set",
            "scheduler.warmup_steps=20",
            "--set",
            "expect.min_test_accuracy=0.95",
            "--set",
            "logging.progress=never",
        ],
        dir.path(),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let s = read_json(&out.join("summary.json"));
    assert_eq!((s["opt_level"].as_str(), s["steps"].as_u64()), (Some("O2"), Some(80)));
    let scale = s["loss_scale"].as_f64().unwrap();
    let overflows = s["overflow_steps"].as_u64().unwrap();
    // Dynamic scaling from 2^16: powers of two, halved once per skipped step (no growth in 80 steps).
    assert_eq!(scale, 65536.0 / 2f64.powi(overflows as i32), "{s}");
    assert_eq!(s["loss_decreased"], true, "{s}");
    let train: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] == "train")
        .collect();
    assert!(train.iter().all(|l| l["loss_scale"].is_number() && l["overflow_steps"].is_number()));
    println!(
        "one O2 epoch: test accuracy {}, {} images/s, {overflows} overflow steps",
        s["test_accuracy"], s["images_per_s"]
    );
}

#[test]
fn o3_summary_reports_that_the_loss_fell() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o3.toml");
    let data_set = format!("data.path={}", mnist_dir().display());
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        &data_set,
        "--set",
        "train.max_steps=30",
        "--set",
        "logging.every_steps=5",
        "--set",
        "scheduler.warmup_steps=10",
        "--set",
        "logging.progress=never",
        "--set",
        "expect.min_test_accuracy=0.0",
    ];
    let o = ddptrain(&args, dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let s = read_json(&out.join("summary.json"));
    assert_eq!((s["opt_level"].as_str(), s["loss_scale"].as_f64()), (Some("O3"), Some(1.0)));
    let (first, last) = (s["initial_loss"].as_f64().unwrap(), s["final_loss"].as_f64().unwrap());
    assert!(last < first, "O3 must train: {s}");
    assert_eq!(s["loss_decreased"], true, "{s}");
}

#[test]
fn check_refuses_master_weights_with_o0_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let o = ddptrain(
        &["check", "--config", cfg.to_str().unwrap(), "--set", "amp.master_weights=true"],
        dir.path(),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("amp.master_weights") && t.contains("makes no sense with O0"), "{t}");
}

#[test]
fn overflowing_steps_are_skipped_logged_with_param_names_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o2.toml");
    // At 2^24 the f16 dlogits (scale * (p - onehot) / N) exceed 65504: every step overflows until the scale backs off.
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        "amp.init_scale=16777216",
        "--set",
        "expect.min_test_accuracy=0.0",
    ];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("step 1: gradient overflow (inf/NaN) at loss scale 16777216, first in fc.bias, fc.weight"),
        "{t}"
    );
    assert!(t.contains("step skipped, loss scale -> 8388608"), "{t}");
    let s = read_json(&out.join("summary.json"));
    let skipped = s["overflow_steps"].as_u64().unwrap();
    assert!(skipped >= 1, "{s}");
    assert_eq!(s["loss_scale"].as_f64().unwrap(), 16777216.0 / 2f64.powi(skipped as i32), "{s}");
}

#[test]
fn too_many_skipped_steps_fail_the_max_overflow_steps_gate() {
    let dir = tempfile::tempdir().unwrap();
    let out_set = format!("run.out_dir={}", dir.path().join("out").display());
    let cfg = repo_root().join("configs/mnist_o2.toml");
    // The scale starts at 2^24, so the first steps overflow (see the test above).
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        "amp.init_scale=16777216",
        "--set",
        "expect.min_test_accuracy=0.0",
        "--set",
        "expect.max_overflow_steps=0",
    ];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains("FAIL expect.max_overflow_steps: expected <= 0, got "), "{t}");
}

#[test]
fn a_run_that_overflows_at_the_minimum_scale_stops_naming_step_and_params() {
    let dir = tempfile::tempdir().unwrap();
    let out_set = format!("run.out_dir={}", dir.path().join("out").display());
    let cfg = repo_root().join("configs/mnist_o2.toml");
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        "amp.init_scale=16777216",
        "--set",
        "amp.min_loss_scale=16777216",
    ];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("step 1: gradients of fc.bias, fc.weight"), "{t}");
    assert!(t.contains("minimum loss scale 16777216 (amp.min_loss_scale)"), "{t}");
}
