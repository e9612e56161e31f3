//! The checkpoint writer: when to save, the atomic save itself, `latest`,
//! pruning to `keep_last`, and the metrics file a resumed run continues.

use super::io::{ckpt_err, entries_to_bytes, write_synced};
use super::state::{
    CheckpointState, FileDigest, OptimizerState, RankLosses, ScheduleState, TrainProgress, FORMAT_VERSION,
};
use super::{parse_step_dir, pending, step_dir_name, MASTER_PREFIX};
use crate::amp::Amp;
use crate::config::{Config, Resume, ResumeChanges};
use crate::dist::{Buffer, Communicator};
use crate::error::{Error, Result};
use crate::metrics::MetricsWriter;
use crate::nn::{Model, StateEntry, StateValue};
use crate::optim::{LrSchedule, Optimizer};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the run looks like beyond its config: a checkpoint records it and a
/// resume must match it.
#[derive(Debug, Clone)]
pub struct RunShape {
    pub world_size: usize,
    pub rank: usize,
    pub steps_per_epoch: u64,
    pub total_steps: u64,
    pub train_samples: usize,
    pub schedule: LrSchedule,
}

/// What rank 0 collects from every rank at a save; empty with one process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankStates {
    /// Every rank's loss accumulators, in rank order.
    pub losses: Vec<RankLosses>,
    /// Every rank's gradients, flattened in parameter order and widened to
    /// f32, in rank order, when any rank has micro-batches pending (empty
    /// otherwise, and then rank 0's own gradients are checked).
    pub pending_grads: Vec<Vec<f32>>,
}

/// Saves checkpoints when the config asks for them and restores one at setup
/// (see `load.rs` for [`Checkpointer::resume`]).
pub struct Checkpointer {
    pub(super) every_steps: u64,
    pub(super) every_epochs: u64,
    /// Rank 0's clock for `every_minutes` (timed.rs).
    pub(super) clock: super::timed::SaveClock,
    pub(super) keep_last: usize,
    pub(super) resume: Resume,
    pub(super) resume_changes: ResumeChanges,
    /// `run.out_dir`, `run.name` and `run.overwrite`: what `claim.rs` needs.
    pub(super) out_dir: PathBuf,
    pub(super) run_name: String,
    pub(super) overwrite: bool,
    pub(super) root: PathBuf,
    pub(super) shape: RunShape,
    pub(super) fingerprint: String,
    pub(super) config_json: serde_json::Value,
    pub(super) opt_level: String,
    pub(super) seed: u64,
    pub(super) last_saved: Option<(u64, u64)>,
    pub(super) written: Vec<PathBuf>,
    pub(super) resumed_from: Option<PathBuf>,
    pub(super) reshard: Option<super::compat::Reshard>,
    save_pause: Option<Duration>,
    halt_after: Option<u64>,
    /// Rank 0's hold on `run.out_dir` ([`Checkpointer::claim`]): kept here
    /// because the checkpointer lives exactly as long as the run that writes
    /// into that directory.
    pub(super) lock: Option<super::RunLock>,
    /// Files every checkpoint carries besides the weights (a text run's
    /// `vocab.json`), as (name, contents), with `digested` set for those
    /// state.json records (see [`Checkpointer::with_file`]).
    extra_files: Vec<ExtraFile>,
}

/// A file every checkpoint and the run's out_dir get besides the weights.
#[derive(Debug, Clone)]
pub struct ExtraFile {
    pub name: &'static str,
    pub contents: Vec<u8>,
    /// Recorded with its size and SHA-256 in state.json, as part of what the
    /// checkpoint is; a copy for readers only (the run's config.toml, which
    /// names this run's out_dir) is not, so that a resumed run's checkpoints
    /// equal an unbroken run's.
    pub digested: bool,
}

