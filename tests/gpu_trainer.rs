//! The GPU trainer as a user sees it, against the CPU trainer: exact resume
//! from a mid-epoch checkpoint, checkpoints that cross devices, bitwise
//! determinism of the recorded trace, the same log lines, metrics and
//! summary, an injected overflow skipping the same step, and the accuracy
//! gates. On the emulated device in CI (scripts/emulated-gpu.sh), on a GPU
//! through scripts/gpu-check.sh; skipped without either (a failure under
//! `CI=true`).

mod common;
use common::resume::*;
use common::*;
use ddptrain::train::{self, RunOptions};
use std::path::Path;
use std::process::{Command, Output};

/// Trains `config` (a path under the repo) on the device and the fetched
/// MNIST digits with the extra `--set`s; checks it exits 0 and returns its
/// output and summary.json.
fn run_on_the_real_digits(config: &str, extra: &[&str]) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut sets = vec![
        format!("run.out_dir={}", out.display()),
        format!("data.path={}", mnist_dir().display()),
        "run.device=cuda".to_string(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let cfg = repo_root().join(config);
    let mut args = vec!["--config", cfg.to_str().unwrap()];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let o = ddptrain_env(&args, dir.path(), &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let s = serde_json::from_slice(&read(&out.join("summary.json"))).unwrap();
    (t, s)
}

fn has_gpu(test: &str) -> bool {
    ddptrain::cuda::test_gpu(test).is_some()
}

/// Crashes at step 13 (the last checkpoint is step 10, batch 2 of epoch 1),
/// resumes on the same device and compares with the uninterrupted run.
fn resume_is_bitwise(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&cfg(&a, "cuda", extra)).unwrap();
    assert!(straight.device.starts_with("cuda:"), "{}", straight.device);
    let cb = cfg(&b, "cuda", extra);
    halted(&cb, 13);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["batches_in_epoch"].as_u64()), (Some(10), Some(2)));
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000010").as_path()));
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits(), "final loss");
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
    assert_eq!((resumed.loss_scale, resumed.overflow_steps), (straight.loss_scale, straight.overflow_steps));
    assert_same_run(&a, &b);
}

#[test]
fn gpu_mid_epoch_resume_is_bitwise() {
    if has_gpu("gpu_mid_epoch_resume_is_bitwise") {
        resume_is_bitwise(&[]);
    }
}

#[test]
fn gpu_mid_epoch_resume_with_random_crop_and_flip_is_bitwise() {
    if has_gpu("gpu_mid_epoch_resume_with_random_crop_and_flip_is_bitwise") {
        resume_is_bitwise(&[
            "data.random_crop.size=28",
            "data.random_crop.padding=4",
            "data.random_horizontal_flip=0.5",
        ]);
    }
}

#[test]
fn gpu_o2_resume_with_the_dynamic_scaler_moving_across_it_is_bitwise() {
    if has_gpu("gpu_o2_resume_with_the_dynamic_scaler_moving_across_it_is_bitwise") {
        // Steps 1-8 overflow (2^24 -> 2^16), then the scale grows every 3 clean steps.
        resume_is_bitwise(&["amp.opt_level=O2", "amp.init_scale=16777216", "amp.growth_interval=3"]);
    }
}

/// The catsdogs ResNet-20 (O2, three-channel crops with 4 pixels of padding,
/// flips) on the device, crashed at step 5 and resumed from step 3, mid-epoch:
/// the straight run bit for bit. Opt-in on the emulated device, where a
/// ResNet-20 step costs seconds whatever the batch (these 14 steps: 43 s
/// measured, 147 s beside another emulated run); the CPU's twin
/// (tests/checkpoint_resume.rs) and the gather kernel's parity with the
/// augmenting loader (`data::tests_cuda`) run in CI.
#[test]
#[ignore = "14 ResNet-20 steps on the emulated device take minutes; run with --ignored"]
fn resnet20_catsdogs_gpu_mid_epoch_resume_with_its_augmentation_is_bitwise() {
    if !has_gpu("resnet20_catsdogs_gpu_mid_epoch_resume_with_its_augmentation_is_bitwise") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&catsdogs(&a, "cuda", &[])).unwrap();
    assert!(straight.device.starts_with("cuda:"), "{}", straight.device);
    let cb = catsdogs(&b, "cuda", &[]);
    halted(&cb, 5);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000003").as_path()));
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits(), "final loss");
    assert_same_run(&a, &b);
}

