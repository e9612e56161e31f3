//! The training loop, one for every device: what a step is (micro-batches
//! forward and backward, the optimizer step), and the bookkeeping around it
//! (loss windows, log lines, metrics, progress, traces, checkpoints, the
//! evaluation after each epoch, the summary and the final barrier). The
//! arithmetic is the [`Engine`]'s.
//!
//! Epochs in `metrics.jsonl` and in the log lines are 0-based indices of the
//! epoch a step was taken in, for every record kind: an evaluation at the
//! end of epoch 0 is `epoch 0`, as its last step's line is. `summary.json`'s
//! `epochs` counts the epochs completed.

use super::engine::{Engine, HostSync, Skip};
use super::records::{header_line, Closing, Rate, SegmentStart, Text};
use super::{stop, trace, Ddp, RunOptions, RunPlan, Summary};
use crate::checkpoint::{Checkpointer, TrainProgress};
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::metrics::{self, MetricsWriter, Progress, ProgressMode};
use crate::optim::LrSchedule;
use crate::rng::MicroBatch;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A run set up on its device: what [`run`] needs besides the engine.
pub(crate) struct Setup {
    pub ddp: Ddp,
    pub plan: RunPlan,
    pub ckpt: Checkpointer,
    pub resumed: Option<TrainProgress>,
    /// Training and test samples (for the header line).
    pub samples: (usize, usize),
    pub num_params: usize,
}

/// How an epoch's pass ended.
enum EpochEnd {
    /// Its batches are done.
    Complete,
    /// The run's last step came inside it, after this many of its micro-batches.
    RunEndedInside(usize),
    /// A signal every rank agreed on, after this many of its micro-batches.
    Stopped(stop::StopSignal, usize),
    /// `--check-trace` found a divergence.
    Diverged,
}

/// The loop's state: everything a step, a log line, an evaluation and a
/// checkpoint read or write.
struct Loop<'a> {
    cfg: &'a Config,
    opts: &'a RunOptions,
    engine: &'a mut dyn Engine,
    ddp: Ddp,
    ckpt: Checkpointer,
    progress: Progress,
    metrics: MetricsWriter,
    tracer: Option<trace::Tracer>,
    trace_divergence: Option<String>,
    /// What the loop has counted: the checkpoint's view of it.
    c: TrainProgress,
    text: Option<Text>,
    steps_per_epoch: u64,
    total_steps: u64,
    /// The step of the last evaluation (none at an epoch's end twice).
    evaluated_at: Option<u64>,
    start: SegmentStart,
    wall: Instant,
}

/// Trains `engine` for the run `setup` planned: the contract of [`super::train_with`].
pub(crate) fn run(cfg: &Config, opts: &RunOptions, setup: Setup, engine: &mut dyn Engine) -> Result<Summary> {
    let Setup { ddp, plan, ckpt, resumed, samples, num_params } = setup;
    let RunPlan { sampler, accum, steps_per_epoch, total_steps, schedule } = plan;
    let device = engine.device();
    let out_dir = cfg.run.out_dir.clone();
    let primary = ddp.is_primary();
    if let Some(p) = resumed.as_ref().filter(|p| p.step >= total_steps) {
        return already_complete(cfg, p, steps_per_epoch, &ddp, &ckpt, engine, (device, num_params));
    }
    let tracer = trace::Tracer::new(opts, primary)?;
    let metrics = if primary {
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| Error::io(format!("cannot create {}", out_dir.display()), e))?;
        crate::checkpoint::open_metrics(cfg, &out_dir, resumed.as_ref())?
    } else {
        MetricsWriter::disabled()
    };
    let progress = progress_for(cfg, primary, total_steps, &out_dir)?;
    progress.println(&header_line(
        cfg,
        num_params,
        samples,
        ddp.world_size(),
        (total_steps, steps_per_epoch),
        &device,
    ));
    if let Some(p) = &resumed {
        progress.set_step(p.step, "resumed");
    }
    // SIGTERM/SIGINT: stop after an agreed step, with a checkpoint (stop.rs).
    if opts.stop_on_signals {
        stop::install()?;
    }
    let mut l = Loop {
        cfg,
        opts,
        engine,
        ddp,
        ckpt,
        progress,
        metrics,
        tracer,
        trace_divergence: None,
        c: resumed.clone().unwrap_or_else(TrainProgress::start),
        text: Text::of(cfg),
        steps_per_epoch,
        total_steps,
        evaluated_at: None,
        start: SegmentStart::of(resumed.as_ref()),
        wall: Instant::now(),
    };
    // Batches of the current epoch a resumed checkpoint already consumed.
    let mut resume_at = resumed.as_ref().map(|p| p.batches_in_epoch);
    // A resume under another world size or batch: where its epoch picks up.
    let mut resharded = l.ckpt.reshard().map(|r| r.consumed);
    let mut interrupted = None;
    // Micro-batches of its last epoch a run that ended inside it consumed:
    // the final checkpoint's place, so that a longer run resumed from it
    // goes on with the rest of that epoch.
    let mut final_batches = 0;
    while l.c.step < total_steps {
        let skip = resume_at.take().unwrap_or(0);
        let indices = match resharded.take() {
            Some(consumed) => sampler.indices_after(l.c.epoch, consumed),
            None => crate::checkpoint::skip_batches(sampler.indices(l.c.epoch), skip, cfg.data.batch_size),
        };
        match l.epoch(indices, accum, &schedule, skip)? {
            EpochEnd::Complete => l.end_epoch()?,
            EpochEnd::RunEndedInside(done) => {
                l.evaluate_at_end(l.c.epoch)?;
                final_batches = done;
                break;
            }
            EpochEnd::Stopped(sig, done) => {
                l.clock();
                let line =
                    stop::checkpoint(sig, l.engine, &mut l.ckpt, &mut l.c, done, &mut l.metrics, &l.ddp)?;
                l.progress.println(&line);
                interrupted = Some(sig);
                break;
            }
            EpochEnd::Diverged => break,
        }
    }
    l.finish(final_batches, interrupted, device, num_params)
}

