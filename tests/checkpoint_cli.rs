//! Checkpoints through the binary: refusals that say what differs, the
//! "auto" fallback to the previous good checkpoint, a save killed midway, and
//! `ddptrain eval`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn corrupt(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    let n = b.len();
    b[n - 3] ^= 0x40;
    std::fs::write(p, b).unwrap();
}

#[test]
fn auto_falls_back_past_a_corrupt_checkpoint_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    corrupt(&out.join("ckpt/step_00000006/model.safetensors"));
    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("step_00000006") && t.contains("model.safetensors is corrupt"), "{t}");
    assert!(t.contains("resuming from the previous good checkpoint") && t.contains("step_00000004"), "{t}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(s["resumed_from"].as_str().unwrap().ends_with("step_00000004"), "{s}");
    assert_eq!(s["steps"], 6);
}

#[test]
fn truncated_and_incomplete_checkpoints_are_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_args(&ckpt_args(&out, &[]), dir.path()).0, Some(0));
    let step4 = out.join("ckpt/step_00000004");
    let f = std::fs::OpenOptions::new().write(true).open(step4.join("optim.safetensors")).unwrap();
    f.set_len(100).unwrap();
    let resume = format!("checkpoint.resume={}", step4.display());
    let other = dir.path().join("other");
    let (code, t) = run_args(&ckpt_args(&other, &[&resume]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("optim.safetensors is truncated or overwritten: 100 bytes"), "{t}");

    std::fs::remove_file(out.join("ckpt/step_00000002/state.json")).unwrap();
    let resume = format!("checkpoint.resume={}", out.join("ckpt/step_00000002").display());
    let (code, t) = run_args(&ckpt_args(&other, &[&resume]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("cannot read state.json") && t.contains("incomplete checkpoint"), "{t}");
}

#[test]
fn incompatible_checkpoints_are_refused_naming_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_args(&ckpt_args(&out, &[]), dir.path()).0, Some(0));
    let latest = out.join("ckpt/latest");
    let resume = format!("checkpoint.resume={}", latest.display());
    let other = dir.path().join("other");

    let (code, t) = run_args(&ckpt_args(&other, &[&resume, "optimizer.lr=0.1"]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("the config differs") && t.contains("optimizer.lr: checkpoint 0.05, this run 0.1"),
        "{t}"
    );

    let narrow = std::fs::read_to_string(repo_root().join("configs/mnist_o0.toml")).unwrap().replacen(
        "out_channels = 16",
        "out_channels = 8",
        1,
    );
    let mut a = ckpt_args(&other, &[&resume]);
    a[1] = write(dir.path(), "mnist_o0.toml", &narrow).display().to_string();
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("the model shapes differ: `layer1.0.bias` is [16] in the checkpoint, [8] here"),
        "{t}"
    );

    let (code, t) = run_args(&ckpt_args(&other, &[&resume, "data.synthetic_train_size=300"]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("data.synthetic_train_size: checkpoint 200, this run 300"), "{t}");

    // Another opt level (O1+ training is not built yet, so the checkpoint claims it).
    let state = latest.join("state.json");
    let text =
        std::fs::read_to_string(&state).unwrap().replace("\"opt_level\": \"O0\"", "\"opt_level\": \"O2\"");
    std::fs::write(&state, text).unwrap();
    let (code, t) = run_args(&ckpt_args(&other, &[&resume]), dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("the opt level differs: the checkpoint was trained at O2, this run is O0"), "{t}");

    // With "auto" and nothing usable left, the run stops rather than silently
    // starting over: the out_dir holds a run this one does not continue.
    let (code, t) = run_args(&ckpt_args(&out, &["optimizer.lr=0.1"]), dir.path());
    assert_eq!(code, Some(2), "{t}");
    assert!(
        t.contains("This run would not continue it: none of its checkpoints can be resumed")
            && t.contains("set run.overwrite = true"),
        "{t}"
    );
    let (code, t) = run_args(&ckpt_args(&out, &["optimizer.lr=0.1", "checkpoint.resume=never"]), dir.path());
    assert_eq!(code, Some(2), "\"never\" does not train over it either: {t}");
    let (code, t) = run_args(&ckpt_args(&out, &["optimizer.lr=0.1", "run.overwrite=true"]), dir.path());
    assert_eq!(code, Some(0), "{t}");
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tmp_save_dir(ckpt: &Path) -> Option<PathBuf> {
    std::fs::read_dir(ckpt).ok()?.flatten().map(|e| e.path()).find(|p| {
        p.file_name().unwrap().to_string_lossy().starts_with(".tmp-step_00000004")
            && p.join("model.safetensors").exists()
    })
}

#[test]
fn a_save_killed_midway_leaves_latest_on_a_complete_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let ckpt = out.join("ckpt");
    let mut a = ckpt_args(&out, &[]);
    a.push("--debug-save-pause-ms=1500".into());
    let mut child = Command::new(env!("CARGO_BIN_EXE_ddptrain"))
        .args(&a)
        .current_dir(dir.path())
        .env_remove("WORLD_SIZE")
        .env(common::HIDE_GPUS.0, common::HIDE_GPUS.1)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the first checkpoint", Duration::from_secs(120), || ckpt.join("latest").exists());
    wait_for("the second save to start", Duration::from_secs(120), || tmp_save_dir(&ckpt).is_some());
    // SIGKILL: no destructor, no cleanup, as in a preemption.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(tmp_save_dir(&ckpt).is_some(), "the kill should land inside the save");
    assert_eq!(std::fs::read_link(ckpt.join("latest")).unwrap(), Path::new("step_00000002"));
    ddptrain::checkpoint::read_checkpoint(&ckpt.join("latest")).expect("latest must be complete");

    let (code, t) = run_args(&ckpt_args(&out, &[]), dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("resuming from") && t.contains("step_00000002"), "{t}");
    assert!(tmp_save_dir(&ckpt).is_none(), "the interrupted save's directory is cleaned up");
    assert_eq!(std::fs::read_link(ckpt.join("latest")).unwrap(), Path::new("step_00000006"));
}

