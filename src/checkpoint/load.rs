//! Reading a checkpoint back: integrity (sizes and SHA-256 recorded in
//! `state.json`), compatibility with this run (what differs is named), and
//! restoring the model, the optimizer and the loop's progress.

use super::io::{ckpt_err, parse_safetensors};
use super::pending;
use super::save::Checkpointer;
use super::state::{CheckpointState, TrainProgress, FORMAT_VERSION};
use super::MASTER_PREFIX;
use super::{parse_step_dir, step_dir_name};
use crate::amp::{Amp, Policy};
use crate::config::Resume;
use crate::dist::Communicator;
use crate::error::Result;
use crate::nn::{Model, StateEntry, StateValue};
use crate::optim::Optimizer;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A checkpoint whose files are complete and uncorrupted.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    pub dir: PathBuf,
    pub state: CheckpointState,
    pub model: Vec<StateEntry>,
    pub optim: Vec<StateEntry>,
}

/// A checkpoint's files as read, before any check: what rank 0 hands to the
/// other ranks on a distributed resume (they verify it as rank 0 did).
#[derive(Debug, Clone, PartialEq)]
pub struct RawCheckpoint {
    /// Where rank 0 read it (named in messages, never opened by other ranks).
    pub dir: PathBuf,
    pub state_json: Vec<u8>,
    pub model: Vec<u8>,
    pub optim: Vec<u8>,
}

/// Reads and verifies the checkpoint in `dir` (a `step_XXXXXXXX` directory,
/// `ckpt/latest`, or a `ckpt` directory, meaning its `latest`).
pub fn read_checkpoint(dir: &Path) -> Result<LoadedCheckpoint> {
    parse_checkpoint(&read_raw(dir)?)
}

/// The bytes of the checkpoint in `dir` (see [`read_checkpoint`] for `dir`).
pub fn read_raw(dir: &Path) -> Result<RawCheckpoint> {
    let dir = if !dir.join("state.json").exists() && dir.join("latest").exists() {
        dir.join("latest")
    } else {
        dir.to_path_buf()
    };
    let fail = |msg: String| ckpt_err(&dir, msg);
    if !dir.is_dir() {
        return Err(fail("no such checkpoint directory".into()));
    }
    let state_json = std::fs::read(dir.join("state.json"))
        .map_err(|e| fail(format!("cannot read state.json ({e}): an incomplete checkpoint")))?;
    let read =
        |file: &str| std::fs::read(dir.join(file)).map_err(|e| fail(format!("cannot read {file}: {e}")));
    let (model, optim) = (read("model.safetensors")?, read("optim.safetensors")?);
    Ok(RawCheckpoint { dir, state_json, model, optim })
}

/// Verifies a checkpoint's bytes (format version, sizes and SHA-256 recorded
/// in `state.json`) and decodes them.
pub fn parse_checkpoint(raw: &RawCheckpoint) -> Result<LoadedCheckpoint> {
    let dir = &raw.dir;
    let fail = |msg: String| ckpt_err(dir, msg);
    let text = std::str::from_utf8(&raw.state_json)
        .map_err(|_| fail("state.json is corrupt: not UTF-8 text".into()))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| fail(format!("state.json is corrupt: {e}")))?;
    let version = value.get("version").and_then(|v| v.as_u64());
    if version != Some(u64::from(FORMAT_VERSION)) {
        return Err(fail(format!(
            "state.json has format version {}; this build reads version {FORMAT_VERSION}",
            version.map_or("(none)".to_string(), |v| v.to_string())
        )));
    }
    let state: CheckpointState =
        serde_json::from_value(value).map_err(|e| fail(format!("state.json is corrupt: {e}")))?;
    let check = |file: &str, bytes: &[u8]| -> Result<Vec<StateEntry>> {
        let digest =
            state.files.get(file).ok_or_else(|| fail(format!("state.json does not record {file}")))?;
        if bytes.len() as u64 != digest.bytes {
            return Err(fail(format!(
                "{file} is truncated or overwritten: {} bytes, state.json records {}",
                bytes.len(),
                digest.bytes
            )));
        }
        let sha: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        if sha != digest.sha256 {
            return Err(fail(format!("{file} is corrupt: its SHA-256 differs from the one in state.json")));
        }
        parse_safetensors(bytes, &dir.join(file))
    };
    let model = check("model.safetensors", &raw.model)?;
    let optim = check("optim.safetensors", &raw.optim)?;
    Ok(LoadedCheckpoint { dir: dir.clone(), state, model, optim })
}

