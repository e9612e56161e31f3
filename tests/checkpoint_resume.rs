//! Exact resume through the library: N steps + resume + the rest equals the
//! straight run bit for bit (weights, optimizer state, metrics, evaluation),
//! from a mid-epoch checkpoint, an end-of-epoch one with pending accumulated
//! gradients, and an explicit checkpoint path; under O2 with the dynamic loss
//! scaler moving across the resume (fp32 masters and scaler state included),
//! under O3 with f16 gradients pending, with dropout, and with random crops
//! and flips (the seed ConvNet's digits, and ResNet-20's three-channel images
//! of configs/resnet20_catsdogs_o2.toml).

mod common;
use common::names_in;
use common::resume::{self, assert_same_run, final_state, halted, metrics, read};
use ddptrain::config::Config;
use ddptrain::train;
use std::path::Path;

/// The shared resume run, on the CPU: the CPU trainer's resume contract;
/// where a (possibly emulated) GPU is visible, "auto" would train on it.
fn cfg(out: &Path, extra: &[&str]) -> Config {
    resume::cfg(out, "cpu", extra)
}

#[test]
fn mid_epoch_resume_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&cfg(&a, &[])).unwrap();
    assert_eq!(straight.steps, 20);
    assert!(straight.resumed_from.is_none());

    // 8 steps per epoch: the last checkpoint before the crash at step 13 is step 10, batch 2 of epoch 1.
    let cb = cfg(&b, &[]);
    halted(&cb, 13);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["epoch"].as_u64()), (Some(10), Some(1)));
    assert_eq!(state["batches_in_epoch"], 2);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000010").as_path()));
    assert_eq!(resumed.steps, 20);
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits());
    assert_eq!(resumed.test_accuracy, straight.test_accuracy);
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
    assert_same_run(&a, &b);
    // The metrics of steps 11-13 the crashed run wrote were replaced, not duplicated.
    let steps: Vec<u64> =
        metrics(&b).iter().filter(|v| v["kind"] == "train").map(|v| v["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![3, 6, 9, 12, 15, 18, 20]);
}

#[test]
fn epoch_end_resume_with_pending_accumulated_gradients_is_bitwise() {
    // AdamW, 3 micro-batches per step over 8 batches per epoch: every epoch ends with
    // 2 micro-batches whose gradients carry into the next epoch's first step.
    let extra = [
        "optimizer.name=adamw",
        "optimizer.lr=0.002",
        "optimizer.momentum=0.0",
        "train.grad_accum_steps=3",
        "train.max_steps=7",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=1",
        "scheduler.name=step",
        "scheduler.step_size=2",
    ];
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    train::train(&cfg(&a, &extra)).unwrap();
    let cb = cfg(&b, &extra);
    halted(&cb, 5);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["epoch"].as_u64()), (Some(4), Some(2)));
    assert_eq!(state["pending_grads"], true);
    train::train(&cb).unwrap();
    assert_same_run(&a, &b);
}

#[test]
fn resume_from_an_explicit_path_into_a_new_out_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&cfg(&a, &[])).unwrap();
    let from = a.join("ckpt/step_00000015");
    let resume = format!("checkpoint.resume={}", from.display());
    let resumed = train::train(&cfg(&b, &[&resume])).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(from.as_path()));
    assert_eq!(read(&a.join("model.safetensors")), read(&b.join("model.safetensors")));
    assert_eq!(final_state(&a).1, final_state(&b).1, "optimizer state differs");
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
}

#[test]
fn keep_last_prunes_old_checkpoints_and_latest_is_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let s = train::train(&cfg(&a, &["checkpoint.keep_last=2"])).unwrap();
    let names: Vec<String> =
        s.checkpoints.iter().map(|p| p.file_name().unwrap().to_string_lossy().into()).collect();
    // The summary lists the checkpoints that are still there, not the pruned ones.
    assert_eq!(names, ["step_00000015", "step_00000020"]);
    assert_eq!(names_in(&a.join("ckpt")), ["latest", "step_00000015", "step_00000020"]);
    assert_eq!(std::fs::read_link(a.join("ckpt/latest")).unwrap(), Path::new("step_00000020"));
    let ckpt_records = metrics(&a).iter().filter(|v| v["kind"] == "checkpoint").count();
    assert_eq!(ckpt_records, 4);
    // optim.safetensors names tensors `<param>.<PyTorch state name>`.
    let names: Vec<String> = ddptrain::checkpoint::load_safetensors(&a.join("ckpt/latest/optim.safetensors"))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"layer1.0.weight.momentum_buffer".to_string()), "{names:?}");
}

/// O2 with a loss scale far too high: steps 1-8 overflow and back off (2^24 ->
/// 2^16), then the scale grows after every 3 clean steps and overflows again.
const O2_SCALER: [&str; 4] =
    ["amp.opt_level=O2", "amp.init_scale=16777216", "amp.growth_interval=3", "logging.every_steps=1"];