#[test]
fn eval_scores_a_checkpoint_like_the_run_did() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_args(&ckpt_args(&out, &[]), dir.path()).0, Some(0));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let mut a = vec!["eval".to_string()];
    a.extend(ckpt_args(&out, &[]));
    a.push("--checkpoint".into());
    a.push(out.join("ckpt/latest").display().to_string());
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(0), "{t}");
    let acc = format!("test accuracy {:.4}", s["test_accuracy"].as_f64().unwrap());
    let loss = format!("test loss {:.4}", s["test_loss"].as_f64().unwrap());
    assert!(t.contains("(step 6, epoch 1)") && t.contains(&acc) && t.contains(&loss), "{t}\n{s}");

    let n = a.len();
    a[n - 1] = dir.path().join("nope").display().to_string();
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("nope")
            && t.contains("no such checkpoint directory, run directory or model file (.safetensors)"),
        "{t}"
    );

    // A file that is not a weights file: refused saying what it is not.
    a[n - 1] = out.join("summary.json").display().to_string();
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(
        t.contains("summary.json: is neither a checkpoint directory nor a model file (.safetensors): not a valid safetensors file"),
        "{t}"
    );

    // The run's final model file scores as its last evaluation did (O0: the same weights).
    a[n - 1] = out.join("model.safetensors").display().to_string();
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(0), "{t}");
    let want = format!("model file {} at O0: {acc}", out.join("model.safetensors").display());
    assert!(t.contains(&want) && t.contains(&loss), "{t}\n{s}");
}

/// `eval --checkpoint` takes what `sample` takes (a run's out_dir, its
/// `ckpt` folder, a checkpoint, a model file) and reads the config the run
/// saved beside it when no `--config` is given.
#[test]
fn eval_finds_the_weights_and_the_config_a_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    assert_eq!(run_args(&ckpt_args(&out, &[]), dir.path()).0, Some(0));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let acc = format!("test accuracy {:.4}", s["test_accuracy"].as_f64().unwrap());
    let eval = |path: &Path| {
        run_args(&["eval".into(), "--checkpoint".into(), path.display().to_string()], dir.path())
    };
    // The out_dir and its ckpt folder: the latest checkpoint, at the run's own opt level.
    for path in [out.clone(), out.join("ckpt")] {
        let (code, t) = eval(&path);
        assert_eq!(code, Some(0), "{t}");
        assert!(t.contains("ckpt/latest (step 6, epoch 1) at O0") && t.contains(&acc), "{path:?}: {t}\n{s}");
    }
    // An out_dir without checkpoints: its final model file.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for f in ["model.safetensors", "config.toml"] {
        std::fs::copy(out.join(f), bare.join(f)).unwrap();
    }
    let (code, t) = eval(&bare);
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.contains(&format!("model file {} at O0: {acc}", bare.join("model.safetensors").display())),
        "{t}"
    );
    // --set still applies to the saved config.
    let a =
        ["eval", "--checkpoint", &out.display().to_string(), "--set", "amp.opt_level=O2"].map(String::from);
    let (code, t) = run_args(&a, dir.path());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("at O2: test accuracy"), "{t}");
    // A model file with no config beside it: the message says to pass one.
    std::fs::remove_file(bare.join("config.toml")).unwrap();
    let (code, t) = eval(&bare.join("model.safetensors"));
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("no config.toml in it or in the two folders above") && t.contains("--config"), "{t}");
    // A folder with none of a run's files names what it looked for.
    let (code, t) = eval(dir.path());
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("holds no checkpoint (state.json), no ckpt/latest and no model.safetensors"), "{t}");
}

