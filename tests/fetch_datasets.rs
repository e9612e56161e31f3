//! scripts/fetch-fashion-mnist.sh and scripts/fetch-catsdogs.sh without the
//! network: a target that already holds valid files is left alone, and a
//! missing download tool is a clear error that writes nothing.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script(name: &str, target: &Path, path: Option<&Path>) -> Output {
    let mut cmd = Command::new(which("bash").unwrap());
    cmd.arg(repo_root().join("scripts").join(name)).arg(target);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().unwrap()
}

/// A PATH with python3 and the shell tools the scripts use, but not npm,
/// apt-get or dpkg-deb.
fn bare_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let tools = [
        "python3", "bash", "mktemp", "rm", "mkdir", "dirname", "cat", "mv", "cp", "chmod", "ls", "head",
        "sed",
    ];
    for tool in tools {
        if let Ok(p) = which(tool) {
            std::os::unix::fs::symlink(p, bin.join(tool)).unwrap();
        }
    }
    bin
}

fn modified(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

#[test]
fn catsdogs_fetch_leaves_valid_files_alone_and_names_missing_npm() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("catsdogs");
    std::fs::create_dir(&target).unwrap();
    let records = |n: usize| -> Vec<u8> {
        (0..n).flat_map(|i| std::iter::once(if i % 2 == 0 { 3 } else { 5 }).chain([0u8; 3072])).collect()
    };
    std::fs::write(target.join("data_batch_1.bin"), records(1600)).unwrap();
    std::fs::write(target.join("test_batch.bin"), records(400)).unwrap();
    let before = modified(&target.join("data_batch_1.bin"));
    let o = script("fetch-catsdogs.sh", &target, None);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("already holds valid CIFAR-10 files (train 1600, test 400)"), "{t}");
    assert_eq!(modified(&target.join("data_batch_1.bin")), before, "an idempotent fetch must not rewrite");

    // One cat too many: not the script's split, so it would fetch, and without npm it cannot.
    std::fs::write(target.join("test_batch.bin"), [records(399), records(1)].concat()).unwrap();
    let o = script("fetch-catsdogs.sh", &target, Some(&bare_path(dir.path())));
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("fetch-catsdogs: error: npm is not installed"), "{t}");
    assert_eq!(modified(&target.join("data_batch_1.bin")), before);
}

#[test]
fn fashion_mnist_fetch_leaves_valid_files_alone_and_names_missing_apt() {
    use ddptrain::data::idx::{write_images, write_labels};
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("fashion-mnist");
    std::fs::create_dir(&target).unwrap();
    for (prefix, n) in [("train", 60000), ("t10k", 10000)] {
        write_images(&target.join(format!("{prefix}-images-idx3-ubyte.gz")), 28, 28, &vec![0; n * 784])
            .unwrap();
        write_labels(&target.join(format!("{prefix}-labels-idx1-ubyte.gz")), &vec![7; n]).unwrap();
    }
    let labels = target.join("t10k-labels-idx1-ubyte.gz");
    let before = modified(&labels);
    let o = script("fetch-fashion-mnist.sh", &target, None);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("already holds valid Fashion-MNIST IDX files (train 60000, test 10000)"), "{t}");
    assert_eq!(modified(&labels), before, "an idempotent fetch must not rewrite");

    // 9,999 test labels: incomplete, so it would fetch, and without apt-get it cannot.
    write_labels(&labels, &[7; 9999]).unwrap();
    let o = script("fetch-fashion-mnist.sh", &target, Some(&bare_path(dir.path())));
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("fetch-fashion-mnist: error: apt-get is not available"), "{t}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().starts_with(".fashion")),
        "staging left behind: {left:?}"
    );
}

fn which(tool: &str) -> Result<PathBuf, ()> {
    let o = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_err(|_| ())?;
    let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if o.status.success() && !p.is_empty() {
        Ok(std::fs::canonicalize(p).map_err(|_| ())?)
    } else {
        Err(())
    }
}
