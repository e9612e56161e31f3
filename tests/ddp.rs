//! DDP through the real binary and launcher on loopback: W processes with the
//! same global batch train the same model as one process (O0: max |dw| < 1e-5),
//! with SyncBatchNorm, without BatchNorm, and with gradient accumulation.

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

/// Trains `config` on `world` processes (through `ddptrain launch` when > 1)
/// with per-rank `batch`, returning the final weights rank 0 wrote.
fn run(
    dir: &Path,
    config: &Path,
    world: usize,
    batch: usize,
    extra: &[&str],
) -> Vec<ddptrain::nn::StateEntry> {
    let out = dir.join(format!("out_w{world}_b{batch}"));
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

fn max_abs_diff(a: &[ddptrain::nn::StateEntry], b: &[ddptrain::nn::StateEntry]) -> f32 {
    use ddptrain::nn::StateValue::*;
    let mut worst = 0.0f32;
    for ea in a {
        let eb = b.iter().find(|e| e.name == ea.name).expect("same tensors");
        match (&ea.value, &eb.value) {
            (F32(x), F32(y)) => {
                for (p, q) in x.iter().zip(y) {
                    worst = worst.max((p - q).abs());
                }
            }
            (I64(x), I64(y)) => assert_eq!(x, y, "{}", ea.name),
            _ => panic!("{}: dtype differs", ea.name),
        }
    }
    worst
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
    let out = dir.path().join("out_w2_b60");
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
