//! The training loop on the GPU: the CPU loop's semantics (sampler, steps,
//! schedule, amp, DDP, checkpoints, metrics, gates), with the model, the
//! data, the optimizer and the loss scaler on the device.
//!
//! Inside a step the host only launches: the batch is gathered from the
//! dataset on the device, the loss and its hits add up on the device, each
//! gradient bucket's all-reduce starts on the communication stream as soon
//! as backward has produced it, and the optimizer reads the overflow flag
//! on the device. The host looks at the device's state on logging steps
//! and, one step late and without stalling, at the loss scaler (to pick the
//! next learning rate and report skipped steps). The CPU [`Model`],
//! [`Optimizer`] and [`crate::amp::Amp`] are kept as host mirrors, brought up to
//! date only for checkpoints, traces and the end of the run.

pub mod eval;
pub mod step;

use super::{trace, RunOptions, RunPlan, Summary};
use crate::amp;
use crate::config::Config;
use crate::cuda::Gpu;
use crate::data::cuda::{gather_batch, DeviceDataset, DeviceIndices};
use crate::dist::cuda::{DeviceComm, DeviceReducer};
use crate::dist::reducer::ReducerOptions;
use crate::error::{Error, Result};
use crate::metrics::{self, MetricsWriter};
use crate::nn::cuda::params::{DevBuf, DeviceParams};
use crate::nn::cuda::{GpuModel, TrainHooks};
use crate::ops::cross_entropy::cuda::CrossEntropyTotals;
use crate::optim::Optimizer;
use cudarc::driver::{CudaSlice, CudaViewMut};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use step::DeviceStep;

/// The DDP hooks the GPU model calls during backward.
struct Hooks<'a> {
    gpu: &'a Gpu,
    reducer: Option<&'a mut DeviceReducer>,
    /// Only the last micro-batch of a step reduces (PyTorch's no_sync for the others).
    sync: bool,
}

impl TrainHooks for Hooks<'_> {
    fn grads_ready(&mut self, params: &mut DeviceParams, ready: &[usize]) -> Result<()> {
        match (&mut self.reducer, self.sync) {
            (Some(r), true) => r.mark_ready(self.gpu, params, ready),
            _ => Ok(()),
        }
    }

    fn all_reduce_sum(&mut self, buf: &mut CudaViewMut<'_, f32>, what: &str) -> Result<()> {
        match &mut self.reducer {
            Some(r) => r.all_reduce_sum_f32(self.gpu, buf, what),
            None => Ok(()),
        }
    }

    fn world_size(&self) -> usize {
        self.reducer.as_ref().map_or(1, |r| r.world_size())
    }
}

/// DDP's broadcast_buffers: rank 0's BatchNorm running statistics to every
/// rank, before each forward (without SyncBatchNorm).
fn broadcast_buffers(gpu: &Gpu, dev: &mut GpuModel, reducer: &mut DeviceReducer) -> Result<()> {
    for buf in dev.buffers_mut() {
        match buf {
            DevBuf::F32(b) => reducer.broadcast_f32(gpu, &mut b.as_view_mut(), "BatchNorm buffers")?,
            DevBuf::F16(b) => reducer.broadcast_f16(gpu, &mut b.as_view_mut(), "BatchNorm buffers")?,
        }
    }
    Ok(())
}

/// The checkpoint saves after step `step` (the checkpointer's own rule):
/// the host mirrors must be current then.
fn save_due(cfg: &Config, step: u64, total: u64) -> bool {
    let every = cfg.checkpoint.every_steps;
    every > 0 && step.is_multiple_of(every) && step < total
}

