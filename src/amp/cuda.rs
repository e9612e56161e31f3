//! Launchers for `kernels/amp.cu`: the fused unscale + inf/NaN check, the
//! loss scaler's update on the device ([`DeviceScaler`]), and the global
//! gradient norm for `clip_grad_norm_`. CPU twins: [`super::LossScaler`] and
//! [`super::clip_grad_norm_`].
//!
//! A training step runs, all on the compute stream and without waiting for
//! the host: [`DeviceScaler::begin_step`], [`DeviceScaler::unscale`] for each
//! gradient buffer, [`DeviceScaler::update`], optionally [`grad_norm_sq`] +
//! [`clip_grad_norm_`], then the optimizer kernels, which read
//! [`DeviceScaler::found_inf`]. The host reads the scaler back only on logging
//! steps ([`DeviceScaler::state`], [`DeviceScaler::check`]).

use super::{LossScaler, Policy, ScalerConfig, ScalerState};
use crate::config::{AmpConfig, LossScale};
use crate::cuda::{as_i64, check_len, launch_1d, DeviceFloat, Gpu, KernelFn, TypedKernelFn, BLOCK};
use crate::error::{Error, Result};
use crate::train::stop::VOTE_LEN;
use crate::typed_kernel;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig};

const FILE: &str = "amp.cu";
static AMP_CLIP_BY_NORM: KernelFn = KernelFn::new(FILE, "amp_clip_by_norm");
static AMP_DIVIDED_SCALE: KernelFn = KernelFn::new(FILE, "amp_divided_scale");
static AMP_SCALER_UPDATE: KernelFn = KernelFn::new(FILE, "amp_scaler_update");
static AMP_SUMSQ_FINISH: KernelFn = KernelFn::new(FILE, "amp_sumsq_finish");
static AMP_SUMSQ_PARTIALS: KernelFn = KernelFn::new(FILE, "amp_sumsq_partials");
static AMP_UNSCALE: TypedKernelFn = typed_kernel!(FILE, "amp_unscale");

fn single_thread() -> LaunchConfig {
    LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }
}

/// `counters` slots, as kernels/amp.cu's `amp_scaler_update` uses them.
const GROWTH_TRACKER: usize = 0;
const OVERFLOW_STEPS: usize = 1;
const ERROR: usize = 2;
const ERROR_STEP: usize = 3;

/// The error [`LossScaler::update`] would have returned, from the code the
/// device recorded (0: none). The device knows no parameter names, so the
/// message names none; otherwise it is the twin's.
pub fn scaler_error(code: i64, step: i64, scale: f32) -> Option<Error> {
    match code {
        0 => None,
        1 => Some(Error::Training(format!(
            "step {step}: gradients are inf or NaN with the static loss scale {scale}; \
             lower optimizer.lr, set train.grad_clip_norm, or use amp.loss_scale = \"dynamic\""
        ))),
        2 => Some(Error::Training(format!(
            "step {step}: gradients are inf or NaN even at the minimum loss scale {scale} \
             (amp.min_loss_scale); the model diverges rather than overflows: lower optimizer.lr \
             or set train.grad_clip_norm"
        ))),
        other => Some(Error::Training(format!(
            "step {step}: the device loss scaler reported unknown error {other}"
        ))),
    }
}

/// [`LossScaler`] with its state on the device.
pub struct DeviceScaler {
    dynamic: bool,
    cfg: ScalerConfig,
    scale: CudaSlice<f32>,
    /// [growth_tracker, overflow_steps, error code, step of the error].
    counters: CudaSlice<i64>,
    found_inf: CudaSlice<i32>,
}

impl DeviceScaler {
    fn new(gpu: &Gpu, dynamic: bool, cfg: ScalerConfig, state: ScalerState) -> Result<Self> {
        let s = gpu.stream();
        let scale = s.clone_htod(&[state.scale]).map_err(|e| Error::cuda("loss scaler alloc", e))?;
        let counters = s.alloc_zeros::<i64>(4).map_err(|e| Error::cuda("loss scaler alloc", e))?;
        let found_inf = s.alloc_zeros::<i32>(1).map_err(|e| Error::cuda("loss scaler alloc", e))?;
        let mut me = DeviceScaler { dynamic, cfg, scale, counters, found_inf };
        me.load_state(gpu, state)?;
        Ok(me)
    }

    /// `LossScaler::dynamic(cfg)` on the device.
    pub fn dynamic(gpu: &Gpu, cfg: ScalerConfig) -> Result<Self> {
        let state = ScalerState { scale: cfg.init_scale, growth_tracker: 0, overflow_steps: 0 };
        Self::new(gpu, true, cfg, state)
    }

