//! DDP through the real binary and launcher on loopback: W processes with the
//! same global batch train the same model as one process (O0: max |dw| < 1e-5),
//! with SyncBatchNorm, without BatchNorm, and with gradient accumulation; under
//! apex O2 (f16 gradients) too, within f16 rounding; and an overflow on one rank
//! makes every rank skip the same step.

mod common;
use common::*;
use std::path::Path;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

const NO_BN_MODEL: &str = r#"
[model]
input_shape = [1, 28, 28]
[[model.layers]]
type = "sequential"
name = "layer1"
layers = [
  { type = "conv2d", out_channels = 8, kernel_size = 5, padding = 2 },
  { type = "relu" },
  { type = "maxpool2d", kernel_size = 2 },
]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "linear"
name = "fc"
out_features = 10
"#;

const COMMON: &str = r#"
[run]
seed = 7
[data]
dataset = "synthetic"
synthetic_train_size = 1200
synthetic_test_size = 200
batch_size = 120
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
weight_decay = 5e-4
[train]
max_steps = 6
[logging]
progress = "never"
every_steps = 3
tensorboard = false
"#;

/// Each run's own out_dir, by its world, batch and extra settings: a run
/// into another's is refused.
fn out_dir(dir: &Path, world: usize, batch: usize, extra: &[&str]) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    extra.hash(&mut h);
    dir.join(format!("out_w{world}_b{batch}_{:016x}", h.finish()))
}

/// Trains `config` on `world` processes (through `ddptrain launch` when > 1)
/// with per-rank `batch`, returning the final weights rank 0 wrote.
fn run(
    dir: &Path,
    config: &Path,
    world: usize,
    batch: usize,
    extra: &[&str],
) -> Vec<ddptrain::nn::StateEntry> {
    let out = out_dir(dir, world, batch, extra);
    let mut args: Vec<String> = Vec::new();
    if world > 1 {
        args.extend(
            [
                "launch",
                "--nproc-per-node",
                &world.to_string(),
                "--master-port",
                &free_port().to_string(),
                "--",
            ]
            .map(String::from),
        );
    }
    args.extend(["--config".into(), config.display().to_string()]);
    for s in [format!("run.out_dir={}", out.display()), format!("data.batch_size={batch}")]
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
    {
        args.extend(["--set".into(), s]);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = ddptrain(&argv, dir);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "world {world}:\n{t}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["world_size"], world, "{summary}");
    ddptrain::checkpoint::load_safetensors(&out.join("model.safetensors")).unwrap()
}

#[test]
fn two_and_three_ranks_with_sync_batchnorm_equal_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    // The seed ConvNet's model section with this test's data and optimizer.
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    let cfg =
        write(dir.path(), "sync.toml", &format!("{model}\n{COMMON}\n[parallel]\nsync_batchnorm = true\n"));
    // Random labels make this training chaotic: rounding-level differences (1e-8
    // after one step) grow past 1e-4 by step 6, so compare after 3 steps.
    let steps = ["train.max_steps=3"];
    let one = run(dir.path(), &cfg, 1, 120, &steps);
    let two = run(dir.path(), &cfg, 2, 60, &steps);
    let three = run(dir.path(), &cfg, 3, 40, &steps);
    let (d2, d3) = (max_abs_diff(&one, &two), max_abs_diff(&one, &three));
    println!("max |dw| vs one rank: two ranks {d2:.3e}, three ranks {d3:.3e}");
    assert!(d2 < 1e-5 && d3 < 1e-5, "two ranks {d2:e}, three ranks {d3:e}");
}

/// The residual graph of configs/resnet_mnist_o2.toml at O0 on the CPU: a
/// value read by two nodes, gradients summed at the fan-out, buckets
/// reduced while backward runs through both branches. One step: the two
/// runs part at rounding level in the stem and layer2.0.conv1 (one rank
/// runs BatchNorm + ReLU + MaxPool fused, two run SyncBatchNorm's sums),
/// 3.9e-6 after one step and 1.2e-5 after three, measured.
#[test]
fn the_resnet_on_two_ranks_with_sync_batchnorm_equals_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/resnet_mnist_o2.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    let cfg =
        write(dir.path(), "resnet.toml", &format!("{model}\n{COMMON}\n[parallel]\nsync_batchnorm = true\n"));
    let steps = ["train.max_steps=1", "parallel.bucket_cap_mb=0.05", "parallel.first_bucket_mb=0.01"];
    let one = run(dir.path(), &cfg, 1, 120, &steps);
    let two = run(dir.path(), &cfg, 2, 60, &steps);
    // Relative: the running variances here are in the tens to hundreds.
    let (d2, abs) = (max_rel_diff(&one, &two), max_abs_diff(&one, &two));
    println!("ResNet, vs one rank: two ranks max |dw| / max(1, |w|) {d2:.3e} (absolute {abs:.3e})");
    assert!(d2 < 1e-5, "two ranks {d2:e} relative");
}

