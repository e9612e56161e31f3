//! `ddptrain check` as a dry run, through the binary: it refuses what
//! training would refuse after the config's validation (missing or broken
//! data, labels past `data.num_classes`, a vocabulary the model cannot
//! predict, an out_dir that is a file, in use, or holding another run),
//! each with training's own message, exits 2, and writes nothing; a valid
//! config still passes, without reading the images.

mod common;
use common::*;
use std::path::{Path, PathBuf};

/// The MNIST config with `sets` (KEY=VALUE) and the out_dir `out`.
fn args(config: &Path, out: &Path, sets: &[String]) -> Vec<String> {
    let mut a = vec!["--config".to_owned(), config.display().to_string()];
    let out = format!("run.out_dir={}", out.display());
    for s in std::iter::once(&out).chain(sets) {
        a.extend(["--set".to_owned(), s.clone()]);
    }
    a
}

fn mnist() -> PathBuf {
    repo_root().join("configs/mnist_o2.toml")
}

fn data_at(dir: &Path) -> String {
    format!("data.path={}", dir.display())
}

/// The line training prints for its refusal of `a` (run in `cwd`): its exit code and the line.
fn training_error(a: &[String], cwd: &Path) -> (Option<i32>, String) {
    let (code, t) = run_args(a, cwd);
    let line = t.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("no error: {t}"));
    (code, line.to_owned())
}

/// `check` of `a` refuses with training's own error line, exit 2, writing nothing; returns that line.
fn refused_like_training(a: &[String], cwd: &Path, out: &Path) -> String {
    let existed = out.exists();
    let mut check = vec!["check".to_owned()];
    check.extend_from_slice(a);
    let (code, t) = run_args(&check, cwd);
    assert_eq!(code, Some(2), "{t}");
    assert!(!t.contains("config OK"), "{t}");
    assert_eq!(out.exists(), existed, "check wrote {}: {t}", out.display());
    let (train_code, line) = training_error(a, cwd);
    assert_ne!(train_code, Some(0));
    assert!(t.lines().any(|l| l == line), "check did not say what training says ({line}):\n{t}");
    line
}

#[test]
fn a_valid_config_passes_writing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut check = vec!["check".to_owned()];
    check.extend(args(&mnist(), &out, &[data_at(&mnist_dir())]));
    let (code, t) = run_args(&check, dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("config OK"), "{t}");
    assert!(!out.exists(), "check wrote {}", out.display());
}

#[test]
fn missing_data_is_refused_as_training_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let a = args(&mnist(), &out, &["data.path=/nonexistent".to_owned()]);
    let line = refused_like_training(&a, dir.path(), &out);
    assert!(line.contains("/nonexistent/train-images-idx3-ubyte: missing"), "{line}");
}

#[test]
fn a_truncated_images_file_and_labels_past_num_classes_are_refused_as_training_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let data = dir.path().join("mnist");
    std::fs::create_dir(&data).unwrap();
    for f in [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ] {
        std::fs::copy(mnist_dir().join(f), data.join(f)).unwrap();
    }
    // Five classes, five logits: a valid config whose digits go up to 9.
    let text = std::fs::read_to_string(mnist()).unwrap();
    assert!(text.contains("out_features = 10 "), "{text}");
    let five = write(dir.path(), "five.toml", &text.replace("out_features = 10 ", "out_features = 5 "));
    let sets = [data_at(&data), "data.num_classes=5".to_owned()];
    let line = refused_like_training(&args(&five, &out, &sets), dir.path(), &out);
    assert!(
        line.contains("`data.num_classes`: is 5 but the train labels in") && line.contains("go up to 9"),
        "{line}"
    );

    let images = data.join("t10k-images-idx3-ubyte");
    let f = std::fs::OpenOptions::new().write(true).open(&images).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 100).unwrap();
    let line = refused_like_training(&args(&mnist(), &out, &[data_at(&data)]), dir.path(), &out);
    assert!(line.contains(&format!("{}: truncated: header says", images.display())), "{line}");
    assert!(line.contains(&format!("but the file has {} bytes", len - 100)), "{line}");
}

