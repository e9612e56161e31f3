#![allow(dead_code)]
//! Helpers for the tests that run the `ddptrain` binary.

pub mod resume;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// The checkout the tests read `configs/`, `kernels/` and `data/` from:
/// `DDPTRAIN_REPO`, else the one this test binary was built in. A bundled
/// test binary run on another machine (scripts/gpu-check.sh) has no cargo
/// and its build path does not exist there.
pub fn repo_root() -> PathBuf {
    from_env("DDPTRAIN_REPO", env!("CARGO_MANIFEST_DIR"))
}

/// The `ddptrain` binary the tests spawn: `DDPTRAIN_BIN`, else the one cargo
/// built beside this test binary (see `repo_root` for why).
pub fn ddptrain_bin() -> PathBuf {
    from_env("DDPTRAIN_BIN", env!("CARGO_BIN_EXE_ddptrain"))
}

/// `var` when set and not empty, else `default`; made absolute, because the
/// tests pass these paths to children that run in other directories.
fn from_env(var: &str, default: impl Into<PathBuf>) -> PathBuf {
    let p = std::env::var_os(var).filter(|v| !v.is_empty()).map_or_else(|| default.into(), PathBuf::from);
    std::path::absolute(&p).unwrap_or_else(|e| panic!("{var}: {}: {e}", p.display()))
}

/// The variable that keeps a spawned run on the CPU when the emulated CUDA
/// device (or a real GPU) is visible: these tests check the CPU trainer and
/// the CLI, with `run.device = "auto"`; the GPU path has tests of its own.
pub const HIDE_GPUS: (&str, &str) = ("CUDA_VISIBLE_DEVICES", "");

pub fn ddptrain(args: &[&str], cwd: &Path) -> Output {
    Command::new(ddptrain_bin())
        .args(args)
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .current_dir(cwd)
        .env_remove("WORLD_SIZE")
        .output()
        .expect("cannot run the ddptrain binary")
}

/// What a child wrote so far, line by line.
pub type Lines = Arc<Mutex<String>>;

/// Collects a child's stream as its lines come, so a test can wait for one.
pub fn collect(from: impl Read + Send + 'static) -> Lines {
    let seen = Arc::new(Mutex::new(String::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            s.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    seen
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A small synthetic-data run of the seed ConvNet: fast, needs no files.
pub const SYNTH: &[&str] = &[
    "--set",
    "data.dataset=synthetic",
    "--set",
    "data.synthetic_train_size=400",
    "--set",
    "data.synthetic_test_size=200",
    "--set",
    "train.max_steps=4",
    "--set",
    "logging.progress=never",
];

/// The MNIST digits fetched by scripts/fetch-mnist.sh (scripts/test.sh fetches them first),
/// or `DDPTRAIN_MNIST`: on the GPU machine they may be only in the bundle (gpu-bundle/data/mnist).
pub fn mnist_dir() -> PathBuf {
    fetched_dir(
        "DDPTRAIN_MNIST",
        "data/mnist",
        "train-images-idx3-ubyte",
        "MNIST files",
        "scripts/fetch-mnist.sh",
    )
}

/// The cats and dogs scripts/fetch-catsdogs.sh writes (scripts/test.sh fetches
/// them first), or `DDPTRAIN_CATSDOGS`.
pub fn catsdogs_dir() -> PathBuf {
    fetched_dir(
        "DDPTRAIN_CATSDOGS",
        "data/catsdogs",
        "test_batch.bin",
        "CIFAR-10 files",
        "scripts/fetch-catsdogs.sh",
    )
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write test file");
    p
}

/// Synthetic run of 6 steps, a checkpoint every 2 (and not after each epoch,
/// as the shipped config also saves).
pub fn ckpt_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--config".into(),
        repo_root().join("configs/mnist_o0.toml").display().to_string(),
        "--set".into(),
        format!("run.out_dir={}", out.display()),
    ];
    for s in [
        "data.dataset=synthetic",
        "data.synthetic_train_size=200",
        "data.synthetic_test_size=100",
        "data.batch_size=50",
        "train.max_steps=6",
        "checkpoint.every_steps=2",
        "checkpoint.every_epochs=0",
        "logging.progress=never",
        "logging.tensorboard=false",
        "expect.min_test_accuracy=0.0",
    ]
    .iter()
    .chain(extra)
    {
        a.push("--set".into());
        a.push(s.to_string());
    }
    a
}

/// `ddptrain launch` of two local ranks running `a`.
pub fn launch2(a: &[String]) -> Vec<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut l: Vec<String> = ["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"]
        .map(String::from)
        .to_vec();
    l.extend_from_slice(a);
    l
}

pub fn run_args(a: &[String], cwd: &Path) -> (Option<i32>, String) {
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = ddptrain(&refs, cwd);
    (o.status.code(), text(&o))
}

/// The largest |difference| between two state dicts' f32 values (integer
/// entries must be equal).
pub fn max_abs_diff(a: &[ddptrain::nn::StateEntry], b: &[ddptrain::nn::StateEntry]) -> f32 {
    max_diff(a, b, |_, _| 1.0)
}