#[test]
fn without_batchnorm_two_ranks_and_gradient_accumulation_equal_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "nobn.toml", &format!("{NO_BN_MODEL}\n{COMMON}"));
    let one = run(dir.path(), &cfg, 1, 120, &[]);
    let two = run(dir.path(), &cfg, 2, 60, &[]);
    // 2 ranks x 2 micro-batches of 30: the first micro-step skips the all-reduce.
    let accum = run(dir.path(), &cfg, 2, 30, &["train.grad_accum_steps=2"]);
    // Small buckets: many all-reduces overlapping backward must give the same result.
    let small =
        run(dir.path(), &cfg, 2, 60, &["parallel.bucket_cap_mb=0.001", "parallel.first_bucket_mb=0.0001"]);
    let (d2, da, ds) = (max_abs_diff(&one, &two), max_abs_diff(&one, &accum), max_abs_diff(&one, &small));
    println!("max |dw| vs one rank: two ranks {d2:.3e}, accumulation {da:.3e}, small buckets {ds:.3e}");
    assert!(d2 < 1e-5 && da < 1e-5 && ds < 1e-5, "{d2:e} {da:e} {ds:e}");
}

#[test]
fn batchnorm_buffers_follow_rank_zero_and_evaluation_counts_every_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    let cfg = write(dir.path(), "bn.toml", &format!("{model}\n{COMMON}"));
    let out = out_dir(dir.path(), 2, 60, &[]);
    run(dir.path(), &cfg, 2, 60, &[]);
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let eval: serde_json::Value = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["kind"] == "eval")
        .unwrap();
    // Each rank scored its shard (100 of the 200 test samples); the sum covers each once.
    assert_eq!(eval["total"], 200, "{eval}");
    let acc = eval["test_accuracy"].as_f64().unwrap();
    assert_eq!(acc, eval["correct"].as_f64().unwrap() / 200.0);
}

#[test]
fn an_uneven_last_batch_with_sync_batchnorm_equals_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
    let model = &seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()];
    let cfg =
        write(dir.path(), "uneven.toml", &format!("{model}\n{COMMON}\n[parallel]\nsync_batchnorm = true\n"));
    // 190 samples: step 1 is a full global batch of 120, step 2 the remaining 70
    // (35 per rank), which no batch size divides evenly.
    let extra = ["data.synthetic_train_size=190", "train.max_steps=2"];
    let one = run(dir.path(), &cfg, 1, 120, &extra);
    let two = run(dir.path(), &cfg, 2, 60, &extra);
    let d = max_abs_diff(&one, &two);
    println!("uneven last batch: max |dw| vs one rank {d:.3e}");
    assert!(d < 1e-5, "{d:e}");
}

/// The seed ConvNet under O2 (f16 conv/linear gradients, f32 BatchNorm
/// gradients: the reducer has buckets of both dtypes), or the BatchNorm-free
/// model, whose two-rank run can equal a one-rank run without SyncBatchNorm.
fn o2_config(dir: &Path, batchnorm: bool) -> std::path::PathBuf {
    let model = if batchnorm {
        let seed = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap();
        seed[seed.find("[model]").unwrap()..seed.find("[data]").unwrap()].to_string()
    } else {
        NO_BN_MODEL.to_string()
    };
    write(dir, "o2.toml", &format!("{model}\n{COMMON}\n[amp]\nopt_level = \"O2\"\n"))
}