/// The "rank R: final state sha256 X | loss scale ..." lines of a run's ranks, sorted.
fn final_digests(t: &str) -> Vec<String> {
    let mut d: Vec<String> =
        t.lines().filter(|l| l.contains("final state sha256")).map(|l| l.trim().to_string()).collect();
    d.sort();
    d
}

/// Two ranks straight, and two ranks halted after step 3 then resumed from
/// step 2: the final weights, optimizer state (masters included),
/// state.json (scaler included) and every rank's final-state digest are the
/// same. Returns the resumed run's dir.
fn two_rank_resume_is_bitwise(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let (a, b) = (dir.join(format!("{name}_straight")), dir.join(format!("{name}_resumed")));
    let (code, straight) = run_args(&launch2(&ckpt_args(&a, extra)), dir);
    assert_eq!(code, Some(0), "{straight}");
    let mut halt = ckpt_args(&b, extra);
    halt.extend(["--halt-after-steps".into(), "3".into()]);
    let (code, t) = run_args(&launch2(&halt), dir);
    assert_ne!(code, Some(0), "{t}");
    assert_eq!(std::fs::read_link(b.join("ckpt/latest")).unwrap(), Path::new("step_00000002"));

    let (code, t) = run_args(&launch2(&ckpt_args(&b, extra)), dir);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("[rank 1] resuming from") && t.contains("step_00000002"), "{t}");
    let digests = final_digests(&straight);
    assert_eq!(digests.len(), 2, "{straight}");
    assert_eq!(digests, final_digests(&t), "{name}: the ranks' final states differ");
    for f in ["model.safetensors", "ckpt/latest/model.safetensors", "ckpt/latest/optim.safetensors"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{name}: {f} differs"
        );
    }
    let state = |d: &Path| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("ckpt/latest/state.json")).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("train_time_s");
        v.as_object_mut().unwrap().remove("wall_s");
        v
    };
    assert_eq!(state(&a), state(&b), "{name}: state.json differs");
    b
}

#[test]
fn two_ranks_resume_from_rank_0s_files_bitwise_and_fail_together_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let b = two_rank_resume_is_bitwise(dir.path(), "o0", &[]);

    // Rank 0 cannot read the checkpoint: every rank exits non-zero with its reason, at once.
    let step6 = b.join("ckpt/step_00000006");
    corrupt(&step6.join("model.safetensors"));
    let resume = format!("checkpoint.resume={}", step6.display());
    let t0 = Instant::now();
    let (code, t) = run_args(&launch2(&ckpt_args(&dir.path().join("c"), &[&resume])), dir.path());
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("[rank 0]") && t.contains("model.safetensors is corrupt"), "{t}");
    assert!(t.contains("[rank 1]") && t.contains("rank 0 cannot resume, so rank 1 cannot either"), "{t}");
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}: {t}", t0.elapsed());
}

#[test]
fn two_ranks_resume_o2_with_masters_and_a_moving_loss_scale_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    // Steps 1-2 overflow from 2^18 down; the scale then grows after 2 clean steps.
    let o2 = [
        "amp.opt_level=O2",
        "amp.init_scale=262144",
        "amp.growth_interval=2",
        "parallel.sync_batchnorm=false",
    ];
    let b = two_rank_resume_is_bitwise(dir.path(), "o2", &o2);
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("ckpt/step_00000002/state.json")).unwrap()).unwrap();
    assert!(s["scaler"]["overflow_steps"].as_u64().unwrap() > 0, "{}", s["scaler"]);
    let end: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("ckpt/latest/state.json")).unwrap()).unwrap();
    assert!(
        end["optimizer"]["step_count"].as_u64().unwrap() >= 2,
        "the masters moved after the resume: {end}"
    );
}

