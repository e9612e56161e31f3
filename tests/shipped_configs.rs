//! Every shipped config with an `[expect]` gate trained as shipped, through
//! the binary, to its gate: only `run.out_dir` (a temporary directory),
//! `data.path` (where scripts/fetch-*.sh put the data, or the `DDPTRAIN_*`
//! directory tests/common names) and the progress bar (off) differ. The
//! exit code must be 0 and every key of the config's `[expect]` table must
//! print its PASS line. Those whose full run takes about a minute or less
//! in the test build run in CI; the longer ones are opt-in
//! (`cargo test --release --features mpi --test shipped_configs -- --ignored`),
//! their figures in BENCHMARKS.md ("Accuracy and whole recipes").
//! configs/ci_smoke.toml has its own test in tests/ci_smoke.rs.

mod common;
use common::*;

use std::path::{Path, PathBuf};

/// The `[expect]` keys of a shipped config, in the file's order.
fn gates(config: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let expect = doc.get("expect").and_then(|e| e.as_table());
    expect.map(|t| t.keys().cloned().collect()).unwrap_or_default()
}

/// Trains `configs/<name>.toml` on `data` and holds it to its own gates.
fn passes_its_gates(name: &str, data: PathBuf) {
    let config = repo_root().join(format!("configs/{name}.toml"));
    let gates = gates(&config);
    assert!(!gates.is_empty(), "{} has no [expect] gate", config.display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sets = [
        format!("run.out_dir={}", out.display()),
        format!("data.path={}", data.display()),
        "logging.progress=never".into(),
    ];
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(sets.iter().flat_map(|s| ["--set", s.as_str()]));
    let o = ddptrain(&args, dir.path());
    let t = text(&o);
    let closing: Vec<&str> =
        t.lines().filter(|l| ["done:", "PASS ", "FAIL "].iter().any(|p| l.starts_with(p))).collect();
    println!("{name}: {}", closing.join("\n  "));
    assert_eq!(o.status.code(), Some(0), "{name} failed its gate or did not finish:\n{t}");
    for g in &gates {
        assert!(t.contains(&format!("PASS expect.{g}:")), "{name}: no PASS line for expect.{g}:\n{t}");
    }
    assert!(!t.contains("FAIL "), "{t}");
}

/// Fashion-MNIST where scripts/fetch-fashion-mnist.sh puts it, or `DDPTRAIN_FASHION_MNIST`.
fn fashion_dir() -> PathBuf {
    let dir = std::env::var_os("DDPTRAIN_FASHION_MNIST")
        .filter(|v| !v.is_empty())
        .map_or_else(|| repo_root().join("data/fashion-mnist"), PathBuf::from);
    let probe = dir.join("train-images-idx3-ubyte.gz");
    assert!(
        probe.exists(),
        "{} has no Fashion-MNIST files: run scripts/fetch-fashion-mnist.sh",
        dir.display()
    );
    dir
}

#[test]
fn mnist_o0_passes_its_gate() {
    passes_its_gates("mnist_o0", mnist_dir());
}

#[test]
fn mnist_o1_passes_its_gate() {
    passes_its_gates("mnist_o1", mnist_dir());
}

#[test]
fn mnist_o2_passes_its_gate() {
    passes_its_gates("mnist_o2", mnist_dir());
}

#[test]
fn resnet_mnist_o2_passes_its_gate() {
    passes_its_gates("resnet_mnist_o2", mnist_dir());
}

#[test]
#[ignore = "reason: 70 s on 2 cores in a release build, over the minute a CI run of a config may take"]
fn mnist_o3_passes_its_gate() {
    passes_its_gates("mnist_o3", mnist_dir());
}

#[test]
#[ignore = "reason: 6 minutes on 2 quiet cores in a release build (19 beside other builds)"]
fn resnet20_catsdogs_o2_passes_its_gate() {
    passes_its_gates("resnet20_catsdogs_o2", catsdogs_dir());
}

#[test]
#[ignore = "reason: about 6 minutes on 2 cores in a release build, and the data of scripts/fetch-fashion-mnist.sh"]
fn resnet20_fashion_o2_passes_its_gate() {
    passes_its_gates("resnet20_fashion_o2", fashion_dir());
}

/// Every config in configs/ with a gate is one of the tests above (or
/// ci_smoke's own), so a new one cannot ship untested.
#[test]
fn every_gated_config_has_a_test_here() {
    let tested = [
        "ci_smoke",
        "mnist_o0",
        "mnist_o1",
        "mnist_o2",
        "mnist_o3",
        "resnet_mnist_o2",
        "resnet20_catsdogs_o2",
        "resnet20_fashion_o2",
    ];
    for name in names_in(&repo_root().join("configs")) {
        let Some(stem) = name.strip_suffix(".toml") else { continue };
        if !gates(&repo_root().join("configs").join(&name)).is_empty() {
            assert!(tested.contains(&stem), "configs/{name} has an [expect] gate but no test in {}", file!());
        }
    }
}
