//! The GPU engine: the model, the data, the optimizer and the loss scaler on
//! the device, with the CPU [`Model`], [`Optimizer`] and [`Amp`] kept as host
//! mirrors, brought up to date only for checkpoints, traces and the end of
//! the run.
//!
//! Inside a step the host only launches: the batch is gathered from the
//! dataset on the device, the loss and its hits add up on the device, each
//! gradient bucket's all-reduce starts on the communication stream as soon
//! as backward has produced it, and the optimizer reads the overflow flag
//! on the device. The host reads the device when the loop looks (logging
//! steps, traces, checkpoints) and, one step late and without stalling, the
//! loss scaler's snapshot (to pick the next learning rate and report
//! skipped steps).

pub mod eval;
pub mod step;

use super::engine::{Engine, Host, HostSync, Look, ScalerLook, Skip, Stepped};
use super::stop::Agreed;
use super::{Ddp, EvalResult};
use crate::amp::{self, Amp, ScalerState};
use crate::config::Config;
use crate::cuda::Gpu;
use crate::data::cuda::{gather_batch, gather_batch_augmented, DeviceAugment, DeviceDataset, DeviceIndices};
use crate::data::Dataset;
use crate::dist::cuda::{DeviceComm, DeviceReducer};
use crate::dist::reducer::ReducerOptions;
use crate::error::{Error, Result};
use crate::nn::cuda::params::{DevBuf, DeviceParams};
use crate::nn::cuda::{GpuModel, TrainHooks};
use crate::nn::Model;
use crate::ops::cross_entropy::cuda::CrossEntropyTotals;
use crate::optim::{LrSchedule, Optimizer};
use crate::rng::MicroBatch;
use cudarc::driver::{CudaSlice, CudaViewMut};
use std::sync::Arc;
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

pub struct CudaEngine {
    gpu: Arc<Gpu>,
    model: Model,
    optimizer: Optimizer,
    amp: Amp,
    dev: GpuModel,
    reducer: Option<DeviceReducer>,
    step_dev: DeviceStep,
    train_dev: DeviceDataset,
    test_dev: DeviceDataset,
    /// The epoch's sample order on the device, and the next row of it to gather.
    order: Option<DeviceIndices>,
    next_row: usize,
    /// Training-time transforms: drawn on the host per epoch, applied by the gather.
    augment: Option<(Arc<crate::data::Augment>, DeviceAugment)>,
    x: CudaSlice<f32>,
    y: CudaSlice<u32>,
    totals: CrossEntropyTotals,
    fold: LossFold,
    skips: SkipTracker,
    eval_batch_size: usize,
    /// The last optimizer step queued (1-based; 0 before the first).
    last_step: u64,
    /// DDP's broadcast_buffers (without SyncBatchNorm, at world size > 1).
    broadcast_buffers: bool,
    inject_inf_at: Option<u64>,
    /// The stop and timed save the ranks agreed on, as of the last snapshot the host read.
    agreed: Agreed,
}

impl CudaEngine {
    /// The device side of a started run, every buffer allocated once,
    /// before the first step; joins the NCCL communicator at world size > 1.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &Config,
        gpu: Arc<Gpu>,
        model: Model,
        optimizer: Optimizer,
        amp: Amp,
        (train_ds, test_ds): (&Dataset, &Dataset),
        ddp: &Ddp,
        accum: usize,
        resumed: bool,
    ) -> Result<Self> {
        let d = &cfg.data;
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
        if resumed {
            // A checkpoint taken with accumulation micro-batches pending restored
            // their gradients into the host model (zero otherwise).
            dev.params.upload_grads(&gpu, &model)?;
        }
        let reducer = if ddp.world_size() > 1 {
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
        let step_dev = DeviceStep::new(&gpu, &dev.params, &optimizer, &amp, accum, cfg.train.grad_clip_norm)?;
        let train_dev = DeviceDataset::upload(&gpu, train_ds)?;
        let test_dev = DeviceDataset::upload(&gpu, test_ds)?;
        let augment = match super::augmentation(cfg) {
            Some(a) => {
                let dev_aug = DeviceAugment::upload(&gpu, &a, train_ds.sample_shape[0])?;
                Some((a, dev_aug))
            }
            None => None,
        };
        let (per, labels) = (train_dev.sample_len(), train_dev.labels_per_sample());
        let s = gpu.stream();
        let alloc_err = |e| Error::cuda("allocating the batch buffers", e);
        let x: CudaSlice<f32> = s.alloc_zeros(max_batch * per).map_err(alloc_err)?;
        let y: CudaSlice<u32> = s.alloc_zeros(max_batch * labels).map_err(alloc_err)?;
        let totals = CrossEntropyTotals::new(&gpu, max_batch * labels)?;
        let state = amp.scaler.state();
        Ok(CudaEngine {
            gpu,
            model,
            optimizer,
            amp,
            dev,
            broadcast_buffers: reducer.is_some()
                && !cfg.parallel.sync_batchnorm
                && cfg.parallel.broadcast_buffers,
            reducer,
            step_dev,
            train_dev,
            test_dev,
            order: None,
            next_row: 0,
            augment,
            x,
            y,
            totals,
            fold: LossFold::default(),
            skips: SkipTracker { reported: state.overflow_steps, scale_in_use: state.scale },
            eval_batch_size: d.eval_batch_size,
            last_step: 0,
            inject_inf_at: ddp.inject_inf_at(),
            agreed: Agreed::default(),
        })
    }

    /// DDP's broadcast_buffers: rank 0's BatchNorm running statistics to
    /// every rank, before each forward.
    fn broadcast_buffers(&mut self) -> Result<()> {
        let (Some(r), true) = (&mut self.reducer, self.broadcast_buffers) else {
            return Ok(());
        };
        for buf in self.dev.buffers_mut() {
            match buf {
                DevBuf::F32(b) => r.broadcast_f32(&self.gpu, &mut b.as_view_mut(), "BatchNorm buffers")?,
                DevBuf::F16(b) => r.broadcast_f16(&self.gpu, &mut b.as_view_mut(), "BatchNorm buffers")?,
            }
        }
        Ok(())
    }
}