/// The settings a resumed run must share with the checkpoint: the config less
/// what cannot change the numbers (where checkpoints go and when, whether an
/// older run's files were removed first, the gates, where the data lives, how
/// far the loader reads ahead), and less what `Config::fingerprint` already
/// leaves out.
pub(super) fn resume_identity(cfg: &Config) -> (String, serde_json::Value) {
    let mut c = cfg.clone();
    c.checkpoint = Default::default();
    c.run.overwrite = false;
    c.expect = Default::default();
    c.data.path = PathBuf::new();
    c.data.prefetch = 0;
    let fp = c.fingerprint();
    let mut v = serde_json::to_value(&c).unwrap_or(serde_json::Value::Null);
    if let Some(root) = v.as_object_mut() {
        for k in ["logging", "checkpoint", "expect"] {
            root.remove(k);
        }
        for (section, keys) in [
            ("run", &["name", "out_dir", "device", "overwrite"][..]),
            ("parallel", &["master_addr", "master_port"][..]),
        ] {
            if let Some(s) = root.get_mut(section).and_then(|s| s.as_object_mut()) {
                keys.iter().for_each(|k| drop(s.remove(*k)));
            }
        }
        if let Some(d) = root.get_mut("data").and_then(|s| s.as_object_mut()) {
            d.remove("path");
            d.remove("prefetch");
        }
    }
    (fp, v)
}

