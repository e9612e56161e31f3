//! What a resume may change. A run is extended by resuming it with more
//! `train.epochs` or `train.max_steps`, evaluated differently, or given new
//! gates: none of that changes what it computed up to its checkpoint, so
//! each such change is listed in the log and the run goes on. A change to
//! what it computed so far (the model, the data, the optimizer and its
//! schedule, the batch, the seed, the world size) is refused, naming the
//! keys, unless `checkpoint.resume_changes = "allow"`: the run then goes on
//! with a warning, as a fine-tune from the checkpoint would, no longer the
//! bitwise continuation of the run that wrote it.
//!
//! The learning rate of step `s` is a pure function of the new config (as
//! nanoGPT's `get_lr(it)` is of its `max_iters`): warmup, whose keys cannot
//! change, is the same, and a cosine schedule decays over the new length
//! from the step the run resumes at, so extending a finished cosine run
//! raises the LR at the resume point to where the longer schedule has it.

use super::io::ckpt_err;
use super::load::LoadedCheckpoint;
use super::save::{schedule_state, Checkpointer};
use crate::config::{diff_keys, ResumeChanges};
use crate::error::Result;
use crate::nn::Model;
use crate::optim::Optimizer;

/// Settings that change nothing a run computed up to its checkpoint: its
/// length, its evaluation, and how long a collective waits. (`[logging]`,
/// `[checkpoint]`, `[expect]` and where the data and the run live are not in
/// the compared record at all: see `save::resume_identity`.)
pub(super) const EXTENDS: [&str; 6] = [
    "train.epochs",
    "train.max_steps",
    "train.eval_every",
    "train.eval_iters",
    "data.eval_batch_size",
    "parallel.timeout_s",
];

/// A resume with `resume_changes = "allow"` under another world size or
/// batch: the resumed epoch's rest is dealt to this job's ranks from the
/// epoch's order, after the samples the checkpoint's job visited
/// ([`crate::data::DistributedSampler::indices_after`]), so no sample of the
/// epoch is visited twice or skipped; later epochs are this job's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reshard {
    /// Positions of the epoch's order the checkpoint's job visited.
    pub consumed: usize,
    pub from_world: usize,
}

fn batch_size(config: &serde_json::Value) -> Option<u64> {
    config["data"]["batch_size"].as_u64()
}

/// Keys named in one refusal or warning; the rest are counted.
const MAX_NAMED: usize = 5;

/// How this run's settings differ from a checkpoint's, each difference as
/// "key: checkpoint X, this run Y".
#[derive(Debug, Default, PartialEq)]
pub(super) struct Changes {
    /// Keys of [`EXTENDS`]: listed in the log.
    pub(super) extends: Vec<String>,
    /// The rest, and a world size or data size that differs.
    pub(super) math: Vec<String>,
    /// Where the resumed epoch picks up under another world size or batch.
    pub(super) reshard: Option<Reshard>,
}

impl Changes {
    pub(super) fn between(saved: &serde_json::Value, ours: &serde_json::Value) -> Changes {
        let mut c = Changes::default();
        for d in diff_keys(saved, ours, ("checkpoint", "this run")) {
            let key = d.split_once(": ").map_or(d.as_str(), |(k, _)| k);
            if EXTENDS.contains(&key) {
                c.extends.push(d);
            } else {
                c.math.push(d);
            }
        }
        c
    }
}

/// `items` joined by "; ", the first few, then "(and N more)".
fn named(items: &[String]) -> String {
    let more = items.len().saturating_sub(MAX_NAMED);
    let head = items.iter().take(MAX_NAMED).cloned().collect::<Vec<_>>().join("; ");
    if more > 0 {
        format!("{head} (and {more} more)")
    } else {
        head
    }
}

