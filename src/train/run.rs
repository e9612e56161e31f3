//! The training loop, one for every device: what a step is (micro-batches
//! forward and backward, the optimizer step), and the bookkeeping around it
//! (loss windows, log lines, metrics, progress, traces, checkpoints, the
//! evaluation after each epoch, the summary and the final barrier). The
//! arithmetic is the [`Engine`]'s.

use super::engine::{Engine, HostSync, Skip};
use super::{stop, trace, Ddp, RunOptions, RunPlan, Summary};
use crate::checkpoint::{Checkpointer, TrainProgress};
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::metrics::{self, MetricsWriter, Progress, ProgressMode};
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

/// Trains `engine` for the run `setup` planned: the contract of [`super::train_with`].
pub(crate) fn run(cfg: &Config, opts: &RunOptions, setup: Setup, engine: &mut dyn Engine) -> Result<Summary> {
    let Setup { mut ddp, plan, mut ckpt, resumed, samples, num_params } = setup;
    let RunPlan { sampler, accum, steps_per_epoch, total_steps, schedule } = plan;
    let d = &cfg.data;
    let device = engine.device();
    let out_dir = cfg.run.out_dir.clone();
    let primary = ddp.is_primary();
    if let Some(p) = resumed.as_ref().filter(|p| p.step >= total_steps) {
        let epochs = full_epochs(p.step, steps_per_epoch);
        return already_complete(cfg, p, epochs, &ddp, &ckpt, engine, (device, num_params));
    }
    let mut tracer = trace::Tracer::new(opts, primary)?;
    let mut trace_divergence: Option<String> = None;

    let mut metrics_out = if primary {
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
    // Like apex, every rank reports the skips it decided on.
    let report = |skip: Option<Skip>| match skip {
        Some(s) if primary => progress.println(&s.message()),
        Some(s) => crate::errln!("{}", s.message()),
        None => {}
    };

    let wall = Instant::now();
    // What the loop has counted: the checkpoint's view of it.
    let mut c = resumed.clone().unwrap_or_else(TrainProgress::start);
    let log_every = cfg.logging.every_steps.max(1);
    // Batches of the current epoch a resumed checkpoint already consumed.
    let mut resume_at = resumed.as_ref().map(|p| p.batches_in_epoch);
    if resumed.is_some() {
        progress.set_step(c.step, "resumed");
    }
    // SIGTERM/SIGINT: stop after an agreed step, with a checkpoint (stop.rs).
    if opts.stop_on_signals {
        stop::install()?;
    }
    let mut interrupted: Option<stop::StopSignal> = None;
    // Micro-batches of its last epoch a run that ended inside it consumed:
    // the final checkpoint's position, so that a longer run resumed from it
    // goes on with the rest of that epoch.
    let mut final_batches = 0;
    // A language model's figures are per token; its evaluation is the validation loss.
    let text = Text::of(cfg);
    // The step of the last `train.eval_every` evaluation (none at an epoch's end twice).
    let mut evaluated_at: Option<u64> = None;
    // An evaluation mid-epoch (`train.eval_every`) or at an epoch's end.
    let evaluate_now =
        |engine: &mut dyn Engine, ddp: &mut Ddp, c: &mut TrainProgress, m: &mut MetricsWriter| {
            evaluate(engine, ddp, c, m, |l| progress.println(l), text, steps_per_epoch)
        };

    'train: while c.step < total_steps {
        let skip = resume_at.take().unwrap_or(0);
        let indices = crate::checkpoint::skip_batches(sampler.indices(c.epoch), skip, d.batch_size);
        let batches =
            if d.drop_last { indices.len() / d.batch_size } else { indices.len().div_ceil(d.batch_size) };
        let rows_left = indices.len();
        engine.begin_epoch(c.epoch, indices)?;
        // A SIGTERM/SIGINT the ranks agreed on, and the micro-batches of the epoch done by then.
        let mut stopping: Option<(stop::StopSignal, usize)> = None;
        let mut ended_inside: Option<usize> = None;
        let mut t0 = Instant::now();
        for k in 0..batches {
            let rows = (rows_left - k * d.batch_size).min(d.batch_size);
            // Micro-batches of this epoch done once this one is (the resumed ones included).
            let done = skip + k + 1;
            let last_micro = done.is_multiple_of(accum);
            let at = MicroBatch { epoch: c.epoch, index: (done - 1) as u64 };
            if let Some(loss) = engine.forward_backward(&mut ddp, rows, last_micro, c.step + 1, at)? {
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
            if !last_micro {
                continue;
            }
            let stepped = engine.optimizer_step(c.step + 1, &schedule)?;
            report(stepped.skip);
            c.step += 1;
            c.window_n += 1;
            let step = c.step;
            let logging = step.is_multiple_of(log_every) || step == total_steps;
            let saving = ckpt.saves_after_step(step);
            let first = step == 1;
            let look = if engine.look_is_free() || logging || tracer.is_some() || saving || first {
                Some(engine.look(&mut c.window_loss)?)
            } else {
                None
            };
            // A look waits for the device: its step's time is training time.
            let dt = t0.elapsed().as_secs_f64();
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
                let step_loss = if tracer.is_some() || first { ddp.mean(step_loss)? } else { step_loss };
                if first {
                    c.initial_loss = step_loss;
                }
                if let Some(t) = tracer.as_mut().filter(|t| t.uses_lines()) {
                    let host = engine.host(HostSync::Weights)?;
                    trace_divergence =
                        t.after_update(step, step_loss, look.grad_norm, look.loss_scale, host.model)?;
                }
            }
            c.step_loss = 0.0;

            if logging {
                let scaler = engine.scaler()?;
                // Before the step's line, which it belongs to.
                report(scaler.skip);
                let loss = ddp.mean(c.window_loss / c.window_n as f64)?;
                let ips = c.window_images as f64 / c.window_time_s.max(1e-9);
                c.final_loss = loss;
                let lr = stepped.lr;
                let (rate, unit) = text.rate(ips);
                let mut rec = json!({"kind": "train", "step": step, "epoch": c.epoch, "loss": loss, "lr": lr,
                    unit.replace('/', "_per_"): rate, "loss_scale": scaler.state.scale, "overflow_steps": scaler.state.overflow_steps});
                if let Some(g) = c.grad_norm {
                    rec["grad_norm"] = json!(g);
                }
                if let Some(f) = engine.allreduce_hidden_fraction(&ddp)? {
                    rec["allreduce_hidden_fraction"] = json!(f);
                }
                metrics_out.write(&rec)?;
                progress.set_step(step, &format!("loss {loss:.4}"));
                progress.println(&format!(
                    "step {step:>6}/{total_steps} | epoch {} | loss {loss:.4} | lr {lr:.5} | {rate:.0} {unit}",
                    c.epoch
                ));
                (c.window_loss, c.window_n, c.window_images, c.window_time_s) = (0.0, 0, 0, 0.0);
            }
            if trace_divergence.is_some() {
                break 'train;
            }
            // nanoGPT's eval_interval; the last step's evaluation is the one after the loop.
            if cfg.train.eval_every.is_some_and(|n| step.is_multiple_of(n)) && step < total_steps {
                evaluate_now(engine, &mut ddp, &mut c, &mut metrics_out)?;
                evaluated_at = Some(step);
            }
            let host = engine.host(if saving { HostSync::WeightsAndGrads } else { HostSync::Stale })?;
            ckpt.after_step(
                host.model,
                host.optimizer,
                host.amp,
                &TrainProgress { batches_in_epoch: done, ..c.clone() },
                &mut metrics_out,
                ddp.communicator(),
            )?;
            if step >= total_steps {
                ended_inside = (done < skip + batches).then_some(done);
                break;
            }
            let agreed = stop::after_step(opts, engine, &mut ddp, &mut ckpt)?;
            if let Some(sig) = agreed.stop {
                // Its checkpoint is the timed save's too.
                stopping = Some((sig, done));
                break;
            }
            if agreed.save {
                // The period restarts whether or not the step was saved already.
                ckpt.restart_clock();
                stop::save_now(engine, &mut ckpt, &mut c, done, &mut metrics_out, &ddp)?;
            }
            t0 = Instant::now();
        }
        // A stop the device told of only now still comes before the evaluation.
        if stopping.is_none() && c.step < total_steps {
            stopping = stop::settled(engine, &ddp)?.map(|sig| (sig, skip + batches));
        }
        if let Some((sig, batches_in_epoch)) = stopping {
            let line =
                stop::checkpoint(sig, engine, &mut ckpt, &mut c, batches_in_epoch, &mut metrics_out, &ddp)?;
            progress.println(&line);
            interrupted = Some(sig);
            break 'train;
        }
        if let Some(done) = ended_inside {
            report(engine.scaler()?.skip);
            if evaluated_at != Some(c.step) {
                evaluate_now(engine, &mut ddp, &mut c, &mut metrics_out)?;
            }
            engine.fold_loss(&mut c.window_loss)?;
            final_batches = done;
            break 'train;
        }
        c.epoch += 1;
        // A skip at the epoch's last step, before the evaluation's line.
        report(engine.scaler()?.skip);
        if evaluated_at != Some(c.step) {
            evaluate_now(engine, &mut ddp, &mut c, &mut metrics_out)?;
        }
        engine.fold_loss(&mut c.window_loss)?;
        let host = engine.host(HostSync::WeightsAndGrads)?;
        ckpt.after_epoch(
            host.model,
            host.optimizer,
            host.amp,
            &TrainProgress { batches_in_epoch: 0, ..c.clone() },
            &mut metrics_out,
            ddp.communicator(),
        )?;
    }
    let scaler = engine.scaler()?;
    report(scaler.skip);
    progress.finish();
    let host = engine.host(HostSync::WeightsAndGrads)?;
    if let (None, Some(t), None) = (&trace_divergence, &tracer, interrupted) {
        trace_divergence = t.finish(c.step);
    }
    if trace_divergence.is_none() {
        ckpt.finish(
            host.model,
            host.optimizer,
            host.amp,
            &TrainProgress { batches_in_epoch: final_batches, ..c.clone() },
            &mut metrics_out,
            ddp.communicator(),
        )?;
    }

    let weights = out_dir.join("model.safetensors");
    let state_dict = host.amp.state_dict(host.model)?;
    if primary {
        crate::checkpoint::save_safetensors(&weights, &state_dict)?;
        for f in ckpt.extra_files() {
            crate::checkpoint::write_atomic(&out_dir.join(f.name), &f.contents)?;
        }
    }
    let summary = Summary {
        rank: ddp.rank(),
        log: primary.then(|| out_dir.join("train.log")),
        name: cfg.run.name.clone(),
        final_loss: c.final_loss,
        test_accuracy: c.last_eval.filter(|_| text.is_none()).map(|e| e.accuracy),
        test_loss: c.last_eval.filter(|_| text.is_none()).map(|e| e.loss),
        val_loss: c.last_eval.filter(|_| text.is_some()).map(|e| e.loss),
        perplexity: c.last_eval.filter(|_| text.is_some()).map(|e| e.loss.exp()),
        // Every rank trains equal batches: the job's throughput is world x this rank's.
        images_per_s: (c.train_images * ddp.world_size()) as f64 / c.train_time_s.max(1e-9),
        tokens_per_s: text
            .tokens_per_s((c.train_images * ddp.world_size()) as f64 / c.train_time_s.max(1e-9)),
        allreduce_hidden_fraction: engine.allreduce_hidden_fraction(&ddp)?,
        steps: c.step,
        epochs: full_epochs(c.step, steps_per_epoch),
        wall_s: wall.elapsed().as_secs_f64(),
        opt_level: cfg.amp.opt_level.to_string(),
        world_size: ddp.world_size(),
        device,
        num_params,
        weights,
        checkpoints: ckpt.kept(),
        resumed_from: ckpt.resumed_from().map(PathBuf::from),
        trace_divergence,
        loss_scale: scaler.state.scale,
        overflow_steps: scaler.state.overflow_steps,
        initial_loss: c.initial_loss,
        loss_decreased: c.final_loss < c.initial_loss,
        interrupted,
    };
    if primary {
        metrics::write_json(&out_dir.join("summary.json"), &summary)?;
    }
    ddp.report_replica_state(&state_dict, scaler.state.scale, scaler.state.overflow_steps);
    // No rank leaves while another may still need it for a collective.
    ddp.barrier("end of training")?;
    engine.finish()?;
    Ok(summary)
}