pub(super) fn schedule_state(shape: &RunShape) -> ScheduleState {
    let s = &shape.schedule;
    ScheduleState {
        kind: format!("{:?}", s.kind),
        base_lr: f64::from(s.base_lr),
        warmup_steps: s.warmup_steps,
        total_steps: s.total_steps,
        steps_per_epoch: shape.steps_per_epoch,
        train_samples: shape.train_samples,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

impl Checkpointer {
    pub fn new(cfg: &Config, shape: RunShape) -> Self {
        let (fingerprint, config_json) = resume_identity(cfg);
        Checkpointer {
            every_steps: cfg.checkpoint.every_steps,
            every_epochs: cfg.checkpoint.every_epochs,
            clock: super::timed::SaveClock::new(cfg.checkpoint.every_minutes, shape.rank),
            keep_last: cfg.checkpoint.keep_last.max(1),
            // run.overwrite wins over "auto", as Hugging Face's
            // overwrite_output_dir does: the run starts from step 0. Every
            // rank decides this alike, so they skip the resume together.
            resume: match &cfg.checkpoint.resume {
                Resume::Auto if cfg.run.overwrite => Resume::Never,
                r => r.clone(),
            },
            resume_changes: cfg.checkpoint.resume_changes,
            out_dir: cfg.run.out_dir.clone(),
            run_name: cfg.run.name.clone(),
            overwrite: cfg.run.overwrite,
            root: cfg.run.out_dir.join("ckpt"),
            shape,
            fingerprint,
            config_json,
            opt_level: cfg.amp.opt_level.to_string(),
            seed: cfg.run.seed,
            last_saved: None,
            written: Vec::new(),
            resumed_from: None,
            reshard: None,
            save_pause: None,
            halt_after: None,
            lock: None,
            extra_files: Vec::new(),
        }
    }

    /// Adds `name` with `contents` to every checkpoint this run writes
    /// (`digested`: see [`ExtraFile::digested`]).
    pub fn with_file(mut self, name: &'static str, contents: Vec<u8>, digested: bool) -> Self {
        self.extra_files.push(ExtraFile { name, contents, digested });
        self
    }

    /// The files [`Checkpointer::with_file`] added.
    pub fn extra_files(&self) -> &[ExtraFile] {
        &self.extra_files
    }

    /// Test hooks: sleep `save_pause` between writing the model file and the
    /// optimizer file of every save (so a test can kill a run mid-save), and
    /// stop the run with an error right after step `halt_after` (a crash
    /// stand-in that leaves the checkpoints as a killed run would).
    pub fn with_test_hooks(mut self, save_pause: Option<Duration>, halt_after: Option<u64>) -> Self {
        self.save_pause = save_pause;
        self.halt_after = halt_after;
        self
    }

    /// Checkpoint directories this process wrote, oldest first.
    pub fn written(&self) -> &[PathBuf] {
        &self.written
    }

    /// Those of [`Checkpointer::written`] that `keep_last` has not pruned since.
    pub fn kept(&self) -> Vec<PathBuf> {
        self.written.iter().filter(|p| p.is_dir()).cloned().collect()
    }

    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    fn enabled(&self) -> bool {
        self.every_steps > 0 || self.every_epochs > 0 || self.clock.on()
    }

    /// Whether [`Checkpointer::after_step`] saves after optimizer step `step`
    /// (a device keeping its state away from the host brings it back first).
    pub fn saves_after_step(&self, step: u64) -> bool {
        self.every_steps > 0 && step.is_multiple_of(self.every_steps) && step < self.shape.total_steps
    }

    /// After each optimizer step (and its log line). The last step is saved by
    /// [`Checkpointer::finish`], after the final evaluation.
    pub fn after_step(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        metrics: &mut MetricsWriter,
        comm: &dyn Communicator,
    ) -> Result<()> {
        if self.saves_after_step(p.step) {
            self.save_and_log(model, opt, amp, p, metrics, comm)?;
        }
        if self.halt_after == Some(p.step) {
            return Err(Error::Training(format!(
                "halted after step {} as asked by --halt-after-steps (resume with checkpoint.resume = \"auto\")",
                p.step
            )));
        }
        Ok(())
    }

    /// After each epoch's evaluation.
    pub fn after_epoch(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        metrics: &mut MetricsWriter,
        comm: &dyn Communicator,
    ) -> Result<()> {
        if self.every_epochs > 0 && p.epoch.is_multiple_of(self.every_epochs) {
            self.save_and_log(model, opt, amp, p, metrics, comm)?;
        }
        Ok(())
    }

    /// At the end of training: a checkpointing run always ends with a checkpoint of its final state.
    pub fn finish(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        metrics: &mut MetricsWriter,
        comm: &dyn Communicator,
    ) -> Result<()> {
        if self.enabled() && self.last_saved != Some((p.step, p.epoch)) {
            self.save_and_log(model, opt, amp, p, metrics, comm)?;
        }
        Ok(())
    }

    /// A run stopped by a signal after step `p.step`, or a timed save:
    /// saved whether or not `[checkpoint]` saves periodically (unless this
    /// step is saved already), so `resume = "auto"` continues from it.
    pub fn on_stop(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        metrics: &mut MetricsWriter,
        comm: &dyn Communicator,
    ) -> Result<()> {
        if self.last_saved != Some((p.step, p.epoch)) {
            self.save_and_log(model, opt, amp, p, metrics, comm)?;
        }
        Ok(())
    }

    pub(super) fn save_and_log(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        metrics: &mut MetricsWriter,
        comm: &dyn Communicator,
    ) -> Result<()> {
        // Every rank is here (the save points depend on step and epoch only):
        // rank 0 collects the loss accumulators and pending gradients, which differ per rank.
        let ranks = if comm.world_size() > 1 { gather_ranks(comm, model, p)? } else { RankStates::default() };
        // Any save, periodic or timed, is the latest state a kill would lose.
        self.clock.reset();
        if self.shape.rank != 0 {
            // As rank 0's save does: `finish` must skip a save on every rank or on none.
            self.last_saved = Some((p.step, p.epoch));
            return saved_on_rank_0(comm, p.step);
        }
        let saved = self.save(model, opt, amp, p, ranks);
        if comm.world_size() > 1 {
            // The other ranks wait for the verdict, so a failed save stops
            // them with its reason rather than at their next collective.
            let word = if saved.is_ok() { 0.0 } else { 1.0 };
            let sent = comm.broadcast(Buffer::F32(vec![word]), 0, "checkpoint: rank 0's save");
            if saved.is_ok() {
                sent?;
            }
        }
        let dir = saved?;
        // The epoch its step was taken in, as the other records number it: a
        // save at an epoch's end (no batch of the next consumed) is the epoch's.
        let epoch = if p.batches_in_epoch == 0 { p.epoch.saturating_sub(1) } else { p.epoch };
        metrics.write(&json!({"kind": "checkpoint", "step": p.step, "epoch": epoch,
            "batches_in_epoch": p.batches_in_epoch, "path": dir}))
    }

    /// Writes a checkpoint of the current state and points `latest` at it.
    /// `ranks`: what every rank holds of its own, with several ranks.
    pub fn save(
        &mut self,
        model: &Model,
        opt: &Optimizer,
        amp: &Amp,
        p: &TrainProgress,
        ranks: RankStates,
    ) -> Result<PathBuf> {
        let name = step_dir_name(p.step);
        let final_dir = self.root.join(&name);
        let (optim_entries, pending_grads) = optim_entries(model, opt, amp, &ranks.pending_grads)?;
        // Every file is encoded before the first is written, so a save that
        // fails for room can say how much the whole checkpoint needs.
        let weights = entries_to_bytes(&model.state_dict()?, &final_dir.join("model.safetensors"))?;
        let optim = entries_to_bytes(&optim_entries, &final_dir.join("optim.safetensors"))?;
        drop(optim_entries);
        let mut files = BTreeMap::new();
        for (file, bytes) in [("model.safetensors", &weights), ("optim.safetensors", &optim)] {
            files.insert(
                file.to_string(),
                FileDigest { bytes: bytes.len() as u64, sha256: sha256_hex(bytes) },
            );
        }
        for f in self.extra_files.iter().filter(|f| f.digested) {
            let digest = FileDigest { bytes: f.contents.len() as u64, sha256: sha256_hex(&f.contents) };
            files.insert(f.name.to_string(), digest);
        }
        let state = CheckpointState {
            version: FORMAT_VERSION,
            progress: p.clone(),
            seed: self.seed,
            opt_level: self.opt_level.clone(),
            world_size: self.shape.world_size,
            config_fingerprint: self.fingerprint.clone(),
            schedule: schedule_state(&self.shape),
            optimizer: OptimizerState {
                name: format!("{:?}", opt.config().kind),
                step_count: opt.step_count(),
            },
            pending_grads,
            rank_losses: ranks.losses,
            scaler: amp.scaler.is_dynamic().then(|| amp.scaler.state().into()),
            files,
            config: self.config_json.clone(),
        };
        let text = serde_json::to_string_pretty(&state)
            .map_err(|e| ckpt_err(&final_dir, format!("cannot encode state.json: {e}")))?;
        // state.json last: a directory without it is an incomplete checkpoint.
        let mut contents: Vec<(&str, &[u8])> =
            vec![("model.safetensors", &weights), ("optim.safetensors", &optim)];
        contents.extend(self.extra_files.iter().map(|f| (f.name, f.contents.as_slice())));
        contents.push(("state.json", text.as_bytes()));
        super::publish::write_checkpoint(&self.root, &name, &contents, self.save_pause)?;
        self.prune(p.step)?;
        self.last_saved = Some((p.step, p.epoch));
        self.written.push(final_dir.clone());
        Ok(final_dir)
    }

    /// Keeps the newest `keep_last` checkpoints up to `current`. Checkpoints
    /// after `current` belong to an abandoned history (a run resumed from an
    /// older checkpoint, or restarted with resume = "never") and go too, as do
    /// temporary directories of interrupted saves.
    fn prune(&self, current: u64) -> Result<()> {
        let rd = std::fs::read_dir(&self.root)
            .map_err(|e| Error::io(format!("cannot list {}", self.root.display()), e))?;
        let mut steps = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") && !name.ends_with(&format!(".{}", std::process::id())) {
                remove_dir(&entry.path())?;
            } else if let Some(s) = parse_step_dir(&name) {
                steps.push((s, entry.path()));
            }
        }
        steps.sort_by_key(|s| std::cmp::Reverse(s.0));
        let mut kept = 0;
        for (s, path) in steps {
            if s <= current && kept < self.keep_last {
                kept += 1;
            } else {
                remove_dir(&path)?;
            }
        }
        Ok(())
    }
}

