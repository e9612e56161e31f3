//! What the training loop ([`super::run`]) asks of a device. The loop owns
//! every piece of bookkeeping (steps, epochs, loss windows, logs, metrics,
//! checkpoints, traces, the summary); an engine owns the model and its
//! optimizer on one device and does the arithmetic. The CPU engine
//! ([`super::cpu`]) finishes each call before it returns; the GPU engine
//! ([`super::cuda`]) only queues work, so the host learns what a step did
//! when the loop looks ([`Engine::look`]), and a skipped step one step late.

use super::stop::Agreed;
use super::{Ddp, EvalResult};
use crate::amp::{Amp, ScalerState};
use crate::error::Result;
use crate::nn::Model;
use crate::optim::{LrSchedule, Optimizer};
use crate::rng::MicroBatch;

/// A step the loss scaler skipped because its gradients held inf/NaN.
#[derive(Debug, Clone, PartialEq)]
pub struct Skip {
    /// The optimizer step (1-based).
    pub step: u64,
    /// The loss scale the step's gradients were computed with.
    pub scale: f32,
    /// The loss scale after backing off.
    pub new_scale: f32,
    /// The first parameters whose gradients overflowed, when the device
    /// knows them (the GPU keeps one flag for the whole step).
    pub first_in: Option<String>,
}

impl Skip {
    pub fn message(&self) -> String {
        let first_in = self.first_in.as_ref().map(|p| format!(", first in {p}")).unwrap_or_default();
        format!(
            "step {}: gradient overflow (inf/NaN) at loss scale {}{first_in}; step skipped, loss scale -> {}",
            self.step, self.scale, self.new_scale
        )
    }
}

/// One optimizer step, as far as the host knows when it returns.
pub struct Stepped {
    /// The learning rate the step was taken with.
    pub lr: f32,
    /// Skips the host learnt of while stepping: on the CPU this step's own,
    /// on the GPU the previous step's.
    pub skip: Option<Skip>,
}

/// The last optimizer step's results, read by the host.
pub struct Look {
    /// The total norm of the unscaled gradients before clipping
    /// (non-finite for a skipped step).
    pub grad_norm: f32,
    /// The loss scale the step's gradients were computed with.
    pub loss_scale: f32,
    /// The norm the metrics show, `None` when the step was not applied.
    pub applied_grad_norm: Option<f32>,
    /// The step's mean training loss, when the device summed it (the GPU);
    /// `None` when the loop already has it from the micro-batches (the CPU).
    pub step_loss: Option<f64>,
}

/// The loss scaler as of the last optimizer step.
pub struct ScalerLook {
    pub state: ScalerState,
    /// A skip the host had not been told of yet.
    pub skip: Option<Skip>,
}

/// How current the host copies of the model and optimizer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostSync {
    /// As they are (nothing will be read from them).
    Stale,
    /// Weights, masters, optimizer state and loss scaler current.
    Weights,
    /// ... and the gradients of micro-batches still pending (checkpoints).
    WeightsAndGrads,
}

/// The host's view of the run's state, for checkpoints, traces and the end of the run.
pub struct Host<'a> {
    pub model: &'a Model,
    pub optimizer: &'a Optimizer,
    pub amp: &'a Amp,
}

pub trait Engine {
    /// The device as the run's header and summary name it.
    fn device(&self) -> String;

    /// Whether [`Engine::look`] costs nothing: then the loop looks after
    /// every step; otherwise only where it needs to (logging, traces,
    /// checkpoints), so that ordinary steps never wait for the device.
    fn look_is_free(&self) -> bool;

    /// Epoch `epoch`'s sample order (batches already consumed by a resumed
    /// checkpoint removed); the epoch keys the training-time augmentation.
    fn begin_epoch(&mut self, epoch: u64, indices: Vec<usize>) -> Result<()>;

    /// Forward and backward of the epoch's next micro-batch (`rows`
    /// samples), gradients accumulating; `sync` (the step's last
    /// micro-batch) lets DDP all-reduce them. `step` is the optimizer step
    /// the micro-batch belongs to; `at` which micro-batch of the run it is
    /// (the key of its dropout masks, [`crate::rng::Draws`]). Returns the
    /// micro-batch's mean loss when the host has it at once.
    fn forward_backward(
        &mut self,
        ddp: &mut Ddp,
        rows: usize,
        sync: bool,
        step: u64,
        at: MicroBatch,
    ) -> Result<Option<f32>>;

    /// apex's optimizer step `step` (1-based) at the schedule's learning
    /// rate for the steps applied so far (skipped steps leave the schedule
    /// where it was), then zeroes the gradients.
    fn optimizer_step(&mut self, step: u64, schedule: &LrSchedule) -> Result<Stepped>;

    /// The last step's results; a device that sums the loss adds the steps
    /// since the last look to `window_loss` (as per-step means).
    fn look(&mut self, window_loss: &mut f64) -> Result<Look>;

    /// Adds to `window_loss` what the device summed since the last look
    /// (nothing on a device that reports the loss per micro-batch).
    fn fold_loss(&mut self, window_loss: &mut f64) -> Result<()>;

    /// The loss scaler as of the last step (stops the run with the
    /// scaler's error when a step overflowed at the minimum scale).
    fn scaler(&mut self) -> Result<ScalerLook>;

    /// The host copies of the model, optimizer and amp state, brought up to date as `sync` says.
    fn host(&mut self, sync: HostSync) -> Result<Host<'_>>;

    /// Scores this rank's shard of the test set, summed over the ranks.
    fn evaluate(&mut self, ddp: &mut Ddp) -> Result<EvalResult>;

    /// DDP only: the share of gradient all-reduce time hidden behind backward.
    fn allreduce_hidden_fraction(&self, ddp: &Ddp) -> Result<Option<f64>>;

    /// At world size > 1: the stop and timed save the ranks agreed on
    /// through a step's gradient all-reduce, as far as the host knows it. The CPU knows the
    /// step just taken; the GPU learns a step's vote from its loss-scaler
    /// snapshot when the next step is taken, or, with `settle`, at once
    /// (waiting for the device: the loop settles only at an epoch's end).
    fn agreed(&mut self, ddp: &Ddp, settle: bool) -> Result<Agreed>;

    /// After the last collective: nothing of the run may still be queued.
    fn finish(&mut self) -> Result<()>;
}
