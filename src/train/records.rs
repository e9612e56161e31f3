//! What a run reports of itself: its header line, its figures per token or
//! per image, and `summary.json`, which holds the whole run over every
//! segment a resume added, and the last segment on its own.

use super::{expect, Ddp, Summary};
use crate::checkpoint::TrainProgress;
use crate::config::{self, Config};
use serde::Serialize;
use std::path::PathBuf;

/// A language model's run: its windows are `block_size` tokens each.
#[derive(Debug, Clone, Copy)]
pub(super) struct Text {
    block_size: usize,
}

impl Text {
    pub(super) fn of(cfg: &Config) -> Option<Text> {
        (cfg.data.dataset == config::DatasetKind::Text)
            .then(|| Text { block_size: cfg.model.input_shape.first().copied().unwrap_or(0) })
    }
}

/// Throughput in the run's unit: tokens for text, images otherwise.
pub(super) trait Rate {
    fn rate(self, samples_per_s: f64) -> (f64, &'static str);
    fn tokens_per_s(self, samples_per_s: f64) -> Option<f64>;
}

impl Rate for Option<Text> {
    fn rate(self, samples_per_s: f64) -> (f64, &'static str) {
        match self.tokens_per_s(samples_per_s) {
            Some(t) => (t, "tokens/s"),
            None => (samples_per_s, "images/s"),
        }
    }

    fn tokens_per_s(self, samples_per_s: f64) -> Option<f64> {
        self.map(|t| samples_per_s * t.block_size as f64)
    }
}

/// Full passes over the training set in `steps` optimizer steps (the
/// micro-batches an epoch leaves over for accumulation do not count).
pub(super) fn full_epochs(steps: u64, steps_per_epoch: u64) -> u64 {
    steps.checked_div(steps_per_epoch).unwrap_or(0)
}

/// The run's first line: what is trained, on what, for how long.
pub(super) fn header_line(
    cfg: &Config,
    num_params: usize,
    (train_len, test_len): (usize, usize),
    world: usize,
    (total_steps, steps_per_epoch): (u64, u64),
    device: &str,
) -> String {
    format!(
        "ddptrain: {} | {num_params} params | {train_len} train / {test_len} test samples | world size {world} x batch {} | {total_steps} steps ({steps_per_epoch} per epoch) | device {device} | opt_level {}",
        cfg.run.name, cfg.data.batch_size, cfg.amp.opt_level
    )
}

/// The last segment of a resumed run: from its checkpoint to its end.
#[derive(Debug, Clone, Serialize)]
pub struct Segment {
    /// The step the segment resumed after.
    pub from_step: u64,
    pub steps: u64,
    pub wall_s: f64,
    pub images_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
}

/// Where this segment of the run started: the resumed checkpoint's counts
/// (zero for a fresh run).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SegmentStart {
    pub step: Option<u64>,
    pub images: usize,
    pub train_time_s: f64,
    pub wall_s: f64,
}

impl SegmentStart {
    pub(super) fn of(resumed: Option<&TrainProgress>) -> SegmentStart {
        resumed.map_or_else(SegmentStart::default, |p| SegmentStart {
            step: Some(p.step),
            images: p.train_images,
            train_time_s: p.train_time_s,
            wall_s: p.wall_s,
        })
    }
}

/// What the summary is made of besides the loop's counts.
pub(super) struct Closing<'a> {
    pub cfg: &'a Config,
    pub ddp: &'a Ddp,
    pub device: String,
    pub num_params: usize,
    pub steps_per_epoch: u64,
    /// Epochs completed when steps do not count them: a resume under another
    /// world size or batch changed the steps an epoch takes.
    pub epochs: Option<u64>,
    pub start: SegmentStart,
    /// This segment's wall time (0 for a finished run run again).
    pub segment_wall_s: f64,
    pub checkpoints: Vec<PathBuf>,
    pub resumed_from: Option<PathBuf>,
    pub loss_scale: f32,
    pub overflow_steps: u64,
    pub allreduce_hidden_fraction: Option<f64>,
    pub trace_divergence: Option<String>,
    pub interrupted: Option<super::stop::StopSignal>,
    pub log: Option<PathBuf>,
}

impl Closing<'_> {
    /// The run's summary from its final counts `c`, its gates judged.
    pub(super) fn summary(self, c: &TrainProgress) -> Summary {
        let text = Text::of(self.cfg);
        let world = self.ddp.world_size();
        // Every rank trains equal batches: the job's throughput is world x this rank's.
        let per_s = |images: usize, secs: f64| (images * world) as f64 / secs.max(1e-9);
        let images_per_s = per_s(c.train_images, c.train_time_s);
        let segment = self.start.step.map(|from| {
            let ips = per_s(
                c.train_images.saturating_sub(self.start.images),
                c.train_time_s - self.start.train_time_s,
            );
            Segment {
                from_step: from,
                steps: c.step.saturating_sub(from),
                wall_s: self.segment_wall_s,
                images_per_s: ips,
                tokens_per_s: text.tokens_per_s(ips),
            }
        });
        let eval = c.last_eval;
        let mut s = Summary {
            rank: self.ddp.rank(),
            log: self.log,
            name: self.cfg.run.name.clone(),
            final_loss: c.final_loss,
            test_accuracy: eval.filter(|_| text.is_none()).map(|e| e.accuracy),
            test_loss: eval.filter(|_| text.is_none()).map(|e| e.loss),
            val_loss: eval.filter(|_| text.is_some()).map(|e| e.loss),
            perplexity: eval.filter(|_| text.is_some()).map(|e| e.loss.exp()),
            eval_step: eval.and_then(|e| e.step),
            images_per_s,
            tokens_per_s: text.tokens_per_s(images_per_s),
            allreduce_hidden_fraction: self.allreduce_hidden_fraction,
            steps: c.step,
            epochs: self.epochs.unwrap_or_else(|| full_epochs(c.step, self.steps_per_epoch)),
            wall_s: self.start.wall_s + self.segment_wall_s,
            resumed_from_step: self.start.step,
            last_segment: segment,
            opt_level: self.cfg.amp.opt_level.to_string(),
            world_size: world,
            device: self.device,
            num_params: self.num_params,
            weights: self.cfg.run.out_dir.join("model.safetensors"),
            checkpoints: self.checkpoints,
            resumed_from: self.resumed_from,
            trace_divergence: self.trace_divergence,
            loss_scale: self.loss_scale,
            overflow_steps: self.overflow_steps,
            initial_loss: c.initial_loss,
            loss_decreased: c.final_loss < c.initial_loss,
            interrupted: self.interrupted,
            gates: Vec::new(),
        };
        s.gates = expect::check(&self.cfg.expect, &s);
        s
    }
}
