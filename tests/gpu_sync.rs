//! The GPU trainer on the emulated device (scripts/emulated-gpu.sh), through
//! its counters: how often an ordinary training step blocks the host, and
//! that the stream-order race checker finds nothing over whole runs (world
//! 1 in this process; world 2 as two `launch`ed ranks sharing the device over
//! the tcp backend), at O0 and O2 with gradient accumulation and SyncBN, and
//! over 20 steps of ResNet-20 at O2, and a small GPT on text at O0 and O2.
//! One test function: the counters are per process, so nothing may run beside it.

mod common;
use common::*;
use ddptrain::cuda::emu;
use std::path::Path;
use std::process::Command;

/// The seed ConvNet on synthetic digits: 100 micro-batches of 20 per epoch,
/// so the step counts below stay inside the first epoch; logging and
/// checkpoints only at the end of the run. The batch is small because the
/// count of host synchronizations does not depend on it and the emulated
/// device's checks make every image cost.
fn sets(level: &str, steps: u64, out: &Path) -> Vec<String> {
    [
        "run.device=cuda".to_string(),
        format!("run.out_dir={}", out.display()),
        format!("amp.opt_level=\"{level}\""),
        "data.dataset=\"synthetic\"".into(),
        "data.synthetic_train_size=2000".into(),
        "data.synthetic_test_size=100".into(),
        "data.batch_size=20".into(),
        "train.grad_accum_steps=2".into(),
        format!("train.max_steps={steps}"),
        "parallel.sync_batchnorm=true".into(),
        "logging.every_steps=1000".into(),
        "logging.progress=\"never\"".into(),
        "logging.tensorboard=false".into(),
    ]
    .to_vec()
}

fn config() -> std::path::PathBuf {
    repo_root().join("configs/mnist_o2.toml")
}

/// Host synchronizations of a whole in-process run of `steps` steps.
fn run(level: &str, steps: u64, out: &Path) -> i64 {
    let cfg = ddptrain::config::load(&config(), &sets(level, steps, out)).unwrap();
    let before = emu::counter("host_syncs").unwrap_or(0);
    ddptrain::train::train(&cfg).unwrap();
    emu::counter("host_syncs").unwrap_or(0) - before
}

/// ResNet-20 (configs/resnet20_fashion_o2.toml, O2 as configured) on
/// synthetic images, a batch of 2 without accumulation: 32 steps per epoch,
/// so `steps` stay inside the first; logging and checkpoints only at the end.
fn resnet20_sets(steps: u64, out: &Path) -> Vec<String> {
    [
        "run.device=cuda".to_string(),
        format!("run.out_dir={}", out.display()),
        "data.dataset=\"synthetic\"".into(),
        "data.synthetic_train_size=64".into(),
        "data.synthetic_test_size=2".into(),
        "data.batch_size=2".into(),
        format!("train.max_steps={steps}"),
        "logging.every_steps=1000".into(),
        "logging.progress=\"never\"".into(),
        "logging.tensorboard=false".into(),
    ]
    .to_vec()
}

/// Host synchronizations of a whole in-process ResNet-20 run of `steps` steps.
fn run_resnet20(steps: u64, out: &Path) -> i64 {
    let path = repo_root().join("configs/resnet20_fashion_o2.toml");
    let cfg = ddptrain::config::load(&path, &resnet20_sets(steps, out)).unwrap();
    let before = emu::counter("host_syncs").unwrap_or(0);
    ddptrain::train::train(&cfg).unwrap();
    emu::counter("host_syncs").unwrap_or(0) - before
}

/// Host synchronizations of a whole in-process run of `steps` steps of a
/// 2-layer GPT (tests/common/gpt.toml) on a few KB of text: about 80 steps
/// of 4 windows per epoch, so `steps` stay inside the first; logging and
/// checkpoints only at the end. `p` is the embeddings' and attention's dropout.
fn run_gpt(level: &str, p: &str, steps: u64, out: &Path) -> i64 {
    std::fs::create_dir_all(out).unwrap();
    let body: String =
        (0..40).map(|i| format!("The state of the union is strong, said speaker {i}.\n")).collect();
    let text = write(out, "input.txt", &body);
    let gpt =
        gpt_config("bytes", 256, (2, 2, 16, 8), p).replace("dropout_p = 0.0", &format!("dropout_p = {p}"));
    let path = write(out, "gpt.toml", &gpt);
    let sets = [
        "run.device=cuda".to_string(),
        format!("run.out_dir={}", out.join("run").display()),
        format!("amp.opt_level=\"{level}\""),
        format!("data.path={:?}", text.display().to_string()),
        format!("train.max_steps={steps}"),
        "logging.every_steps=1000".into(),
    ];
    let cfg = ddptrain::config::load(&path, &sets).unwrap();
    let before = emu::counter("host_syncs").unwrap_or(0);
    ddptrain::train::train(&cfg).unwrap();
    emu::counter("host_syncs").unwrap_or(0) - before
}

