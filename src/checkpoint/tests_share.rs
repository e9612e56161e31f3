//! O2 checkpoints carry the fp32 masters and the dynamic loss scaler; a resume
//! refuses masters that are missing, mis-shaped or foreign, and a scaler state
//! that does not fit; on two TCP ranks only rank 0 reads the files, and its
//! failure reaches the other rank.

use super::load::{parse_checkpoint, read_raw};
use super::share::{decode_message, encode_message, ResumeMessage};
use super::*;
use crate::amp::{Amp, LossScaler, Policy, ScalerState};
use crate::config::{self, Config};
use crate::dist::rendezvous::{join, serve, RendezvousOpts};
use crate::dist::{Communicator, TcpCommunicator};
use crate::nn::{Model, StateValue};
use crate::optim::Optimizer;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

struct Run {
    model: Model,
    opt: Optimizer,
    amp: Amp,
    ckpt: Checkpointer,
}

fn config(out: &Path, extra: &[&str]) -> Config {
    let mut sets: Vec<String> = ["amp.opt_level=O2", "optimizer.momentum=0.9", "data.dataset=synthetic"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    sets.push(format!("run.out_dir={}", out.display()));
    sets.extend(extra.iter().map(|s| s.to_string()));
    config::load(&crate::testing::repo_root().join("configs/mnist_o0.toml"), &sets).unwrap()
}

fn run(out: &Path, rank: usize, extra: &[&str]) -> Run {
    let cfg = config(out, extra);
    let mut model = Model::new(&cfg.resolve_model().unwrap(), cfg.run.seed).unwrap();
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    let opt = Optimizer::new(crate::train::optimizer_config(&cfg.optimizer), &sizes).unwrap();
    let amp =
        Amp::new(Policy::resolve(&cfg.amp).unwrap(), LossScaler::from_config(&cfg.amp).unwrap(), &mut model);
    let shape = RunShape {
        world_size: 2,
        rank,
        steps_per_epoch: 10,
        total_steps: 20,
        train_samples: 2000,
        schedule: crate::train::lr_schedule(&cfg, 20),
    };
    Run { model, opt, amp, ckpt: Checkpointer::new(&cfg, shape) }
}

fn progress(step: u64) -> TrainProgress {
    TrainProgress {
        step,
        epoch: 0,
        batches_in_epoch: step as usize,
        step_loss: 0.0,
        window_loss: 1.25,
        window_n: 1,
        window_images: 100,
        final_loss: 2.5,
        last_eval: None,
        grad_norm: Some(0.5),
        train_images: 300,
        train_time_s: 0.75,
        window_time_s: 0.25,
        initial_loss: 2.75,
        wall_s: 12.5,
    }
}

/// Rank 0's checkpoint after two O2 steps: masters that the f16 weights only
/// approximate, momentum, and a scaler that has moved.
fn saved(out: &Path) -> (Run, PathBuf) {
    let mut r = run(out, 0, &[]);
    for step in 1..=2u64 {
        for (i, p) in r.model.params_mut().into_iter().enumerate() {
            let g: Vec<f32> = (0..p.grad.numel())
                .map(|j| ((i * 31 + j) % 17) as f32 * 1e-3 * step as f32 * 65536.0)
                .collect();
            p.grad.copy_from_f32(&g).unwrap();
        }
        let out = r.amp.step(&mut r.model, &mut r.opt, 0.01, None, step).unwrap();
        assert!(!out.skipped);
        r.model.zero_grad().unwrap();
    }
    r.amp.scaler.load_state(ScalerState { scale: 2048.0, growth_tracker: 3, overflow_steps: 4 });
    let ranks = RankStates { losses: losses(), pending_grads: Vec::new() };
    let dir = r.ckpt.save(&r.model, &r.opt, &r.amp, &progress(2), ranks).unwrap();
    (r, dir)
}

/// Two ranks' accumulators: rank 1's differ from rank 0's (which `progress` holds).
fn losses() -> Vec<RankLosses> {
    vec![RankLosses { step_loss: 0.0, window_loss: 1.25 }, RankLosses { step_loss: 0.0, window_loss: 1.5 }]
}

fn masters(r: &Run) -> Vec<Vec<f32>> {
    r.amp.masters().unwrap().masters().to_vec()
}

#[test]
fn an_o2_checkpoint_holds_masters_and_scaler_and_restores_them_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (r, path) = saved(dir.path());
    let names: Vec<String> =
        load_safetensors(&path.join("optim.safetensors")).unwrap().into_iter().map(|e| e.name).collect();
    assert!(names.contains(&"master.fc.weight".to_string()), "{names:?}");
    let m = &masters(&r)[r.model.params().iter().position(|p| p.name == "fc.weight").unwrap()];
    let fc = r.model.params().into_iter().find(|p| p.name == "fc.weight").unwrap().value.to_f32_vec();
    assert_ne!(m, &fc, "the masters are more precise than the f16 weights");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path.join("state.json")).unwrap()).unwrap();
    assert_eq!(
        state["scaler"],
        serde_json::json!({"scale": "2048", "growth_tracker": 3, "overflow_steps": 4})
    );

    let mut fresh = run(dir.path(), 0, &[]);
    let c = read_checkpoint(&path).unwrap();
    fresh.ckpt.apply(c, &mut fresh.model, &mut fresh.opt, &mut fresh.amp).unwrap();
    assert_eq!(masters(&fresh), masters(&r));
    assert_eq!(fresh.amp.scaler.state(), r.amp.scaler.state());
    assert_eq!(fresh.opt.state(), r.opt.state());
    assert_eq!(fresh.model.state_dict().unwrap(), r.model.state_dict().unwrap());
}