/// Final weights by name, widened to f32.
fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    let mut w: Vec<(String, Vec<f32>)> = ddptrain::checkpoint::load_safetensors(path)
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.value {
            ddptrain::nn::StateValue::F32(v) => Some((e.name, v)),
            _ => None,
        })
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// max over tensors of max|a - b| / max|b| (each tensor against its own scale).
fn max_rel_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            let scale = vb.iter().fold(0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
            va.iter().zip(vb).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
        })
        .fold(0f32, f32::max)
}

#[test]
fn checkpoints_cross_between_the_gpu_and_the_cpu() {
    if !has_gpu("checkpoints_cross_between_the_gpu_and_the_cpu") {
        return;
    }
    // The seed ConvNet with average pooling in place of max pooling: a
    // max-pool window whose two largest inputs lie within rounding of each
    // other takes its argmax from the last bit, which the two devices need
    // not share, and the gradient then goes to another pixel.
    let dir = tempfile::tempdir().unwrap();
    let seed_convnet = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    assert_eq!(seed_convnet.matches("type = \"maxpool2d\"").count(), 2, "the seed ConvNet's pools moved");
    let avg = dir.path().join("mnist_avgpool.toml");
    std::fs::write(&avg, seed_convnet.replace("type = \"maxpool2d\"", "type = \"avgpool2d\"")).unwrap();
    let cfg = |out: &Path, device: &str| cfg_of(&avg, out, device, &[]);
    let straight = |device: &str| weights(&dir.path().join(format!("{device}_straight/model.safetensors")));
    for device in ["cuda", "cpu"] {
        train::train(&cfg(&dir.path().join(format!("{device}_straight")), device)).unwrap();
    }
    // The devices round differently, and SGD with momentum on 50-image
    // batches may amplify that: the straight runs have parted by 1.7e-3 to
    // 7.2e-3 after 20 steps (seeds 1, 2, 3, 42), a run crossing at step 10
    // by 9e-7 to 2.1e-4 from its first device's (a crossed run has only its
    // last ten steps to part in); on another machine (its OpenBLAS under the
    // emulated cuBLAS) the straight runs parted by 1.6e-5 and the crossed
    // one by as much, the rounding noise of the last steps. A resume that
    // lost state (a step, the momentum, the data order, the schedule)
    // starts those steps elsewhere, far above that noise.
    let between_devices = max_rel_diff(&straight("cpu"), &straight("cuda"));
    println!("the straight runs part by {between_devices:.3e}");
    let bound = (between_devices / 4.0).clamp(1e-4, 1e-3);
    for (first, then) in [("cuda", "cpu"), ("cpu", "cuda")] {
        let out = dir.path().join(format!("{first}_then_{then}"));
        halted(&cfg(&out, first), 13);
        let resumed = train::train(&cfg(&out, then)).unwrap();
        assert_eq!(resumed.resumed_from.as_deref(), Some(out.join("ckpt/step_00000010").as_path()));
        assert_eq!(resumed.steps, 20);
        let d = max_rel_diff(&weights(&out.join("model.safetensors")), &straight(first));
        println!("{first} then {then}: max relative weight difference to the {first} run {d:.3e}");
        assert!(
            d < bound,
            "{first} then {then}: weights differ from the {first} run by {d:e} (relative), more than \
             {bound:e}, a quarter of the straight runs' difference (at least 1e-4)"
        );
    }
}

