//! Reading a checkpoint back: integrity (sizes and SHA-256 recorded in
//! `state.json`), compatibility with this run (what differs is named), and
//! restoring the model, the optimizer and the loop's progress.

use super::io::{ckpt_err, parse_safetensors};
use super::save::{schedule_state, Checkpointer};
use super::state::{CheckpointState, TrainProgress, FORMAT_VERSION};
use super::{parse_step_dir, step_dir_name};
use crate::config::Resume;
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

/// Reads and verifies the checkpoint in `dir` (a `step_XXXXXXXX` directory,
/// `ckpt/latest`, or a `ckpt` directory, meaning its `latest`).
pub fn read_checkpoint(dir: &Path) -> Result<LoadedCheckpoint> {
    let dir = if !dir.join("state.json").exists() && dir.join("latest").exists() {
        dir.join("latest")
    } else {
        dir.to_path_buf()
    };
    let fail = |msg: String| ckpt_err(&dir, msg);
    if !dir.is_dir() {
        return Err(fail("no such checkpoint directory".into()));
    }
    let text = std::fs::read_to_string(dir.join("state.json"))
        .map_err(|e| fail(format!("cannot read state.json ({e}): an incomplete checkpoint")))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("state.json is corrupt: {e}")))?;
    let version = value.get("version").and_then(|v| v.as_u64());
    if version != Some(u64::from(FORMAT_VERSION)) {
        return Err(fail(format!(
            "state.json has format version {}; this build reads version {FORMAT_VERSION}",
            version.map_or("(none)".to_string(), |v| v.to_string())
        )));
    }
    let state: CheckpointState =
        serde_json::from_value(value).map_err(|e| fail(format!("state.json is corrupt: {e}")))?;
    if state.scaler.is_some() {
        return Err(fail("it holds a loss-scaler state, which this build cannot restore".into()));
    }
    let read = |file: &str| -> Result<Vec<StateEntry>> {
        let digest =
            state.files.get(file).ok_or_else(|| fail(format!("state.json does not record {file}")))?;
        let path = dir.join(file);
        let bytes = std::fs::read(&path).map_err(|e| fail(format!("cannot read {file}: {e}")))?;
        if bytes.len() as u64 != digest.bytes {
            return Err(fail(format!(
                "{file} is truncated or overwritten: {} bytes, state.json records {}",
                bytes.len(),
                digest.bytes
            )));
        }
        let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        if sha != digest.sha256 {
            return Err(fail(format!("{file} is corrupt: its SHA-256 differs from the one in state.json")));
        }
        parse_safetensors(&bytes, &path)
    };
    let model = read("model.safetensors")?;
    let optim = read("optim.safetensors")?;
    Ok(LoadedCheckpoint { dir, state, model, optim })
}

/// Loads a checkpoint's weights into `model` for evaluation. Only the model's
/// shapes must match; the rest of the config may differ.
pub fn load_for_eval(dir: &Path, model: &mut Model) -> Result<CheckpointState> {
    let c = read_checkpoint(dir)?;
    check_model_shapes(&c, model)?;
    model.load_state_dict(c.model, &c.dir.join("model.safetensors"))?;
    Ok(c.state)
}

fn shape_map(entries: &[StateEntry]) -> BTreeMap<&str, &[usize]> {
    entries.iter().map(|e| (e.name.as_str(), e.shape.as_slice())).collect()
}

fn check_model_shapes(c: &LoadedCheckpoint, model: &Model) -> Result<()> {
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

/// Dotted keys whose values differ between two configs, as "key: checkpoint X, this run Y".
fn config_diff(theirs: &serde_json::Value, ours: &serde_json::Value) -> Vec<String> {
    fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    flatten(&key, v, out);
                }
            }
            _ => {
                out.insert(prefix.to_string(), v.to_string());
            }
        }
    }
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten("", theirs, &mut a);
    flatten("", ours, &mut b);
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let none = "(unset)".to_string();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            format!("{k}: checkpoint {}, this run {}", a.get(k).unwrap_or(&none), b.get(k).unwrap_or(&none))
        })
        .collect()
}