#[test]
fn masters_that_are_missing_misshaped_foreign_or_unwanted_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = saved(dir.path());
    let refusal = |extra: &[&str], edit: &dyn Fn(&mut LoadedCheckpoint)| -> String {
        let mut r = run(dir.path(), 0, extra);
        let mut c = read_checkpoint(&path).unwrap();
        c.state.config_fingerprint = r.ckpt.fingerprint.clone();
        edit(&mut c);
        r.ckpt.apply(c, &mut r.model, &mut r.opt, &mut r.amp).unwrap_err().to_string()
    };
    let e = refusal(&[], &|c| c.optim.retain(|e| !e.name.starts_with("master.layer1")));
    assert!(e.contains("this run keeps fp32 master weights (amp.opt_level = \"O2\")"), "{e}");
    assert!(e.contains("lacks `master.layer1.0.weight`, `master.layer1.0.bias`"), "{e}");
    let e = refusal(&[], &|c| {
        let m = c.optim.iter_mut().find(|e| e.name == "master.fc.weight").unwrap();
        m.shape = vec![m.shape[1], m.shape[0]];
    });
    assert!(
        e.contains(
            "master weight `master.fc.weight` has shape [1568, 10], but parameter `fc.weight` is [10, 1568]"
        ),
        "{e}"
    );
    let e = refusal(&[], &|c| {
        let m = c.optim.iter_mut().find(|e| e.name == "master.fc.bias").unwrap();
        if let StateValue::F32(v) = &mut m.value {
            v[0] += 0.5;
        }
    });
    assert!(e.contains("`master.fc.bias` does not round to the weight `fc.bias`"), "{e}");
    let e = refusal(&["amp.master_weights=false"], &|_| {});
    assert!(e.contains("it holds fp32 master weights (`master.") && e.contains("this run keeps none"), "{e}");
    let e = refusal(&[], &|c| c.state.scaler = None);
    assert!(e.contains("it has no loss-scaler state") && e.contains("dynamic loss scaler"), "{e}");
    let e = refusal(&["amp.growth_interval=2"], &|_| {});
    assert!(e.contains("cannot restore the loss scaler: its loss scaler counted 3 clean steps"), "{e}");
    let e = refusal(&["amp.loss_scale=128.0"], &|_| {});
    assert!(e.contains("this run's loss scale is static (128)"), "{e}");
}

#[test]
fn resume_messages_round_trip_and_malformed_ones_are_refused() {
    let raw = RawCheckpoint {
        dir: PathBuf::from("/x/ckpt/step_00000002"),
        state_json: b"{}".to_vec(),
        model: vec![1, 2, 3, 4, 5],
        optim: vec![],
    };
    let refused = ResumeMessage::Refused { dir: "runs/x".into(), msg: "holds another run's files".into() };
    for m in [ResumeMessage::Fresh, ResumeMessage::Failed("no".into()), refused, ResumeMessage::Resume(raw)] {
        assert_eq!(decode_message(&encode_message(&m)).unwrap(), m);
    }
    let mut bytes = encode_message(&ResumeMessage::Failed("why".into()));
    bytes.pop();
    assert!(decode_message(&bytes).unwrap_err().contains("truncated in its reason"));
    assert!(decode_message(&[7]).unwrap_err().contains("unknown tag 7"));
    assert!(decode_message(&[0, 0]).unwrap_err().contains("1 trailing bytes"));
}