/// Loads a checkpoint into the fp32 `model` for evaluation and casts it for
/// `policy`, as a PyTorch user would: `load_state_dict` of the checkpoint's
/// fp32 weights, then apex's `amp.initialize` (O2: f16 conv/linear, fp32
/// BatchNorm). The fp32 weights are the masters where the run kept them
/// (`model.safetensors` holds their f16 rounding), so at the run's own opt
/// level this is the model the run evaluated, and at O0 an O2 run's fp32
/// model. Only the model's shapes must match; the rest of the config may differ.
pub fn load_for_eval(dir: &Path, model: &mut Model, policy: &Policy) -> Result<CheckpointState> {
    let c = read_checkpoint(dir)?;
    check_model_shapes(&c, model)?;
    let masters: HashMap<&str, &StateEntry> =
        c.optim.iter().filter_map(|e| Some((e.name.strip_prefix(MASTER_PREFIX)?, e))).collect();
    let mut weights = c.model.clone();
    for w in &mut weights {
        let Some(m) = masters.get(w.name.as_str()) else { continue };
        if m.shape != w.shape {
            return Err(ckpt_err(
                &c.dir.join("optim.safetensors"),
                format!(
                    "master weight `{}` has shape {:?}, but `{}` is {:?}",
                    m.name, m.shape, w.name, w.shape
                ),
            ));
        }
        w.value = m.value.clone();
    }
    model.load_state_dict(weights, &c.dir.join("model.safetensors"))?;
    crate::amp::cast_model(model, policy);
    Ok(c.state)
}

/// What `ddptrain eval` loaded its weights from.
#[derive(Debug, Clone)]
pub enum EvalSource {
    /// A checkpoint directory, with its state (step, epoch, opt level).
    Checkpoint(Box<CheckpointState>),
    /// A weights file such as a run's `out_dir/model.safetensors`.
    ModelFile,
}

/// Loads `path` into the fp32 `model` for evaluation and casts it for
/// `policy`: a checkpoint directory as [`load_for_eval`] does, or a weights
/// file (`out_dir/model.safetensors`, what `model.init_from` takes). A file
/// has no optimizer state, so its own weights are used: a run's final
/// `model.safetensors` holds the fp32 masters where the run kept them, and the
/// model's weights otherwise.
pub fn load_eval_weights(path: &Path, model: &mut Model, policy: &Policy) -> Result<EvalSource> {
    if path.is_dir() {
        return Ok(EvalSource::Checkpoint(Box::new(load_for_eval(path, model, policy)?)));
    }
    if !path.is_file() {
        return Err(ckpt_err(path, "no such checkpoint directory or model file (.safetensors)"));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| crate::error::Error::io(format!("cannot read model file {}", path.display()), e))?;
    let entries = parse_safetensors(&bytes, path).map_err(|e| match e {
        crate::error::Error::Checkpoint { msg, .. } => ckpt_err(
            path,
            format!("is neither a checkpoint directory nor a model file (.safetensors): {msg}"),
        ),
        other => other,
    })?;
    model.load_state_dict(entries, path)?;
    crate::amp::cast_model(model, policy);
    Ok(EvalSource::ModelFile)
}

fn shape_map(entries: &[StateEntry]) -> BTreeMap<&str, &[usize]> {
    entries.iter().map(|e| (e.name.as_str(), e.shape.as_slice())).collect()
}

