//! The CPU engine: the model, its optimizer and apex's amp state in host
//! memory, every call done when it returns. Batches come from a
//! [`Loader`] that builds the next ones on its own thread.

use super::active_wait::ActiveWait;
use super::engine::{Engine, Host, HostSync, Look, ScalerLook, Skip, Stepped};
use super::stop::Agreed;
use super::{evaluate_shard, Ddp, EvalResult};
use crate::amp::{Amp, StepOutcome};
use crate::config::Config;
use crate::data::{Augment, Dataset, Loader};
use crate::error::{Error, Result};
use crate::nn::Model;
use crate::ops;
use crate::optim::{LrSchedule, Optimizer};
use crate::rng::MicroBatch;
use std::sync::Arc;

pub struct CpuEngine {
    model: Model,
    optimizer: Optimizer,
    amp: Amp,
    train_ds: Arc<Dataset>,
    test_ds: Arc<Dataset>,
    batch_size: usize,
    eval_batch_size: usize,
    drop_last: bool,
    prefetch: usize,
    accum: usize,
    grad_clip_norm: Option<f32>,
    loader: Option<Loader>,
    /// Training-time transforms, applied by the loader thread.
    augment: Option<Arc<Augment>>,
    /// The last optimizer step's outcome (None before the first).
    last: Option<StepOutcome>,
    /// Keeps the pool's workers polling through a step's serial stretches.
    active: ActiveWait,
}

impl CpuEngine {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &Config,
        model: Model,
        optimizer: Optimizer,
        amp: Amp,
        train_ds: Arc<Dataset>,
        test_ds: Arc<Dataset>,
        accum: usize,
    ) -> Self {
        let d = &cfg.data;
        CpuEngine {
            model,
            optimizer,
            amp,
            train_ds,
            test_ds,
            batch_size: d.batch_size,
            eval_batch_size: d.eval_batch_size,
            drop_last: d.drop_last,
            prefetch: d.prefetch,
            accum,
            grad_clip_norm: cfg.train.grad_clip_norm,
            loader: None,
            augment: super::augmentation(cfg),
            last: None,
            active: ActiveWait::from_env(),
        }
    }
}

impl Engine for CpuEngine {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn look_is_free(&self) -> bool {
        true
    }

    fn begin_epoch(&mut self, epoch: u64, indices: Vec<usize>) -> Result<()> {
        self.loader = Some(Loader::training(
            self.train_ds.clone(),
            indices,
            (self.batch_size, self.drop_last, self.prefetch),
            epoch,
            self.augment.clone(),
        ));
        Ok(())
    }

    fn forward_backward(
        &mut self,
        ddp: &mut Ddp,
        rows: usize,
        sync: bool,
        _step: u64,
        at: MicroBatch,
    ) -> Result<Option<f32>> {
        self.active.arm();
        let batch = self.loader.as_mut().and_then(Iterator::next).ok_or_else(|| {
            Error::Training(format!("the data loader ended before a batch of {rows} samples"))
        })?;
        ddp.sync_buffers(&mut self.model)?;
        self.model.draws.at = at;
        let (logits, saved) = self.model.forward_train(batch.images)?;
        let shape = logits.shape().to_vec();
        let out = ops::cross_entropy::forward_backward(
            &ops::cross_entropy::as_rows(logits)?,
            &batch.labels,
            self.amp.loss_scale() / self.accum as f32,
        )?;
        // A non-finite loss stops the run before backward spreads it.
        if out.loss.is_finite() {
            ddp.backward(&mut self.model, saved, out.dlogits.reshape(&shape)?, sync)?;
        }
        Ok(Some(out.loss))
    }

    fn optimizer_step(&mut self, step: u64, schedule: &LrSchedule) -> Result<Stepped> {
        self.active.arm();
        let lr =
            schedule.lr_at(step.saturating_sub(1).saturating_sub(self.amp.scaler.state().overflow_steps));
        let outcome = self.amp.step(&mut self.model, &mut self.optimizer, lr, self.grad_clip_norm, step)?;
        let skip = outcome.skipped.then(|| Skip {
            step,
            scale: outcome.loss_scale,
            new_scale: self.amp.loss_scale(),
            first_in: Some(outcome.overflow.describe(3)),
        });
        self.model.zero_grad()?;
        self.last = Some(outcome);
        Ok(Stepped { lr, skip })
    }

    fn look(&mut self, _window_loss: &mut f64) -> Result<Look> {
        let last =
            self.last.as_ref().ok_or_else(|| Error::Training("no optimizer step to look at".into()))?;
        Ok(Look {
            grad_norm: last.grad_norm,
            loss_scale: last.loss_scale,
            applied_grad_norm: (!last.skipped).then_some(last.grad_norm),
            step_loss: None,
        })
    }

    fn fold_loss(&mut self, _window_loss: &mut f64) -> Result<()> {
        Ok(())
    }

    fn scaler(&mut self) -> Result<ScalerLook> {
        Ok(ScalerLook { state: self.amp.scaler.state(), skip: None })
    }

    fn host(&mut self, _sync: HostSync) -> Result<Host<'_>> {
        Ok(Host { model: &self.model, optimizer: &self.optimizer, amp: &self.amp })
    }

    fn evaluate(&mut self, ddp: &mut Ddp) -> Result<EvalResult> {
        // The loader stays: `train.eval_every` evaluates inside an epoch,
        // whose remaining batches it still holds.
        ddp.sync_buffers(&mut self.model)?;
        let local = evaluate_shard(
            &self.model,
            &self.test_ds,
            ddp.rank(),
            ddp.world_size(),
            self.eval_batch_size,
            self.prefetch,
        )?;
        ddp.reduce_eval(local)
    }

    fn allreduce_hidden_fraction(&self, ddp: &Ddp) -> Result<Option<f64>> {
        Ok(ddp.allreduce_hidden_fraction())
    }

    fn agreed(&mut self, ddp: &Ddp, _settle: bool) -> Result<Agreed> {
        Ok(ddp.agreed())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}