    /// `LossScaler::fixed(scale)` on the device.
    pub fn fixed(gpu: &Gpu, scale: f32) -> Result<Self> {
        let state = ScalerState { scale, growth_tracker: 0, overflow_steps: 0 };
        Self::new(gpu, false, ScalerConfig::default(), state)
    }

    /// The scaler a validated `[amp]` asks for, as [`LossScaler::from_config`].
    pub fn from_config(gpu: &Gpu, amp: &AmpConfig) -> Result<Self> {
        match Policy::resolve(amp)?.loss_scale {
            LossScale::Dynamic => Self::dynamic(gpu, ScalerConfig::resolve(amp)?),
            LossScale::Static(v) => Self::fixed(gpu, v as f32),
        }
    }

    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    /// The current scale (one f32), for the kernel that scales the loss.
    pub fn scale(&self) -> &CudaSlice<f32> {
        &self.scale
    }

    /// The overflow flag (one i32, nonzero: skip this step) the optimizer
    /// kernels read.
    pub fn found_inf(&self) -> &CudaSlice<i32> {
        &self.found_inf
    }

    /// Clears the overflow flag; call once per step before the first unscale.
    pub fn begin_step(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.stream().memset_zeros(&mut self.found_inf).map_err(|e| Error::cuda("amp begin_step", e))
    }

    /// One gradient buffer: `out = grads / scale` in f32, setting the
    /// overflow flag on any inf/NaN (as [`LossScaler::unscale`]).
    pub fn unscale<T: DeviceFloat>(
        &mut self,
        gpu: &Gpu,
        grads: &CudaView<'_, T>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        const OP: &str = "amp unscale";
        check_len(OP, "out", out.len(), grads.len())?;
        if grads.is_empty() {
            return Ok(());
        }
        let n = as_i64(OP, grads.len())?;
        let f = gpu.kernel(T::pick(&AMP_UNSCALE))?;
        let mut b = f.launch_on(gpu.stream());
        b.arg(grads).arg(out).arg(&n).arg(&self.scale).arg(&mut self.found_inf);
        // SAFETY: argument types and order match amp_unscale_impl; lengths checked above.
        unsafe { b.launch(launch_1d(grads.len())) }.map_err(|e| Error::cuda(OP, e))?;
        Ok(())
    }

    /// After every unscale of optimizer step `step` (1-based): moves the
    /// scale as [`LossScaler::update`]. Its errors are recorded on the device
    /// and surface at the next [`DeviceScaler::check`].
    pub fn update(&mut self, gpu: &Gpu, step: u64) -> Result<()> {
        const OP: &str = "amp scaler update";
        let f = gpu.kernel(&AMP_SCALER_UPDATE)?;
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        let interval = i64::try_from(self.cfg.growth_interval).unwrap_or(i64::MAX);
        let dynamic = i32::from(self.dynamic);
        let c = &self.cfg;
        let mut b = f.launch_on(gpu.stream());
        b.arg(&mut self.scale).arg(&mut self.counters).arg(&mut self.found_inf).arg(&step).arg(&dynamic);
        b.arg(&c.growth_factor)
            .arg(&c.backoff_factor)
            .arg(&interval)
            .arg(&c.min_loss_scale)
            .arg(&c.max_loss_scale);
        // SAFETY: argument types and order match amp_scaler_update.
        unsafe { b.launch(single_thread()) }.map_err(|e| Error::cuda(OP, e))?;
        Ok(())
    }

    fn read(&self, gpu: &Gpu) -> Result<(f32, Vec<i64>, i32)> {
        let s = gpu.stream();
        let scale = s.clone_dtoh(&self.scale).map_err(|e| Error::cuda("reading the loss scale", e))?;
        let counters = s.clone_dtoh(&self.counters).map_err(|e| Error::cuda("reading the loss scaler", e))?;
        let flag = s.clone_dtoh(&self.found_inf).map_err(|e| Error::cuda("reading the overflow flag", e))?;
        Ok((scale[0], counters, flag[0]))
    }

    /// `out[0] = scale / divisor` on the device: the loss-gradient factor
    /// with `divisor` accumulation micro-batches.
    pub fn divided_scale(&self, gpu: &Gpu, divisor: f32, out: &mut CudaSlice<f32>) -> Result<()> {
        const OP: &str = "amp divided_scale";
        check_len(OP, "out", out.len(), 1)?;
        let f = gpu.kernel(&AMP_DIVIDED_SCALE)?;
        let mut b = f.launch_on(gpu.stream());
        b.arg(&self.scale).arg(&divisor).arg(out);
        // SAFETY: argument types and order match amp_divided_scale.
        unsafe { b.launch(single_thread()) }.map_err(|e| Error::cuda(OP, e))?;
        Ok(())
    }