pub(super) fn check_model_shapes(c: &LoadedCheckpoint, model: &Model) -> Result<()> {
    let ours = model.state_dict()?;
    let (theirs, ours) = (shape_map(&c.model), shape_map(&ours));
    let mut diffs = Vec::new();
    for (name, shape) in &ours {
        match theirs.get(name) {
            None => diffs.push(format!("`{name}` {shape:?} is not in the checkpoint")),
            Some(s) if s != shape => {
                diffs.push(format!("`{name}` is {s:?} in the checkpoint, {shape:?} here"))
            }
            Some(_) => {}
        }
    }
    diffs.extend(
        theirs.keys().filter(|n| !ours.contains_key(*n)).map(|n| format!("`{n}` is not in this model")),
    );
    if diffs.is_empty() {
        return Ok(());
    }
    let more = if diffs.len() > 4 { format!(" (and {} more)", diffs.len() - 4) } else { String::new() };
    diffs.truncate(4);
    Err(ckpt_err(&c.dir, format!("the model shapes differ: {}{more}", diffs.join("; "))))
}

impl Checkpointer {
    /// Restores model, optimizer, master weights, loss scaler and progress per
    /// `checkpoint.resume`; `None` when the run starts fresh. With "auto", an
    /// unusable newest checkpoint falls back to the previous good one (and says
    /// so on stderr). With several ranks only rank 0 reads files; the others
    /// get its checkpoint through `comm` (see `share.rs`).
    pub fn resume(
        &mut self,
        model: &mut Model,
        opt: &mut Optimizer,
        amp: &mut Amp,
        comm: &dyn Communicator,
    ) -> Result<Option<TrainProgress>> {
        if matches!(self.resume, Resume::Never) {
            return Ok(None);
        }
        if comm.world_size() == 1 {
            return Ok(self.resume_local(model, opt, amp)?.map(|(p, _)| p));
        }
        super::share::resume_distributed(self, model, opt, amp, comm)
    }

    /// Rank 0's (or a single process's) resume from its own files; also
    /// returns the bytes of the checkpoint it resumed from.
    pub(super) fn resume_local(
        &mut self,
        model: &mut Model,
        opt: &mut Optimizer,
        amp: &mut Amp,
    ) -> Result<Option<(TrainProgress, RawCheckpoint)>> {
        let candidates = match &self.resume {
            Resume::Never => return Ok(None),
            Resume::Path(p) => {
                let raw = read_raw(p)?;
                let c = parse_checkpoint(&raw)?;
                return self.apply(c, model, opt, amp).map(|p| Some((p, raw)));
            }
            Resume::Auto => self.auto_candidates(),
        };
        let mut refused = Vec::new();
        for dir in candidates {
            let attempt = read_raw(&dir).and_then(|raw| {
                let c = parse_checkpoint(&raw)?;
                self.apply(c, model, opt, amp).map(|p| (p, raw))
            });
            match attempt {
                Ok(done) => {
                    if !refused.is_empty() {
                        crate::errln!(
                            "warning: resuming from the previous good checkpoint {}",
                            dir.display()
                        );
                    }
                    return Ok(Some(done));
                }
                Err(e) => {
                    crate::errln!("warning: checkpoint.resume = \"auto\": cannot resume from it: {e}");
                    refused.push(e.to_string());
                }
            }
        }
        if refused.is_empty() {
            return Ok(None);
        }
        // Nothing here this run continues: the out_dir holds another run.
        let why = match refused.len() {
            1 => refused.swap_remove(0),
            n => format!("{} (and the {} older ones: see the warnings above)", refused.swap_remove(0), n - 1),
        };
        Err(self.unresumable(why))
    }