#[test]
fn two_ranks_resume_an_epoch_end_with_each_ranks_pending_f16_gradients_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    // 400 samples per rank at batch 50 and 3 micro-batches per step: 2 steps an
    // epoch, and each epoch ends with 2 micro-batches pending whose gradients
    // (f16 under O2, accumulated locally by each rank) carry into step 3.
    let accum = [
        "amp.opt_level=O2",
        "parallel.sync_batchnorm=false",
        "data.synthetic_train_size=800",
        "train.grad_accum_steps=3",
        "train.max_steps=4",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=1",
    ];
    let b = two_rank_resume_is_bitwise(dir.path(), "accum", &accum);
    let step2 = b.join("ckpt/step_00000002");
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step2.join("state.json")).unwrap()).unwrap();
    assert_eq!((s["epoch"].as_u64(), s["pending_grads"].as_bool()), (Some(1), Some(true)), "{s}");
    let optim = ddptrain::checkpoint::load_safetensors(&step2.join("optim.safetensors")).unwrap();
    let grad = |name: &str| optim.iter().find(|e| e.name == name).map(|e| e.value.clone());
    let (g0, g1) = (grad("fc.weight.grad").unwrap(), grad("rank1.fc.weight.grad").unwrap());
    assert_ne!(g0, g1, "the ranks' pending gradients differ, so each must get its own back");
}

/// `ddptrain eval --json` of `ckpt` with `extra` settings.
fn eval_json(out: &Path, ckpt: &Path, extra: &[&str], cwd: &Path) -> serde_json::Value {
    let mut a = vec!["eval".to_string()];
    a.extend(ckpt_args(out, extra));
    a.extend(["--checkpoint".into(), ckpt.display().to_string(), "--json".into()]);
    let (code, t) = run_args(&a, cwd);
    assert_eq!(code, Some(0), "{t}");
    let line = t.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON line: {t}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn eval_of_an_o2_checkpoint_scores_the_runs_model_and_at_o0_its_fp32_masters() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o2 = ["amp.opt_level=O2"];
    let (code, t) = run_args(&ckpt_args(&out, &o2), dir.path());
    assert_eq!(code, Some(0), "{t}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let latest = out.join("ckpt/latest");

    // At O2, the f16 model cast from the fp32 weights: the run's own final evaluation, exactly.
    let ev = eval_json(&out, &latest, &o2, dir.path());
    assert_eq!((ev["step"].as_u64(), ev["opt_level"].as_str()), (Some(6), Some("O2")), "{ev}");
    assert_eq!(ev["test_loss"].as_f64(), s["test_loss"].as_f64(), "{ev}\n{s}");
    assert_eq!(ev["test_accuracy"], s["test_accuracy"], "{ev}\n{s}");

    // At O0, the fp32 masters (the run's out_dir/model.safetensors) in the fp32 model,
    // not their f16 rounding that model.safetensors of the checkpoint holds.
    let ev0 = eval_json(&out, &latest, &[], dir.path());
    let sets: Vec<String> = ckpt_args(&out, &[]).into_iter().skip(3).step_by(2).collect();
    let cfg = ddptrain::config::load(&repo_root().join("configs/mnist_o0.toml"), &sets).unwrap();
    let ddptrain::train::Prepared { mut model, test_ds, .. } = ddptrain::train::prepare(&cfg).unwrap();
    let weights = out.join("model.safetensors");
    model.load_state_dict(ddptrain::checkpoint::load_safetensors(&weights).unwrap(), &weights).unwrap();
    let fp32 = ddptrain::train::evaluate(&model, &test_ds, cfg.data.eval_batch_size, 0).unwrap();
    assert_eq!(ev0["test_loss"].as_f64(), Some(fp32.loss), "{ev0}");
    assert_ne!(ev0["test_loss"], ev["test_loss"], "O0 and O2 evaluate in different precisions");

    // The model file holds the fp32 masters: at O0 the fp32 model, at O2 the run's own evaluation.
    let file0 = eval_json(&out, &weights, &[], dir.path());
    assert_eq!((file0["kind"].as_str(), file0["step"].is_null()), (Some("model file"), true), "{file0}");
    assert_eq!(file0["test_loss"], ev0["test_loss"], "{file0}\n{ev0}");
    let file2 = eval_json(&out, &weights, &o2, dir.path());
    assert_eq!(file2["test_loss"].as_f64(), s["test_loss"].as_f64(), "{file2}\n{s}");
    assert_eq!(file2["test_accuracy"], s["test_accuracy"], "{file2}\n{s}");
}
