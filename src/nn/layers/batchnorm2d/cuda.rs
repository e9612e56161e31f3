//! BatchNorm2d on the device (`ops/batch_norm/cuda.rs`, `kernels/batch_norm.cu`),
//! SyncBatchNorm included: its statistics' sums are all-reduced between
//! the launches through the step's hooks. With f16 parameters and running
//! statistics (O3) it runs on f32 copies and rounds the statistics and the
//! gradients back once, as `forward_widened` / `backward_widened` do on the
//! CPU. Backward: `+=` into dW and db, `=` into dx.

use super::{parts, running_stats, BatchNorm2d};
use crate::cuda::{cast, Gpu};
use crate::error::Result;
use crate::nn::cuda::layer::{
    f32_param, internal, read, Backward, Grads, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch, StateArgs,
};
use crate::nn::cuda::model::{alloc, view, view_mut};
use crate::nn::cuda::params::DevBuf;
use crate::nn::Node;
use crate::ops::batch_norm::cuda::{self as bnk, Epilogue};
use crate::ops::batch_norm::{BnGrads, BnHyper, BnParams, RunningStats, SavedStats};
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaViewMut};
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormPlan {
    pub channels: usize,
    /// H*W of the input.
    pub hw: usize,
    /// SyncBatchNorm: statistics over every rank.
    pub sync: bool,
    /// That of weight, bias and the running statistics (f16 under O3).
    pub param_dtype: DType,
    pub eps: f32,
    pub momentum: f32,
}

impl BatchNormPlan {
    /// The f32 scratch: weight, bias, running mean and variance (f16 ones
    /// cast up), the gradients before their one rounding, backward's
    /// `[sum dy, sum dy*xhat]` and SyncBatchNorm's `[count, sum, sumsq]`.
    fn scratch(&self) -> [usize; 8] {
        let c = self.channels;
        [c, c, c, c, c, c, 2 * c, 1 + 2 * c]
    }
}

/// Running statistics in the parameters' dtype, the batch mean and invstd
/// of the last training forward, and num_batches_tracked (host-side:
/// nothing on the device reads it).
pub struct BnState {
    running_mean: DevBuf,
    running_var: DevBuf,
    mean: CudaSlice<f32>,
    invstd: CudaSlice<f32>,
    num_batches_tracked: i64,
    channels: usize,
}

impl BnState {
    /// f16 running statistics (O3) cast up into the scratch (`up`) or the
    /// scratch rounded back into them (once per step, as on the CPU).
    fn cast_running(&mut self, gpu: &Gpu, s: [&mut CudaViewMut<'_, f32>; 2], up: bool) -> Result<()> {
        let c = self.channels;
        let [rm, rv] = s;
        for (dev, scratch) in [(&mut self.running_mean, rm), (&mut self.running_var, rv)] {
            if up {
                cast::f16_to_f32(gpu, &view::<f16>(dev, c)?, scratch)?;
            } else {
                cast::f32_to_f16(gpu, &scratch.as_view(), &mut view_mut::<f16>(dev, c)?)?;
            }
        }
        Ok(())
    }
}

impl DeviceLayer for BatchNorm2d {
    type Plan = BatchNormPlan;
    type State = BnState;

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(BatchNormPlan, Needs)> {
        let [c, h, w] = a.chw()?;
        let host = a.host();
        let wt = &host.weights;
        let dt = a.param_dtype(0)?;
        let same = [
            wt.param(1, "batchnorm2d")?.value.dtype(),
            wt.tensor(0, "batchnorm2d")?.dtype(),
            wt.tensor(1, "batchnorm2d")?.dtype(),
        ];
        if same.iter().any(|&d| d != dt) || a.model.param_value(a.node, 0)?.numel() != c {
            return Err(a.bad(format!("needs parameters and running statistics of {c} values of one dtype")));
        }
        let p = BatchNormPlan {
            channels: c,
            hw: h * w,
            sync: host.sync.is_some(),
            param_dtype: dt,
            eps: self.eps,
            momentum: self.momentum,
        };
        let mut s = Scratch::default();
        for len in p.scratch() {
            s.push(DType::F32, len);
        }
        Ok((p, Needs::new().reads_input().scratch(s)))
    }