/// Trains on `gpu` (this rank's device); the same contract as [`super::train_with`].
pub fn train(cfg: &Config, opts: &RunOptions, gpu: Arc<Gpu>) -> Result<Summary> {
    let device = format!("cuda:{} {}", gpu.ctx().ordinal(), gpu.name());
    let super::Started { mut model, train_ds, test_ds, ddp, plan, mut optimizer, mut ckpt, mut amp, resumed } =
        super::start(cfg, opts)?;
    let RunPlan { sampler, accum, steps_per_epoch, total_steps, schedule } = plan;
    let d = &cfg.data;

    // The device side, every buffer allocated once, before the first step.
    let opts_r = ReducerOptions::from_config(&cfg.parallel);
    let (first_bucket_bytes, bucket_cap_bytes) = crate::dist::cuda::bucket_bytes(&opts_r);
    let max_batch = d.batch_size.max(d.eval_batch_size);
    let mut dev = GpuModel::new(
        gpu.clone(),
        &model,
        max_batch,
        first_bucket_bytes,
        bucket_cap_bytes,
        cfg.amp.allow_tf32,
    )?;
    if resumed.is_some() {
        // A checkpoint taken with accumulation micro-batches pending restored
        // their gradients into the host model (zero otherwise).
        dev.params.upload_grads(&gpu, &model)?;
    }
    let mut reducer = if ddp.world_size() > 1 {
        let comm = match cfg.parallel.backend {
            crate::config::Backend::Tcp => DeviceComm::Tcp(ddp.communicator_arc()),
            _ => DeviceComm::Nccl(crate::cuda::nccl::NcclComm::new(
                &gpu,
                ddp.rank(),
                ddp.world_size(),
                ddp.communicator(),
                std::time::Duration::from_secs(cfg.parallel.timeout_s),
            )?),
        };
        let mut r = DeviceReducer::new(&gpu, comm, &dev.params, &opts_r)?;
        r.broadcast_from_rank0(&gpu, &mut dev.params)?;
        Some(r)
    } else {
        None
    };
    let mut step_dev = DeviceStep::new(&gpu, &dev.params, &optimizer, &amp, accum, cfg.train.grad_clip_norm)?;
    let train_dev = DeviceDataset::upload(&gpu, &train_ds)?;
    let test_dev = DeviceDataset::upload(&gpu, &test_ds)?;
    let [c, h, w] = train_ds.sample_shape;
    let per = c * h * w;
    let s = gpu.stream();
    let alloc_err = |e| Error::cuda("allocating the batch buffers", e);
    let mut x: CudaSlice<f32> = s.alloc_zeros(max_batch * per).map_err(alloc_err)?;
    let mut y: CudaSlice<u32> = s.alloc_zeros(max_batch).map_err(alloc_err)?;
    let mut totals = CrossEntropyTotals::new(&gpu, max_batch)?;

    let mut tracer = trace::Tracer::new(opts)?;
    let mut trace_divergence: Option<String> = None;
    let out_dir = cfg.run.out_dir.clone();
    let primary = ddp.is_primary();
    let mut metrics_out = if primary {
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| Error::io(format!("cannot create {}", out_dir.display()), e))?;
        crate::checkpoint::open_metrics(cfg, &out_dir, resumed.as_ref())?
    } else {
        MetricsWriter::disabled()
    };
    let progress = super::progress_for(cfg, primary, total_steps);
    progress.println(&super::header_line(
        cfg,
        model.num_params(),
        (train_ds.len(), test_ds.len()),
        ddp.world_size(),
        (total_steps, steps_per_epoch),
        &device,
    ));

    let wall = Instant::now();
    let (mut train_time, mut train_images) = (0.0f64, 0usize);
    let (mut step, mut epoch) = (0u64, 0u64);
    let (mut window_loss, mut window_n) = (0.0f64, 0u64);
    let (mut final_loss, mut initial_loss) = (f64::NAN, f64::NAN);
    let mut last_eval: Option<super::EvalResult> = None;
    let log_every = cfg.logging.every_steps.max(1);
    let (mut window_start, mut window_images) = (Instant::now(), 0usize);
    // The device sums the rows' losses; the host folds that sum into
    // `window_loss` (a sum of per-step mean losses, the CPU's and the
    // checkpoint's meaning) whenever it looks, so a resumed run folds at the
    // same steps as the uninterrupted one and logs the same bits.
    let mut fold = LossFold::default();
    let mut grad_norm: Option<f32> = None;
    let mut resume_at: Option<usize> = None;
    if let Some(p) = &resumed {
        (step, epoch, window_loss, window_n, window_images) =
            (p.step, p.epoch, p.window_loss, p.window_n, p.window_images);
        (final_loss, last_eval, grad_norm) = (p.final_loss, p.last_eval.map(Into::into), p.grad_norm);
        (train_images, train_time, resume_at) = (p.train_images, p.train_time_s, Some(p.batches_in_epoch));
        progress.set_step(step, "resumed");
    }
    // The checkpoint's view of the loop (step_loss is 0 between steps).
    macro_rules! train_progress {
        ($batches_in_epoch:expr) => {
            crate::checkpoint::TrainProgress {
                step,
                epoch,
                batches_in_epoch: $batches_in_epoch,
                step_loss: 0.0,
                window_loss,
                window_n,
                window_images,
                final_loss,
                last_eval: last_eval.map(Into::into),
                grad_norm,
                train_images,
                train_time_s: train_time,
            }
        };
    }
    // Skipped steps the host has reported so far, and the loss scale the
    // step being taken runs with (what the CPU's overflow message names).
    let mut skips = SkipReport {
        reported: amp.scaler.state().overflow_steps,
        scale_in_use: amp.scaler.state().scale,
        primary,
    };

    'train: while step < total_steps {
        let skip = resume_at.take().unwrap_or(0);
        let indices = crate::checkpoint::skip_batches(sampler.indices(epoch), skip, d.batch_size);
        let order = DeviceIndices::upload(&gpu, &train_dev, &indices)?;
        let batches =
            if d.drop_last { indices.len() / d.batch_size } else { indices.len().div_ceil(d.batch_size) };
        let mut t0 = Instant::now();
        for k in 0..batches {
            let n = (indices.len() - k * d.batch_size).min(d.batch_size);
            if let Some(r) = &mut reducer {
                if !cfg.parallel.sync_batchnorm && cfg.parallel.broadcast_buffers {
                    broadcast_buffers(&gpu, &mut dev, r)?;
                }
            }
            gather_batch(
                &gpu,
                &train_dev,
                &order,
                k * d.batch_size,
                n,
                &mut x.slice_mut(0..n * per),
                &mut y.slice_mut(0..n),
            )?;
            // Micro-batches of this epoch done once this one is (the resumed ones included).
            let done = skip + k + 1;
            let last_micro = done.is_multiple_of(accum);
            let inject = last_micro && ddp.inject_inf_at() == Some(step + 1);
            if let (true, Some(r)) = (inject, &mut reducer) {
                r.inject_inf_next();
            }
            {
                let grad_scale = step_dev.grad_scale();
                let mut hooks = Hooks { gpu: &gpu, reducer: reducer.as_mut(), sync: last_micro };
                dev.train_batch(
                    &x.slice(0..n * per),
                    &y.slice(0..n),
                    n,
                    &grad_scale,
                    &mut totals,
                    &mut hooks,
                )?;
            }
            if inject && reducer.is_none() {
                // As the CPU loop does at world size 1: the last parameter's
                // whole gradient becomes inf, before the optimizer sees it.
                dev.params.fill_last_grad(&gpu, f32::INFINITY)?;
            }
            train_images += n;
            window_images += n;
            fold.rows += n;
            if !last_micro {
                continue;
            }
            if let Some(r) = &mut reducer {
                r.finish(&gpu, &mut dev.params)?;
            }
            // The scaler as of the previous step (its copy finished while this
            // step's backward was queued): skipped steps leave the schedule
            // where it was, as on the CPU.
            let snap = step_dev.snapshot.read()?;
            if let Some((code, at)) = snap.error {
                return Err(amp::cuda::scaler_error(code, at, snap.state.scale)
                    .unwrap_or_else(|| Error::Training("loss scaler error".into())));
            }
            skips.report(&progress, snap.step, snap.state);
            skips.scale_in_use = snap.state.scale;
            let lr = schedule.lr_at(step - snap.state.overflow_steps);
            step_dev.step(&gpu, &mut dev.params, lr, step + 1)?;
            dev.params.zero_grad(&gpu)?;
            step += 1;
            window_n += 1;
            fold.steps += 1;
            train_time += t0.elapsed().as_secs_f64();

            let logging = step.is_multiple_of(log_every) || step == total_steps;
            let host_view = logging || tracer.is_some() || save_due(cfg, step, total_steps);
            if host_view {
                let step_loss = fold.fold(&gpu, &mut totals, &mut window_loss)?;
                let local = window_loss / window_n.max(1) as f64;
                let norm_sq = gpu
                    .stream()
                    .clone_dtoh(step_dev.norm_sq())
                    .map_err(|e| Error::cuda("reading the grad norm", e))?;
                let norm = norm_sq.first().copied().unwrap_or(f32::NAN).sqrt();
                if norm.is_finite() {
                    grad_norm = Some(norm);
                }
                if !local.is_finite() {
                    return Err(Error::Training(format!(
                        "loss is {local} in steps {}..={step} (epoch {epoch}); lower optimizer.lr or set train.grad_clip_norm",
                        step + 1 - window_n
                    )));
                }
                if let Some(t) = &mut tracer {
                    dev.download(&mut model)?;
                    step_dev.sync_to_host(&gpu, &dev.params, &mut optimizer, &mut amp)?;
                    // The scale this step's gradients were computed with.
                    trace_divergence = t.after_update(step, step_loss, norm, snap.state.scale, &model)?;
                }
            }
            if logging {
                let state = step_dev.scaler.state(&gpu)?;
                // Before the step's line, as the CPU prints it.
                skips.report(&progress, step, state);
                let loss = ddp.mean(window_loss / window_n as f64)?;
                let ips = window_images as f64 / window_start.elapsed().as_secs_f64().max(1e-9);
                final_loss = loss;
                if initial_loss.is_nan() {
                    initial_loss = loss;
                }
                let mut rec = json!({"kind": "train", "step": step, "epoch": epoch, "loss": loss, "lr": lr,
                    "images_per_s": ips, "loss_scale": state.scale, "overflow_steps": state.overflow_steps});
                if let Some(g) = grad_norm {
                    rec["grad_norm"] = json!(g);
                }
                if let Some(f) = reducer.as_ref().map(|r| r.last_hidden_fraction()).transpose()?.flatten() {
                    rec["allreduce_hidden_fraction"] = json!(f);
                }
                metrics_out.write(&rec)?;
                progress.set_step(step, &format!("loss {loss:.4}"));
                if super::progress_is_plain(cfg) || step.is_multiple_of(log_every * 10) || step == total_steps
                {
                    progress.println(&format!(
                        "step {step:>6}/{total_steps} | epoch {epoch} | loss {loss:.4} | lr {lr:.5} | {ips:.0} images/s"
                    ));
                }
                (window_loss, window_n, window_images) = (0.0, 0, 0);
                window_start = Instant::now();
            }
            if trace_divergence.is_some() {
                break 'train;
            }
            if save_due(cfg, step, total_steps) {
                sync_host(&gpu, &dev, &step_dev, &mut model, &mut optimizer, &mut amp)?;
            }
            ckpt.after_step(
                &model,
                &optimizer,
                &amp,
                &train_progress!(done),
                &mut metrics_out,
                ddp.communicator(),
            )?;
            if step >= total_steps {
                break;
            }
            t0 = Instant::now();
        }
        epoch += 1;
        // A skip at the epoch's last step, before the evaluation's line.
        let snap = step_dev.snapshot.read()?;
        skips.report(&progress, snap.step, snap.state);
        if let Some(r) = &mut reducer {
            if !cfg.parallel.sync_batchnorm && cfg.parallel.broadcast_buffers {
                broadcast_buffers(&gpu, &mut dev, r)?;
            }
        }
        let ev = eval::evaluate(
            &gpu,
            &mut dev,
            &test_dev,
            &mut x,
            &mut y,
            d.eval_batch_size,
            &ddp,
            reducer.as_mut(),
        )?;
        metrics_out.write(&json!({"kind": "eval", "step": step, "epoch": epoch, "test_accuracy": ev.accuracy, "test_loss": ev.loss, "correct": ev.correct, "total": ev.total}))?;
        progress.println(&format!(
            "epoch {epoch} | step {step} | test accuracy {:.4} ({}/{}) | test loss {:.4}",
            ev.accuracy, ev.correct, ev.total, ev.loss
        ));
        last_eval = Some(ev);
        window_start = Instant::now();
        sync_host(&gpu, &dev, &step_dev, &mut model, &mut optimizer, &mut amp)?;
        fold.fold(&gpu, &mut totals, &mut window_loss)?;
        ckpt.after_epoch(
            &model,
            &optimizer,
            &amp,
            &train_progress!(0),
            &mut metrics_out,
            ddp.communicator(),
        )?;
    }
    let snap_state = step_dev.scaler.state(&gpu)?;
    skips.report(&progress, step, snap_state);
    progress.finish();
    step_dev.scaler.check(&gpu)?;
    sync_host(&gpu, &dev, &step_dev, &mut model, &mut optimizer, &mut amp)?;
    if let (None, Some(t)) = (&trace_divergence, &tracer) {
        trace_divergence = t.finish(step);
    }
    if trace_divergence.is_none() {
        ckpt.finish(&model, &optimizer, &amp, &train_progress!(0), &mut metrics_out, ddp.communicator())?;
    }
    let weights = out_dir.join("model.safetensors");
    if primary {
        crate::checkpoint::save_safetensors(&weights, &amp.state_dict(&model)?)?;
    }
    let summary = Summary {
        name: cfg.run.name.clone(),
        final_loss,
        test_accuracy: last_eval.map(|e| e.accuracy),
        test_loss: last_eval.map(|e| e.loss),
        images_per_s: (train_images * ddp.world_size()) as f64 / train_time.max(1e-9),
        allreduce_hidden_fraction: reducer.as_ref().map(|r| r.last_hidden_fraction()).transpose()?.flatten(),
        steps: step,
        epochs: epoch,
        wall_s: wall.elapsed().as_secs_f64(),
        opt_level: cfg.amp.opt_level.to_string(),
        world_size: ddp.world_size(),
        device,
        num_params: model.num_params(),
        weights,
        checkpoints: ckpt.written().to_vec(),
        resumed_from: ckpt.resumed_from().map(PathBuf::from),
        trace_divergence,
        loss_scale: snap_state.scale,
        overflow_steps: snap_state.overflow_steps,
        initial_loss,
        loss_decreased: final_loss < initial_loss,
    };
    if primary {
        metrics::write_json(&out_dir.join("summary.json"), &summary)?;
    }
    ddp.report_replica_state(&amp.state_dict(&model)?, snap_state.scale, snap_state.overflow_steps);
    ddp.barrier("end of training")?;
    // NCCL is torn down with the reducer: nothing of ours may still be queued.
    gpu.synchronize()?;
    drop(reducer);
    Ok(summary)
}