impl Engine for CudaEngine {
    fn device(&self) -> String {
        format!("cuda:{} {}", self.gpu.ctx().ordinal(), self.gpu.name())
    }

    fn look_is_free(&self) -> bool {
        false
    }

    fn begin_epoch(&mut self, epoch: u64, indices: Vec<usize>) -> Result<()> {
        self.order = Some(match &self.augment {
            Some((a, _)) => DeviceIndices::upload_augmented(&self.gpu, &self.train_dev, &indices, a, epoch)?,
            None => DeviceIndices::upload(&self.gpu, &self.train_dev, &indices, epoch)?,
        });
        self.next_row = 0;
        Ok(())
    }

    fn forward_backward(
        &mut self,
        ddp: &mut Ddp,
        rows: usize,
        sync: bool,
        step: u64,
        at: MicroBatch,
    ) -> Result<Option<f32>> {
        self.broadcast_buffers()?;
        let order =
            self.order.as_ref().ok_or_else(|| Error::Training("a batch before its epoch began".into()))?;
        let (per, labels) = (self.train_dev.sample_len(), self.train_dev.labels_per_sample());
        let gpu = &self.gpu;
        let (x, y) = (&mut self.x.slice_mut(0..rows * per), &mut self.y.slice_mut(0..rows * labels));
        match &self.augment {
            Some((_, aug)) => {
                gather_batch_augmented(gpu, &self.train_dev, order, aug, self.next_row, rows, x, y)?
            }
            None => gather_batch(gpu, &self.train_dev, order, self.next_row, rows, x, y)?,
        }
        self.next_row += rows;
        let inject = sync && self.inject_inf_at == Some(step);
        if let (true, Some(r)) = (inject, &mut self.reducer) {
            r.inject_inf_next();
        }
        if let (true, Some(r)) = (sync, &mut self.reducer) {
            r.set_vote(ddp.vote().elements());
        }
        {
            let grad_scale = self.step_dev.grad_scale();
            let mut hooks = Hooks { gpu, reducer: self.reducer.as_mut(), sync };
            self.dev.draws.at = at;
            self.dev.train_batch(
                &self.x.slice(0..rows * per),
                &self.y.slice(0..rows * labels),
                rows,
                &grad_scale,
                &mut self.totals,
                &mut hooks,
            )?;
        }
        if inject && self.reducer.is_none() {
            // As the CPU does at world size 1: the last parameter's whole
            // gradient becomes inf, before the optimizer sees it.
            self.dev.params.fill_last_grad(gpu, f32::INFINITY)?;
        }
        self.fold.rows += rows * labels;
        Ok(None)
    }

    fn optimizer_step(&mut self, step: u64, schedule: &LrSchedule) -> Result<Stepped> {
        let gpu = &self.gpu;
        if let Some(r) = &mut self.reducer {
            r.finish(gpu, &mut self.dev.params)?;
        }
        // The scaler as of the previous step (its copy finished while this
        // step's backward was queued).
        let snap = self.step_dev.snapshot.read()?;
        if let Some((code, at)) = snap.error {
            return Err(amp::cuda::scaler_error(code, at, snap.state.scale)
                .unwrap_or_else(|| Error::Training("loss scaler error".into())));
        }
        let skip = self.skips.seen(snap.step, snap.state);
        self.skips.scale_in_use = snap.state.scale;
        self.agreed = Agreed::from_sum(snap.vote);
        let lr = schedule.lr_at(step.saturating_sub(1).saturating_sub(snap.state.overflow_steps));
        let vote = self.reducer.as_ref().map(|r| r.vote());
        self.step_dev.step(gpu, &mut self.dev.params, lr, step, vote)?;
        self.dev.params.zero_grad(gpu)?;
        self.fold.steps += 1;
        self.last_step = step;
        Ok(Stepped { lr, skip })
    }