/// A language model's run: its windows are `block_size` tokens each.
#[derive(Debug, Clone, Copy)]
struct Text {
    block_size: usize,
}

impl Text {
    fn of(cfg: &Config) -> Option<Text> {
        (cfg.data.dataset == config::DatasetKind::Text)
            .then(|| Text { block_size: cfg.model.input_shape.first().copied().unwrap_or(0) })
    }
}

/// Throughput in the run's unit: tokens for text, images otherwise.
trait Rate {
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

/// Evaluates, records the result in `c` (so checkpoints and the summary
/// carry it) and writes its metrics record and log line: accuracy and loss
/// on the test split, or a language model's validation loss and perplexity.
fn evaluate(
    engine: &mut dyn Engine,
    ddp: &mut Ddp,
    c: &mut TrainProgress,
    metrics_out: &mut MetricsWriter,
    println: impl Fn(&str),
    text: Option<Text>,
    steps_per_epoch: u64,
) -> Result<()> {
    let ev = engine.evaluate(ddp)?;
    // Epochs completed by this step: the current epoch's index mid-epoch,
    // its count after it, and 0 still for a run that max_steps ended inside
    // its first epoch (the loop has counted that epoch as done by then).
    let (step, epoch) = (c.step, full_epochs(c.step, steps_per_epoch));
    if text.is_some() {
        let ppl = ev.loss.exp();
        metrics_out.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "val_loss": ev.loss, "perplexity": ppl, "tokens": ev.total}))?;
        println(&format!(
            "step {step} | epoch {epoch} | val loss {:.4} | perplexity {ppl:.2} ({} tokens)",
            ev.loss, ev.total
        ));
    } else {
        metrics_out.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "test_accuracy": ev.accuracy, "test_loss": ev.loss, "correct": ev.correct, "total": ev.total}))?;
        println(&format!(
            "epoch {epoch} | step {step} | test accuracy {:.4} ({}/{}) | test loss {:.4}",
            ev.accuracy, ev.correct, ev.total, ev.loss
        ));
    }
    c.last_eval = Some(ev.into());
    Ok(())
}