    fn state(p: &BatchNormPlan, a: &StateArgs<'_>) -> Result<BnState> {
        let (c, dt) = (p.channels, p.param_dtype);
        let mut s = BnState {
            running_mean: DevBuf::zeros(a.gpu, dt, c)?,
            running_var: DevBuf::zeros(a.gpu, dt, c)?,
            mean: alloc(a.gpu, c)?,
            invstd: alloc(a.gpu, c)?,
            num_batches_tracked: 0,
            channels: c,
        };
        Self::upload(&mut s, a.gpu, a.node)?;
        Ok(s)
    }

    fn forward<A: Elem>(p: &BatchNormPlan, bn: &mut BnState, f: Forward<'_, A>) -> Result<()> {
        forward_with(p, bn, f, Epilogue::Default)
    }

    /// In its two launches, so that SyncBatchNorm can all-reduce the
    /// per-channel sums between them. The weight and bias gradients are this
    /// rank's (DDP averages them like any other).
    fn backward<A: Elem>(p: &BatchNormPlan, bn: &BnState, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, n, mut params, x, dy, dx, mut ws, hooks, .. } = b;
        let x = read(x, "input")?;
        let (c, dt, shape) = (p.channels, p.param_dtype, [n, p.channels, p.hw, 1]);
        let [mut w32, _, _, _, mut dw32, mut db32, mut sums, _] = ws.take::<f32, 8>(p.scratch())?;
        let (mean, invstd) = (bn.mean.slice(0..c), bn.invstd.slice(0..c));
        let saved = SavedStats { mean: &mean, invstd: &invstd };
        match dt {
            DType::F32 => params.with_grads::<f32, ()>(|g| {
                let (dw, db) = affine(g)?;
                bnk::backward_reduce(
                    gpu,
                    &x,
                    &dy,
                    &shape,
                    saved,
                    &mut sums,
                    BnGrads { dweight: dw, dbias: db },
                )
            })?,
            // f16 .grad (O3): accumulated in f32, rounded once.
            DType::F16 => params.with_grads::<f16, ()>(|g| {
                let (dw, db) = affine(g)?;
                cast::f16_to_f32(gpu, &*dw, &mut dw32)?;
                cast::f16_to_f32(gpu, &*db, &mut db32)?;
                let grads = BnGrads { dweight: &mut dw32, dbias: &mut db32 };
                bnk::backward_reduce(gpu, &x, &dy, &shape, saved, &mut sums, grads)?;
                cast::f32_to_f16(gpu, &dw32, dw)?;
                cast::f32_to_f16(gpu, &db32, db)
            })?,
        }
        let Some(mut dx) = dx else { return Ok(()) };
        let count = if p.sync {
            hooks.all_reduce_sum(&mut sums, "SyncBatchNorm backward")?;
            hooks.world_size() * n * p.hw
        } else {
            n * p.hw
        };
        let w = f32_param(gpu, &params, &mut w32, 0, dt)?;
        let reduced = bnk::ReducedSums { sums: &sums.as_view(), count };
        bnk::backward_dx(gpu, &x, &dy, &shape, saved, &w, reduced, &mut dx)
    }

    /// The host's shapes and dtypes are the plan's: `GpuModel` checks the
    /// parameters, whose shape and dtype the running statistics share.
    fn upload(s: &mut BnState, gpu: &Gpu, node: &Node) -> Result<()> {
        let (rm, rv, count) = running_stats(&node.weights)?;
        s.running_mean.write_f32(gpu, 0, &rm.to_f32_vec())?;
        s.running_var.write_f32(gpu, 0, &rv.to_f32_vec())?;
        s.num_batches_tracked = count;
        Ok(())
    }

