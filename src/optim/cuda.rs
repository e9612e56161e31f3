//! Launchers for `kernels/optim.cu`: [`DeviceOptimizer`] steps flat f32
//! master weights in place (and writes the model's f16 or f32 copy) with the
//! same update as [`Optimizer::step`], skipping on the device when the loss
//! scaler's overflow flag is set.
//!
//! Parameters are one flat buffer, the concatenation of the tensors in
//! registration order, so one launch steps them all (the update is
//! elementwise). The step counter lives on the device too (see
//! kernels/optim.cu); [`DeviceOptimizer::to_host`] and
//! [`DeviceOptimizer::from_host`] move the whole state for checkpoints.

use super::{widen, Optimizer, OptimizerConfig, OptimizerKind, ParamState};
use crate::cuda::{as_i64, check_len, DeviceFloat, KernelFn, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig};
use std::path::Path;

const FILE: &str = "optim.cu";
static ADAM_STEP: TypedKernelFn = typed_kernel!(FILE, "adam_step");
static OPTIM_ADVANCE_STEP: KernelFn = KernelFn::new(FILE, "optim_advance_step");
static SGD_STEP: TypedKernelFn = typed_kernel!(FILE, "sgd_step");

/// An [`Optimizer`] whose state lives on the device as flat f32 buffers.
pub struct DeviceOptimizer {
    cfg: OptimizerConfig,
    param_sizes: Vec<usize>,
    total: usize,
    /// SGD: [momentum_buffer] when momentum != 0, else none; Adam/AdamW:
    /// [exp_avg, exp_avg_sq]. Each is `total` long, zero until first used.
    state: Vec<CudaSlice<f32>>,
    /// Completed (not skipped) steps: Adam's `state['step']`.
    step_count: CudaSlice<i64>,
    /// Per parameter: whether weight decay applies ([`Optimizer::decay`]).
    decay: Vec<bool>,
}

impl DeviceOptimizer {
    /// As [`Optimizer::new`]: validates `cfg`; state starts as PyTorch's does.
    pub fn new(gpu: &Gpu, cfg: OptimizerConfig, param_sizes: &[usize]) -> Result<Self> {
        cfg.validate()?;
        if param_sizes.is_empty() {
            return Err(Error::shape("optimizer got an empty parameter list"));
        }
        let total: usize = param_sizes.iter().sum();
        let buffers = match cfg.kind {
            OptimizerKind::Sgd if cfg.momentum != 0.0 => 1,
            OptimizerKind::Sgd => 0,
            OptimizerKind::Adam | OptimizerKind::AdamW => 2,
        };
        let s = gpu.stream();
        let alloc =
            |n: usize| s.alloc_zeros::<f32>(n.max(1)).map_err(|e| Error::cuda("optimizer state alloc", e));
        let state = (0..buffers).map(|_| alloc(total)).collect::<Result<Vec<_>>>()?;
        let step_count = s.alloc_zeros::<i64>(1).map_err(|e| Error::cuda("optimizer state alloc", e))?;
        let decay = vec![true; param_sizes.len()];
        Ok(DeviceOptimizer { cfg, param_sizes: param_sizes.to_vec(), total, state, step_count, decay })
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.cfg
    }

    /// Total elements over all parameters: the length of every flat buffer.
    pub fn numel(&self) -> usize {
        self.total
    }

