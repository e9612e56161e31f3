//! `ddptrain sample`: text from a text run's out_dir, `ckpt` folder,
//! checkpoint or model file, found through the `config.toml` and
//! `vocab.json` the run wrote; the same seed gives the same text; a model
//! trained on one sentence continues it; and every argument a user can get
//! wrong is refused, exit 2, saying what to do.

mod common;
use common::*;
use std::path::{Path, PathBuf};

const LINE: &str = "the cat sat on the mat.\n";

/// The training run's settings over the config, as `--set` values.
fn recipe(data: &Path, out: &Path) -> Vec<String> {
    vec![
        format!("data.path={}", data.display()),
        format!("run.out_dir={}", out.display()),
        "run.seed=3".into(),
        "amp.opt_level=\"O2\"".into(),
        "optimizer.lr=1e-2".into(),
        "train.max_steps=150".into(),
        "train.eval_every=150".into(),
        "train.eval_iters=1".into(),
        "checkpoint.every_steps=50".into(),
    ]
}

/// A 1-layer character GPT (block 16) trained on LINE repeated, at O2 with
/// a checkpoint every 50 steps; returns (dir, config, out_dir).
fn trained() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = write(dir.path(), "input.txt", &LINE.repeat(200));
    let vocab = LINE.chars().collect::<std::collections::BTreeSet<_>>().len();
    let cfg = write(dir.path(), "gpt.toml", &gpt_config("chars", vocab, (1, 2, 32, 16), "0.0"));
    let out = dir.path().join("out");
    let mut args = vec!["--config".to_owned(), cfg.display().to_string()];
    for s in recipe(&data, &out) {
        args.extend(["--set".to_owned(), s]);
    }
    let (code, t) = run_args(&args, dir.path());
    assert_eq!(code, Some(0), "{t}");
    (dir, cfg, out)
}