/// Full passes over the training set in `steps` optimizer steps (the
/// micro-batches an epoch leaves over for accumulation do not count).
fn full_epochs(steps: u64, steps_per_epoch: u64) -> u64 {
    steps.checked_div(steps_per_epoch).unwrap_or(0)
}

/// A run resumed from its final checkpoint has nothing left to train: it
/// says so and reports the finished run's figures from the checkpoint,
/// without writing a file (the summary, metrics and TensorBoard logs stay
/// as the run left them). Every rank gets here from the same checkpoint.
fn already_complete(
    cfg: &Config,
    p: &TrainProgress,
    epochs: u64,
    ddp: &Ddp,
    ckpt: &Checkpointer,
    engine: &mut dyn Engine,
    (device, num_params): (String, usize),
) -> Result<Summary> {
    let resumed_from = ckpt.resumed_from().map(PathBuf::from);
    let text = Text::of(cfg);
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
    let summary = Summary {
        rank: ddp.rank(),
        log: None,
        name: cfg.run.name.clone(),
        final_loss: p.final_loss,
        test_accuracy: p.last_eval.filter(|_| text.is_none()).map(|e| e.accuracy),
        test_loss: p.last_eval.filter(|_| text.is_none()).map(|e| e.loss),
        val_loss: p.last_eval.filter(|_| text.is_some()).map(|e| e.loss),
        perplexity: p.last_eval.filter(|_| text.is_some()).map(|e| e.loss.exp()),
        images_per_s: (p.train_images * ddp.world_size()) as f64 / p.train_time_s.max(1e-9),
        tokens_per_s: text
            .tokens_per_s((p.train_images * ddp.world_size()) as f64 / p.train_time_s.max(1e-9)),
        allreduce_hidden_fraction: None,
        steps: p.step,
        epochs,
        wall_s: 0.0,
        opt_level: cfg.amp.opt_level.to_string(),
        world_size: ddp.world_size(),
        device,
        num_params,
        weights: cfg.run.out_dir.join("model.safetensors"),
        checkpoints: Vec::new(),
        resumed_from,
        trace_divergence: None,
        loss_scale: scaler.state.scale,
        overflow_steps: scaler.state.overflow_steps,
        initial_loss: p.initial_loss,
        loss_decreased: p.final_loss < p.initial_loss,
        interrupted: None,
    };
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

/// The run's first line: what is trained, on what, for how long.
fn header_line(
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