    /// One step over the flat `master` weights with the flat unscaled f32
    /// `grads`; `model`, when given, receives the masters rounded to `T`.
    /// Does nothing (weights, state and step count untouched) when
    /// `found_inf[0]` is nonzero at the time the kernels run.
    pub fn step<T: DeviceFloat>(
        &mut self,
        gpu: &Gpu,
        master: &mut CudaViewMut<'_, f32>,
        grads: &CudaView<'_, f32>,
        mut model: Option<&mut CudaViewMut<'_, T>>,
        lr: f32,
        found_inf: &CudaSlice<i32>,
    ) -> Result<()> {
        const OP: &str = "optimizer step";
        check_len(OP, "master weights", master.len(), self.total)?;
        check_len(OP, "gradients", grads.len(), self.total)?;
        if let Some(m) = &model {
            check_len(OP, "model copy", m.len(), self.total)?;
        }
        check_len(OP, "found_inf", found_inf.len(), 1)?;
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::Training(format!("learning rate {lr} is not a finite number >= 0")));
        }
        // One launch per run of parameters that share a weight decay (all of
        // them unless the optimizer leaves some undecayed, as nanoGPT's
        // groups do): the CPU steps those with weight_decay = 0.
        for (range, decay) in self.segments() {
            let weight_decay = if decay { self.cfg.weight_decay } else { 0.0 };
            let (m, g) = (&mut master.slice_mut(range.clone()), &grads.slice(range.clone()));
            let mut model = model.as_mut().map(|v| v.slice_mut(range.clone()));
            self.launch(gpu, range, weight_decay, m, g, model.as_mut(), lr, found_inf)?;
        }
        let f = gpu.kernel(&OPTIM_ADVANCE_STEP)?;
        let mut b = f.launch_on(gpu.stream());
        b.arg(&mut self.step_count).arg(found_inf);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: argument types and order match optim_advance_step.
        unsafe { b.launch(one) }.map_err(|e| Error::cuda(OP, e))?;
        Ok(())
    }

    /// Runs of consecutive elements whose parameters share a decay flag.
    fn segments(&self) -> Vec<(std::ops::Range<usize>, bool)> {
        let mut out: Vec<(std::ops::Range<usize>, bool)> = Vec::new();
        let mut at = 0;
        for (&size, &decay) in self.param_sizes.iter().zip(&self.decay) {
            match out.last_mut() {
                Some((r, d)) if *d == decay => r.end += size,
                _ => out.push((at..at + size, decay)),
            }
            at += size;
        }
        out.retain(|(r, _)| !r.is_empty());
        out
    }

    /// The update kernel over the elements `range` of the flat buffers
    /// (`master`, `grads` and `model` are already that range).
    #[allow(clippy::too_many_arguments)]
    fn launch<T: DeviceFloat>(
        &mut self,
        gpu: &Gpu,
        range: std::ops::Range<usize>,
        weight_decay: f32,
        master: &mut CudaViewMut<'_, f32>,
        grads: &CudaView<'_, f32>,
        model: Option<&mut CudaViewMut<'_, T>>,
        lr: f32,
        found_inf: &CudaSlice<i32>,
    ) -> Result<()> {
        const OP: &str = "optimizer step";
        let n = as_i64(OP, range.len())?;
        let null: u64 = 0;
        let cfg = launch_1d(range.len());
        let c = &self.cfg;
        match c.kind {
            OptimizerKind::Sgd => {
                // The Python-side scalars, as sgd::SgdScalars rounds them.
                let lr64 = widen(lr);
                let neg_lr = (-lr64) as f32;
                let momentum = widen(c.momentum) as f32;
                let one_minus_dampening = (1.0 - widen(c.dampening)) as f32;
                let weight_decay = widen(weight_decay) as f32;
                let nesterov = i32::from(c.nesterov);
                let f = gpu.kernel(T::pick(&SGD_STEP))?;
                let mut momentum_buffer = self.state.first_mut().map(|b| b.slice_mut(range));
                let mut b = f.launch_on(gpu.stream());
                b.arg(master).arg(grads);
                match momentum_buffer.as_mut() {
                    Some(buf) => b.arg(buf),
                    None => b.arg(&null),
                };
                match model {
                    Some(m) => b.arg(m),
                    None => b.arg(&null),
                };
                b.arg(&n).arg(&self.step_count).arg(found_inf).arg(&neg_lr).arg(&momentum);
                b.arg(&one_minus_dampening).arg(&weight_decay).arg(&nesterov);
                // SAFETY: argument types and order match sgd_step_impl; every
                // buffer holds the range's `n` elements (the caller checked
                // the whole); the momentum buffer is null only when momentum
                // == 0, where it is unused.
                unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
            }
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let (lr64, beta1, beta2) = (widen(lr), widen(c.betas.0), widen(c.betas.1));
                let (eps, weight_decay) = (widen(c.eps), widen(weight_decay));
                let decoupled = i32::from(c.kind == OptimizerKind::AdamW);
                let f = gpu.kernel(T::pick(&ADAM_STEP))?;
                let [m1, m2] = self.state.as_mut_slice() else {
                    return Err(Error::Training(format!("{OP}: Adam state is not two buffers")));
                };
                let (mut m1, mut m2) = (m1.slice_mut(range.clone()), m2.slice_mut(range));
                let mut b = f.launch_on(gpu.stream());
                b.arg(master).arg(grads).arg(&mut m1).arg(&mut m2);
                match model {
                    Some(m) => b.arg(m),
                    None => b.arg(&null),
                };
                b.arg(&n).arg(&self.step_count).arg(found_inf).arg(&lr64).arg(&beta1).arg(&beta2);
                b.arg(&eps).arg(&weight_decay).arg(&decoupled);
                // SAFETY: argument types and order match adam_step_impl; every
                // buffer holds the range's `n` elements.
                unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
            }
        }
        Ok(())
    }

    /// Steps taken so far, not counting skipped ones (waits for the stream).
    pub fn step_count(&self, gpu: &Gpu) -> Result<u64> {
        let v = gpu
            .stream()
            .clone_dtoh(&self.step_count)
            .map_err(|e| Error::cuda("reading the step count", e))?;
        Ok(v[0].max(0) as u64)
    }

    /// The same optimizer on the CPU, state and step count included (for
    /// checkpoints and tests; waits for the stream).
    pub fn to_host(&self, gpu: &Gpu) -> Result<Optimizer> {
        let step_count = self.step_count(gpu)?;
        let flat: Vec<Vec<f32>> = self
            .state
            .iter()
            .map(|b| gpu.stream().clone_dtoh(b).map_err(|e| Error::cuda("reading optimizer state", e)))
            .collect::<Result<_>>()?;
        let mut cpu = Optimizer::new(self.cfg.clone(), &self.param_sizes)?.with_decay_mask(&self.decay)?;
        let names: &[&str] = match self.cfg.kind {
            // PyTorch has no momentum buffer before the first step.
            OptimizerKind::Sgd if step_count == 0 => &[],
            OptimizerKind::Sgd if self.cfg.momentum != 0.0 => &["momentum_buffer"],
            OptimizerKind::Sgd => &[],
            OptimizerKind::Adam | OptimizerKind::AdamW => &["exp_avg", "exp_avg_sq"],
        };
        let mut tensors = Vec::new();
        let mut off = 0;
        for (i, &size) in self.param_sizes.iter().enumerate() {
            for (name, buf) in names.iter().zip(&flat) {
                tensors.push((*name, i, &buf[off..off + size]));
            }
            off += size;
        }
        cpu.load_state_tensors(Path::new("<device optimizer>"), step_count, &tensors)?;
        Ok(cpu)
    }

    /// The device twin of `cpu` (config, state and step count).
    pub fn from_host(gpu: &Gpu, cpu: &Optimizer) -> Result<Self> {
        let mut me = Self::new(gpu, cpu.config().clone(), cpu.param_sizes())?;
        me.decay = cpu.decay().to_vec();
        let mut flat: Vec<Vec<f32>> = vec![Vec::with_capacity(me.total); me.state.len()];
        for st in cpu.state() {
            let parts: Vec<&[f32]> = match st {
                ParamState::Sgd { momentum_buffer: Some(b) } => vec![b],
                ParamState::Sgd { momentum_buffer: None } => vec![],
                ParamState::Adam { exp_avg, exp_avg_sq } => vec![exp_avg, exp_avg_sq],
            };
            for (dst, src) in flat.iter_mut().zip(parts) {
                dst.extend_from_slice(src);
            }
        }
        let s = gpu.stream();
        for (dev, host) in me.state.iter_mut().zip(&flat) {
            // Before the first SGD step there is no buffer: the device one stays zero.
            if host.len() == me.total && me.total > 0 {
                s.memcpy_htod(host, &mut dev.slice_mut(..me.total))
                    .map_err(|e| Error::cuda("loading optimizer state", e))?;
            }
        }
        let count = i64::try_from(cpu.step_count()).unwrap_or(i64::MAX);
        s.memcpy_htod(&[count], &mut me.step_count).map_err(|e| Error::cuda("loading optimizer state", e))?;
        Ok(me)
    }
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