/// Every rank's (step_loss, window_loss) and, when any rank has micro-batches
/// pending, every rank's gradients, in rank order. The f64 bits travel as f32
/// words, which a broadcast or gather moves without touching; a fifth word
/// says whether the rank has a non-zero gradient.
fn gather_ranks(comm: &dyn Communicator, model: &Model, p: &TrainProgress) -> Result<RankStates> {
    let grads = pending::local_flat(model);
    let mut words: Vec<f32> = [p.step_loss, p.window_loss]
        .iter()
        .flat_map(|v| {
            let b = v.to_bits();
            [f32::from_bits(b as u32), f32::from_bits((b >> 32) as u32)]
        })
        .collect();
    words.push(if grads.iter().any(|&g| g != 0.0) { 1.0 } else { 0.0 });
    let all = comm.all_gather(Buffer::F32(words), "checkpoint: loss accumulators")?.into_f32()?;
    let f64_at = |w: &[f32]| f64::from_bits(u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32));
    let losses = all
        .chunks_exact(5)
        .map(|c| RankLosses { step_loss: f64_at(&c[0..2]), window_loss: f64_at(&c[2..4]) })
        .collect();
    let any_pending = all.chunks_exact(5).any(|c| c[4] != 0.0);
    let pending_grads = if any_pending { pending::gather(comm, grads)? } else { Vec::new() };
    Ok(RankStates { losses, pending_grads })
}

