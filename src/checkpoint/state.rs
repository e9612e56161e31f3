//! `state.json`: everything besides tensors that a resumed run needs to
//! continue bit for bit.
//!
//! Floats that must survive the round trip exactly (loss accumulators, timings)
//! are written as strings holding Rust's shortest round-trip decimal
//! (`"2.3025851249694824"`), which `str::parse` reads back to the same bits;
//! JSON number parsers are not required to.
//!
//! RNG state: there is none to store. Every random stream is derived from
//! (run seed, purpose, index) (`crate::rng`): the sampler permutation of epoch
//! `e` is stream (seed, Sampler, e), init is (seed, Init, layer), synthetic data
//! is (seed, Synthetic, split). So `seed`, `epoch` and `batches_in_epoch` fix
//! every future draw.
//!
//! `scaler` is the dynamic loss scaler's state (scale, clean steps since the
//! last growth or overflow, steps skipped so far); it is `null` when the loss
//! scale is static (O0, O3, or a number in `amp.loss_scale`), whose state is
//! the config's number: a static scale never moves, and an overflow under it
//! stops the run, so nothing is skipped either.
//!
//! Runs with fp32 master weights (O2, or `amp.master_weights = true`) keep them
//! in `optim.safetensors` as `master.<parameter name>`, f32 with the
//! parameter's shape; `model.safetensors` holds the model's own (f16-rounded)
//! weights, as PyTorch's `model.state_dict()` would under apex.

use crate::amp::ScalerState;
use crate::train::EvalResult;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bumped whenever a reader of the previous version could misread a checkpoint.
pub const FORMAT_VERSION: u32 = 1;

/// The training loop's position and the accumulators behind its metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainProgress {
    /// Optimizer steps taken.
    pub step: u64,
    /// Epochs completed (the epoch the next batch comes from).
    pub epoch: u64,
    /// Batches of `epoch` already consumed (its sampler order is recomputed from the seed).
    pub batches_in_epoch: usize,
    /// Loss summed over the micro-batches since the last optimizer step (non-zero only when
    /// gradient accumulation left micro-batches pending at an epoch's end).
    #[serde(with = "exact_f64")]
    pub step_loss: f64,
    /// Training loss summed since the last logged step, and the steps in that sum.
    #[serde(with = "exact_f64")]
    pub window_loss: f64,
    pub window_n: u64,
    pub window_images: usize,
    /// The last logged mean training loss (NaN before the first log line).
    #[serde(with = "exact_f64")]
    pub final_loss: f64,
    pub last_eval: Option<EvalState>,
    /// The total norm of the unscaled gradients (before clipping) of the last applied step.
    #[serde(with = "exact_f32_opt")]
    pub grad_norm: Option<f32>,
    /// Images trained on and seconds spent in training steps, for images/s over the whole run.
    pub train_images: usize,
    #[serde(with = "exact_f64")]
    pub train_time_s: f64,
    /// Seconds of training steps in the logging window, for its images/s
    /// (evaluations and checkpoints excluded).
    #[serde(with = "exact_f64", default)]
    pub window_time_s: f64,
    /// The first optimizer step's loss (mean over ranks; NaN in checkpoints
    /// written before it was kept).
    #[serde(with = "exact_f64", default = "nan")]
    pub initial_loss: f64,
    /// Wall time of the run up to this checkpoint, over every segment.
    #[serde(with = "exact_f64", default)]
    pub wall_s: f64,
}

fn nan() -> f64 {
    f64::NAN
}