fn sample(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut a = vec!["sample"];
    a.extend_from_slice(args);
    let o = ddptrain(&a, dir);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn sample_continues_the_text_a_model_was_trained_on() {
    let (dir, cfg, out) = trained();
    let d = dir.path();
    let o = out.display().to_string();
    let args = ["--checkpoint", &o, "--prompt", "the c", "--tokens", "40", "--seed", "5"];
    let (code, text, err) = sample(d, &args);
    assert_eq!(code, Some(0), "{text}{err}");
    let text = text.strip_suffix('\n').unwrap();
    assert_eq!(text.chars().count(), 5 + 40, "{text:?}");
    assert!(text.starts_with("the c"), "{text:?}");
    // Near-greedy, the sentence comes back; at the default temperature it is
    // the sentence's characters at least.
    let (_, greedy, _) = sample(d, &[&args[..6], &["--temperature", "0.01"]].concat());
    assert!(LINE.repeat(4).contains(greedy.strip_suffix('\n').unwrap()), "{greedy:?}");
    assert!(text.chars().all(|c| LINE.contains(c)), "{text:?}");

    // The same seed, the same text; the final weights equal the last checkpoint's.
    assert_eq!(sample(d, &args).1, format!("{text}\n"));
    let ckpt = out.join("ckpt").display().to_string();
    let last = out.join("ckpt/step_00000150").display().to_string();
    let file = out.join("model.safetensors").display().to_string();
    for path in [&ckpt, &last, &file] {
        let mut a = args.to_vec();
        a[1] = path;
        assert_eq!(sample(d, &a).1, format!("{text}\n"), "from {path}");
    }
    // The model has learned the sentence: seeds differ only where the
    // temperature flattens its certainty. Samples are separated as nanoGPT's.
    let hot = |seed: &str| {
        let mut a = args.to_vec();
        a[7] = seed;
        sample(d, &[&a[..], &["--temperature", "5", "--top-k", "all"]].concat()).1
    };
    assert_ne!(hot("5"), hot("6"));
    assert_eq!(hot("5"), hot("5"));
    let (_, three, _) = sample(d, &[&args[..], &["--num-samples", "3"]].concat());
    assert_eq!(three.matches("\n---------------\n").count(), 2, "{three}");
    assert!(
        three.starts_with(&format!("{text}\n")),
        "sample 0 of a seed is the same alone or among 3: {three}"
    );

    // The config the run wrote is the one it ran: it loads, to the same settings.
    let written = ddptrain::config::load(&out.join("config.toml"), &[]).unwrap();
    let original = ddptrain::config::load(&cfg, &recipe(&d.join("input.txt"), &out)).unwrap();
    assert_eq!(written.fingerprint_json(), original.fingerprint_json());
    assert!(out.join("ckpt/step_00000050/config.toml").is_file());

    // `ddptrain eval` scores a text checkpoint as the run's evaluation did.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let sets: Vec<String> =
        recipe(&d.join("input.txt"), &out).into_iter().flat_map(|s| ["--set".into(), s]).collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let c = cfg.display().to_string();
    let o = ddptrain(&[&["eval", "--config", &c, "--checkpoint", &last, "--json"], &sets[..]].concat(), d);
    let rec: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", common::text(&o)));
    assert_eq!(rec["val_loss"].as_f64(), summary["val_loss"].as_f64(), "{rec}");
    assert_eq!(rec["tokens"], 4 * 16, "eval_iters = 1 batch of 4 windows of 16 tokens: {rec}");
    assert!(rec.get("test_accuracy").is_none(), "{rec}");
    let o = ddptrain(&[&["eval", "--config", &c, "--checkpoint", &last], &sets[..]].concat(), d);
    let line = format!(
        "at O2: val loss {:.4} (perplexity {:.2}) over 64 tokens",
        summary["val_loss"].as_f64().unwrap(),
        summary["val_loss"].as_f64().unwrap().exp()
    );
    assert!(common::text(&o).contains(&line), "{}", common::text(&o));
}

#[test]
fn sample_refuses_what_it_cannot_use_and_says_what_to_do() {
    let (dir, _cfg, out) = trained();
    let d = dir.path();
    let o = out.display().to_string();
    let refused = |args: &[&str], code: i32, says: &[&str]| {
        let (c, text, err) = sample(d, &[&["--checkpoint", &o], args].concat());
        assert_eq!(c, Some(code), "{args:?}: {text}{err}");
        for s in says {
            assert!(err.contains(s), "{args:?}: {err}");
        }
    };
    refused(
        &["--prompt", "the dog"],
        2,
        &["the prompt has 'd'", "not in the model's vocabulary (12 characters"],
    );
    refused(&["--temperature", "0"], 2, &["--temperature must be a number above 0 (got 0)"]);
    refused(&["--temperature", "NaN"], 2, &["--temperature must be a number above 0"]);
    refused(&["--top-k", "0"], 2, &["`0` is not a count of tokens of at least 1, or \"all\""]);
    refused(&["--prompt", ""], 2, &["the prompt is empty"]);
    let mnist = repo_root().join("configs/mnist_o0.toml").display().to_string();
    refused(&["--config", &mnist], 2, &["sample generates text", "dataset = \"mnist\"", "ddptrain eval"]);

    let (c, _, err) = sample(d, &["--checkpoint", &d.join("nope").display().to_string()]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.contains("no such checkpoint directory, run directory or model file"), "{err}");
    // A folder without the run's config: the message asks for --config, which then works.
    let moved = d.join("weights");
    std::fs::create_dir(&moved).unwrap();
    std::fs::copy(out.join("model.safetensors"), moved.join("model.safetensors")).unwrap();
    let m = moved.join("model.safetensors").display().to_string();
    let (c, _, err) = sample(d, &["--checkpoint", &m]);
    assert_eq!(c, Some(1), "{err}");
    assert!(
        err.contains("no config.toml in it or in the two folders above") && err.contains("--config"),
        "{err}"
    );
    std::fs::copy(out.join("config.toml"), moved.join("run.toml")).unwrap();
    let r = moved.join("run.toml").display().to_string();
    let (c, _, err) = sample(d, &["--checkpoint", &m, "--config", &r, "--tokens", "3"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.contains("no vocab.json in it or in the two folders above"), "{err}");
    std::fs::write(moved.join("vocab.json"), r#"{"vocab": "bytes"}"#).unwrap();
    let (c, _, err) = sample(d, &["--checkpoint", &m, "--config", &r, "--tokens", "3"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(
        err.contains("has 256 tokens, and the model predicts [16, 12]: not this model's vocabulary"),
        "{err}"
    );
    std::fs::copy(out.join("vocab.json"), moved.join("vocab.json")).unwrap();
    let (c, text, err) = sample(d, &["--checkpoint", &m, "--config", &r, "--tokens", "3"]);
    assert_eq!(c, Some(0), "{err}");
    assert_eq!(text.chars().count(), 1 + 3 + 1, "the default prompt is a newline: {text:?}");
}
