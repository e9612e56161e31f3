//! Every config error a user can make: exit code 2, a message naming the key
//! and the file, and nothing written to out_dir.

mod common;
use common::*;

const SEED: &str = "configs/mnist_o0.toml";

fn seed_config() -> String {
    std::fs::read_to_string(repo_root().join(SEED)).expect("read seed config")
}

/// Runs `ddptrain --config <body>` in a temp dir and checks the config error contract.
fn expect_config_error(body: &str, extra: &[&str], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "bad.toml", body);
    let out_dir = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out_dir.display());
    let mut args = vec!["--config", cfg.to_str().unwrap(), "--set", &out_set];
    args.extend_from_slice(extra);
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "exit code for {needles:?}; output:\n{t}");
    for n in needles {
        assert!(t.contains(n), "message should contain {n:?}; got:\n{t}");
    }
    assert!(!out_dir.exists(), "a config error must not write to out_dir");
}

#[test]
fn unknown_key_names_key_and_file() {
    let body = seed_config().replace("[train]", "[train]\nepochz = 3");
    expect_config_error(&body, &[], &["epochz", "bad.toml"]);
}

#[test]
fn wrong_type_names_key() {
    expect_config_error(&seed_config(), &["--set", "data.batch_size=\"many\""], &["batch_size"]);
}

#[test]
fn zero_batch_size_is_refused() {
    expect_config_error(&seed_config(), &["--set", "data.batch_size=0"], &["data.batch_size", "bad.toml"]);
}

#[test]
fn kernel_larger_than_input_is_refused() {
    let body = seed_config().replace("[1, 28, 28]", "[1, 3, 3]");
    expect_config_error(&body, &[], &["kernel_size", "bad.toml"]);
}

#[test]
fn layers_that_do_not_chain_are_refused() {
    // Drop the flatten table: the linear layer then sees a 3-D input.
    let seed = seed_config();
    let start = seed.find("[[model.layers]]\ntype = \"flatten\"").expect("seed config has a flatten table");
    let end = start + seed[start..].find('\n').unwrap() + 1;
    let end = end + seed[end..].find('\n').unwrap() + 1;
    let body = format!("{}{}", &seed[..start], &seed[end..]);
    assert!(!body.contains("flatten"));
    expect_config_error(&body, &[], &["model.layers[2]", "flatten", "bad.toml"]);
}

#[test]
fn env_override_with_wrong_type_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(dir.path(), "c.toml", &seed_config());
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ddptrain"))
        .args(["check", "--config", cfg.to_str().unwrap()])
        .env("DDPTRAIN_TRAIN__EPOCHS", "lots")
        .env(common::HIDE_GPUS.0, common::HIDE_GPUS.1)
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("epochs") && t.contains("DDPTRAIN_TRAIN__EPOCHS"), "{t}");
}

#[test]
fn missing_config_file_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = ddptrain(&["--config", "nope.toml"], dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("nope.toml"), "{t}");
}

#[test]
fn set_without_equals_is_refused() {
    expect_config_error(&seed_config(), &["--set", "train.epochs"], &["train.epochs", "="]);
}

#[test]
fn amp_override_that_makes_no_sense_names_key_and_file() {
    let body = seed_config().replace("[amp]", "[amp]\nmaster_weights = true");
    expect_config_error(&body, &[], &["amp.master_weights", "makes no sense with O0", "bad.toml"]);
}

#[test]
fn check_prints_resolved_config_and_model_summary() {
    let o = ddptrain(&["check", "--config", SEED, "--set", "train.epochs=2"], &repo_root());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    for needle in ["epochs = 2", "layer1.0", "layer2.1", "fc", "29034"] {
        assert!(t.contains(needle), "check output should contain {needle:?}:\n{t}");
    }
    // Every state_dict key with its shape and the dtype the opt level holds it in.
    let keys: Vec<Vec<&str>> = t
        .lines()
        .skip_while(|l| !l.starts_with("# state_dict at "))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect())
        .collect();
    assert_eq!(keys.len(), 16, "{t}");
    assert_eq!(keys[0], ["layer1.0.weight", "[16, 1, 5, 5]", "float32"], "{t}");
    assert_eq!(keys[6], ["layer1.1.num_batches_tracked", "[]", "int64"], "{t}");
}