/// Four runs, each O0/O2 pair recorded twice. Opt-in on the emulated
/// device (about a minute and a half of CPU, and CI's time is spent): there
/// the stream-order race checker of tests/gpu_sync.rs is what holds the
/// kernels to one order; on a GPU, whose scheduling could vary,
/// scripts/gpu-check.sh runs it.
#[test]
#[ignore = "four emulated runs; scripts/gpu-check.sh runs it on a GPU; run with --ignored"]
fn two_gpu_runs_record_byte_identical_traces() {
    if !has_gpu("two_gpu_runs_record_byte_identical_traces") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut traces = Vec::new();
    for (k, level) in ["O0", "O2", "O0", "O2"].iter().enumerate() {
        let out = dir.path().join(format!("run{k}"));
        let level = format!("amp.opt_level={level}");
        let c = cfg(&out, "cuda", &[&level, "train.grad_accum_steps=2", "train.max_steps=8"]);
        std::fs::create_dir_all(&out).unwrap();
        let trace = out.join("trace.jsonl");
        let opts = RunOptions { record_trace: Some(trace.clone()), ..Default::default() };
        train::train_with(&c, &opts).unwrap();
        traces.push(read(&trace));
    }
    assert_eq!(String::from_utf8_lossy(&traces[0]).lines().count(), 8);
    assert!(traces[0] == traces[2], "two O0 runs recorded different traces");
    assert!(traces[1] == traces[3], "two O2 runs recorded different traces");
}

