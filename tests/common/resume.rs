//! What the exact-resume tests share (tests/checkpoint_resume.rs on the CPU,
//! tests/gpu_trainer.rs on the device): the small run they resume, and the
//! comparison of two runs' final files bit for bit.

use super::repo_root;
use ddptrain::config::{self, Config};
use ddptrain::train::{self, RunOptions};
use std::path::Path;

/// The seed ConvNet of configs/mnist_o0.toml (its optimizer and schedule) on
/// synthetic digits: 8 steps per epoch, 20 steps, a checkpoint every 5.
pub fn cfg(out: &Path, device: &str, extra: &[&str]) -> Config {
    cfg_of(&repo_root().join("configs/mnist_o0.toml"), out, device, extra)
}

/// [`cfg`]'s run of the model of `config` (a file with the seed ConvNet's
/// input shape and classes).
pub fn cfg_of(config: &Path, out: &Path, device: &str, extra: &[&str]) -> Config {
    let sets = [
        "data.dataset=synthetic",
        "data.synthetic_train_size=400",
        "data.synthetic_test_size=100",
        "data.batch_size=50",
        "train.max_steps=20",
        "train.grad_clip_norm=1.0",
        "scheduler.warmup_steps=3",
        "logging.every_steps=3",
        "logging.progress=never",
        "logging.tensorboard=false",
        "checkpoint.every_steps=5",
        // Not also after each epoch, as the shipped config saves.
        "checkpoint.every_epochs=0",
    ];
    load(config, &sets, device, out, extra)
}

/// configs/resnet20_catsdogs_o2.toml as configured (ResNet-20 under O2, its
/// 4-pixel-padded crop and flip of 3x32x32 images) on synthetic images in
/// place of the cats and dogs: 4 steps per epoch, a checkpoint every 3 steps.
pub fn catsdogs(out: &Path, device: &str, extra: &[&str]) -> Config {
    let sets = [
        "data.dataset=synthetic",
        "data.synthetic_train_size=16",
        "data.synthetic_test_size=4",
        // CIFAR-10's statistics, which the real run's padding fill is normalized by.
        "data.mean=[0.4914, 0.4822, 0.4465]",
        "data.std=[0.2470, 0.2435, 0.2616]",
        "data.batch_size=4",
        "train.max_steps=6",
        "scheduler.warmup_steps=2",
        "logging.every_steps=2",
        "logging.progress=never",
        "logging.tensorboard=false",
        "checkpoint.every_steps=3",
        // Not also after each epoch, as the shipped config saves.
        "checkpoint.every_epochs=0",
    ];
    load(&repo_root().join("configs/resnet20_catsdogs_o2.toml"), &sets, device, out, extra)
}

/// The config file `config` with `sets`, the device, the
/// output directory and then `extra` set over it.
fn load(config: &Path, sets: &[&str], device: &str, out: &Path, extra: &[&str]) -> Config {
    let mut all: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    all.push(format!("run.device={device}"));
    all.push(format!("run.out_dir={}", out.display()));
    all.extend(extra.iter().map(|s| s.to_string()));
    config::load(config, &all).unwrap()
}

pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// metrics.jsonl without the timing fields, which no two runs share.
pub fn metrics(out: &Path) -> Vec<serde_json::Value> {
    String::from_utf8(read(&out.join("metrics.jsonl")))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("images_per_s");
            v
        })
        .collect()
}

/// [`metrics`] less the checkpoint records (a resumed run saves at other steps).
pub fn metrics_without_checkpoints(out: &Path) -> Vec<serde_json::Value> {
    metrics(out).into_iter().filter(|v| v["kind"] != "checkpoint").collect()
}

/// Weights, optimizer state and progress (less timings) of the last checkpoint.
pub fn final_state(out: &Path) -> (Vec<u8>, Vec<u8>, serde_json::Value) {
    let dir = out.join("ckpt/latest");
    let mut state: serde_json::Value = serde_json::from_slice(&read(&dir.join("state.json"))).unwrap();
    state.as_object_mut().unwrap().remove("train_time_s");
    state.as_object_mut().unwrap().remove("wall_s");
    (read(&dir.join("model.safetensors")), read(&dir.join("optim.safetensors")), state)
}

/// Runs `a` and `b` ended with the same files, bit for bit.
pub fn assert_same_run(a: &Path, b: &Path) {
    // assert! rather than assert_eq!: a failure must not print megabytes of bytes.
    assert!(read(&a.join("model.safetensors")) == read(&b.join("model.safetensors")), "final weights differ");
    let (ma, oa, sa) = final_state(a);
    let (mb, ob, sb) = final_state(b);
    assert!(ma == mb, "checkpointed weights differ");
    assert!(oa == ob, "optimizer state differs");
    assert_eq!(sa, sb, "state.json differs");
    assert_eq!(metrics_without_checkpoints(a), metrics_without_checkpoints(b), "metrics differ");
}

/// Trains `cfg` until it halts, as a crash would, after step `after`.
pub fn halted(cfg: &Config, after: u64) {
    let opts = RunOptions { halt_after_steps: Some(after), ..Default::default() };
    let err = train::train_with(cfg, &opts).unwrap_err().to_string();
    assert!(err.contains(&format!("halted after step {after}")), "{err}");
}