impl TrainProgress {
    /// A run before its first step.
    pub fn start() -> Self {
        TrainProgress {
            step: 0,
            epoch: 0,
            batches_in_epoch: 0,
            step_loss: 0.0,
            window_loss: 0.0,
            window_n: 0,
            window_images: 0,
            final_loss: f64::NAN,
            last_eval: None,
            grad_norm: None,
            train_images: 0,
            train_time_s: 0.0,
            window_time_s: 0.0,
            initial_loss: f64::NAN,
            wall_s: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalState {
    #[serde(with = "exact_f64")]
    pub accuracy: f64,
    #[serde(with = "exact_f64")]
    pub loss: f64,
    pub correct: usize,
    pub total: usize,
    /// The step it evaluated (absent in checkpoints written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

impl From<EvalResult> for EvalState {
    fn from(e: EvalResult) -> Self {
        EvalState { accuracy: e.accuracy, loss: e.loss, correct: e.correct, total: e.total, step: None }
    }
}

impl From<EvalState> for EvalResult {
    fn from(e: EvalState) -> Self {
        EvalResult { accuracy: e.accuracy, loss: e.loss, correct: e.correct, total: e.total }
    }
}

/// The inputs of the LR schedule; the LR of step `s` is a pure function of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleState {
    /// `LrSchedule::kind` as Rust writes it, e.g. `Cosine { eta_min: 0.0 }`.
    pub kind: String,
    #[serde(with = "exact_f64")]
    pub base_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub steps_per_epoch: u64,
    pub train_samples: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState {
    /// "SGD", "Adam" or "AdamW".
    pub name: String,
    /// Updates taken (Adam's `state['step']`).
    pub step_count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileDigest {
    pub bytes: u64,
    pub sha256: String,
}

/// The whole of `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    pub version: u32,
    #[serde(flatten)]
    pub progress: TrainProgress,
    pub seed: u64,
    pub opt_level: String,
    pub world_size: usize,
    /// `Config::fingerprint()` of the config with `[checkpoint]`, `[expect]`,
    /// `data.path` and `data.prefetch` reset: the settings a resumed run must share.
    pub config_fingerprint: String,
    pub schedule: ScheduleState,
    pub optimizer: OptimizerState,
    /// True when `optim.safetensors` also holds `<param>.grad` (gradients of
    /// micro-batches accumulated but not yet stepped on), and with several
    /// ranks every other rank's as `rank{r}.<param>.grad` (see `pending.rs`).
    pub pending_grads: bool,
    /// With several ranks, every rank's own loss accumulators in rank order
    /// (the progress fields hold rank 0's): the logged loss is their mean, so
    /// each rank resumes with its own. Absent for a single process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_losses: Vec<RankLosses>,
    /// The dynamic loss scaler's state; `null` with a static loss scale.
    pub scaler: Option<ScalerRecord>,
    /// Size and SHA-256 of `model.safetensors` and `optim.safetensors`.
    pub files: BTreeMap<String, FileDigest>,
    /// The fingerprinted settings as JSON, so a refusal can name what differs.
    pub config: serde_json::Value,
}

/// One rank's loss accumulators (see [`TrainProgress`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankLosses {
    #[serde(with = "exact_f64")]
    pub step_loss: f64,
    #[serde(with = "exact_f64")]
    pub window_loss: f64,
}

/// [`crate::amp::ScalerState`] with the scale written exactly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerRecord {
    #[serde(with = "exact_f32")]
    pub scale: f32,
    /// Clean steps since the last growth or overflow (torch's `_growth_tracker`).
    pub growth_tracker: u64,
    /// Optimizer steps skipped for overflow so far (the LR schedule counts only the others).
    pub overflow_steps: u64,
}

impl From<ScalerState> for ScalerRecord {
    fn from(s: ScalerState) -> Self {
        ScalerRecord { scale: s.scale, growth_tracker: s.growth_tracker, overflow_steps: s.overflow_steps }
    }
}

impl From<ScalerRecord> for ScalerState {
    fn from(r: ScalerRecord) -> Self {
        ScalerState { scale: r.scale, growth_tracker: r.growth_tracker, overflow_steps: r.overflow_steps }
    }
}

/// f64 as its shortest round-trip decimal string.
pub(crate) mod exact_f64 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| D::Error::custom(format!("`{s}` is not a number")))
    }
}

pub(crate) mod exact_f32 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| D::Error::custom(format!("`{s}` is not a number")))
    }
}

pub(crate) mod exact_f32_opt {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_some(&x.to_string()),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f32>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(|_| D::Error::custom(format!("`{s}` is not a number"))))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_round_trip_bit_for_bit() {
        let p = TrainProgress {
            step: 3,
            epoch: 1,
            batches_in_epoch: 7,
            step_loss: 0.1 + 0.2,
            window_loss: std::f64::consts::PI / 3.0,
            window_n: 2,
            window_images: 200,
            final_loss: f64::NAN,
            last_eval: Some(EvalState {
                accuracy: 1.0 / 3.0,
                loss: 2.0 / 7.0,
                correct: 1,
                total: 3,
                step: Some(4),
            }),
            grad_norm: Some(1.0f32 / 7.0),
            train_images: 300,
            train_time_s: 1e-300,
            window_time_s: 1.0 / 9.0,
            initial_loss: 2.0f64.sqrt(),
            wall_s: 0.1 + 0.7,
        };
        let back: TrainProgress = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back.window_time_s.to_bits(), p.window_time_s.to_bits());
        assert_eq!(back.initial_loss.to_bits(), p.initial_loss.to_bits());
        assert_eq!(back.wall_s.to_bits(), p.wall_s.to_bits());
        assert_eq!(back.step_loss.to_bits(), p.step_loss.to_bits());
        assert_eq!(back.window_loss.to_bits(), p.window_loss.to_bits());
        assert!(back.final_loss.is_nan());
        assert_eq!(back.last_eval, p.last_eval);
        assert_eq!(back.grad_norm.map(f32::to_bits), p.grad_norm.map(f32::to_bits));
        assert_eq!(back.train_time_s.to_bits(), p.train_time_s.to_bits());
    }

    #[test]
    fn a_checkpoint_from_before_the_initial_loss_and_window_time_reads_with_defaults() {
        let mut v = serde_json::to_value(TrainProgress::start()).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("initial_loss");
        o.remove("window_time_s");
        let back: TrainProgress = serde_json::from_value(v).unwrap();
        assert!(back.initial_loss.is_nan());
        assert_eq!(back.window_time_s, 0.0);
    }

    #[test]
    fn the_scaler_record_round_trips_exactly_and_refuses_unknown_fields() {
        let r = ScalerRecord { scale: 1.0 + f32::EPSILON, growth_tracker: 3, overflow_steps: 9 };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"scale":"1.0000001","growth_tracker":3,"overflow_steps":9}"#);
        let back: ScalerRecord = serde_json::from_str(&text).unwrap();
        assert_eq!((back.scale.to_bits(), back), (r.scale.to_bits(), r));
        let err = serde_json::from_str::<ScalerRecord>(
            r#"{"scale":"2","growth_tracker":0,"overflow_steps":0,"x":1}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `x`"), "{err}");
    }
}