/// [`max_abs_diff`] with each difference relative to `max(1, |b|)`, as
/// `--trace-tolerance` measures: running variances of activations in the
/// hundreds differ in more absolute digits than weights near 1 do.
pub fn max_rel_diff(a: &[ddptrain::nn::StateEntry], b: &[ddptrain::nn::StateEntry]) -> f32 {
    max_diff(a, b, |q, _| q.abs().max(1.0))
}

/// [`max_abs_diff`] with each tensor's differences relative to its own
/// largest magnitude in `b` (a tensor near zero is held to its scale, not
/// to 0).
pub fn max_peak_rel_diff(a: &[ddptrain::nn::StateEntry], b: &[ddptrain::nn::StateEntry]) -> f32 {
    max_diff(a, b, |_, peak| peak.max(f32::MIN_POSITIVE))
}

/// The largest `|p - q| / scale(q, peak)` over the f32 values of `a` and
/// `b`, `peak` the largest |q| of the tensor.
fn max_diff(
    a: &[ddptrain::nn::StateEntry],
    b: &[ddptrain::nn::StateEntry],
    scale: impl Fn(f32, f32) -> f32,
) -> f32 {
    use ddptrain::nn::StateValue::*;
    let mut worst = (0.0f32, "");
    for ea in a {
        let eb = b.iter().find(|e| e.name == ea.name).expect("same tensors");
        match (&ea.value, &eb.value) {
            (F32(x), F32(y)) => {
                assert_eq!(x.len(), y.len(), "{}", ea.name);
                let peak = y.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (p, q) in x.iter().zip(y) {
                    let d = (p - q).abs() / scale(*q, peak);
                    if d > worst.0 {
                        worst = (d, &ea.name);
                    }
                }
            }
            (I64(x), I64(y)) => assert_eq!(x, y, "{}", ea.name),
            _ => panic!("{}: dtype differs", ea.name),
        }
    }
    // Where it is, for the failure message of whoever asserts on it.
    println!("  largest difference {:e} in {}", worst.0, worst.1);
    worst.0
}

/// A small conv net under O2 (f16 and f32 gradient buckets, fp32 masters,
/// the dynamic loss scaler) on `train_size` synthetic 8x8 images in batches
/// of 16 per rank, with no periodic or timed checkpoint: the one the stop writes is
/// the only one: the runs tests/signals.rs and tests/mpi_backend.rs stop.
pub fn stop_config(dir: &Path, device: &str, train_size: usize, total_steps: u64) -> PathBuf {
    let body = format!(
        r#"[run]
seed = 3
device = "{device}"
[model]
input_shape = [1, 8, 8]
layers = [
  {{ type = "sequential", name = "layer1", layers = [
      {{ type = "conv2d", out_channels = 4, kernel_size = 3, padding = 1 }},
      {{ type = "batchnorm2d" }}, {{ type = "relu" }} ] }},
  {{ type = "flatten" }},
  {{ type = "linear", name = "fc", out_features = 10 }},
]
[data]
dataset = "synthetic"
synthetic_train_size = {train_size}
synthetic_test_size = 32
batch_size = 16
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[amp]
opt_level = "O2"
[train]
max_steps = {total_steps}
[logging]
progress = "never"
every_steps = 1
tensorboard = false
[checkpoint]
every_steps = 0
every_minutes = 0
[parallel]
timeout_s = 120
"#
    );
    write(dir, &format!("{device}-{train_size}.toml"), &body)
}

/// The python that has torch, numpy and safetensors, or `None` when the test
/// is skipped.
pub fn torch_python(test: &str) -> Option<String> {
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

/// The State of the Union addresses scripts/fetch-sotu.sh writes (scripts/test.sh
/// fetches them first), or `DDPTRAIN_SOTU`.
pub fn sotu_dir() -> PathBuf {
    fetched_dir(
        "DDPTRAIN_SOTU",
        "data/sotu",
        "2021_joseph_r_biden_d.txt",
        "State of the Union addresses",
        "scripts/fetch-sotu.sh",
    )
}

/// tests/common/gpt.toml filled in: nanoGPT's GPT with `n_layer` blocks of
/// `n_head` heads, `n_embd` wide, over `block_size` positions and `vocab`
/// tokens of `data.vocab = vocab_kind`, dropout `p` after the embeddings.
pub fn gpt_config(
    vocab_kind: &str,
    vocab: usize,
    (n_layer, n_head, n_embd, block_size): (usize, usize, usize, usize),
    p: &str,
) -> String {
    let n = |x: usize| x.to_string();
    [
        ("{VOCAB}", vocab_kind.to_owned()),
        ("{C3}", n(3 * n_embd)),
        ("{C4}", n(4 * n_embd)),
        ("{C}", n(n_embd)),
        ("{T}", n(block_size)),
        ("{H}", n(n_head)),
        ("{L}", n(n_layer)),
        ("{V}", n(vocab)),
        ("{P}", p.to_owned()),
    ]
    .into_iter()
    .fold(include_str!("gpt.toml").to_owned(), |t, (k, v)| t.replace(k, &v))
}

/// `env` when set, else `default` under the repository root; asserts that
/// `probe` is in it, naming the script that fetches the `what`.
fn fetched_dir(env: &str, default: &str, probe: &str, what: &str, script: &str) -> PathBuf {
    let dir = from_env(env, repo_root().join(default));
    assert!(dir.join(probe).exists(), "{} has no {what}: run {script} (scripts/test.sh does)", dir.display());
    dir
}