/// A rank other than 0 after rank 0's save: its verdict.
fn saved_on_rank_0(comm: &dyn Communicator, step: u64) -> Result<()> {
    let verdict = comm.broadcast(Buffer::F32(vec![0.0]), 0, "checkpoint: rank 0's save")?.into_f32()?;
    if verdict.first().is_some_and(|&w| w == 0.0) {
        return Ok(());
    }
    Err(Error::Training(format!(
        "rank 0 could not write the checkpoint of step {step}, so rank {} stops too: rank 0's error says why",
        comm.rank()
    )))
}

fn remove_dir(path: &Path) -> Result<()> {
    std::fs::remove_dir_all(path).map_err(|e| Error::io(format!("cannot remove {}", path.display()), e))
}

/// Optimizer state as `<param>.<state>` tensors, the fp32 masters as
/// `master.<param>` when the run keeps them, plus the pending gradients when
/// micro-batches are pending (any gradient non-zero between steps; see
/// `pending.rs`): `gathered` holds every rank's, or is empty and rank 0's own are used.
fn optim_entries(
    model: &Model,
    opt: &Optimizer,
    amp: &Amp,
    gathered: &[Vec<f32>],
) -> Result<(Vec<StateEntry>, bool)> {
    let params = model.params();
    let mut out = Vec::new();
    for (state, i, values) in opt.state_tensors() {
        let p = params.get(i).ok_or_else(|| {
            Error::internal(format!("optimizer state for parameter {i} of {}", params.len()))
        })?;
        out.push(StateEntry {
            name: format!("{}.{state}", p.name),
            shape: p.value.shape().to_vec(),
            value: StateValue::F32(values.to_vec()),
        });
    }
    if let Some(m) = amp.masters() {
        for (p, master) in params.iter().zip(m.masters()) {
            out.push(StateEntry {
                name: format!("{MASTER_PREFIX}{}", p.name),
                shape: p.value.shape().to_vec(),
                value: StateValue::F32(master.clone()),
            });
        }
    }
    let grads = if gathered.is_empty() {
        pending::entries(model, &[pending::local_flat(model)])?
    } else {
        pending::entries(model, gathered)?
    };
    let pending = !grads.is_empty();
    out.extend(grads);
    Ok((out, pending))
}

/// Opens `metrics.jsonl` (and TensorBoard when `logging.tensorboard`). A resumed
/// run keeps the records up to its checkpoint and appends; records a crashed
/// run wrote after the checkpoint are dropped, since the resumed run writes them again.
pub fn open_metrics(cfg: &Config, out_dir: &Path, resumed: Option<&TrainProgress>) -> Result<MetricsWriter> {
    let writer = match resumed {
        Some(p) => {
            cut_metrics(&out_dir.join("metrics.jsonl"), p)?;
            MetricsWriter::append(out_dir)?
        }
        None => MetricsWriter::create(out_dir)?,
    };
    if cfg.logging.tensorboard {
        writer.with_tensorboard(&out_dir.join("tb"))
    } else {
        Ok(writer)
    }
}

/// Keeps the records written up to checkpoint `p`: what a run resumed from
/// it writes again is cut, a fallback to an older checkpoint included.
fn cut_metrics(path: &Path, p: &TrainProgress) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let (step, epoch) = (p.step, p.epoch);
    // An evaluation at the checkpoint's own step came before it when the
    // checkpoint carries it (older checkpoints: when it closed an epoch).
    let eval_at_step_kept = match p.last_eval.and_then(|e| e.step) {
        Some(s) => s == step,
        None => p.batches_in_epoch == 0,
    };
    let mut kept = String::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let s = v["step"].as_u64().unwrap_or(0);
        let e = v["epoch"].as_u64().unwrap_or(0);
        let keep = match v["kind"].as_str() {
            Some("eval") => s < step || (s == step && eval_at_step_kept),
            // Of two saves of one step, the one inside the epoch comes first.
            Some("checkpoint") => match v["batches_in_epoch"].as_u64() {
                Some(b) => s < step || (s == step && (b > 0 || p.batches_in_epoch == 0)),
                None => s < step || (s == step && e <= epoch),
            },
            _ => s <= step,
        };
        if keep {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let tmp = path.with_extension("jsonl.tmp");
    write_synced(&tmp, kept.as_bytes())?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("cannot rename {}", tmp.display()), e))
}