impl Checkpointer {
    /// Checks `c` against this run: what can never be resumed across (the
    /// opt level, the model's shapes, the optimizer) is refused; what changes
    /// the math so far is refused unless `checkpoint.resume_changes =
    /// "allow"`. Returns the changes, for [`Checkpointer::report_changes`].
    pub(super) fn check_compatible(
        &self,
        c: &LoadedCheckpoint,
        model: &Model,
        opt: &Optimizer,
    ) -> Result<Changes> {
        let st = &c.state;
        let fail = |msg: String| Err(ckpt_err(&c.dir, msg));
        if st.opt_level != self.opt_level {
            return fail(format!(
                "the opt level differs: the checkpoint was trained at {}, this run is {} (amp.opt_level)",
                st.opt_level, self.opt_level
            ));
        }
        super::load::check_model_shapes(c, model)?;
        let kind = format!("{:?}", opt.config().kind);
        if st.optimizer.name != kind {
            return fail(format!("the optimizer differs: checkpoint {}, this run {kind}", st.optimizer.name));
        }
        let mut changes = if st.config_fingerprint == self.fingerprint {
            Changes::default()
        } else if st.config.is_object() {
            Changes::between(&st.config, &self.config_json)
        } else {
            return fail("state.json's config record is damaged".into());
        };
        if st.world_size != self.shape.world_size {
            changes.math.push(format!(
                "the world size: checkpoint {} processes, this run {}",
                st.world_size, self.shape.world_size
            ));
        }
        let ours = schedule_state(&self.shape);
        if (st.schedule.train_samples, st.schedule.steps_per_epoch)
            != (ours.train_samples, ours.steps_per_epoch)
            && st.world_size == self.shape.world_size
        {
            changes.math.push(format!(
                "the training data (did it change?): checkpoint {} samples, {} steps per epoch, this run {}, {}",
                st.schedule.train_samples, st.schedule.steps_per_epoch, ours.train_samples, ours.steps_per_epoch
            ));
        }
        if !changes.math.is_empty() && self.resume_changes == ResumeChanges::Refuse {
            return fail(format!(
                "the config differs from the checkpoint's in what the run computed so far: {}. Resume with \
                 the checkpoint's settings (its config.toml), train into another run.out_dir, or set \
                 checkpoint.resume_changes = \"allow\" to continue from it anyway (no longer bitwise the \
                 run that wrote it)",
                named(&changes.math)
            ));
        }
        changes.reshard = self.reshard_of(c);
        if changes.reshard.is_some() && st.pending_grads {
            return fail(format!(
                "it holds the gradients of micro-batches accumulated but not yet stepped on, which a job of \
                 another world size or batch cannot split (the checkpoint's: {} processes x batch {}); \
                 resume it as it was trained, past its next step's checkpoint",
                st.world_size,
                batch_size(&st.config).map_or_else(|| "?".to_string(), |b| b.to_string())
            ));
        }
        Ok(changes)
    }

    /// Where a resume that changed the world size or the batch picks up
    /// its epoch: after the samples the checkpoint's job visited of it.
    fn reshard_of(&self, c: &LoadedCheckpoint) -> Option<Reshard> {
        let st = &c.state;
        let theirs = batch_size(&st.config)?;
        let ours = batch_size(&self.config_json)?;
        if (st.world_size, theirs) == (self.shape.world_size, ours) {
            return None;
        }
        let consumed =
            st.progress.batches_in_epoch.saturating_mul(theirs as usize).saturating_mul(st.world_size);
        Some(Reshard { consumed, from_world: st.world_size })
    }

    /// A resume under another world size or batch: see [`Reshard`].
    pub fn reshard(&self) -> Option<Reshard> {
        self.reshard
    }

    /// The run's length and schedule once a reshard has recounted them.
    pub fn set_plan(&mut self, total_steps: u64, schedule: crate::optim::LrSchedule) {
        self.shape.total_steps = total_steps;
        self.shape.schedule = schedule;
    }

    /// Rank 0 lists what this resume changes: the extensions, and with
    /// `resume_changes = "allow"` the warning for the rest.
    pub(super) fn report_changes(&self, changes: &Changes) {
        if self.shape.rank != 0 {
            return;
        }
        if !changes.extends.is_empty() {
            crate::errln!("resuming with changed settings: {}", changes.extends.join("; "));
        }
        if !changes.math.is_empty() {
            crate::errln!(
                "warning: checkpoint.resume_changes = \"allow\": resuming with settings that change what the \
                 run computed so far ({}); it goes on from the checkpoint, but no longer continues bitwise as \
                 the run that wrote it would have",
                named(&changes.math)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_length_and_the_evaluation_extend_a_run_and_the_rest_changes_its_math() {
        let saved = json!({"train": {"epochs": 2, "eval_iters": 5, "grad_accum_steps": 1},
            "data": {"batch_size": 32, "eval_batch_size": 100}, "optimizer": {"lr": 0.1}});
        let ours = json!({"train": {"epochs": 4, "eval_iters": 5, "grad_accum_steps": 1, "max_steps": 900},
            "data": {"batch_size": 64, "eval_batch_size": 200}, "optimizer": {"lr": 0.1}});
        let c = Changes::between(&saved, &ours);
        assert_eq!(
            c.extends,
            [
                "data.eval_batch_size: checkpoint 100, this run 200",
                "train.epochs: checkpoint 2, this run 4",
                "train.max_steps: checkpoint (unset), this run 900",
            ]
        );
        assert_eq!(c.math, ["data.batch_size: checkpoint 32, this run 64"]);
        assert_eq!(Changes::between(&saved, &saved), Changes::default());
    }

    #[test]
    fn many_changes_are_counted() {
        let items: Vec<String> = (0..7).map(|i| format!("k{i}")).collect();
        assert_eq!(named(&items), "k0; k1; k2; k3; k4 (and 2 more)");
        assert_eq!(named(&items[..2]), "k0; k1");
    }
}