impl Loop<'_> {
    /// Like apex, every rank reports the skips it decided on.
    fn report(&self, skip: Option<Skip>) {
        match skip {
            Some(s) if self.ddp.is_primary() => self.progress.println(&s.message()),
            Some(s) => crate::errln!("{}", s.message()),
            None => {}
        }
    }

    /// Records the run's wall time so far in its counts, for the next checkpoint.
    fn clock(&mut self) {
        self.c.wall_s = self.start.wall_s + self.wall.elapsed().as_secs_f64();
    }

    /// One pass over `indices`, what is left of epoch `c.epoch` once a
    /// resumed checkpoint's `skip` micro-batches of it are done.
    fn epoch(
        &mut self,
        indices: Vec<usize>,
        accum: usize,
        schedule: &LrSchedule,
        skip: usize,
    ) -> Result<EpochEnd> {
        let cfg = self.cfg;
        let d = &cfg.data;
        let batches =
            if d.drop_last { indices.len() / d.batch_size } else { indices.len().div_ceil(d.batch_size) };
        let rows_left = indices.len();
        self.engine.begin_epoch(self.c.epoch, indices)?;
        let mut t0 = Instant::now();
        for k in 0..batches {
            let rows = (rows_left - k * d.batch_size).min(d.batch_size);
            // Micro-batches of this epoch done once this one is (the resumed ones included).
            let done = skip + k + 1;
            let last_micro = done.is_multiple_of(accum);
            self.micro_batch(rows, last_micro, done, accum)?;
            if !last_micro {
                continue;
            }
            let stepped = self.engine.optimizer_step(self.c.step + 1, schedule)?;
            self.report(stepped.skip);
            self.c.step += 1;
            self.c.window_n += 1;
            let step = self.c.step;
            let logging =
                step.is_multiple_of(self.cfg.logging.every_steps.max(1)) || step == self.total_steps;
            let saving = self.ckpt.saves_after_step(step);
            self.look(logging || saving, t0)?;
            if logging {
                self.log_step(stepped.lr)?;
            }
            if self.trace_divergence.is_some() {
                return Ok(EpochEnd::Diverged);
            }
            // nanoGPT's eval_interval; the last step's evaluation is the one after the loop.
            if self.cfg.train.eval_every.is_some_and(|n| step.is_multiple_of(n)) && step < self.total_steps {
                self.evaluate(self.c.epoch)?;
            }
            self.clock();
            let host = self.engine.host(if saving { HostSync::WeightsAndGrads } else { HostSync::Stale })?;
            self.ckpt.after_step(
                host.model,
                host.optimizer,
                host.amp,
                &TrainProgress { batches_in_epoch: done, ..self.c.clone() },
                &mut self.metrics,
                self.ddp.communicator(),
            )?;
            if step >= self.total_steps {
                return Ok(if done < skip + batches {
                    EpochEnd::RunEndedInside(done)
                } else {
                    EpochEnd::Complete
                });
            }
            let agreed = stop::after_step(self.opts, self.engine, &mut self.ddp, &mut self.ckpt)?;
            if let Some(sig) = agreed.stop {
                // Its checkpoint is the timed save's too.
                return Ok(EpochEnd::Stopped(sig, done));
            }
            if agreed.save {
                // The period restarts whether or not the step was saved already.
                self.ckpt.restart_clock();
                self.clock();
                stop::save_now(self.engine, &mut self.ckpt, &mut self.c, done, &mut self.metrics, &self.ddp)?;
            }
            t0 = Instant::now();
        }
        // A stop the device told of only now still comes before the evaluation.
        if self.c.step < self.total_steps {
            if let Some(sig) = stop::settled(self.engine, &self.ddp)? {
                return Ok(EpochEnd::Stopped(sig, skip + batches));
            }
        }
        Ok(EpochEnd::Complete)
    }

    /// Forward and backward of micro-batch `done` of the epoch (`rows` samples).
    fn micro_batch(&mut self, rows: usize, last_micro: bool, done: usize, accum: usize) -> Result<()> {
        let c = &mut self.c;
        let at = MicroBatch { epoch: c.epoch, index: (done - 1) as u64 };
        if let Some(loss) = self.engine.forward_backward(&mut self.ddp, rows, last_micro, c.step + 1, at)? {
            if !loss.is_finite() {
                return Err(Error::Training(format!(
                    "loss is {loss} at step {} (epoch {}); lower optimizer.lr or set train.grad_clip_norm",
                    c.step + 1,
                    c.epoch
                )));
            }
            c.window_loss += loss as f64 / accum as f64;
            c.step_loss += loss as f64 / accum as f64;
        }
        c.train_images += rows;
        c.window_images += rows;
        Ok(())
    }

    /// The step's time, and where someone reads them (a log line, a trace,
    /// a checkpoint, the first step) its loss and gradient norm.
    fn look(&mut self, wanted: bool, t0: Instant) -> Result<()> {
        let step = self.c.step;
        let first = step == 1;
        let look = if self.engine.look_is_free() || wanted || self.tracer.is_some() || first {
            Some(self.engine.look(&mut self.c.window_loss)?)
        } else {
            None
        };
        // A look waits for the device: its step's time is training time.
        let dt = t0.elapsed().as_secs_f64();
        let c = &mut self.c;
        c.train_time_s += dt;
        c.window_time_s += dt;
        if let Some(look) = look {
            let step_loss = look.step_loss.unwrap_or(c.step_loss);
            if let Some(g) = look.applied_grad_norm {
                c.grad_norm = Some(g);
            }
            let local = c.window_loss / c.window_n.max(1) as f64;
            if !local.is_finite() {
                return Err(Error::Training(format!(
                    "loss is {local} in steps {}..={step} (epoch {}); lower optimizer.lr or set train.grad_clip_norm",
                    (step + 1).saturating_sub(c.window_n),
                    c.epoch
                )));
            }
            // Every rank records the same line (the loss is the ranks'
            // mean), so `--check-trace` stops all of them at one step.
            let traced = self.tracer.is_some();
            let step_loss = if traced || first { self.ddp.mean(step_loss)? } else { step_loss };
            if first {
                self.c.initial_loss = step_loss;
            }
            if let Some(t) = self.tracer.as_mut().filter(|t| t.uses_lines()) {
                let host = self.engine.host(HostSync::Weights)?;
                self.trace_divergence =
                    t.after_update(step, step_loss, look.grad_norm, look.loss_scale, host.model)?;
            }
        }
        self.c.step_loss = 0.0;
        Ok(())
    }

    /// The logging window's line and metrics record; the window restarts.
    fn log_step(&mut self, lr: f32) -> Result<()> {
        let scaler = self.engine.scaler()?;
        // Before the step's line, which it belongs to.
        self.report(scaler.skip);
        let c = &mut self.c;
        let (step, total_steps) = (c.step, self.total_steps);
        let loss = self.ddp.mean(c.window_loss / c.window_n as f64)?;
        let ips = c.window_images as f64 / c.window_time_s.max(1e-9);
        c.final_loss = loss;
        let (rate, unit) = self.text.rate(ips);
        let mut rec = json!({"kind": "train", "step": step, "epoch": c.epoch, "loss": loss, "lr": lr,
            unit.replace('/', "_per_"): rate, "loss_scale": scaler.state.scale, "overflow_steps": scaler.state.overflow_steps});
        if let Some(g) = c.grad_norm {
            rec["grad_norm"] = json!(g);
        }
        if let Some(f) = self.engine.allreduce_hidden_fraction(&self.ddp)? {
            rec["allreduce_hidden_fraction"] = json!(f);
        }
        self.metrics.write(&rec)?;
        self.progress.set_step(step, &format!("loss {loss:.4}"));
        self.progress.println(&format!(
            "step {step:>6}/{total_steps} | epoch {} | loss {loss:.4} | lr {lr:.5} | {rate:.0} {unit}",
            c.epoch
        ));
        (c.window_loss, c.window_n, c.window_images, c.window_time_s) = (0.0, 0, 0, 0.0);
        Ok(())
    }

    /// Evaluates, records the result in `c` (so checkpoints and the summary
    /// carry it) and writes its metrics record and log line: accuracy and
    /// loss on the test split, or a language model's validation loss and
    /// perplexity. `epoch` is the epoch its step was taken in.
    fn evaluate(&mut self, epoch: u64) -> Result<()> {
        let ev = self.engine.evaluate(&mut self.ddp)?;
        let step = self.c.step;
        if self.text.is_some() {
            let ppl = ev.loss.exp();
            self.metrics.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "val_loss": ev.loss, "perplexity": ppl, "tokens": ev.total}))?;
            self.progress.println(&format!(
                "step {step} | epoch {epoch} | val loss {:.4} | perplexity {ppl:.2} ({} tokens)",
                ev.loss, ev.total
            ));
        } else {
            self.metrics.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "test_accuracy": ev.accuracy, "test_loss": ev.loss, "correct": ev.correct, "total": ev.total}))?;
            self.progress.println(&format!(
                "epoch {epoch} | step {step} | test accuracy {:.4} ({}/{}) | test loss {:.4}",
                ev.accuracy, ev.correct, ev.total, ev.loss
            ));
        }
        self.c.last_eval = Some(crate::checkpoint::EvalState { step: Some(step), ..ev.into() });
        self.evaluated_at = Some(step);
        Ok(())
    }

    /// At an epoch's end or the run's: a skip at its last step, the
    /// evaluation (unless `train.eval_every` just ran one), and what the
    /// device summed of the loss since the last look.
    fn evaluate_at_end(&mut self, epoch: u64) -> Result<()> {
        let skip = self.engine.scaler()?.skip;
        self.report(skip);
        if self.evaluated_at != Some(self.c.step) {
            self.evaluate(epoch)?;
        }
        self.engine.fold_loss(&mut self.c.window_loss)
    }

    /// An epoch completed: its evaluation and its checkpoint.
    fn end_epoch(&mut self) -> Result<()> {
        self.c.epoch += 1;
        self.evaluate_at_end(self.c.epoch - 1)?;
        self.clock();
        let host = self.engine.host(HostSync::WeightsAndGrads)?;
        self.ckpt.after_epoch(
            host.model,
            host.optimizer,
            host.amp,
            &TrainProgress { batches_in_epoch: 0, ..self.c.clone() },
            &mut self.metrics,
            self.ddp.communicator(),
        )
    }

    /// The run's end: its final checkpoint, weights and summary, then the
    /// barrier no rank leaves before the others.
    fn finish(
        mut self,
        final_batches: usize,
        interrupted: Option<stop::StopSignal>,
        device: String,
        num_params: usize,
    ) -> Result<Summary> {
        let scaler = self.engine.scaler()?;
        self.report(scaler.skip);
        self.progress.finish();
        if let (None, Some(t), None) = (&self.trace_divergence, &self.tracer, interrupted) {
            self.trace_divergence = t.finish(self.c.step);
        }
        self.clock();
        let host = self.engine.host(HostSync::WeightsAndGrads)?;
        if self.trace_divergence.is_none() {
            self.ckpt.finish(
                host.model,
                host.optimizer,
                host.amp,
                &TrainProgress { batches_in_epoch: final_batches, ..self.c.clone() },
                &mut self.metrics,
                self.ddp.communicator(),
            )?;
        }
        let out_dir = &self.cfg.run.out_dir;
        let state_dict = host.amp.state_dict(host.model)?;
        let primary = self.ddp.is_primary();
        if primary {
            crate::checkpoint::save_safetensors(&out_dir.join("model.safetensors"), &state_dict)?;
            for f in self.ckpt.extra_files() {
                crate::checkpoint::write_atomic(&out_dir.join(f.name), &f.contents)?;
            }
        }
        let summary = Closing {
            cfg: self.cfg,
            ddp: &self.ddp,
            device,
            num_params,
            steps_per_epoch: self.steps_per_epoch,
            epochs: self.ckpt.reshard().map(|_| self.c.epoch),
            start: self.start,
            segment_wall_s: self.wall.elapsed().as_secs_f64(),
            checkpoints: self.ckpt.kept(),
            resumed_from: self.ckpt.resumed_from().map(PathBuf::from),
            loss_scale: scaler.state.scale,
            overflow_steps: scaler.state.overflow_steps,
            allreduce_hidden_fraction: self.engine.allreduce_hidden_fraction(&self.ddp)?,
            trace_divergence: self.trace_divergence.take(),
            interrupted,
            log: primary.then(|| out_dir.join("train.log")),
        }
        .summary(&self.c);
        if primary {
            metrics::write_json(&out_dir.join("summary.json"), &summary)?;
        }
        self.ddp.report_replica_state(&state_dict, scaler.state.scale, scaler.state.overflow_steps);
        // No rank leaves while another may still need it for a collective.
        self.ddp.barrier("end of training")?;
        self.engine.finish()?;
        Ok(summary)
    }
}