/// The summary of [`run`]'s run with these arguments.
fn summary(dir: &Path, world: usize, batch: usize, extra: &[&str]) -> serde_json::Value {
    let p = out_dir(dir, world, batch, extra).join("summary.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn o2_two_and_three_ranks_reducing_in_f16_or_fp32_match_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = o2_config(dir.path(), false);
    let steps = ["train.max_steps=3"];
    let c = ddptrain::config::load(&cfg, &[]).unwrap();
    let init =
        ddptrain::nn::Model::new(&c.resolve_model().unwrap(), c.run.seed).unwrap().state_dict().unwrap();
    let one = run(dir.path(), &cfg, 1, 120, &steps);
    let s1 = summary(dir.path(), 1, 120, &steps);
    // How far training moved the weights: the scale f16 rounding errors are relative to.
    let moved = max_abs_diff(&init, &one);
    let d = |world: usize, extra: &[&str]| {
        let all: Vec<&str> = steps.iter().chain(extra).copied().collect();
        let batch = 120 / world;
        let other = run(dir.path(), &cfg, world, batch, &all);
        let s = summary(dir.path(), world, batch, &all);
        assert_eq!(
            (&s["overflow_steps"], &s["loss_scale"]),
            (&s1["overflow_steps"], &s1["loss_scale"]),
            "{s}"
        );
        max_abs_diff(&one, &other)
    };
    let r = [
        ("2 ranks f16", d(2, &[])),
        ("2 ranks fp32", d(2, &["parallel.allreduce_fp32=true"])),
        ("2 ranks predivide 2", d(2, &["parallel.gradient_predivide_factor=2"])),
        ("3 ranks f16", d(3, &[])),
        ("3 ranks fp32", d(3, &["parallel.allreduce_fp32=true"])),
        ("3 ranks predivide 3", d(3, &["parallel.gradient_predivide_factor=3"])),
    ];
    println!("O2: weights moved up to {moved:.3e}; max |dw| vs one rank: {r:?}");
    // Tolerance: f16 has a unit roundoff u = 2^-11. A step's gradient differs
    // from one rank's by at most ~4 roundings of u relative (each run's local
    // f16 gradient, the f16 sum's hops, the post-scale), so two runs' weights
    // differ by about 8u of how far they moved over these few steps. A wrong
    // average (a missing 1/world, a dropped bucket) is off by the order of `moved`.
    // Measured: 2 ranks 4.2e-5 (the same in all three modes: with two addends
    // f16 and f32 sums round alike and /2 is exact), 3 ranks 4.6e-5 to 4.8e-5,
    // moved 3.1e-2; bound 1.2e-4.
    let tol = 8.0 * 2f32.powi(-11) * moved;
    for (what, dw) in r {
        assert!(dw < tol, "{what}: {dw:e} > {tol:e} (weights moved {moved:e})");
    }
}

/// Runs `ddptrain` (through `launch` when `world` > 1) with `config`, the
/// `--set`s and one extra environment variable; returns its output after
/// checking it succeeded.
fn run_env(dir: &Path, config: &Path, world: usize, sets: &[&str], env: (&str, &str)) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ddptrain"));
    cmd.env(common::HIDE_GPUS.0, common::HIDE_GPUS.1);
    if world > 1 {
        let port = free_port().to_string();
        cmd.args(["launch", "--nproc-per-node", &world.to_string(), "--master-port", &port, "--"]);
    }
    cmd.arg("--config").arg(config);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let o = cmd.current_dir(dir).env_remove("WORLD_SIZE").env(env.0, env.1).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    t
}

/// The part of each rank's "final state" line after the rank, in rank order.
fn final_states(t: &str, world: usize) -> Vec<String> {
    let finals: Vec<String> = (0..world)
        .map(|r| {
            let l = t.lines().find(|l| l.starts_with(&format!("[rank {r}] rank {r}: final state sha256")));
            l.unwrap_or_else(|| panic!("no final state from rank {r}:\n{t}"))
                .split_once(": final state")
                .unwrap()
                .1
                .to_string()
        })
        .collect();
    assert!(finals.iter().all(|f| *f == finals[0]), "replicas differ:\n{t}");
    finals
}

#[test]
fn an_overflow_on_one_rank_skips_the_same_step_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = o2_config(dir.path(), true);
    let out = dir.path().join("inject");
    let sets = [&format!("run.out_dir={}", out.display()) as &str, "data.batch_size=60", "train.max_steps=4"];
    // Only rank 1 overflows, at its second step.
    let t = run_env(dir.path(), &cfg, 2, &sets, ("DDPTRAIN_INJECT_GRAD_INF", "1:2"));
    let skips: Vec<&str> = t.lines().filter(|l| l.contains("gradient overflow")).collect();
    assert_eq!(skips.len(), 2, "one skip per rank:\n{t}");
    for r in 0..2 {
        assert!(
            skips.iter().any(|l| l.starts_with(&format!("[rank {r}] step 2: gradient overflow"))
                && l.ends_with("step skipped, loss scale -> 32768")),
            "rank {r} did not skip step 2:\n{t}"
        );
    }
    let finals = final_states(&t, 2);
    assert!(finals[0].ends_with("| loss scale 32768 | overflow steps 1"), "{t}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!((s["overflow_steps"].as_u64(), s["loss_scale"].as_f64()), (Some(1), Some(32768.0)), "{s}");
    // The hook names a rank: here no rank is 1, and a single process injects at 0:2.
    // (Two steps: this chaotic run overflows by itself at step 3.)
    let one = |r: usize| format!("run.out_dir={}", dir.path().join(format!("one_inject_{r}")).display());
    let (one1, one0) = (one(1), one(0));
    let t = run_env(dir.path(), &cfg, 1, &[&one1, "train.max_steps=2"], ("DDPTRAIN_INJECT_GRAD_INF", "1:2"));
    assert!(!t.contains("gradient overflow"), "{t}");
    let t = run_env(dir.path(), &cfg, 1, &[&one0, "train.max_steps=2"], ("DDPTRAIN_INJECT_GRAD_INF", "0:2"));
    let skips: Vec<&str> = t.lines().filter(|l| l.contains("gradient overflow")).collect();
    assert!(skips.len() == 1 && skips[0].starts_with("step 2: gradient overflow"), "{t}");
}