/// `ddptrain` with the GPUs visible (the common helper hides them).
fn ddptrain_env(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(ddptrain_bin());
    c.args(args).current_dir(cwd).env_remove("WORLD_SIZE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("cannot run the ddptrain binary")
}

/// A run of the seed O2 ConvNet through the CLI on `device`: its output, and
/// its out dir.
fn cli_run(device: &str, dir: &Path, env: &[(&str, &str)]) -> (String, std::path::PathBuf) {
    let out = dir.join(device);
    let cfg = repo_root().join("configs/mnist_o2.toml");
    let sets = [
        format!("run.device={device}"),
        format!("run.out_dir={}", out.display()),
        "data.dataset=synthetic".into(),
        "data.synthetic_train_size=400".into(),
        "data.synthetic_test_size=100".into(),
        "data.batch_size=50".into(),
        "train.max_steps=12".into(),
        "logging.every_steps=2".into(),
        "logging.progress=never".into(),
        "logging.tensorboard=true".into(),
        "checkpoint.every_steps=5".into(),
        // 12 steps do not learn the digits: the gate's line is still printed.
        "expect.min_test_accuracy=0.0".into(),
    ];
    let mut args = vec!["--config", cfg.to_str().unwrap()];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let o = ddptrain_env(&args, dir, env);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{device}: {t}");
    (t, out)
}

/// The log with what differs by design masked: the device's name, speeds,
/// and the parameters the CPU names in an overflow message (the device keeps
/// one flag per step).
fn masked(log: &str) -> Vec<String> {
    log.lines()
        .map(|l| {
            let l = match (l.find(" | device "), l.find(" | opt_level")) {
                (Some(a), Some(b)) if a < b => format!("{}{}", &l[..a], &l[b..]),
                _ => l.to_string(),
            };
            let l = match (l.find(", first in "), l.find("; step skipped")) {
                (Some(a), Some(b)) if a < b => format!("{}{}", &l[..a], &l[b..]),
                _ => l,
            };
            // The final line names the run's out dir.
            let l = match l.find("; wrote ") {
                Some(i) => l[..i].to_string(),
                None => l,
            };
            match l.rfind(" | ") {
                Some(i) if l.ends_with(" images/s") => l[..i].to_string(),
                _ => l,
            }
        })
        .filter(|l| !l.starts_with("wrote ") && !l.contains("checkpoint"))
        .collect()
}

/// `line` with every number (digits, with their point) as one `#`.
fn mask_numbers(line: &str) -> String {
    let mut out = String::new();
    for c in line.chars() {
        let numeric = c.is_ascii_digit() || (c == '.' && out.ends_with('#'));
        if !numeric {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// Numbers within `rel` (relative), everything else exactly.
fn assert_close_json(a: &serde_json::Value, b: &serde_json::Value, rel: f64, at: &str) {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= rel * y.abs().max(1.0), "{at}: {x} vs {y}");
        }
        (V::Object(x), V::Object(y)) => {
            let (kx, ky): (Vec<_>, Vec<_>) = (x.keys().collect(), y.keys().collect());
            assert_eq!(kx, ky, "{at}: fields");
            for (k, v) in x {
                assert_close_json(v, &y[k], rel, &format!("{at}.{k}"));
            }
        }
        // The checkpoint writes exact floats as strings.
        (V::String(x), V::String(y)) => match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() => {
                assert!((x - y).abs() <= rel * y.abs().max(1.0), "{at}: {x} vs {y}")
            }
            _ => assert_eq!(a, b, "{at}"),
        },
        (V::Array(x), V::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: length");
            for (k, (x, y)) in x.iter().zip(y).enumerate() {
                assert_close_json(x, y, rel, &format!("{at}[{k}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// The user's promise: the GPU run prints the CPU run's lines and writes the
/// same metrics, checkpoints, TensorBoard events and summary; and an
/// injected overflow (DDPTRAIN_INJECT_GRAD_INF) skips the same step.
#[test]
fn the_gpu_run_logs_and_writes_what_the_cpu_run_does() {
    if !has_gpu("the_gpu_run_logs_and_writes_what_the_cpu_run_does") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let inject = [("DDPTRAIN_INJECT_GRAD_INF", "0:7")];
    let (cpu_log, cpu) = cli_run("cpu", dir.path(), &[HIDE_GPUS, inject[0]]);
    let (gpu_log, gpu) = cli_run("cuda", dir.path(), &inject);
    assert!(gpu_log.contains("cuemu") || !cpu_log.contains("cuemu"), "{gpu_log}");
    let skip = "step 7: gradient overflow (inf/NaN) at loss scale 65536; step skipped, loss scale -> 32768";
    for (log, device) in [(&cpu_log, "cpu"), (&gpu_log, "cuda")] {
        assert!(masked(log).iter().any(|l| l == skip), "{device} did not skip step 7:\n{log}");
    }
    // The same lines; their numbers (O2's f16 activations agree to about
    // 1e-3, timings not at all) are compared through the metrics below.
    let numbers_masked = |log: &str| -> Vec<String> { masked(log).iter().map(|l| mask_numbers(l)).collect() };
    assert_eq!(
        numbers_masked(&gpu_log),
        numbers_masked(&cpu_log),
        "GPU log:\n{gpu_log}\nCPU log:\n{cpu_log}"
    );

    let (mc, mg) = (metrics_without_checkpoints(&cpu), metrics_without_checkpoints(&gpu));
    assert_eq!(mc.len(), mg.len(), "metrics records");
    for (k, (g, c)) in mg.iter().zip(&mc).enumerate() {
        assert_close_json(g, c, 2e-2, &format!("metrics.jsonl line {k}"));
    }
    let summary = |out: &Path| -> serde_json::Value {
        let mut s: serde_json::Value = serde_json::from_slice(&read(&out.join("summary.json"))).unwrap();
        let o = s.as_object_mut().unwrap();
        for volatile in ["wall_s", "images_per_s", "device", "weights", "checkpoints", "resumed_from"] {
            o.remove(volatile);
        }
        s
    };
    assert_close_json(&summary(&gpu), &summary(&cpu), 2e-2, "summary.json");
    assert_eq!(summary(&gpu)["overflow_steps"], 1);
    let listing = |out: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(out.join("ckpt"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(listing(&gpu), listing(&cpu), "checkpoints");
    let (_, _, mut sc) = final_state(&cpu);
    let (_, _, mut sg) = final_state(&gpu);
    for s in [&mut sc, &mut sg] {
        // Digests of the weights' bytes, which agree only to f16 tolerance.
        s.as_object_mut().unwrap().remove("files");
    }
    assert_close_json(&sg, &sc, 2e-2, "state.json");
    let tb = |out: &Path| std::fs::read_dir(out.join("tb")).unwrap().count();
    assert!(tb(&gpu) > 0 && tb(&gpu) == tb(&cpu), "TensorBoard event files");
}

/// configs/ci_smoke.toml on the device, as CI runs it on the CPU: 200 steps
/// of the real digits that must pass its accuracy and loss gates. Opt-in:
/// about five minutes on the emulated device, where the step-by-step
/// parity tests (tests/ddp_cuda.rs, `nn::cuda` in the library) already
/// hold the device to the CPU trainer that CI gates on the same config.
#[test]
#[ignore = "200 steps of the real digits on the emulated device take minutes; run with --ignored"]
fn ci_smoke_on_the_gpu_passes_its_gates() {
    if !has_gpu("ci_smoke_on_the_gpu_passes_its_gates") {
        return;
    }
    let (t, s) = run_on_the_real_digits("configs/ci_smoke.toml", &[]);
    assert!(t.contains("PASS expect.min_test_accuracy") && t.contains("PASS expect.max_final_loss"), "{t}");
    assert!(s["device"].as_str().unwrap().starts_with("cuda:"), "{s}");
    assert_eq!(s["steps"], 200);
    println!("ci_smoke on the GPU: test accuracy {}, {}s", s["test_accuracy"], s["wall_s"]);
}

/// The accuracy figure: configs/mnist_o2.toml, 5 epochs, >= 97% (its
/// own [expect] gate) on the device.
#[test]
#[ignore = "5 epochs of MNIST on the emulated device take minutes; run with --ignored"]
fn mnist_o2_on_the_gpu_reaches_97_percent() {
    if !has_gpu("mnist_o2_on_the_gpu_reaches_97_percent") {
        return;
    }
    let (t, s) = run_on_the_real_digits("configs/mnist_o2.toml", &["logging.progress=never"]);
    assert!(t.contains("PASS expect.min_test_accuracy"), "{t}");
    assert_eq!(s["epochs"], 5);
    println!("mnist_o2 on the GPU: test accuracy {}, {}s", s["test_accuracy"], s["wall_s"]);
}

/// configs/resnet_mnist_o2.toml (the residual graph) for its 5 epochs on
/// the device. Its 98% gate is the CPU trainer's (98.50-98.75% there over
/// four seeds); O2 on the device rounds in other places and takes another
/// path to the end (98.10% on the emulated device, 53 minutes, with the
/// config's earlier lr 0.05 without Nesterov), so this holds it to 97.5%.
#[test]
#[ignore = "5 epochs of the ResNet on the emulated device take about an hour; run with --ignored"]
fn resnet_mnist_o2_on_the_gpu_reaches_97_5_percent() {
    if !has_gpu("resnet_mnist_o2_on_the_gpu_reaches_97_5_percent") {
        return;
    }
    let sets = ["logging.progress=never", "expect.min_test_accuracy=0.975"];
    let (t, s) = run_on_the_real_digits("configs/resnet_mnist_o2.toml", &sets);
    assert!(t.contains("PASS expect.min_test_accuracy"), "{t}");
    assert_eq!(s["epochs"], 5);
    println!("resnet_mnist_o2 on the GPU: test accuracy {}, {}s", s["test_accuracy"], s["wall_s"]);
}

/// What makes two runs on a GPU give the same bits: no kernel reduces with
/// atomics (whose order the hardware picks); every sum is a fixed tree of
/// strided partials, shuffles and shared memory. Reads the sources, so it
/// runs without a device.
#[test]
fn no_kernel_uses_atomics() {
    let mut seen = 0;
    for e in std::fs::read_dir(repo_root().join("kernels")).unwrap() {
        let path = e.unwrap().path();
        if !matches!(path.extension().and_then(|x| x.to_str()), Some("cu" | "cuh")) {
            continue;
        }
        seen += 1;
        let src = String::from_utf8(read(&path)).unwrap();
        for (k, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let calls_atomic = code.match_indices("atomic").any(|(i, _)| {
                let rest = &code[i + "atomic".len()..];
                let name: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                rest[name.len()..].trim_start().starts_with('(')
            });
            assert!(
                !calls_atomic,
                "{}:{}: an atomic makes the reduction order the hardware's: {line}",
                path.display(),
                k + 1
            );
        }
    }
    assert!(seen >= 10, "only {seen} kernel sources in kernels/");
}
