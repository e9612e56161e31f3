//! A GPT on `dataset = "text"` through the binary and the library: the
//! validation loss every `train.eval_every` steps and at the end, in the log,
//! `metrics.jsonl` and `summary.json` (perplexity, tokens/s), the
//! `max_val_loss` gate, and a mid-run resume bit for bit.

mod common;
use common::resume::{final_state, halted, read};
use common::*;
use ddptrain::config::{self, Config};
use ddptrain::train;
use std::path::{Path, PathBuf};

/// The recipe over tests/common/gpt.toml's GPT (1 layer, 2 heads, 16 wide, 8 bytes).
const RECIPE: &[&str] = &[
    "run.seed=7",
    "optimizer.lr=3e-3",
    "scheduler.name=cosine",
    "scheduler.warmup_steps=2",
    "scheduler.eta_min=3e-4",
    "train.max_steps=10",
    "train.eval_every=4",
    "train.eval_iters=2",
    "logging.every_steps=2",
];

/// The config (`transformer.drop` at `dropout`) and a 6 KB text beside it in
/// `dir`, and the recipe's `--set`s, `data.path` included.
fn setup(dir: &Path, dropout: &str) -> (PathBuf, Vec<String>) {
    let line = "It is the duty of the president to report on the state of the union.\n";
    let data = write(dir, "input.txt", &line.repeat(90));
    let cfg = write(dir, "gpt.toml", &gpt_config("bytes", 256, (1, 2, 16, 8), dropout));
    let mut sets: Vec<String> = RECIPE.iter().map(|s| s.to_string()).collect();
    sets.push(format!("data.path={}", data.display()));
    (cfg, sets)
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&read(p)).unwrap()
}