#[test]
fn o2_resume_with_the_dynamic_scaler_moving_across_it_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&cfg(&a, &O2_SCALER)).unwrap();
    let cb = cfg(&b, &O2_SCALER);
    halted(&cb, 13);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["batches_in_epoch"].as_u64()), (Some(10), Some(2)));
    let scaler = &state["scaler"];
    let (tracker, skipped) =
        (scaler["growth_tracker"].as_u64().unwrap(), scaler["overflow_steps"].as_u64().unwrap());
    assert!(tracker > 0 && skipped > 0, "the scaler state at the resume is not trivial: {scaler}");
    let masters: Vec<String> =
        ddptrain::checkpoint::load_safetensors(&b.join("ckpt/latest/optim.safetensors"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n.starts_with("master."))
            .collect();
    assert_eq!(masters.len(), 10, "{masters:?}");

    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000010").as_path()));
    assert_eq!((resumed.loss_scale, resumed.overflow_steps), (straight.loss_scale, straight.overflow_steps));
    assert_same_run(&a, &b);
    // The scale grew and overflowed again after the resume: what the restored tracker and count decide.
    let after: Vec<(f64, u64)> = metrics(&b)
        .iter()
        .filter(|v| v["kind"] == "train" && v["step"].as_u64().unwrap() > 10)
        .map(|v| (v["loss_scale"].as_f64().unwrap(), v["overflow_steps"].as_u64().unwrap()))
        .collect();
    let at_resume = scaler["scale"].as_str().unwrap().parse::<f64>().unwrap();
    assert!(after.iter().any(|&(s, _)| s > at_resume), "no growth after the resume: {after:?}");
    assert!(after.iter().any(|&(_, o)| o > skipped), "no overflow after the resume: {after:?}");
}

#[test]
fn o3_epoch_end_resume_with_pending_f16_gradients_is_bitwise() {
    let extra = [
        "amp.opt_level=O3",
        "train.grad_accum_steps=3",
        "train.max_steps=7",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=1",
    ];
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    train::train(&cfg(&a, &extra)).unwrap();
    let cb = cfg(&b, &extra);
    halted(&cb, 5);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["pending_grads"].as_bool()), (Some(4), Some(true)));
    assert_eq!(state["scaler"], serde_json::Value::Null, "O3's static scale has no state to keep");
    train::train(&cb).unwrap();
    assert_same_run(&a, &b);
}

/// `cfg` with `nn.Dropout(p)` between the seed ConvNet's flatten and its
/// classifier (a fixture: configs/ stays without dropout).
fn with_dropout(mut c: Config, p: f64) -> Config {
    use ddptrain::config::LayerConfig;
    use ddptrain::nn::layers::{dropout, LayerSpec};
    let at = c.model.layers.iter().position(|l| l.type_name() == "flatten").expect("a flatten") + 1;
    let drop = LayerConfig::Layer {
        name: Some("drop".into()),
        spec: LayerSpec::Dropout(dropout::Config { p }),
        tie: None,
    };
    c.model.layers.insert(at, drop);
    c
}

/// Dropout's masks are a function of (seed, node, rank, micro-batch), not a
/// generator's state that a checkpoint would have to hold: a run with
/// dropout resumed mid-epoch, and one resumed with accumulated micro-batches
/// carried across an epoch's end, are the straight runs bit for bit.
#[test]
fn resume_with_dropout_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    let straight = train::train(&with_dropout(cfg(&a, &[]), 0.5)).unwrap();
    // The masks are drawn: without them the run differs.
    let plain = train::train(&with_dropout(cfg(&c, &[]), 0.0)).unwrap();
    assert_ne!(plain.final_loss.to_bits(), straight.final_loss.to_bits());
    let cb = with_dropout(cfg(&b, &[]), 0.5);
    halted(&cb, 13);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits());
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
    assert_same_run(&a, &b);

    let extra = [
        "train.grad_accum_steps=3",
        "train.max_steps=7",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=1",
    ];
    let (a, b) = (dir.path().join("a3"), dir.path().join("b3"));
    train::train(&with_dropout(cfg(&a, &extra), 0.3)).unwrap();
    let cb = with_dropout(cfg(&b, &extra), 0.3);
    halted(&cb, 5);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!(state["pending_grads"], true);
    train::train(&cb).unwrap();
    assert_same_run(&a, &b);
}

#[test]
fn mid_epoch_resume_with_random_crop_and_flip_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, plain) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("plain"));
    let aug = ["data.random_crop.size=28", "data.random_crop.padding=4", "data.random_horizontal_flip=0.5"];
    let straight = train::train(&cfg(&a, &aug)).unwrap();
    let cb = cfg(&b, &aug);
    halted(&cb, 13);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000010").as_path()));
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits());
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
    assert_same_run(&a, &b);
    // The transforms did reach the batches.
    train::train(&cfg(&plain, &[])).unwrap();
    assert_ne!(read(&a.join("model.safetensors")), read(&plain.join("model.safetensors")));
}

/// The catsdogs ResNet-20 crashed at step 5 and resumed from step 3 (batch 3
/// of epoch 0, so the resumed run redraws the rest of the epoch's crops and
/// flips) is the straight run bit for bit: three channels, each padded with
/// its own normalized fill, the f16 model and fp32 masters of O2.
#[test]
fn resnet20_catsdogs_mid_epoch_resume_with_its_augmentation_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, plain) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("plain"));
    let straight = train::train(&resume::catsdogs(&a, "cpu", &[])).unwrap();
    let cb = resume::catsdogs(&b, "cpu", &[]);
    assert!(cb.data.augments(), "the config augments its training images");
    halted(&cb, 5);
    let state: serde_json::Value = serde_json::from_slice(&read(&b.join("ckpt/latest/state.json"))).unwrap();
    assert_eq!((state["step"].as_u64(), state["epoch"].as_u64()), (Some(3), Some(0)));
    assert_eq!(state["batches_in_epoch"], 3);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000003").as_path()));
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits());
    assert_eq!(resumed.test_loss.map(f64::to_bits), straight.test_loss.map(f64::to_bits));
    assert_same_run(&a, &b);
    // The transforms did reach the batches.
    let off = ["data.random_crop.padding=0", "data.random_horizontal_flip=0.0"];
    train::train(&resume::catsdogs(&plain, "cpu", &off)).unwrap();
    assert_ne!(read(&a.join("model.safetensors")), read(&plain.join("model.safetensors")));
}
