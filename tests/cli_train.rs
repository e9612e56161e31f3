//! Training through the binary: the outputs a run writes, the `[expect]` gates,
//! and the shortened seed MNIST run CI relies on.

mod common;
use common::*;

fn read_json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn synthetic_run_writes_metrics_summary_and_weights() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut args =
        vec!["--config", cfg.to_str().unwrap(), "--set", &out_set, "--set", "logging.every_steps=2"];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    // Random labels cannot reach the seed config's 97% gate: exit 3 with a verdict.
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains("FAIL expect.min_test_accuracy: expected >= 0.9700"), "{t}");

    let s = read_json(&out.join("summary.json"));
    for key in [
        "final_loss",
        "test_accuracy",
        "images_per_s",
        "steps",
        "epochs",
        "wall_s",
        "opt_level",
        "world_size",
        "device",
    ] {
        assert!(s.get(key).is_some(), "summary.json lacks {key}: {s}");
    }
    assert_eq!(s["steps"], 4);
    assert_eq!(s["opt_level"], "O0");
    assert_eq!(s["world_size"], 1);
    assert_eq!(s["device"], "cpu");
    assert!(s["images_per_s"].as_f64().unwrap() > 0.0);

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let train: Vec<_> = lines.iter().filter(|l| l["kind"] == "train").collect();
    assert_eq!(train.iter().map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), vec![2, 4]);
    assert!(lines.iter().any(|l| l["kind"] == "eval" && l["test_accuracy"].is_number()));
    assert!(out.join("model.safetensors").exists());
}

#[test]
fn passing_gates_exit_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out_set = format!("run.out_dir={}", dir.path().join("out").display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut args = vec![
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        &out_set,
        "--set",
        "expect.min_test_accuracy=0.0",
        "--set",
        "expect.max_final_loss=100.0",
        "--set",
        "expect.max_overflow_steps=0",
    ];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("PASS expect.min_test_accuracy") && t.contains("PASS expect.max_final_loss"), "{t}");
    assert!(t.contains("PASS expect.max_overflow_steps: expected <= 0, got 0"), "{t}");
}

#[test]
fn missing_data_names_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let o = ddptrain(
        &["--config", cfg.to_str().unwrap(), "--set", &out_set, "--set", "data.path=no/such/dir"],
        dir.path(),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("no/such/dir") && t.contains("fetch-mnist.sh"), "{t}");
    assert!(!out.exists(), "nothing may be written when the data cannot be loaded");
}

/// The seed config, shortened to one epoch (and a 20-step warmup), on the real digits:
/// 95.9% here; the full 5 epochs reach 98.6%.
#[test]
fn seed_mnist_config_learns_in_one_epoch() {
    let data = mnist_dir();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let data_set = format!("data.path={}", data.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
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
    assert_eq!(s["epochs"], 1);
    assert_eq!(s["steps"], 80, "8000 digits at batch 100");
    println!(
        "one epoch of the seed config: test accuracy {}, {} images/s",
        s["test_accuracy"], s["images_per_s"]
    );
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error_and_auto_falls_back_with_one_warning() {
    // common::ddptrain hides every GPU from the child (CUDA_VISIBLE_DEVICES=""),
    // so this checks a machine without one wherever it runs.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut args = vec!["--config", cfg.to_str().unwrap(), "--set", &out_set, "--set", "run.device=cuda"];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("run.device = \"cuda\" but no CUDA device is visible"), "{t}");
    assert!(t.contains("set run.device = \"cpu\" or \"auto\""), "{t}");
    assert!(!out.join("summary.json").exists());

    args[5] = "run.device=auto";
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(t.matches("found no CUDA device").count(), 1, "one warning line:\n{t}");
    assert!(t.contains("training on the CPU"), "{t}");
    assert_eq!(read_json(&out.join("summary.json"))["device"], "cpu");
}

/// ResNet-20 without its ReLUs, 3 SGD steps on the CPU: Winograd F(6x6,
/// 3x3) against the direct kernels (`--direct-convs`) through the model,
/// its graph and its threads. With no ReLU, no element of the gradient
/// hangs on the sign of a value within rounding of zero, so the two runs
/// differ by rounding only: measured 1.7e-6 at most (a BatchNorm running
/// variance). With the ReLUs the same runs differ by 2e-2 (conv1's weight),
/// because a BatchNorm output a few ulps from zero passes its gradient in
/// one run and blocks it in the other (`ops::conv2d::set_winograd`).
#[test]
fn winograd_trains_a_relu_free_resnet20_as_the_direct_kernels_do() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/resnet20_fashion_o2.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    let model = model
        .replace("    { type = \"relu\", name = \"relu\" },\n", "")
        .replace("  { type = \"relu\", name = \"relu\" },\n", "")
        .replace("[[model.layers]]\ntype = \"relu\"\nname = \"relu\"\n\n", "");
    assert!(!model.contains("relu"), "a ReLU left in the model:\n{model}");
    let body = format!(
        "{model}\n[run]\nseed = 7\ndevice = \"cpu\"\n[data]\ndataset = \"synthetic\"\n\
         synthetic_train_size = 12\nsynthetic_test_size = 4\nbatch_size = 4\n\
         [optimizer]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.9\n[amp]\nopt_level = \"O0\"\n\
         [train]\nmax_steps = 3\n[logging]\nprogress = \"never\"\ntensorboard = false\n"
    );
    let cfg = write(dir.path(), "r20.toml", &body);
    let run = |name: &str, flags: &[&str]| {
        let out = dir.path().join(name);
        let out_set = format!("run.out_dir={}", out.display());
        let mut args = vec!["--config", cfg.to_str().unwrap(), "--set", &out_set];
        args.extend_from_slice(flags);
        let o = ddptrain(&args, dir.path());
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        ddptrain::checkpoint::load_safetensors(&out.join("model.safetensors")).unwrap()
    };
    let (winograd, direct) = (run("winograd", &[]), run("direct", &["--direct-convs"]));
    let d = max_rel_diff(&winograd, &direct);
    println!("ResNet-20 without ReLUs, Winograd vs direct convs after 3 steps: max |dw| {d:e}");
    assert!(d < 1e-5, "{d:e}");
}

/// nanoGPT's parameter groups leave the 1-D parameters undecayed; the
/// device's optimizer keeps them too (its numerics against the CPU's are
/// src/optim/tests_cuda.rs's and the GPT run's in src/train/cuda/tests_gpt.rs).
#[test]
fn parameter_groups_train_on_the_gpu() {
    let test = "parameter_groups_train_on_the_gpu";
    if ddptrain::cuda::test_gpu(test).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = repo_root().join("configs/mnist_o0.toml").display().to_string();
    // The config's SGD with weight decay 5e-4: groups apply to every
    // optimizer. Four steps on random digits: the accuracy gate is not the point.
    let sets = ["run.device=cuda", "optimizer.weight_decay_min_dim=2", "expect.min_test_accuracy=0.0"];
    let mut args: Vec<&str> = vec!["--config", &cfg];
    args.extend(sets.iter().flat_map(|s| ["--set", s]));
    args.extend_from_slice(SYNTH);
    // Unlike `ddptrain()`, the device stays visible.
    let o = std::process::Command::new(ddptrain_bin()).args(&args).current_dir(dir.path()).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("device cuda:"), "{t}");
}
