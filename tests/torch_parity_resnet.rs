//! An augmented image recipe against PyTorch's (scripts/resnet_recipe.py):
//! the config's model built in PyTorch from `ddptrain check --json`, from
//! the same init, on the same batches with the same random crops and flips
//! (the plan written here from ddptrain's own sampler and augmentation
//! draws). On the cats and dogs (what CI has), 3 O0 steps of
//! configs/resnet20_catsdogs_o2.toml whose losses must match step by step,
//! and a plan with its flips inverted, which must not; and, opt-in,
//! configs/resnet20_fashion_o2.toml's whole 15-epoch recipe, whose final test
//! accuracies must agree within 0.3 points. Needs a python with torch (see
//! tests/torch_parity.rs).

mod common;
use common::*;
use ddptrain::data::DistributedSampler;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every epoch's visits of `config` (with `sets`) at world size 1, as
/// little-endian u32 records (index, top, left, flip): the order ddptrain's
/// sampler visits the training set in and each sample's augmentation draws.
/// `invert_flips` writes a wrong plan, for the test that the oracle can fail.
fn plan(dir: &Path, config: &Path, sets: &[String], invert_flips: bool) -> PathBuf {
    let cfg = ddptrain::config::load(config, sets).expect("load the config");
    let (train, _) = ddptrain::train::load_datasets(&cfg).expect("load the training set");
    let augment = ddptrain::train::augmentation(&cfg).expect("the config augments its images");
    let shape: [usize; 3] = train.sample_shape.as_slice().try_into().expect("images of [C, H, W]");
    let len = train.len();
    let sampler = DistributedSampler {
        len,
        num_replicas: 1,
        rank: 0,
        shuffle: cfg.data.shuffle,
        seed: cfg.run.seed,
        drop_last: cfg.data.drop_last,
    };
    let steps_per_epoch = len.div_ceil(cfg.data.batch_size) as u64;
    // The trainer's run length: the shorter of train.epochs and train.max_steps.
    let by_epochs = cfg.train.epochs.map(|e| e * steps_per_epoch);
    let steps = by_epochs.into_iter().chain(cfg.train.max_steps).min().expect("a run length");
    let epochs = steps.div_ceil(steps_per_epoch);
    let mut bytes = Vec::new();
    for epoch in 0..epochs {
        for i in sampler.indices(epoch) {
            let d = augment.draw(epoch, len, i, shape);
            for v in [i, d.top, d.left, usize::from(d.flip != invert_flips)] {
                bytes.extend_from_slice(&u32::try_from(v).expect("fits a u32").to_le_bytes());
            }
        }
    }
    let path = dir.join(if invert_flips { "plan-flipped.bin" } else { "plan.bin" });
    std::fs::write(&path, bytes).expect("write the plan");
    path
}

/// scripts/resnet_recipe.py on `config` with `sets` (for both sides) and `args`.
fn recipe(python: &str, config: &Path, sets: &[String], plan: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(python)
        .arg("scripts/resnet_recipe.py")
        .arg("--bin")
        .arg(ddptrain_bin())
        .arg("--config")
        .arg(config)
        .arg("--plan")
        .arg(plan)
        .args(sets.iter().flat_map(|s| ["--set", s]))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run scripts/resnet_recipe.py");
    (o.status.code(), text(&o))
}

fn catsdogs_sets() -> Vec<String> {
    vec![
        format!("data.path={}", catsdogs_dir().display()),
        "train.max_steps=3".into(),
        r#"amp.opt_level="O0""#.into(),
    ]
}

/// Both trainers take the same first 3 steps (SGD with Nesterov momentum,
/// the warmup's rates) on the same cropped and flipped cats and dogs: their
/// losses agree to 1e-4 (measured: 0, 1.8e-7, 3.9e-6), which a crop, a flip,
/// a sample or a rate off would not give (the next test). Later steps drift
/// apart about 10x a step (4.3e-4 at step 5, 1.9e-3 at step 6), as runs of
/// different arithmetic do while the warmup's rate climbs.
#[test]
fn three_augmented_resnet_steps_match_pytorch() {
    let Some(python) = torch_python("three_augmented_resnet_steps_match_pytorch") else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = repo_root().join("configs/resnet20_catsdogs_o2.toml");
    let sets = catsdogs_sets();
    let plan = plan(dir.path(), &config, &sets, false);
    let (code, t) =
        recipe(&python, &config, &sets, &plan, &["--loss-steps", "3", "--loss-tol", "1e-4", "--tol", "1"]);
    println!("{t}");
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("OK final test accuracy"), "{t}");
}

/// With every flip inverted on PyTorch's side the first step's loss already
/// differs: the oracle sees the augmentation.
#[test]
fn inverted_flips_fail_the_augmented_oracle() {
    let Some(python) = torch_python("inverted_flips_fail_the_augmented_oracle") else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = repo_root().join("configs/resnet20_catsdogs_o2.toml");
    let mut sets = catsdogs_sets();
    sets[1] = "train.max_steps=1".into();
    let plan = plan(dir.path(), &config, &sets, true);
    let (code, t) =
        recipe(&python, &config, &sets, &plan, &["--loss-steps", "1", "--loss-tol", "1e-4", "--tol", "1"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("MISMATCH step 1's loss"), "{t}");
}

/// configs/resnet20_fashion_o2.toml's whole recipe (15 epochs of the 60,000
/// training images, evaluated on the 10,000 test images after each) in
/// ddptrain and in PyTorch, from one init, on the same batches, crops and
/// flips: the final test accuracies within 0.3 points, and ddptrain's at
/// least the config's 92.5% (its `[expect]` gate, exit 3 otherwise).
/// `DDPTRAIN_RECIPE_SET` shortens it (`--set` overrides joined by `;`, for
/// both sides: `train.epochs=1`); `DDPTRAIN_RECIPE_OUT` keeps the plan and
/// ddptrain's run there; `DDPTRAIN_RECIPE_THREADS` (default 1) threads per
/// side, the two sides running at once.
#[test]
#[ignore = "the full recipe trains twice on the CPU (about an hour on 2 cores, with a release ddptrain and \
            scripts/fetch-fashion-mnist.sh's data): \
            cargo test --release --test torch_parity_resnet -- --ignored resnet20_fashion_recipe_matches_pytorch"]
fn resnet20_fashion_recipe_matches_pytorch() {
    let Some(python) = torch_python("resnet20_fashion_recipe_matches_pytorch") else { return };
    let sets: Vec<String> = std::env::var("DDPTRAIN_RECIPE_SET")
        .unwrap_or_default()
        .split(';')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let tmp = tempfile::tempdir().expect("temp dir");
    let keep = std::env::var_os("DDPTRAIN_RECIPE_OUT").filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = keep.unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let config = repo_root().join("configs/resnet20_fashion_o2.toml");
    let threads = std::env::var("DDPTRAIN_RECIPE_THREADS").unwrap_or_else(|_| "1".into());
    let plan = plan(&dir, &config, &sets, false);
    let run = dir.join("run");
    let run = run.to_string_lossy();
    let args =
        ["--loss-steps", "3", "--loss-tol", "1e-2", "--threads", &threads, "--concurrent", "--out", &run];
    let (code, t) = recipe(&python, &config, &sets, &plan, &args);
    println!("{t}");
    assert_eq!(code, Some(0), "ddptrain's recipe and PyTorch's disagree:\n{t}");
}