    /// Starts an asynchronous copy of the scale and counters into `snap`
    /// (pinned host memory), read later with [`ScalerSnapshot::read`]: how
    /// the trainer learns of skipped steps one step late, without stalling.
    pub fn snapshot(&self, gpu: &Gpu, snap: &mut ScalerSnapshot) -> Result<()> {
        let s = gpu.stream();
        s.memcpy_dtoh(&self.scale, &mut snap.scale).map_err(|e| Error::cuda("loss scaler snapshot", e))?;
        s.memcpy_dtoh(&self.counters, &mut snap.counters)
            .map_err(|e| Error::cuda("loss scaler snapshot", e))?;
        snap.copied.record(s).map_err(|e| Error::cuda("loss scaler snapshot", e))?;
        snap.step = snap.pending_step;
        Ok(())
    }

    /// The state a checkpoint stores (waits for the stream).
    pub fn state(&self, gpu: &Gpu) -> Result<ScalerState> {
        let (scale, c, _) = self.read(gpu)?;
        Ok(ScalerState {
            scale,
            growth_tracker: c[GROWTH_TRACKER].max(0) as u64,
            overflow_steps: c[OVERFLOW_STEPS].max(0) as u64,
        })
    }

    /// Whether the last step was skipped (waits for the stream).
    pub fn skipped(&self, gpu: &Gpu) -> Result<bool> {
        Ok(self.read(gpu)?.2 != 0)
    }

    /// The error [`LossScaler::update`] would have raised at some step since
    /// the start, if any (waits for the stream).
    pub fn check(&self, gpu: &Gpu) -> Result<()> {
        let (scale, c, _) = self.read(gpu)?;
        match scaler_error(c[ERROR], c[ERROR_STEP], scale) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Restores a checkpoint's state (and clears any recorded error).
    pub fn load_state(&mut self, gpu: &Gpu, state: ScalerState) -> Result<()> {
        let s = gpu.stream();
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let counters = [clamp(state.growth_tracker), clamp(state.overflow_steps), 0, 0];
        s.memcpy_htod(&[state.scale], &mut self.scale).map_err(|e| Error::cuda("loss scaler load", e))?;
        s.memcpy_htod(&counters, &mut self.counters).map_err(|e| Error::cuda("loss scaler load", e))?;
        Ok(())
    }

    /// The CPU scaler with this state (waits for the stream).
    pub fn to_host(&self, gpu: &Gpu) -> Result<LossScaler> {
        let state = self.state(gpu)?;
        let mut s = if self.dynamic { LossScaler::dynamic(self.cfg) } else { LossScaler::fixed(state.scale) };
        s.load_state(state);
        Ok(s)
    }
}

/// The scaler's state as of some step, copied to pinned host memory
/// asynchronously by [`DeviceScaler::snapshot`].
pub struct ScalerSnapshot {
    scale: cudarc::driver::PinnedHostSlice<f32>,
    counters: cudarc::driver::PinnedHostSlice<i64>,
    /// The ranks' stop and save vote of the step (src/train/stop.rs), zero until
    /// [`ScalerSnapshot::copy_vote`] copies one.
    vote: cudarc::driver::PinnedHostSlice<f32>,
    /// Recorded after both copies: the one wait of [`ScalerSnapshot::read`].
    /// (The pinned slices' own events are cudarc's tracking, which is off
    /// (see `Gpu::new`): their `as_slice` does not wait for anything.)
    copied: cudarc::driver::CudaEvent,
    /// The optimizer step the last snapshot was taken after (0: none yet).
    step: u64,
    pending_step: u64,
}

/// What a [`ScalerSnapshot`] held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotValues {
    pub step: u64,
    pub state: ScalerState,
    /// The error the scaler recorded, if any ([`scaler_error`]).
    pub error: Option<(i64, i64)>,
    /// The step's stop and save vote, summed over the ranks (`stop::Agreed::from_sum` reads it).
    pub vote: [f32; VOTE_LEN],
}