/// An ordinary step (no logging, checkpoint or trace) makes this many
/// host-blocking calls: the loss scaler read one step late (see
/// `amp::cuda::ScalerSnapshot`), which the learning-rate schedule needs on
/// the host to leave skipped steps out.
const HOST_SYNCS_PER_STEP: i64 = 1;

#[test]
fn ordinary_steps_block_the_host_a_fixed_number_of_times_and_nothing_races() {
    if ddptrain::cuda::device_count() == 0 {
        ddptrain::cuda::skip_or_fail("gpu_sync", "no CUDA device");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for level in ["O0", "O2"] {
        let short = run(level, 2, &tmp.path().join(format!("{level}_2")));
        let long = run(level, 7, &tmp.path().join(format!("{level}_7")));
        if emu::counter("host_syncs").is_none() {
            continue; // a real driver has no counters
        }
        let per_step = (long - short) as f64 / 5.0;
        println!("{level}: {short} host syncs in 2 steps, {long} in 7: {per_step} per ordinary step");
        assert_eq!(long - short, 5 * HOST_SYNCS_PER_STEP, "{level}: host syncs of 5 ordinary steps");
    }
    // ResNet-20: 20 ordinary steps (2 steps and 22 steps, both ending on
    // the run's one logging step), checked by the race checker below.
    let short = run_resnet20(2, &tmp.path().join("resnet20_2"));
    let long = run_resnet20(22, &tmp.path().join("resnet20_22"));
    if emu::counter("host_syncs").is_some() {
        println!("ResNet-20 O2: {short} host syncs in 2 steps, {long} in 22");
        assert_eq!(long - short, 20 * HOST_SYNCS_PER_STEP, "ResNet-20: host syncs of 20 ordinary steps");
    }
    // The GPT (configs/gpt_sotu_o2.toml's model, small) on text at O0
    // without dropout and at O2 with it (attention's reuses backward's
    // workspace, and O2 without dropout runs the same launches less the masks).
    for (level, p) in [("O0", "0.0"), ("O2", "0.1")] {
        let short = run_gpt(level, p, 2, &tmp.path().join(format!("gpt_{level}_{p}_2")));
        let long = run_gpt(level, p, 7, &tmp.path().join(format!("gpt_{level}_{p}_7")));
        if emu::counter("host_syncs").is_some() {
            println!("GPT {level} dropout {p}: {short} host syncs in 2 steps, {long} in 7");
            assert_eq!(
                long - short,
                5 * HOST_SYNCS_PER_STEP,
                "GPT {level} {p}: host syncs of 5 ordinary steps"
            );
        }
    }
    if let Some(c) = emu::counters() {
        println!("world 1 counters: {c:?}");
        assert_eq!(emu::counter("races"), Some(0), "{:?}", emu::last_error());
        assert_eq!(emu::counter("errors"), Some(0), "{:?}", emu::last_error());
        // The trainer's kernels ran under the emulator's device checks.
        for check in ["bounds_checks", "init_checks", "shared_checks", "host_guards"] {
            assert!(emu::counter(check) > Some(0), "{check}: {c:?}");
        }
    }

    // World 2: two ranks through `launch`, one device, the tcp backend.
    for level in ["O0", "O2"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let out = tmp.path().join(format!("{level}_w2"));
        let mut args: Vec<String> =
            ["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"]
                .map(String::from)
                .to_vec();
        args.extend(["--config".to_string(), config().display().to_string()]);
        // Six steps of random-ish digits: the config's 97% accuracy gate is not the point here.
        let extra = ["parallel.backend=\"tcp\"".to_string(), "expect.min_test_accuracy=0.0".to_string()];
        for s in sets(level, 6, &out).into_iter().chain(extra) {
            args.extend(["--set".to_string(), s]);
        }
        let o = Command::new(ddptrain_bin()).args(&args).env_remove("WORLD_SIZE").output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{level} world 2:\n{text}");
        assert!(!text.contains("cuemu: error"), "{level} world 2:\n{text}");
    }
}