    fn download(s: &BnState, gpu: &Gpu, node: &mut Node) -> Result<()> {
        let p = parts(&mut node.weights)?;
        p.running_mean.copy_from_f32(&s.running_mean.read_f32(gpu, 0, s.channels)?)?;
        p.running_var.copy_from_f32(&s.running_var.read_f32(gpu, 0, s.channels)?)?;
        *p.num_batches_tracked = s.num_batches_tracked;
        Ok(())
    }

    /// running_mean and running_var: rank 0's go to every rank each step
    /// without SyncBatchNorm (DDP's broadcast_buffers).
    fn buffers_mut(s: &mut BnState) -> Vec<&mut DevBuf> {
        vec![&mut s.running_mean, &mut s.running_var]
    }
}

/// The forward, with `epilogue` applied to each output (the fused groups
/// of `nn/cuda/fused/`).
pub(crate) fn forward_with<A: Elem>(
    p: &BatchNormPlan,
    bn: &mut BnState,
    f: Forward<'_, A>,
    epilogue: Epilogue<'_, '_, A>,
) -> Result<()> {
    let Forward { gpu, n, train, params, x, mut y, mut ws, hooks, .. } = f;
    let (c, dt, shape) = (p.channels, p.param_dtype, [n, p.channels, p.hw, 1]);
    let [mut w32, mut b32, mut rm32, mut rv32, _, _, _, mut totals] = ws.take::<f32, 8>(p.scratch())?;
    let half = dt == DType::F16;
    if half {
        bn.cast_running(gpu, [&mut rm32, &mut rv32], true)?;
    }
    let w = f32_param(gpu, &params, &mut w32, 0, dt)?;
    let b = f32_param(gpu, &params, &mut b32, 1, dt)?;
    let bnp = BnParams { weight: &w, bias: &b };
    if !train {
        let (rm, rv) = match dt {
            DType::F16 => (rm32.as_view(), rv32.as_view()),
            DType::F32 => (view::<f32>(&bn.running_mean, c)?, view::<f32>(&bn.running_var, c)?),
        };
        let running = RunningStats { running_mean: &rm, running_var: &rv };
        return bnk::forward_eval(gpu, &x, &shape, bnp, running, p.eps, &mut y, epilogue);
    }
    {
        let BnState { running_mean: drm, running_var: drv, mean, invstd, .. } = &mut *bn;
        let (mut rm, mut rv) = if half {
            (rm32.slice_mut(..), rv32.slice_mut(..))
        } else {
            (view_mut::<f32>(drm, c)?, view_mut::<f32>(drv, c)?)
        };
        let (mut mean, mut invstd) = (mean.slice_mut(0..c), invstd.slice_mut(0..c));
        let running = RunningStats { running_mean: &mut rm, running_var: &mut rv };
        let hyper = BnHyper { momentum: p.momentum, eps: p.eps };
        if p.sync {
            bnk::local_sums(gpu, &x, &shape, &mut totals)?;
            hooks.all_reduce_sum(&mut totals, "SyncBatchNorm forward")?;
            let saved = SavedStats { mean: &mut mean, invstd: &mut invstd };
            bnk::sync_stats(gpu, &totals.as_view(), c, hyper, saved, running)?;
            let saved = SavedStats { mean: &mean.as_view(), invstd: &invstd.as_view() };
            bnk::forward_apply(gpu, &x, &shape, saved, bnp, &mut y, epilogue)?;
        } else {
            let saved = SavedStats { mean: &mut mean, invstd: &mut invstd };
            bnk::forward_train(gpu, &x, &shape, bnp, running, hyper, &mut y, saved, epilogue)?;
        }
    }
    if half {
        bn.cast_running(gpu, [&mut rm32, &mut rv32], false)?;
    }
    bn.num_batches_tracked += 1;
    Ok(())
}

/// BatchNorm's weight and bias gradients (it always has both).
fn affine<'s, 'v, G>(g: Grads<'s, 'v, G>) -> Result<(&'s mut CudaViewMut<'v, G>, &'s mut CudaViewMut<'v, G>)> {
    match g {
        (dw, Some(db)) => Ok((dw, db)),
        (_, None) => Err(internal("a BatchNorm2d without a bias")),
    }
}
