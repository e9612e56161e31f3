//! Golden traces through the binary: same-seed O0 runs reproduce a trace bit
//! for bit, a resumed run continues it, and a check stops at the first
//! divergence (exit 3) naming the step, the quantity and the parameter.

mod common;
use common::*;
use std::path::Path;

fn run(dir: &Path, out: &str, extra: &[&str]) -> (Option<i32>, String) {
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let out_set = format!("run.out_dir={}", dir.join(out).display());
    let mut a = vec!["--config", cfg.to_str().unwrap(), "--set", &out_set];
    a.extend_from_slice(SYNTH);
    a.extend_from_slice(&["--set", "train.max_steps=5", "--set", "logging.tensorboard=false"]);
    a.extend_from_slice(extra);
    let o = ddptrain(&a, dir);
    (o.status.code(), text(&o))
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn same_seed_runs_reproduce_a_trace_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (t1, t2) = (dir.path().join("t1.jsonl"), dir.path().join("t2.jsonl"));
    let (c, t) = run(dir.path(), "a", &["--record-trace", t1.to_str().unwrap()]);
    assert_eq!(c, Some(3), "{t}"); // the seed config's accuracy gate, on random labels
    let (c, t) = run(dir.path(), "b", &["--record-trace", t2.to_str().unwrap()]);
    assert_eq!(c, Some(3), "{t}");
    assert_eq!(std::fs::read(&t1).unwrap(), std::fs::read(&t2).unwrap());
    let l = lines(&t1);
    assert_eq!(l.len(), 5);
    assert_eq!(l[0]["step"], 1);
    assert_eq!(l[0]["loss_scale"], "1");
    assert!(l[0]["grad_norm"].as_str().unwrap().parse::<f32>().unwrap() > 0.0);
    assert_eq!(l[0]["params"][0]["name"], "layer1.0.weight");
    assert_eq!(l[0]["params"][0]["sha256"].as_str().unwrap().len(), 16);

    let (c, t) =
        run(dir.path(), "c", &["--check-trace", t1.to_str().unwrap(), "--set", "expect.min_test_accuracy=0"]);
    assert_eq!(c, Some(0), "{t}");
    assert!(t.contains("PASS trace") && t.contains("all 5 steps match"), "{t}");

    // Halted at step 2 and resumed: the resumed part of the trace is the straight one's.
    let t3 = dir.path().join("t3.jsonl");
    let ck = ["--set", "checkpoint.every_steps=2"];
    let (c, t) = run(dir.path(), "d", &[&ck[..], &["--halt-after-steps", "3"]].concat());
    assert_eq!(c, Some(1), "{t}");
    let (c, t) = run(dir.path(), "d", &[&ck[..], &["--record-trace", t3.to_str().unwrap()]].concat());
    assert_eq!(c, Some(3), "{t}");
    assert_eq!(lines(&t3), lines(&t1)[2..].to_vec());
}

#[test]
fn a_check_stops_at_the_first_divergence_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let golden = dir.path().join("golden.jsonl");
    run(dir.path(), "a", &["--record-trace", golden.to_str().unwrap()]);
    let g = golden.to_str().unwrap();

    // Another learning rate: step 1's loss and gradient agree, its updated weights do not.
    let (c, t) = run(dir.path(), "b", &["--check-trace", g, "--set", "optimizer.lr=0.04"]);
    assert_eq!(c, Some(3), "{t}");
    assert!(t.contains("diverges at step 1: parameter layer1.0.weight differs"), "{t}");
    assert!(!t.contains("PASS trace"), "{t}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("b/summary.json")).unwrap()).unwrap();
    assert_eq!(s["steps"], 1, "the run stops at the divergence");

    // A loss off by one part in 1e7 at step 3: caught bitwise, accepted at tolerance 1e-5.
    let mut l = lines(&golden);
    let loss: f64 = l[2]["loss"].as_str().unwrap().parse().unwrap();
    l[2]["loss"] = (loss * (1.0 + 1e-7)).to_string().into();
    let edited = dir.path().join("edited.jsonl");
    let body: Vec<String> = l.iter().map(|v| v.to_string()).collect();
    std::fs::write(&edited, body.join("\n")).unwrap();
    let e = edited.to_str().unwrap();
    let (c, t) = run(dir.path(), "c", &["--check-trace", e]);
    assert_eq!(c, Some(3), "{t}");
    assert!(t.contains("diverges at step 3: loss is") && t.contains("every parameter digest matches"), "{t}");
    let (c, t) = run(
        dir.path(),
        "d",
        &["--check-trace", e, "--trace-tolerance", "1e-5", "--set", "expect.min_test_accuracy=0"],
    );
    assert_eq!(c, Some(0), "{t}");

    // A run longer than the trace, and a bad tolerance.
    let (c, t) = run(dir.path(), "e", &["--check-trace", g, "--set", "train.max_steps=6"]);
    assert_eq!(c, Some(3), "{t}");
    assert!(t.contains("step 6 is not in the trace"), "{t}");
    let (c, t) = run(dir.path(), "f", &["--check-trace", g, "--trace-tolerance=-1"]);
    assert_eq!(c, Some(2), "{t}");
    assert!(t.contains("--trace-tolerance") && t.contains("must be a number >= 0"), "{t}");
}