#[test]
fn o3_two_ranks_keep_f16_batchnorm_buffers_in_step() {
    // O3 keeps BatchNorm in f16 too: its running statistics are broadcast from
    // rank 0 as f16 and every bucket is f16.
    let dir = tempfile::tempdir().unwrap();
    let cfg = o2_config(dir.path(), true);
    let sets = ["amp.opt_level=O3", "data.batch_size=60", "train.max_steps=3"];
    let t = run_env(dir.path(), &cfg, 2, &sets, ("DDPTRAIN_UNUSED", ""));
    final_states(&t, 2);
}

#[test]
fn o2_sync_batchnorm_on_two_ranks_matches_one_rank() {
    // O2 casts activations to f16 and keeps BatchNorm in f32: SyncBatchNorm
    // widens x and dy, reduces its statistics in f32 and rounds its output to f16.
    // Predividing by the world size (PyTorch DDP's own order) keeps the f16 sum
    // of two loss-scaled gradients from overflowing where one rank's mean does
    // not; with apex's default factor 1 the two runs skip different steps.
    let dir = tempfile::tempdir().unwrap();
    let cfg = o2_config(dir.path(), true);
    let c = ddptrain::config::load(&cfg, &[]).unwrap();
    let init =
        ddptrain::nn::Model::new(&c.resolve_model().unwrap(), c.run.seed).unwrap().state_dict().unwrap();
    let (one_sets, two_sets) = (
        ["train.max_steps=3"],
        ["train.max_steps=3", "parallel.sync_batchnorm=true", "parallel.gradient_predivide_factor=2"],
    );
    let one = run(dir.path(), &cfg, 1, 120, &one_sets);
    let two = run(dir.path(), &cfg, 2, 60, &two_sets);
    let (s1, s2) = (summary(dir.path(), 1, 120, &one_sets), summary(dir.path(), 2, 60, &two_sets));
    assert_eq!(
        (&s1["overflow_steps"], &s1["loss_scale"]),
        (&s2["overflow_steps"], &s2["loss_scale"]),
        "{s2}"
    );
    // Only float tensors moved (num_batches_tracked counts steps).
    let float_only = |sd: &[ddptrain::nn::StateEntry]| -> Vec<ddptrain::nn::StateEntry> {
        sd.iter().filter(|e| matches!(e.value, ddptrain::nn::StateValue::F32(_))).cloned().collect()
    };
    let moved = max_abs_diff(&float_only(&init), &float_only(&one));
    let dw = max_abs_diff(&one, &two);
    println!("O2 SyncBatchNorm: weights moved up to {moved:.3e}; max |dw| 2 ranks vs one: {dw:.3e}");
    // The same f16 budget as the test above (8 roundings of u = 2^-11 relative
    // to the movement); SyncBatchNorm's statistics from two halves differ from
    // one pass only in f32 summation order, far below f16 rounding.
    let tol = 8.0 * 2f32.powi(-11) * moved;
    assert!(dw < tol, "{dw:e} > {tol:e} (weights moved {moved:e})");
}

/// One rank reports the job: `done:` and the gates' verdicts come from rank
/// 0 alone (every rank printed them, each naming the out_dir only rank 0
/// wrote), and they close rank 0's `train.log`.
#[test]
fn only_rank_zero_reports_the_finished_job() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write(
        dir.path(),
        "cfg.toml",
        &format!("{NO_BN_MODEL}{COMMON}[expect]\nmax_final_loss = 100.0\n"),
    );
    let out = dir.path().join("out");
    let t =
        run_env(dir.path(), &config, 2, &[&format!("run.out_dir={}", out.display())], ("DDPTRAIN_NONE", ""));
    assert_eq!(t.matches("[rank 0] done: 6 steps").count(), 1, "{t}");
    assert_eq!(t.matches("[rank 0] PASS expect.max_final_loss").count(), 1, "{t}");
    assert!(!t.contains("[rank 1] done:") && !t.contains("[rank 1] PASS"), "{t}");
    let log = std::fs::read_to_string(out.join("train.log")).unwrap();
    let tail: Vec<&str> = log.lines().rev().take(2).collect();
    assert!(
        tail[1].starts_with("done: 6 steps") && tail[0].starts_with("PASS expect.max_final_loss"),
        "{log}"
    );
}