fn pair() -> Vec<TcpCommunicator> {
    let o = RendezvousOpts {
        fingerprint: "fp".into(),
        config: serde_json::Value::Null,
        job_token: None,
        timeout: Duration::from_secs(20),
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = l.local_addr().unwrap().to_string();
    let o2 = o.clone();
    let h0 = std::thread::spawn(move || TcpCommunicator::connect(serve(l, 2, &o2)?, o2.timeout));
    let h1 = std::thread::spawn(move || TcpCommunicator::connect(join(&ep, 1, 2, &o)?, o.timeout));
    vec![h0.join().unwrap().unwrap(), h1.join().unwrap().unwrap()]
}

/// Both ranks do `f` at once, rank 0 with `out0`, rank 1 with `out1`.
fn on_pair<T: Send>(
    out0: &Path,
    out1: &Path,
    extra: &[&str],
    f: impl Fn(&mut Run, &dyn Communicator) -> T + Sync,
) -> Vec<(Run, T)> {
    let comms = pair();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let out = if rank == 0 { out0 } else { out1 };
                let f = &f;
                s.spawn(move || {
                    let mut r = run(out, rank, extra);
                    let got = f(&mut r, comm as &dyn Communicator);
                    (r, got)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Both ranks resume at once, rank 0 from `out0`, rank 1 from `out1`.
fn resume_pair(
    out0: &Path,
    out1: &Path,
    extra: &[&str],
) -> Vec<(Run, crate::error::Result<Option<TrainProgress>>)> {
    on_pair(out0, out1, extra, |r, comm| r.ckpt.resume(&mut r.model, &mut r.opt, &mut r.amp, comm))
}

#[test]
fn on_two_ranks_only_rank_0_reads_and_both_resume_identically() {
    let dir = tempfile::tempdir().unwrap();
    let (r, path) = saved(&dir.path().join("a"));
    // Rank 1's out_dir has no checkpoint at all: what it resumes from came from rank 0.
    let empty = dir.path().join("nothing-here");
    let mut ranks = resume_pair(&dir.path().join("a"), &empty, &["checkpoint.resume=auto"]);
    let (r1, p1) = ranks.pop().unwrap();
    let (r0, p0) = ranks.pop().unwrap();
    let (p0, p1) = (p0.unwrap().unwrap(), p1.unwrap().unwrap());
    assert_eq!(p0, progress(2));
    assert_eq!(p1, TrainProgress { window_loss: 1.5, ..p0 }, "rank 1 resumes with its own accumulators");
    for other in [&r0, &r1] {
        assert_eq!(masters(other), masters(&r));
        assert_eq!(other.amp.scaler.state(), r.amp.scaler.state());
        assert_eq!(other.opt.state(), r.opt.state());
        assert_eq!(other.opt.step_count(), r.opt.step_count());
        assert_eq!(other.model.state_dict().unwrap(), r.model.state_dict().unwrap());
        assert_eq!(other.ckpt.resumed_from(), Some(path.as_path()));
    }
    assert!(!empty.exists(), "rank 1 touched nothing of its own");
}

#[test]
fn when_rank_0_cannot_read_its_checkpoint_both_ranks_fail_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = saved(&dir.path().join("a"));
    let model = path.join("model.safetensors");
    let mut b = std::fs::read(&model).unwrap();
    let n = b.len();
    b[n - 5] ^= 1;
    std::fs::write(&model, b).unwrap();
    let resume = format!("checkpoint.resume={}", path.display());
    let t = std::time::Instant::now();
    let ranks = resume_pair(&dir.path().join("a"), &dir.path().join("b"), &[&resume]);
    let errs: Vec<String> = ranks.iter().map(|(_, e)| e.as_ref().unwrap_err().to_string()).collect();
    assert!(errs[0].contains("model.safetensors is corrupt"), "{}", errs[0]);
    assert!(errs[1].contains("rank 0 cannot resume, so rank 1 cannot either"), "{}", errs[1]);
    assert!(errs[1].contains("model.safetensors is corrupt"), "{}", errs[1]);
    assert!(t.elapsed() < Duration::from_secs(10), "no rank waits for a timeout");
    // The bytes rank 0 would send are what a rank verifies: a flipped bit is caught there too.
    let mut raw = read_raw(&path).unwrap();
    raw.model[0] ^= 1;
    assert!(parse_checkpoint(&raw).unwrap_err().to_string().contains("is corrupt"));
}

/// Rank 0's checkpoint with micro-batches pending on both ranks (rank 1's
/// gradients are twice rank 0's: distinct, and exact in f16 too); returns
/// the path and both ranks' flattened gradients.
fn saved_with_pending(out: &Path) -> (PathBuf, Vec<Vec<f32>>) {
    let mut r = run(out, 0, &[]);
    for (i, p) in r.model.params_mut().into_iter().enumerate() {
        let g: Vec<f32> = (0..p.grad.numel()).map(|j| ((i * 7 + j) % 13) as f32 * 0.125 - 0.5).collect();
        p.grad.copy_from_f32(&g).unwrap();
    }
    let rank0 = super::pending::local_flat(&r.model);
    let rank1: Vec<f32> = rank0.iter().map(|g| g * 2.0).collect();
    let ranks = RankStates { losses: losses(), pending_grads: vec![rank0.clone(), rank1.clone()] };
    let dir = r.ckpt.save(&r.model, &r.opt, &r.amp, &progress(2), ranks).unwrap();
    (dir, vec![rank0, rank1])
}

#[test]
fn every_rank_restores_its_own_pending_gradients_and_mismatched_sets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, grads) = saved_with_pending(dir.path());
    let names: Vec<String> =
        load_safetensors(&path.join("optim.safetensors")).unwrap().into_iter().map(|e| e.name).collect();
    assert!(names.contains(&"fc.weight.grad".into()) && names.contains(&"rank1.fc.weight.grad".into()));
    let apply = |rank: usize, edit: &dyn Fn(&mut LoadedCheckpoint)| {
        let mut r = run(dir.path(), rank, &[]);
        let mut c = read_checkpoint(&path).unwrap();
        edit(&mut c);
        r.ckpt.apply(c, &mut r.model, &mut r.opt, &mut r.amp).map(|_| super::pending::local_flat(&r.model))
    };
    assert_eq!(apply(0, &|_| {}).unwrap(), grads[0]);
    assert_eq!(apply(1, &|_| {}).unwrap(), grads[1], "rank 1 resumes with its own gradients");
    // An older build's checkpoint holds rank 0's only: every rank takes them.
    let legacy = |c: &mut LoadedCheckpoint| c.optim.retain(|e| !e.name.starts_with("rank1."));
    assert_eq!(apply(1, &legacy).unwrap(), grads[0]);

    let refusal = |edit: &dyn Fn(&mut LoadedCheckpoint)| apply(1, edit).unwrap_err().to_string();
    let e = refusal(&|c| c.optim.retain(|e| e.name != "rank1.fc.bias.grad"));
    assert!(
        e.contains("the pending gradients are incomplete: rank 1 has 9 of 10 (`rank1.<param>.grad`)"),
        "{e}"
    );
    let e = refusal(&|c| {
        let g = c.optim.iter_mut().find(|e| e.name == "rank1.fc.bias.grad").unwrap();
        g.name = "rank2.fc.bias.grad".into();
    });
    assert!(
        e.contains(
            "`rank2.fc.bias.grad` holds pending gradients of rank 2, but state.json records a world \
                    size of 2 (ranks 0 to 1)"
        ),
        "{e}"
    );
    let e = refusal(&|c| c.state.pending_grads = false);
    assert!(e.contains("it holds pending gradients (`<param>.grad`), but state.json records none"), "{e}");
    let e = refusal(&|c| {
        let g = c.optim.iter_mut().find(|e| e.name == "rank1.fc.bias.grad").unwrap();
        g.value = StateValue::F32(vec![0.0; 3]);
    });
    assert!(e.contains("`rank1.fc.bias.grad` has 3 values, its parameter 10"), "{e}");
    let e = refusal(&|c| c.optim.retain(|e| !e.name.ends_with(".grad") || e.name.starts_with("rank1.")));
    assert!(e.contains("the pending gradients are incomplete: rank 0 has 0 of 10"), "{e}");
}

/// Both ranks claim at once, rank 0 `out0`, rank 1 `out1`.
fn claim_pair(out0: &Path, out1: &Path, extra: &[&str]) -> Vec<(Run, crate::error::Result<()>)> {
    on_pair(out0, out1, extra, |r, comm| r.ckpt.claim(comm))
}

#[test]
fn rank_0s_refusal_of_its_out_dir_is_every_ranks_and_a_claim_locks_on_rank_0_only() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::write(a.join("summary.json"), "{\"steps\": 6}").unwrap();
    let t = std::time::Instant::now();
    let ranks = claim_pair(&a, &b, &["checkpoint.resume=never"]);
    let errs: Vec<&crate::Error> = ranks.iter().map(|(_, e)| e.as_ref().unwrap_err()).collect();
    assert!(errs.iter().all(|e| matches!(e, crate::Error::OutDir { .. })), "{errs:?}");
    assert_eq!(errs[0].to_string(), errs[1].to_string(), "rank 1 fails with rank 0's own error");
    assert!(
        errs[0].to_string().contains("holds another run's files: a finished run (6 steps)"),
        "{}",
        errs[0]
    );
    assert!(t.elapsed() < Duration::from_secs(10), "no rank waits for a timeout");
    assert!(!a.join(LOCK_FILE).exists() && !b.exists(), "a refusal writes nothing");

    let ranks = claim_pair(&b, &dir.path().join("c"), &[]);
    assert!(ranks.iter().all(|(_, r)| r.is_ok()));
    assert!(b.join(LOCK_FILE).is_file() && !dir.path().join("c").exists(), "rank 0 alone locks");
}