/// The training loss the device has summed since the host last looked.
#[derive(Default)]
struct LossFold {
    /// Rows and optimizer steps in the device's sum.
    rows: usize,
    steps: u64,
}

impl LossFold {
    /// Adds the device's sum to `window_loss` as `steps` steps of its mean
    /// row loss, restarts the device's sum, and returns that mean (the step's
    /// own loss when one step passed). Rows of micro-batches whose step is
    /// still pending stay on the device for the step they belong to.
    fn fold(&mut self, gpu: &Gpu, totals: &mut CrossEntropyTotals, window_loss: &mut f64) -> Result<f64> {
        if self.steps == 0 || self.rows == 0 {
            return Ok(0.0);
        }
        let mean = totals.read(gpu)?.0 / self.rows as f64;
        *window_loss += mean * self.steps as f64;
        totals.reset(gpu)?;
        (self.rows, self.steps) = (0, 0);
        Ok(mean)
    }
}

/// Prints each step the device skipped, as the CPU loop does, as soon as
/// the host sees the scaler's state: at the next step's snapshot (one step
/// late, without stalling), or before a line that follows the step (a
/// logged step, the evaluation, the end of the run).
struct SkipReport {
    reported: u64,
    scale_in_use: f32,
    primary: bool,
}

impl SkipReport {
    /// `state` is the scaler's after optimizer step `step`; the host has
    /// looked at every step before it, so a new skip is `step`'s own.
    fn report(&mut self, progress: &metrics::Progress, step: u64, state: amp::ScalerState) {
        if state.overflow_steps <= self.reported {
            return;
        }
        // The CPU also names the first parameters with inf/NaN gradients;
        // the device keeps one flag for the whole step.
        let msg = format!(
            "step {step}: gradient overflow (inf/NaN) at loss scale {}; step skipped, loss scale -> {}",
            self.scale_in_use, state.scale
        );
        // Like apex, every rank reports the skip it decided on.
        if self.primary {
            progress.println(&msg);
        } else {
            eprintln!("{msg}");
        }
        self.reported = state.overflow_steps;
    }
}

/// The host mirrors brought up to date with the device (waits for it).
fn sync_host(
    gpu: &Gpu,
    dev: &GpuModel,
    step_dev: &DeviceStep,
    model: &mut crate::nn::Model,
    optimizer: &mut Optimizer,
    amp: &mut amp::Amp,
) -> Result<()> {
    dev.download(model)?;
    dev.params.download_grads(gpu, model)?;
    step_dev.sync_to_host(gpu, &dev.params, optimizer, amp)
}

#[cfg(test)]
mod tests_cuda;