/// A run resumed from its final checkpoint has nothing left to train: it
/// says so and reports the finished run's figures from the checkpoint,
/// without writing a file (the summary, metrics and TensorBoard logs stay
/// as the run left them). Every rank gets here from the same checkpoint.
fn already_complete(
    cfg: &Config,
    p: &TrainProgress,
    steps_per_epoch: u64,
    ddp: &Ddp,
    ckpt: &Checkpointer,
    engine: &mut dyn Engine,
    (device, num_params): (String, usize),
) -> Result<Summary> {
    let resumed_from = ckpt.resumed_from().map(PathBuf::from);
    if ddp.is_primary() {
        crate::errln!(
            "ddptrain: {} is complete ({} of {} steps, checkpoint {}); nothing to train (raise train.epochs or train.max_steps to train it further, set run.overwrite = true to train it again from step 0, or train into another run.out_dir)",
            cfg.run.name,
            p.step,
            p.step,
            resumed_from.as_deref().map_or_else(|| "?".into(), |r| r.display().to_string())
        );
    }
    let scaler = engine.scaler()?;
    let summary = Closing {
        cfg,
        ddp,
        device,
        num_params,
        steps_per_epoch,
        epochs: None,
        // Nothing trained: the run's figures are the checkpoint's.
        start: SegmentStart { step: None, ..SegmentStart::of(Some(p)) },
        segment_wall_s: 0.0,
        checkpoints: Vec::new(),
        resumed_from,
        loss_scale: scaler.state.scale,
        overflow_steps: scaler.state.overflow_steps,
        allreduce_hidden_fraction: None,
        trace_divergence: None,
        interrupted: None,
        log: None,
    }
    .summary(p);
    // A run whose closing writes failed (a full disk) gets them now, from
    // its final checkpoint; a complete out_dir is left as it is.
    let out_dir = &cfg.run.out_dir;
    if ddp.is_primary() {
        let weights = out_dir.join("model.safetensors");
        if !weights.exists() {
            let host = engine.host(HostSync::WeightsAndGrads)?;
            crate::checkpoint::save_safetensors(&weights, &host.amp.state_dict(host.model)?)?;
            for f in ckpt.extra_files() {
                crate::checkpoint::write_atomic(&out_dir.join(f.name), &f.contents)?;
            }
            crate::errln!("wrote {}, which the run's end had not", weights.display());
        }
        let path = out_dir.join("summary.json");
        if !path.exists() {
            metrics::write_json(&path, &summary)?;
            crate::errln!("wrote {}, which the run's end had not", path.display());
        }
    }
    ddp.barrier("end of training")?;
    engine.finish()?;
    Ok(summary)
}

/// The run's lines on rank 0, appended to `out_dir/train.log` too, with a
/// bar as `logging.progress` says; silent elsewhere.
fn progress_for(cfg: &Config, primary: bool, total_steps: u64, out_dir: &Path) -> Result<Progress> {
    if !primary {
        return Ok(Progress::silent());
    }
    Progress::new(
        match cfg.logging.progress {
            config::ProgressSetting::Auto => ProgressMode::Auto,
            config::ProgressSetting::Always => ProgressMode::Always,
            config::ProgressSetting::Never => ProgressMode::Never,
        },
        total_steps,
        Some(&out_dir.join("train.log")),
    )
}

#[cfg(test)]
mod tests {
    use super::super::records::full_epochs;

    #[test]
    fn epochs_count_full_passes() {
        assert_eq!(full_epochs(7, 4), 1);
        assert_eq!(full_epochs(8, 4), 2);
        assert_eq!(full_epochs(3, 0), 0);
    }
}