impl ScalerSnapshot {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let ctx = gpu.ctx();
        let err = |e| Error::cuda("allocating pinned memory for the loss scaler", e);
        // SAFETY: plain (not write-combined: the host reads it) page-locked
        // memory; only read through ScalerSnapshot::read, after the copy's event.
        let (scale, counters, vote) = unsafe {
            (
                ctx.alloc_pinned_with_flags(1, 0),
                ctx.alloc_pinned_with_flags(4, 0),
                ctx.alloc_pinned_with_flags::<f32>(VOTE_LEN, 0),
            )
        };
        let mut vote = vote.map_err(err)?;
        vote.as_mut_slice().map_err(err)?.fill(0.0);
        let copied = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| Error::cuda("creating the loss scaler snapshot event", e))?;
        Ok(ScalerSnapshot {
            scale: scale.map_err(err)?,
            counters: counters.map_err(err)?,
            vote,
            copied,
            step: 0,
            pending_step: 0,
        })
    }

    /// Labels the next [`DeviceScaler::snapshot`] as taken after `step`.
    pub fn at_step(&mut self, step: u64) -> &mut Self {
        self.pending_step = step;
        self
    }

    /// Queues the copy of the ranks' summed stop vote (`VOTE_LEN` f32 on
    /// the device) into the next snapshot; call before [`DeviceScaler::snapshot`],
    /// whose event then covers it.
    pub fn copy_vote(&mut self, gpu: &Gpu, vote: &CudaSlice<f32>) -> Result<()> {
        check_len("stop vote snapshot", "vote", vote.len(), VOTE_LEN)?;
        gpu.stream().memcpy_dtoh(vote, &mut self.vote).map_err(|e| Error::cuda("stop vote snapshot", e))
    }

    /// Waits for the last snapshot's copy (long done when taken a step ago).
    pub fn read(&self) -> Result<SnapshotValues> {
        self.copied.synchronize().map_err(|e| Error::cuda("waiting for the loss scaler snapshot", e))?;
        let scale = self.scale.as_slice().map_err(|e| Error::cuda("reading the loss scaler snapshot", e))?;
        let c = self.counters.as_slice().map_err(|e| Error::cuda("reading the loss scaler snapshot", e))?;
        let v = self.vote.as_slice().map_err(|e| Error::cuda("reading the loss scaler snapshot", e))?;
        let mut vote = [0.0; VOTE_LEN];
        vote.copy_from_slice(v.get(..VOTE_LEN).unwrap_or(&[0.0; VOTE_LEN]));
        Ok(SnapshotValues {
            step: self.step,
            state: ScalerState {
                scale: scale[0],
                growth_tracker: c[GROWTH_TRACKER].max(0) as u64,
                overflow_steps: c[OVERFLOW_STEPS].max(0) as u64,
            },
            error: (c[ERROR] != 0).then_some((c[ERROR], c[ERROR_STEP])),
            vote,
        })
    }
}

/// Blocks of stage 1 of [`grad_norm_sq`]: the length of its workspace.
pub const NORM_PARTIALS: usize = 1024;

/// `out[0] = sum g^2` (or `+=` when `accumulate`, for the next buffer of the
/// same step), in f32 with a fixed reduction order: the same gradients give
/// the same bits every run. `workspace` holds [`NORM_PARTIALS`] floats.
pub fn grad_norm_sq(
    gpu: &Gpu,
    grads: &CudaView<'_, f32>,
    workspace: &mut CudaViewMut<'_, f32>,
    out: &mut CudaViewMut<'_, f32>,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "grad_norm_sq";
    check_len(OP, "workspace", workspace.len(), NORM_PARTIALS)?;
    check_len(OP, "out", out.len(), 1)?;
    let n = as_i64(OP, grads.len())?;
    let blocks = grads.len().div_ceil(BLOCK as usize).clamp(1, NORM_PARTIALS);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let f = gpu.kernel(&AMP_SUMSQ_PARTIALS)?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(grads).arg(&n).arg(&mut *workspace);
    // Stage 1 writes partials[0..blocks]; stage 2 reads exactly those.
    // SAFETY: argument types and order match amp_sumsq_partials.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
    let nparts = blocks as i64;
    let acc = i32::from(accumulate);
    let f = gpu.kernel(&AMP_SUMSQ_FINISH)?;
    let mut b = f.launch_on(gpu.stream());
    let partials = workspace.as_view();
    b.arg(&partials).arg(&nparts).arg(out).arg(&acc);
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: argument types and order match amp_sumsq_finish.
    unsafe { b.launch(one) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

/// [`super::clip_grad_norm_`] on one buffer given the squared total norm from
/// [`grad_norm_sq`]: scales `grads` by `max_norm / (norm + 1e-6)` when that is
/// below 1; a no-op on a step the scaler skips.
pub fn clip_grad_norm_(
    gpu: &Gpu,
    grads: &mut CudaViewMut<'_, f32>,
    norm_sq: &CudaView<'_, f32>,
    max_norm: f32,
    found_inf: &CudaSlice<i32>,
) -> Result<()> {
    const OP: &str = "clip_grad_norm_";
    check_len(OP, "norm_sq", norm_sq.len(), 1)?;
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::Training(format!("{OP}: max_norm must be a finite number > 0, got {max_norm}")));
    }
    if grads.is_empty() {
        return Ok(());
    }
    let n = as_i64(OP, grads.len())?;
    let cfg = launch_1d(grads.len());
    let f = gpu.kernel(&AMP_CLIP_BY_NORM)?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(grads).arg(&n).arg(norm_sq).arg(&max_norm).arg(found_inf);
    // SAFETY: argument types and order match amp_clip_by_norm.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
#[cfg(test)]
#[path = "tests_snapshot.rs"]
mod tests_snapshot;