#[test]
fn a_vocabulary_the_model_cannot_predict_is_refused_as_training_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let line = "It is the duty of the president to report on the state of the union.\n";
    let data = write(dir.path(), "input.txt", &line.repeat(20));
    let cfg = write(dir.path(), "gpt.toml", &gpt_config("chars", 4, (1, 2, 16, 8), "0.0"));
    let line = refused_like_training(&args(&cfg, &out, &[data_at(&data)]), dir.path(), &out);
    assert!(line.contains("has 18 distinct tokens (data.vocab = \"chars\")"), "{line}");
}

#[test]
fn an_out_dir_that_is_a_file_is_in_use_or_holds_another_run_is_refused_as_training_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_at(&mnist_dir());
    let file = write(dir.path(), "plain", "x");
    let line = refused_like_training(&args(&mnist(), &file, std::slice::from_ref(&data)), dir.path(), &file);
    assert!(line.contains("is a file, not a directory"), "{line}");

    let out = dir.path().join("held");
    let lock = ddptrain::checkpoint::RunLock::acquire(&out).unwrap();
    let line = refused_like_training(&args(&mnist(), &out, std::slice::from_ref(&data)), dir.path(), &out);
    assert!(
        line.contains("is in use by another ddptrain run") && line.contains(&std::process::id().to_string()),
        "{line}"
    );
    drop(lock);

    // A finished run in the out_dir, which checkpoint.resume = "never" would not continue.
    let out = dir.path().join("done");
    let mut train = ckpt_args(&out, &[]);
    train.extend(["--set".to_owned(), "train.max_steps=2".to_owned()]);
    let (code, t) = run_args(&train, dir.path());
    assert_eq!(code, Some(0), "{t}");
    let mut never = ckpt_args(&out, &["checkpoint.resume=\"never\""]);
    never.extend(["--set".to_owned(), "train.max_steps=2".to_owned()]);
    let line = refused_like_training(&never, dir.path(), &out);
    assert!(
        line.contains("holds another run's files: a finished run") && line.contains("Nothing was written"),
        "{line}"
    );
    // The same run again continues it (resume = "auto"): no refusal.
    let mut check = vec!["check".to_owned()];
    check.extend(train);
    let (code, t) = run_args(&check, dir.path());
    assert_eq!(code, Some(0), "{t}");
}

#[test]
fn cifar_files_are_checked_by_size_and_labels_and_a_truncated_one_is_refused_as_training_refuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let config = repo_root().join("configs/resnet20_catsdogs_o2.toml");
    let data = dir.path().join("catsdogs");
    std::fs::create_dir(&data).unwrap();
    for f in ["data_batch_1.bin", "test_batch.bin"] {
        std::fs::copy(catsdogs_dir().join(f), data.join(f)).unwrap();
    }
    let mut check = vec!["check".to_owned()];
    check.extend(args(&config, &out, &[data_at(&data)]));
    let (code, t) = run_args(&check, dir.path());
    assert_eq!(code, Some(0), "{t}");

    // A label past CIFAR-10's classes in the last record, then a cut file.
    let test = data.join("test_batch.bin");
    let mut bytes = std::fs::read(&test).unwrap();
    let last = bytes.len() - 3073;
    bytes[last] = 10;
    std::fs::write(&test, &bytes).unwrap();
    let line = refused_like_training(&args(&config, &out, &[data_at(&data)]), dir.path(), &out);
    assert!(line.contains("label 10 of record") && line.contains("is out of range"), "{line}");
    std::fs::write(&test, &bytes[..bytes.len() - 5]).unwrap();
    let line = refused_like_training(&args(&config, &out, &[data_at(&data)]), dir.path(), &out);
    assert!(line.contains(&format!("{}: truncated: ", test.display())), "{line}");
}