fn grad_norms(p: &Path) -> Vec<f32> {
    lines(p).iter().map(|l| l["grad_norm"].as_str().unwrap().parse().unwrap()).collect()
}

#[test]
fn trace_grad_norm_is_the_unscaled_norm_before_clipping_at_o0_and_o2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let trace = |name: &str, extra: &[&str]| -> std::path::PathBuf {
        let t = d.join(format!("{name}.jsonl"));
        let (c, out) = run(d, name, &[&["--record-trace", t.to_str().unwrap()], extra].concat());
        assert!(matches!(c, Some(0) | Some(3)), "{out}");
        t
    };
    let clip = |v: &str| ["--set".to_string(), format!("train.grad_clip_norm={v}")];
    let o2 = ["--set", "amp.opt_level=O2", "--set", "amp.init_scale=1024", "--set", "logging.every_steps=1"];

    // O0: a clip that never bites changes nothing, norms included (each step
    // reports its own gradients, not the previous step's).
    let plain = trace("o0", &[]);
    let loose = clip("1e9");
    let loose = trace("o0_loose", &loose.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(std::fs::read(&plain).unwrap(), std::fs::read(&loose).unwrap());

    // O2 at loss scale 1024, clipped hard to 0.01 or not at all: step 1's
    // gradients are the same, and so is its reported norm, which is the
    // unscaled one (O0's within f16 rounding) from before clipping.
    let o2_plain = trace("o2", &o2);
    let tight = clip("0.01");
    let o2_clip =
        trace("o2_clip", &[&o2[..], &tight.iter().map(String::as_str).collect::<Vec<_>>()].concat());
    let (n0, n2, n2c) = (grad_norms(&plain), grad_norms(&o2_plain), grad_norms(&o2_clip));
    assert_eq!(n2c[0].to_bits(), n2[0].to_bits(), "O2 step 1: {} clipped vs {} unclipped", n2c[0], n2[0]);
    assert!(n2c.iter().all(|&n| n > 0.01), "pre-clip norms: {n2c:?}");
    assert!((n2[0] - n0[0]).abs() <= 0.01 * n0[0], "O2 {} vs O0 {}: not the unscaled norm", n2[0], n0[0]);
    assert_eq!(lines(&o2_clip)[0]["loss_scale"], "1024");
    // metrics.jsonl and the trace report the same norm at every step.
    let m: Vec<f32> = std::fs::read_to_string(d.join("o2_clip/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| v["grad_norm"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(m, n2c);

    // A step skipped for overflow reports a non-finite norm and the scale it ran at.
    let huge = trace("o2_overflow", &["--set", "amp.opt_level=O2", "--set", "amp.init_scale=16777216"]);
    let l = lines(&huge);
    assert!(!grad_norms(&huge)[0].is_finite(), "{}", l[0]);
    assert_eq!(
        (l[0]["loss_scale"].as_str(), l[1]["loss_scale"].as_str()),
        (Some("16777216"), Some("8388608"))
    );
}