    /// `latest`'s target, then the older checkpoints, newest first.
    fn auto_candidates(&self) -> Vec<PathBuf> {
        let latest = std::fs::read_link(self.root.join("latest"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        let latest_step = latest.as_deref().and_then(parse_step_dir);
        let mut steps: Vec<u64> = std::fs::read_dir(&self.root)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| parse_step_dir(&e.file_name().to_string_lossy()))
                    .filter(|&s| latest_step.is_none_or(|l| s < l))
                    .collect()
            })
            .unwrap_or_default();
        steps.sort_unstable_by(|a, b| b.cmp(a));
        latest_step.into_iter().chain(steps).map(|s| self.root.join(step_dir_name(s))).collect()
    }

    /// Checks `c` against this run and restores it. Everything that can be
    /// refused is checked before anything is changed.
    pub(super) fn apply(
        &mut self,
        c: LoadedCheckpoint,
        model: &mut Model,
        opt: &mut Optimizer,
        amp: &mut Amp,
    ) -> Result<TrainProgress> {
        let changes = self.check_compatible(&c, model, opt)?;
        let optim_path = c.dir.join("optim.safetensors");
        let index: HashMap<String, usize> =
            model.params().iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect();
        let params = model.params();
        let mut states: Vec<(&str, usize, &[f32])> = Vec::new();
        let mut grads = pending::Found::new(c.state.world_size, index.len());
        let mut masters: Vec<Option<&StateEntry>> = vec![None; index.len()];
        for e in &c.optim {
            if let Some(&i) = e.name.strip_prefix(MASTER_PREFIX).and_then(|p| index.get(p)) {
                masters[i] = Some(e);
                continue;
            }
            let grad = pending::parse_grad_name(&e.name, &index);
            let split = ["momentum_buffer", "exp_avg_sq", "exp_avg"].into_iter().find_map(|s| {
                e.name
                    .strip_suffix(s)
                    .and_then(|p| p.strip_suffix('.'))
                    .and_then(|p| index.get(p))
                    .map(|&i| (s, i))
            });
            match (grad, split, &e.value) {
                (Some((r, i)), _, StateValue::F32(values)) => {
                    grads.insert(&optim_path, &e.name, (r, i), params[i].grad.numel(), values)?
                }
                (None, Some((state, i)), StateValue::F32(values)) => {
                    states.push((state, i, values.as_slice()))
                }
                _ => return Err(ckpt_err(&optim_path, format!("unexpected tensor `{}`", e.name))),
            }
        }
        drop(params);
        let legacy = grads.check(&optim_path, c.state.pending_grads)?;
        if legacy && self.shape.rank == 0 {
            crate::errln!(
                "warning: the checkpoint holds rank 0's pending accumulated gradients only (an older \
                 build wrote it); every rank resumes with them, so the step they complete is not exactly \
                 the uninterrupted one"
            );
        }
        let ranks = c.state.rank_losses.len();
        let same_world = c.state.world_size == self.shape.world_size;
        if self.shape.world_size > 1 && ranks != self.shape.world_size && same_world {
            return Err(ckpt_err(
                &c.dir.join("state.json"),
                format!("it records the losses of {ranks} ranks, this run has {}", self.shape.world_size),
            ));
        }
        let masters = self.checked_masters(&c, model, amp, &masters)?;
        let scaler = match c.state.scaler {
            Some(rec) => {
                let mut s = amp.scaler.clone();
                s.restore(rec.into()).map_err(|m| {
                    ckpt_err(&c.dir.join("state.json"), format!("cannot restore the loss scaler: {m}"))
                })?;
                s
            }
            None if amp.scaler.is_dynamic() => {
                return Err(ckpt_err(
                    &c.dir.join("state.json"),
                    "it has no loss-scaler state (`scaler` is null), but this run uses the dynamic loss \
                     scaler (amp.loss_scale = \"dynamic\"): it was written with a static loss scale or by \
                     an older build, and resuming would restart the scale from amp.init_scale",
                ))
            }
            None => amp.scaler.clone(),
        };
        opt.load_state_tensors(&optim_path, c.state.optimizer.step_count, &states)?;
        model.load_state_dict(c.model.clone(), &c.dir.join("model.safetensors"))?;
        // Sizes were checked above; f16 gradients round back exactly.
        for (p, g) in model.params_mut().into_iter().zip(grads.of_rank(self.shape.rank, legacy)) {
            match g {
                Some(g) => p.grad.copy_from_f32(g)?,
                None => p.grad.fill_(0.0),
            }
        }
        if let (Some(m), Some(dst)) = (masters, amp.masters_mut()) {
            dst.load(m)?;
        }
        amp.scaler = scaler;
        let mut p = c.state.progress.clone();
        if let Some(mine) = c.state.rank_losses.get(self.shape.rank).filter(|_| same_world) {
            (p.step_loss, p.window_loss) = (mine.step_loss, mine.window_loss);
        } else if !same_world && ranks > 0 {
            // Another job size: every rank takes the ranks' mean, which the logged loss is.
            let n = ranks as f64;
            p.step_loss = c.state.rank_losses.iter().map(|r| r.step_loss).sum::<f64>() / n;
            p.window_loss = c.state.rank_losses.iter().map(|r| r.window_loss).sum::<f64>() / n;
        }
        self.reshard = changes.reshard;
        crate::errln!(
            "resuming from {} (step {}, epoch {}, batch {} of the epoch)",
            c.dir.display(),
            p.step,
            p.epoch,
            p.batches_in_epoch
        );
        self.report_changes(&changes);
        self.last_saved = Some((p.step, p.epoch));
        self.resumed_from = Some(c.dir);
        Ok(p)
    }

    /// The checkpoint's fp32 master weights in parameter order, when this run
    /// keeps masters; refused when they are missing, mis-shaped, not the
    /// masters of the checkpoint's own weights, or present for a run without masters.
    fn checked_masters(
        &self,
        c: &LoadedCheckpoint,
        model: &Model,
        amp: &Amp,
        found: &[Option<&StateEntry>],
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let path = c.dir.join("optim.safetensors");
        let fail = |msg: String| Err(ckpt_err(&path, msg));
        if amp.masters().is_none() {
            return match found.iter().flatten().next() {
                Some(e) => fail(format!(
                    "it holds fp32 master weights (`{}`), but this run keeps none (amp.opt_level = \"{}\", \
                     amp.master_weights)",
                    e.name, self.opt_level
                )),
                None => Ok(None),
            };
        }
        let params = model.params();
        let missing: Vec<String> = params
            .iter()
            .zip(found)
            .filter(|(_, e)| e.is_none())
            .map(|(p, _)| format!("`{MASTER_PREFIX}{}`", p.name))
            .collect();
        if !missing.is_empty() {
            let more =
                if missing.len() > 4 { format!(" (and {} more)", missing.len() - 4) } else { String::new() };
            return fail(format!(
                "this run keeps fp32 master weights (amp.opt_level = \"{}\"), but the checkpoint lacks {}{more}",
                self.opt_level,
                missing[..missing.len().min(4)].join(", ")
            ));
        }
        let mut out = Vec::with_capacity(params.len());
        for (p, e) in params.iter().zip(found.iter().flatten()) {
            let StateValue::F32(master) = &e.value else {
                return fail(format!("master weight `{}` must be a floating-point tensor", e.name));
            };
            if e.shape != p.value.shape() {
                return fail(format!(
                    "master weight `{}` has shape {:?}, but parameter `{}` is {:?}",
                    e.name,
                    e.shape,
                    p.name,
                    p.value.shape()
                ));
            }
            // The model's weights are always the masters rounded to the model's
            // dtype; masters that do not round to the checkpoint's weights come
            // from another checkpoint.
            let saved = c.model.iter().find(|m| m.name == p.name).map(|m| &m.value);
            if let Some(StateValue::F32(w)) = saved {
                let (mut a, mut b) = (p.value.clone(), p.value.clone());
                a.copy_from_f32(master)?;
                b.copy_from_f32(w)?;
                let bits = |t: &crate::tensor::Tensor| {
                    t.to_f32_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                if bits(&a) != bits(&b) {
                    return fail(format!(
                        "master weight `{}` does not round to the weight `{}` in model.safetensors: the two \
                         files do not belong to the same checkpoint",
                        e.name, p.name
                    ));
                }
            }
            out.push(master.clone());
        }
        Ok(Some(out))
    }
}
