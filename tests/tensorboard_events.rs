//! TensorBoard event files read back by the real `tensorboard` Python package
//! (EventAccumulator). scripts/test.sh installs it and sets DDPTRAIN_TB_PYTHON.

mod common;
use common::*;
use std::process::Command;

const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;

#[test]
fn tensorboard_reads_back_the_scalars_of_metrics_jsonl() {
    let Ok(python) = std::env::var("DDPTRAIN_TB_PYTHON") else {
        println!(
            "skipped: DDPTRAIN_TB_PYTHON is unset (scripts/test.sh sets it after installing tensorboard)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        "logging.every_steps=2",
        "--set",
        "logging.tensorboard=true",
        "--set",
        "train.grad_clip_norm=1.0",
        "--set",
        "expect.min_test_accuracy=0",
    ];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let r = Command::new(&python).arg("-c").arg(READER).arg(out.join("tb")).output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let tb: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();

    let records: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut checked = 0;
    for rec in &records {
        let (prefix, x) = match rec["kind"].as_str() {
            Some("train") => ("train", &rec["step"]),
            // The global step, as the train scalars: PyTorch's usual x axis.
            Some("eval") => ("test", &rec["step"]),
            _ => continue,
        };
        for (field, tag) in [
            ("loss", "loss"),
            ("lr", "lr"),
            ("images_per_s", "images_per_s"),
            ("grad_norm", "grad_norm"),
            ("test_accuracy", "accuracy"),
            ("test_loss", "loss"),
        ] {
            let Some(want) = rec.get(field).and_then(|v| v.as_f64()) else { continue };
            let tag = format!("{prefix}/{tag}");
            let points = tb[&tag].as_array().unwrap_or_else(|| panic!("no {tag} in {tb}"));
            let got =
                points.iter().find(|p| p[0] == *x).unwrap_or_else(|| panic!("{tag} lacks step {x}: {tb}"));
            assert_eq!(got[1].as_f64().unwrap() as f32, want as f32, "{tag} at {x}");
            checked += 1;
        }
    }
    // Steps 2 and 4 with loss, lr, images/s and grad norm, and one evaluation with accuracy and loss.
    assert_eq!(checked, 10, "{tb}");
    let last_step = records.iter().rev().find(|r| r["kind"] == "train").map(|r| r["step"].clone());
    assert_eq!(tb["test/accuracy"][0][0], last_step.unwrap(), "test scalars at the global step: {tb}");
}