impl Checkpointer {
    /// Restores model, optimizer and progress per `checkpoint.resume`; `None`
    /// when the run starts fresh. With "auto", an unusable newest checkpoint
    /// falls back to the previous good one (and says so on stderr).
    pub fn resume(&mut self, model: &mut Model, opt: &mut Optimizer) -> Result<Option<TrainProgress>> {
        let candidates = match &self.resume {
            Resume::Never => return Ok(None),
            Resume::Path(p) => {
                let c = read_checkpoint(p)?;
                return self.apply(c, model, opt).map(Some);
            }
            Resume::Auto => self.auto_candidates(),
        };
        let mut refused = Vec::new();
        for dir in candidates {
            match read_checkpoint(&dir).and_then(|c| self.apply(c, model, opt)) {
                Ok(p) => {
                    if !refused.is_empty() {
                        eprintln!("warning: resuming from the previous good checkpoint {}", dir.display());
                    }
                    return Ok(Some(p));
                }
                Err(e) => {
                    eprintln!("warning: checkpoint.resume = \"auto\": cannot resume from it: {e}");
                    refused.push(e.to_string());
                }
            }
        }
        if refused.is_empty() {
            return Ok(None);
        }
        Err(ckpt_err(
            &self.root,
            format!(
                "no usable checkpoint to resume from ({}); set checkpoint.resume = \"never\" to start over \
                 (its checkpoints then replace these) or use another run.out_dir",
                refused.join("; ")
            ),
        ))
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

    fn check_compatible(&self, c: &LoadedCheckpoint, model: &Model, opt: &Optimizer) -> Result<()> {
        let st = &c.state;
        let fail = |msg: String| Err(ckpt_err(&c.dir, msg));
        if st.opt_level != self.opt_level {
            return fail(format!(
                "the opt level differs: the checkpoint was trained at {}, this run is {} (amp.opt_level)",
                st.opt_level, self.opt_level
            ));
        }
        if st.world_size != self.shape.world_size {
            return fail(format!(
                "the world size differs: the checkpoint was trained by {} processes, this run has {}",
                st.world_size, self.shape.world_size
            ));
        }
        check_model_shapes(c, model)?;
        if st.config_fingerprint != self.fingerprint {
            let mut diff = config_diff(&st.config, &self.config_json);
            let more = if diff.len() > 5 { format!(" (and {} more)", diff.len() - 5) } else { String::new() };
            diff.truncate(5);
            let what = if diff.is_empty() {
                "state.json's config record is damaged".into()
            } else {
                diff.join("; ")
            };
            return fail(format!("the config differs from the checkpoint's: {what}{more}"));
        }
        let ours = schedule_state(&self.shape);
        if st.schedule != ours {
            return fail(format!(
                "the run's length differs (did the training data change?): the checkpoint has {} samples, \
                 {} steps per epoch, {} steps in all; this run has {}, {}, {}",
                st.schedule.train_samples,
                st.schedule.steps_per_epoch,
                st.schedule.total_steps,
                ours.train_samples,
                ours.steps_per_epoch,
                ours.total_steps
            ));
        }
        let kind = format!("{:?}", opt.config().kind);
        if st.optimizer.name != kind {
            return fail(format!("the optimizer differs: checkpoint {}, this run {kind}", st.optimizer.name));
        }
        Ok(())
    }

    fn apply(
        &mut self,
        c: LoadedCheckpoint,
        model: &mut Model,
        opt: &mut Optimizer,
    ) -> Result<TrainProgress> {
        self.check_compatible(&c, model, opt)?;
        let optim_path = c.dir.join("optim.safetensors");
        let index: HashMap<String, usize> =
            model.params().iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect();
        let mut states: Vec<(&str, usize, &[f32])> = Vec::new();
        let mut grads: Vec<Option<&[f32]>> = vec![None; index.len()];
        for e in &c.optim {
            let split = ["momentum_buffer", "exp_avg_sq", "exp_avg", "grad"].into_iter().find_map(|s| {
                e.name
                    .strip_suffix(s)
                    .and_then(|p| p.strip_suffix('.'))
                    .and_then(|p| index.get(p))
                    .map(|&i| (s, i))
            });
            let (Some((state, i)), StateValue::F32(values)) = (split, &e.value) else {
                return Err(ckpt_err(&optim_path, format!("unexpected tensor `{}`", e.name)));
            };
            if state == "grad" {
                grads[i] = Some(values.as_slice());
            } else {
                states.push((state, i, values.as_slice()));
            }
        }
        let pending = grads.iter().filter(|g| g.is_some()).count();
        if pending != if c.state.pending_grads { grads.len() } else { 0 } {
            return Err(ckpt_err(&optim_path, "the pending gradients are incomplete"));
        }
        opt.load_state_tensors(&optim_path, c.state.optimizer.step_count, &states)?;
        model.load_state_dict(c.model.clone(), &c.dir.join("model.safetensors"))?;
        for (p, g) in model.params_mut().into_iter().zip(&grads) {
            let dst = p.grad.as_f32_mut()?;
            match g {
                Some(g) if g.len() == dst.len() => dst.copy_from_slice(g),
                Some(_) => {
                    return Err(ckpt_err(&optim_path, format!("`{}.grad` has the wrong size", p.name)))
                }
                None => dst.fill(0.0),
            }
        }
        let p = c.state.progress.clone();
        eprintln!(
            "resuming from {} (step {}, epoch {}, batch {} of the epoch)",
            c.dir.display(),
            p.step,
            p.epoch,
            p.batches_in_epoch
        );
        self.last_saved = Some((p.step, p.epoch));
        self.resumed_from = Some(c.dir);
        Ok(p)
    }
}