    fn look(&mut self, window_loss: &mut f64) -> Result<Look> {
        let step_loss = self.fold.fold(&self.gpu, &mut self.totals, window_loss)?;
        let norm_sq = self
            .gpu
            .stream()
            .clone_dtoh(self.step_dev.norm_sq())
            .map_err(|e| Error::cuda("reading the grad norm", e))?;
        let norm = norm_sq.first().copied().unwrap_or(f32::NAN).sqrt();
        Ok(Look {
            grad_norm: norm,
            loss_scale: self.skips.scale_in_use,
            applied_grad_norm: norm.is_finite().then_some(norm),
            step_loss: Some(step_loss),
        })
    }

    fn fold_loss(&mut self, window_loss: &mut f64) -> Result<()> {
        self.fold.fold(&self.gpu, &mut self.totals, window_loss).map(|_| ())
    }

    fn scaler(&mut self) -> Result<ScalerLook> {
        let scaler = &self.step_dev.scaler;
        scaler.check(&self.gpu)?;
        let state = scaler.state(&self.gpu)?;
        let skip = self.skips.seen(self.last_step, state);
        Ok(ScalerLook { state, skip })
    }

    fn host(&mut self, sync: HostSync) -> Result<Host<'_>> {
        if sync != HostSync::Stale {
            self.dev.download(&mut self.model)?;
            if sync == HostSync::WeightsAndGrads {
                self.dev.params.download_grads(&self.gpu, &mut self.model)?;
            }
            self.step_dev.sync_to_host(&self.gpu, &self.dev.params, &mut self.optimizer, &mut self.amp)?;
        }
        Ok(Host { model: &self.model, optimizer: &self.optimizer, amp: &self.amp })
    }

    fn evaluate(&mut self, ddp: &mut Ddp) -> Result<EvalResult> {
        self.broadcast_buffers()?;
        eval::evaluate(
            &self.gpu,
            &mut self.dev,
            &self.test_dev,
            &mut self.x,
            &mut self.y,
            self.eval_batch_size,
            ddp,
            self.reducer.as_mut(),
        )
    }

    fn allreduce_hidden_fraction(&self, _ddp: &Ddp) -> Result<Option<f64>> {
        Ok(self.reducer.as_ref().map(|r| r.last_hidden_fraction()).transpose()?.flatten())
    }

    fn agreed(&mut self, _ddp: &Ddp, settle: bool) -> Result<Agreed> {
        if settle {
            // The last step's own snapshot (the device is waited for); the
            // next step's reads it again, so a save it tells of is not lost.
            self.agreed = Agreed::from_sum(self.step_dev.snapshot.read()?.vote);
        }
        Ok(self.agreed)
    }

    fn finish(&mut self) -> Result<()> {
        // NCCL is torn down with the reducer: nothing of ours may still be queued.
        self.gpu.synchronize()?;
        self.reducer = None;
        Ok(())
    }
}

/// The training loss the device has summed since the host last looked.
#[derive(Default)]
struct LossFold {
    /// Rows (a language model's: tokens) and optimizer steps in the device's sum.
    rows: usize,
    steps: u64,
}

impl LossFold {
    /// Adds the device's sum to `window_loss` as `steps` steps of its mean
    /// row loss, restarts the device's sum, and returns that mean (the step's
    /// own loss when one step passed). The host folds whenever it looks, so
    /// a resumed run folds at the same steps as the uninterrupted one and
    /// logs the same bits.
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

/// The skips the host has learnt of: the device keeps counting them, the
/// host reports each once, as soon as it reads the scaler's state.
struct SkipTracker {
    reported: u64,
    /// The loss scale the step being taken runs with.
    scale_in_use: f32,
}

impl SkipTracker {
    /// `state` is the scaler's after optimizer step `step`; the host has
    /// looked at every step before it, so a new skip is `step`'s own.
    fn seen(&mut self, step: u64, state: ScalerState) -> Option<Skip> {
        if state.overflow_steps <= self.reported {
            return None;
        }
        self.reported = state.overflow_steps;
        Some(Skip { step, scale: self.scale_in_use, new_scale: state.scale, first_in: None })
    }
}

#[cfg(test)]
mod tests_cuda;
#[cfg(test)]
mod tests_gpt;