#[test]
fn a_text_run_reports_validation_loss_perplexity_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, recipe) = setup(dir.path(), "0.0");
    let out = dir.path().join("out");
    let run = |out: &Path, sets: &[&str]| {
        let mut args = vec!["--config".to_owned(), cfg.display().to_string()];
        let out = format!("run.out_dir={}", out.display());
        for s in recipe.iter().map(String::as_str).chain([out.as_str()]).chain(sets.iter().copied()) {
            args.extend(["--set".to_owned(), s.to_owned()]);
        }
        run_args(&args, dir.path())
    };
    let (code, t) = run(&out, &["expect.max_val_loss=0.01", "logging.tensorboard=true"]);
    // 10 steps cannot bring a byte model's loss to 0.01 nats: exit 3 with the verdict.
    assert_eq!(code, Some(3), "{t}");
    let s = read_json(&out.join("summary.json"));
    let val = s["val_loss"].as_f64().unwrap();
    assert!(t.contains(&format!("FAIL expect.max_val_loss: expected <= 0.0100, got {val:.4}")), "{t}");
    assert!(val.is_finite() && val < 256f64.ln(), "{s}");
    assert_eq!(s["perplexity"].as_f64(), Some(val.exp()));
    // serde_json's default float parsing may land 1 ulp off the written value.
    let (tokens, images) = (s["tokens_per_s"].as_f64().unwrap(), s["images_per_s"].as_f64().unwrap());
    assert!((tokens - images * 8.0).abs() <= 1e-12 * tokens, "{s}");
    assert!(s["test_accuracy"].is_null() && s["test_loss"].is_null(), "{s}");
    assert!(t.contains("tokens/s") && !t.contains("images/s"), "{t}");
    assert!(t.contains("step 4 | epoch 0 | val loss ") && t.contains("(64 tokens)"), "{t}");
    assert!(t.contains(&format!("val loss {val:.4} (perplexity {:.2})", val.exp())), "{t}");

    let lines: Vec<serde_json::Value> = String::from_utf8(read(&out.join("metrics.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let evals: Vec<_> = lines.iter().filter(|l| l["kind"] == "eval").collect();
    let steps: Vec<u64> = evals.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    // Every 4 steps and at the end; 2 batches of 4 windows of 8 tokens each time.
    assert_eq!(steps, vec![4, 8, 10]);
    // All inside epoch 0, the final evaluation of the run max_steps ended too.
    assert!(t.contains("step 10 | epoch 0 | val loss "), "{t}");
    for e in &evals {
        assert_eq!(e["epoch"], 0, "{e}");
        assert_eq!(e["tokens"], 64);
        assert_eq!(e["perplexity"].as_f64(), e["val_loss"].as_f64().map(f64::exp));
        assert!(e.get("test_accuracy").is_none(), "{e}");
    }
    assert_eq!(evals[2]["val_loss"].as_f64(), Some(val));
    let train: Vec<_> = lines.iter().filter(|l| l["kind"] == "train").collect();
    assert!(train.iter().all(|l| l["tokens_per_s"].as_f64().is_some_and(|v| v > 0.0)), "{train:?}");
    assert!(train.iter().all(|l| l.get("images_per_s").is_none()), "{train:?}");

    // TensorBoard's tags (event files hold them as plain bytes).
    let mut events = Vec::new();
    for e in std::fs::read_dir(out.join("tb")).unwrap() {
        events.extend(read(&e.unwrap().path()));
    }
    for tag in ["val/loss", "val/perplexity", "val/tokens", "train/tokens_per_s"] {
        assert!(events.windows(tag.len()).any(|w| w == tag.as_bytes()), "no {tag} in the event files");
    }
    assert!(!events.windows(5).any(|w| w == b"test/"), "a text run wrote test/ scalars");

    // A reachable gate passes.
    let (code, t) = run(&dir.path().join("out2"), &["expect.max_val_loss=100"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains(&format!("PASS expect.max_val_loss: expected <= 100.0000, got {val:.4}")), "{t}");
}

fn cfg(dir: &Path, out: &Path, device: &str) -> Config {
    // Dropout draws: a resume must redraw the masks an unbroken run would.
    let (cfg, mut sets) = setup(dir, "0.1");
    sets.extend([
        format!("run.out_dir={}", out.display()),
        "checkpoint.every_steps=3".to_owned(),
        format!("run.device={device}"),
    ]);
    config::load(&cfg, &sets).unwrap()
}

/// metrics.jsonl less timings and checkpoint records (a resumed run saves at other steps).
fn metrics(out: &Path) -> Vec<serde_json::Value> {
    String::from_utf8(read(&out.join("metrics.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] != "checkpoint")
        .map(|mut v| {
            v.as_object_mut().unwrap().remove("tokens_per_s");
            v
        })
        .collect()
}

#[test]
fn a_text_run_resumed_mid_run_is_bitwise() {
    resumed_mid_run_is_bitwise("cpu");
}

/// On the device: the windows of the resumed epoch cut out of the token
/// stream again, the dropout masks redrawn, the optimizer's decay groups kept.
#[test]
fn a_text_run_on_the_gpu_resumed_mid_run_is_bitwise() {
    if ddptrain::cuda::test_gpu("a_text_run_on_the_gpu_resumed_mid_run_is_bitwise").is_some() {
        resumed_mid_run_is_bitwise("cuda");
    }
}

fn resumed_mid_run_is_bitwise(device: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let straight = train::train(&cfg(dir.path(), &a, device)).unwrap();
    assert!(straight.device.starts_with(device), "{}", straight.device);
    // Halted after step 7: the checkpoint of step 6 (after the evaluation of step 4) resumes.
    let cb = cfg(dir.path(), &b, device);
    halted(&cb, 7);
    let resumed = train::train(&cb).unwrap();
    assert_eq!(resumed.resumed_from.as_deref(), Some(b.join("ckpt/step_00000006").as_path()));
    assert_eq!(resumed.val_loss.map(f64::to_bits), straight.val_loss.map(f64::to_bits));
    assert_eq!(resumed.final_loss.to_bits(), straight.final_loss.to_bits());
    assert!(read(&a.join("model.safetensors")) == read(&b.join("model.safetensors")), "final weights differ");
    let ((ma, oa, sa), (mb, ob, sb)) = (final_state(&a), final_state(&b));
    assert!(ma == mb && oa == ob, "checkpointed weights or optimizer state differ");
    assert_eq!(sa, sb, "state.json differs");
    assert_eq!(metrics(&a), metrics(&b));
    assert!(read(&b.join("vocab.json")) == read(&a.join("vocab.json")));
}

/// A vocabulary larger than the model's logits is refused in the config's
/// words (`data.vocab = "chars"`), naming the key to change.
#[test]
fn a_vocabulary_the_model_cannot_predict_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let line = "It is the duty of the president to report on the state of the union.\n";
    let data = write(dir.path(), "input.txt", &line.repeat(20));
    let cfg = write(dir.path(), "gpt.toml", &gpt_config("chars", 4, (1, 2, 16, 8), "0.0"));
    let sets = [
        format!("data.path={}", data.display()),
        format!("run.out_dir={}", dir.path().join("out").display()),
    ];
    let mut args = vec!["--config".to_owned(), cfg.display().to_string()];
    for s in sets {
        args.extend(["--set".to_owned(), s]);
    }
    let (code, t) = run_args(&args, dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains("has 18 distinct tokens (data.vocab = \"chars\"); set the vocabulary size to at least 18"),
        "{t}"
    );
    assert!(!t.contains("Chars"), "{t}");
}
