//! One layer of [`super::model::GpuModel`], forward and backward: the
//! device twins of `Layer::forward_train` / `forward_eval` / `backward` in
//! src/nn/mod.rs, over preallocated buffers, with the same amp behaviour:
//! O1's conv and linear cast their input and weights to f16 per call and
//! add their f16 gradients into the f32 `.grad`; BatchNorm with f16
//! parameters (O3) runs on f32 copies and rounds its running statistics and
//! gradients back once, as `forward_widened` / `backward_widened` do.

use super::acts::Acts;
use super::model::{BnScratch, Elem, HalfScratch, TrainHooks};
use super::params::{DevBuf, DevElem, DeviceParams};
use super::plan::{LayerPlan, Step};
use crate::cuda::blas::Blas;
use crate::cuda::{cast, Gpu};
use crate::error::{Error, Result};
use crate::nn::layers::batchnorm2d::{parts, BatchNorm2d};
use crate::nn::layers::{BufferValue, LayerKind};
use crate::nn::Node;
use crate::ops::add::cuda as addk;
use crate::ops::avg_pool2d::cuda as avgk;
use crate::ops::batch_norm::cuda as bnk;
use crate::ops::batch_norm::{BnGrads, BnHyper, BnParams, RunningStats, SavedStats};
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::cuda as convk;
use crate::ops::dropout::{cuda as dropk, Mask};
use crate::ops::linear::cuda as lin;
use crate::ops::max_pool2d::cuda as pool;
use crate::ops::relu::cuda as relu;
use crate::rng::Draws;
use crate::tensor::DType;
use crate::tensor::Tensor;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;

pub(super) fn internal(msg: impl std::fmt::Display) -> Error {
    Error::internal(format!("device model: {msg}"))
}

/// What the layers of one step share: the device, cuBLAS, the parameters
/// and the scratch buffers.
pub(super) struct Ctx<'a> {
    pub gpu: &'a Gpu,
    /// The micro-batch's random draws (dropout).
    pub draws: Draws,
    pub blas: &'a Blas,
    pub params: &'a mut DeviceParams,
    /// O1: conv and linear compute in f16 on f32 activations.
    pub o1: bool,
    pub col: &'a mut DevBuf,
    pub dy_t: &'a mut DevBuf,
    pub bn: &'a mut BnScratch,
    pub half: Option<&'a mut HalfScratch>,
    pub tf: &'a mut super::transformer::TransformerScratch,
}

/// What a layer keeps between its forward and its backward.
pub(super) enum LayerState {
    None,
    BatchNorm(Box<BnState>),
    /// The flat index of each output's maximum within its plane.
    MaxPool(CudaSlice<u32>),
    /// O1: the layer's input cast to f16, which its backward reads.
    HalfInput(CudaSlice<f16>),
    LayerNorm(Box<super::transformer::LnState>),
    /// The attention matrix (softmax), in the activation dtype.
    Attention(DevBuf),
}

/// A BatchNorm's buffers: running statistics in the parameters' dtype,
/// the batch mean and invstd of the last training forward, and the
/// num_batches_tracked counter (host-side: nothing on the device reads it).
pub(super) struct BnState {
    running_mean: DevBuf,
    running_var: DevBuf,
    mean: CudaSlice<f32>,
    invstd: CudaSlice<f32>,
    num_batches_tracked: i64,
    eps: f32,
    momentum: f32,
    channels: usize,
}

/// The BatchNorm2d of `node`, or an internal error.
fn batchnorm(node: &Node) -> Result<&BatchNorm2d> {
    match &node.kind {
        LayerKind::BatchNorm2d(bn) => Ok(bn),
        other => Err(internal(format!("{} holds no BatchNorm statistics", other.type_name()))),
    }
}

impl BnState {
    pub fn new(gpu: &Gpu, node: &Node, channels: usize) -> Result<BnState> {
        let bn = batchnorm(node)?;
        let dt = node.weights.tensor(0, "batchnorm2d")?.dtype();
        let alloc = |e| Error::cuda("allocating BatchNorm statistics", e);
        let mut s = BnState {
            running_mean: DevBuf::zeros(gpu, dt, channels)?,
            running_var: DevBuf::zeros(gpu, dt, channels)?,
            mean: gpu.stream().alloc_zeros(channels.max(1)).map_err(alloc)?,
            invstd: gpu.stream().alloc_zeros(channels.max(1)).map_err(alloc)?,
            num_batches_tracked: 0,
            eps: bn.eps,
            momentum: bn.momentum,
            channels,
        };
        s.upload(gpu, node)?;
        Ok(s)
    }

    fn check(&self, running: [&Tensor; 2]) -> Result<()> {
        for t in running {
            if t.dtype() != self.running_mean.dtype() || t.numel() != self.channels {
                return Err(internal(format!(
                    "BatchNorm running statistics {:?} {:?} do not match the device's {} {:?}",
                    t.shape(),
                    t.dtype(),
                    self.channels,
                    self.running_mean.dtype()
                )));
            }
        }
        Ok(())
    }

    pub fn upload(&mut self, gpu: &Gpu, node: &Node) -> Result<()> {
        let bn = batchnorm(node)?;
        let w = &node.weights;
        let (rm, rv) = (w.tensor(0, "batchnorm2d")?, w.tensor(1, "batchnorm2d")?);
        self.check([rm, rv])?;
        self.running_mean.write_f32(gpu, 0, &rm.to_f32_vec())?;
        self.running_var.write_f32(gpu, 0, &rv.to_f32_vec())?;
        let count = match w.buffers.get(2).map(|b| &b.value) {
            Some(BufferValue::Count(c)) => *c,
            _ => return Err(internal("BatchNorm without num_batches_tracked")),
        };
        (self.num_batches_tracked, self.eps, self.momentum) = (count, bn.eps, bn.momentum);
        Ok(())
    }

    /// running_mean and running_var (rank 0's go to every rank each step
    /// without SyncBatchNorm: DDP's broadcast_buffers).
    pub fn running_mut(&mut self) -> [&mut DevBuf; 2] {
        [&mut self.running_mean, &mut self.running_var]
    }

    pub fn download(&self, gpu: &Gpu, node: &mut Node) -> Result<()> {
        let p = parts(&mut node.weights)?;
        self.check([&*p.running_mean, &*p.running_var])?;
        p.running_mean.copy_from_f32(&self.running_mean.read_f32(gpu, 0, self.channels)?)?;
        p.running_var.copy_from_f32(&self.running_var.read_f32(gpu, 0, self.channels)?)?;
        *p.num_batches_tracked = self.num_batches_tracked;
        Ok(())
    }
}

/// The first `len` values of a typed scratch buffer.
pub(super) fn slice<T>(s: &CudaSlice<T>, len: usize) -> Result<CudaView<'_, T>> {
    let have = s.len();
    s.try_slice(0..len).ok_or_else(|| internal(format!("{len} values asked of a buffer of {have}")))
}

pub(super) fn slice_mut<T>(s: &mut CudaSlice<T>, len: usize) -> Result<CudaViewMut<'_, T>> {
    let have = s.len();
    s.try_slice_mut(0..len).ok_or_else(|| internal(format!("{len} values asked of a buffer of {have}")))
}

fn typed<T: DevElem>(b: &DevBuf) -> Result<&CudaSlice<T>> {
    T::of(b).ok_or_else(|| internal(format!("a {:?} buffer used as {:?}", b.dtype(), T::DTYPE)))
}

fn typed_mut<T: DevElem>(b: &mut DevBuf) -> Result<&mut CudaSlice<T>> {
    let dt = b.dtype();
    T::of_mut(b).ok_or_else(|| internal(format!("a {dt:?} buffer used as {:?}", T::DTYPE)))
}

/// The first `len` values of a buffer, as `T`.
pub(super) fn view<T: DevElem>(b: &DevBuf, len: usize) -> Result<CudaView<'_, T>> {
    slice(typed(b)?, len)
}

pub(super) fn view_mut<T: DevElem>(b: &mut DevBuf, len: usize) -> Result<CudaViewMut<'_, T>> {
    slice_mut(typed_mut(b)?, len)
}

/// The whole of a scratch buffer (the launchers take a larger one).
pub(super) fn whole_mut<T: DevElem>(b: &mut DevBuf) -> Result<CudaViewMut<'_, T>> {
    Ok(typed_mut::<T>(b)?.as_view_mut())
}

/// A layer's input (read) and output (written) activations.
pub(super) fn io<'b, T: DevElem>(
    acts: &'b mut Acts<'_>,
    lp: &LayerPlan,
    n: usize,
) -> Result<(CudaView<'b, T>, CudaViewMut<'b, T>)> {
    let (x, y) = acts.read_write(lp.src, lp.dst)?;
    Ok((view(x, n * lp.in_numel)?, view_mut(y, n * lp.out_numel)?))
}

/// `(dw, db)` out of the one or two gradients `with_params` hands over.
#[allow(clippy::type_complexity)]
pub(super) fn weight_and_bias<'s, 'v, G>(
    gs: &'s mut [CudaViewMut<'v, G>],
) -> Result<(&'s mut CudaViewMut<'v, G>, Option<&'s mut CudaViewMut<'v, G>>)> {
    match gs {
        [w] => Ok((w, None)),
        [w, b] => Ok((w, Some(b))),
        _ => Err(internal(format!("{} gradients for a weight and a bias", gs.len()))),
    }
}

pub(super) fn ids(weight: usize, bias: Option<usize>) -> Vec<usize> {
    std::iter::once(weight).chain(bias).collect()
}

/// Forward of one layer over `n` images, training mode when `train`
/// (batch statistics, running statistics moved, SyncBatchNorm through
/// `hooks`), else evaluation mode. Flatten does nothing: its output is its
/// input buffer.
pub(super) fn forward<A: Elem>(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    state: &mut LayerState,
    acts: &mut Acts<'_>,
    n: usize,
    train: bool,
    hooks: &mut dyn TrainHooks,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    match (&lp.step, state) {
        (Step::Flatten, _) => Ok(()),
        (
            Step::Embedding { .. } | Step::LayerNorm { .. } | Step::Gelu { .. } | Step::Attention { .. },
            state,
        ) => super::transformer::forward::<A>(ctx, lp, state, acts, n, train),
        (Step::Conv { .. } | Step::Linear { .. }, LayerState::HalfInput(x16)) if ctx.o1 => {
            super::half::forward(ctx, lp, x16, acts, n)
        }
        (&Step::Conv { geom, weight, bias }, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            let w = ctx.params.value::<A>(weight)?;
            let b = bias.map(|b| ctx.params.value::<A>(b)).transpose()?;
            let g = ConvGeom { n, ..geom };
            convk::forward(gpu, blas, &g, &x, &w, b.as_ref(), &mut whole_mut::<A>(ctx.col)?, &mut y)
        }
        (&Step::Linear { in_features, out_features, rows, weight, bias }, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            let w = ctx.params.value::<A>(weight)?;
            let b = bias.map(|b| ctx.params.value::<A>(b)).transpose()?;
            lin::forward(gpu, blas, n * rows, in_features, out_features, &x, &w, b.as_ref(), &mut y)
        }
        (Step::Relu, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            relu::forward(gpu, &x, &mut y)
        }
        (&Step::AvgPool { shape: [c, h, w], args }, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            avgk::forward(gpu, &x, [n, c, h, w], args, &mut y)
        }
        (&Step::Dropout { p, node }, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            if train {
                dropk::apply(gpu, &Mask::new(p, ctx.draws.node(node)), &x, &mut y)
            } else {
                gpu.stream()
                    .memcpy_dtod(&x, &mut y)
                    .map_err(|e| Error::cuda(format!("dropout {} (eval)", lp.name), e))
            }
        }
        // ((x0 + x1) + x2) + ...: each partial sum rounded to the storage
        // dtype, as the CPU's chain of adds rounds it.
        (Step::Add, _) => {
            let (xs, y) = acts.reads_write(&lp.srcs, lp.dst)?;
            let Some((&[a, b], rest)) = xs.split_at_checked(2) else {
                return Err(internal(format!("add {} reads {:?}", lp.name, lp.srcs)));
            };
            let len = n * lp.out_numel;
            let mut y = view_mut::<A>(y, len)?;
            addk::forward(gpu, &view::<A>(a, len)?, &view::<A>(b, len)?, &mut y)?;
            for &c in rest {
                addk::accumulate(gpu, &mut y, &view::<A>(c, len)?)?;
            }
            Ok(())
        }
        (&Step::MaxPool { shape: [c, h, w], kernel, stride }, state) => {
            let LayerState::MaxPool(indices) = state else { return Err(no_state(lp)) };
            let (x, mut y) = io::<A>(acts, lp, n)?;
            let mut indices = slice_mut(indices, n * lp.out_numel)?;
            pool::forward(gpu, &x, [n, c, h, w], kernel, stride, &mut y, &mut indices).map(|_| ())
        }
        (Step::BatchNorm { .. }, state) => {
            let LayerState::BatchNorm(bn) = state else { return Err(no_state(lp)) };
            let (x, mut y) = io::<A>(acts, lp, n)?;
            if train {
                bn_forward_train(ctx, &lp.step, bn, &x, &mut y, n, hooks)
            } else {
                bn_forward_eval(ctx, &lp.step, bn, &x, &mut y, n)
            }
        }
    }
}

/// A layer whose state is not the kind its step keeps (a plan and a state
/// list out of step with each other).
pub(super) fn no_state(lp: &LayerPlan) -> Error {
    internal(format!("layer {} ({:?}) has no state of its kind", lp.name, lp.step))
}

/// Backward of one layer: parameter gradients accumulated into `.grad`,
/// and dx into `gx` when `need_dx`, from dy in `gy`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<A: Elem>(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    state: &LayerState,
    acts: &Acts<'_>,
    (gy, gx): (&DevBuf, &mut DevBuf),
    n: usize,
    need_dx: bool,
    hooks: &mut dyn TrainHooks,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    let (in_len, out_len) = (n * lp.in_numel, n * lp.out_numel);
    if let (Step::Conv { .. } | Step::Linear { .. }, LayerState::HalfInput(x16), true) =
        (&lp.step, state, ctx.o1)
    {
        return super::half::backward(ctx, lp, x16, (gy, gx), n, need_dx);
    }
    let dy = view::<A>(gy, out_len)?;
    let mut dx = if need_dx { Some(view_mut::<A>(gx, in_len)?) } else { None };
    if let Step::Embedding { .. } | Step::LayerNorm { .. } | Step::Gelu { .. } | Step::Attention { .. } =
        lp.step
    {
        return super::transformer::backward::<A>(ctx, lp, state, acts, &dy, dx.as_mut(), n);
    }
    let x = view::<A>(acts.get(lp.src)?, in_len)?;
    match (&lp.step, state) {
        (&Step::Conv { geom, weight, bias }, _) => {
            let g = ConvGeom { n, ..geom };
            let (col, dy_t) = (&mut *ctx.col, &mut *ctx.dy_t);
            ctx.params.with_params::<A, A, ()>(&[weight], &ids(weight, bias), |w, gs| {
                let (dw, db) = weight_and_bias(gs)?;
                let (mut col, mut dy_t) = (whole_mut::<A>(col)?, whole_mut::<A>(dy_t)?);
                convk::backward(gpu, blas, &g, &x, &w[0], &dy, &mut col, &mut dy_t, dw, db, dx.as_mut())
            })
        }
        (&Step::Linear { in_features, out_features, rows, weight, bias }, _) => {
            ctx.params.with_params::<A, A, ()>(&[weight], &ids(weight, bias), |w, gs| {
                let (dw, db) = weight_and_bias(gs)?;
                let (x, w, dx) = (&x, &w[0], dx.as_mut());
                lin::backward(gpu, blas, n * rows, in_features, out_features, x, w, &dy, dw, db, dx)
            })
        }
        (Step::Relu, _) => {
            let y = view::<A>(acts.get(lp.dst)?, out_len)?;
            let dx = dx.as_mut().ok_or_else(|| internal("ReLU backward without dx"))?;
            relu::backward(gpu, &y, &dy, dx)
        }
        (&Step::MaxPool { shape: [c, h, w], kernel, stride }, state) => {
            let LayerState::MaxPool(indices) = state else { return Err(no_state(lp)) };
            let indices = slice(indices, out_len)?;
            let dx = dx.as_mut().ok_or_else(|| internal("max_pool backward without dx"))?;
            pool::backward(gpu, &dy, &indices, [n, c, h, w], kernel, stride, dx)
        }
        (Step::BatchNorm { .. }, state) => {
            let LayerState::BatchNorm(bn) = state else { return Err(no_state(lp)) };
            bn_backward(ctx, &lp.step, bn, &x, &dy, dx.as_mut(), n, hooks)
        }
        (&Step::AvgPool { shape: [c, h, w], args }, _) => {
            let dx = dx.as_mut().ok_or_else(|| internal("avg_pool backward without dx"))?;
            avgk::backward(gpu, &dy, [n, c, h, w], args, dx)
        }
        (&Step::Dropout { p, node }, _) => {
            let dx = dx.as_mut().ok_or_else(|| internal("dropout backward without dx"))?;
            dropk::apply(gpu, &Mask::new(p, ctx.draws.node(node)), &dy, dx)
        }
        (Step::Add | Step::Flatten, _) => {
            Err(internal(format!("{}: its gradients are routed by the model", lp.name)))
        }
        (Step::Embedding { .. } | Step::LayerNorm { .. } | Step::Gelu { .. } | Step::Attention { .. }, _) => {
            Err(internal(format!("{}: a transformer layer's backward", lp.name)))
        }
    }
}

/// Normalization parameter `i` as the f32 view the launchers take: the
/// value itself, or (f16 parameters: BatchNorm's O3, LayerNorm's O2) its
/// copy cast up into `scratch`.
pub(super) fn f32_param<'b>(
    gpu: &Gpu,
    params: &'b DeviceParams,
    scratch: &'b mut CudaSlice<f32>,
    i: usize,
    c: usize,
    dt: DType,
) -> Result<CudaView<'b, f32>> {
    match dt {
        DType::F32 => params.value::<f32>(i),
        DType::F16 => {
            cast::f16_to_f32(gpu, &params.value::<f16>(i)?, &mut slice_mut(scratch, c)?)?;
            let scratch: &'b CudaSlice<f32> = scratch;
            slice(scratch, c)
        }
    }
}

/// `(channels, hw, weight, bias, sync, param_dtype)` of a BatchNorm step.
fn bn_step(step: &Step) -> Result<(usize, usize, usize, usize, bool, DType)> {
    match *step {
        Step::BatchNorm { channels, hw, weight, bias, sync, param_dtype } => {
            Ok((channels, hw, weight, bias, sync, param_dtype))
        }
        ref other => Err(internal(format!("{other:?} run as a BatchNorm"))),
    }
}

/// f16 running statistics (O3) cast up into the scratch (`up`) or the
/// scratch rounded back into them (once per step, as on the CPU).
fn bn_running_cast(gpu: &Gpu, bn: &mut BnState, s: &mut BnScratch, up: bool) -> Result<()> {
    let c = bn.channels;
    for (dev, scratch) in
        [(&mut bn.running_mean, &mut s.running_mean), (&mut bn.running_var, &mut s.running_var)]
    {
        if up {
            cast::f16_to_f32(gpu, &view::<f16>(dev, c)?, &mut slice_mut(scratch, c)?)?;
        } else {
            cast::f32_to_f16(gpu, &slice(scratch, c)?, &mut view_mut::<f16>(dev, c)?)?;
        }
    }
    Ok(())
}

fn bn_forward_train<A: Elem>(
    ctx: &mut Ctx<'_>,
    step: &Step,
    bn: &mut BnState,
    x: &CudaView<'_, A>,
    y: &mut CudaViewMut<'_, A>,
    n: usize,
    hooks: &mut dyn TrainHooks,
) -> Result<()> {
    let (c, hw, wi, bi, sync, dt) = bn_step(step)?;
    let (gpu, shape) = (ctx.gpu, [n, c, hw, 1]);
    let s = &mut *ctx.bn;
    let half = dt == DType::F16;
    if half {
        bn_running_cast(gpu, bn, s, true)?;
    }
    {
        let BnScratch { weight, bias, running_mean, running_var, totals, .. } = &mut *s;
        let w = f32_param(gpu, ctx.params, weight, wi, c, dt)?;
        let b = f32_param(gpu, ctx.params, bias, bi, c, dt)?;
        let BnState { running_mean: drm, running_var: drv, mean, invstd, eps, momentum, .. } = &mut *bn;
        let (mut rm, mut rv) = if half {
            (slice_mut(running_mean, c)?, slice_mut(running_var, c)?)
        } else {
            (view_mut::<f32>(drm, c)?, view_mut::<f32>(drv, c)?)
        };
        let (mut mean, mut invstd) = (slice_mut(mean, c)?, slice_mut(invstd, c)?);
        let params = BnParams { weight: &w, bias: &b };
        let running = RunningStats { running_mean: &mut rm, running_var: &mut rv };
        let hyper = BnHyper { momentum: *momentum, eps: *eps };
        if sync {
            let mut totals = slice_mut(totals, 1 + 2 * c)?;
            bnk::local_sums(gpu, x, &shape, &mut totals)?;
            hooks.all_reduce_sum(&mut totals, "SyncBatchNorm forward")?;
            let saved = SavedStats { mean: &mut mean, invstd: &mut invstd };
            bnk::sync_stats(gpu, &totals.as_view(), c, hyper, saved, running)?;
            let saved = SavedStats { mean: &mean.as_view(), invstd: &invstd.as_view() };
            bnk::forward_apply(gpu, x, &shape, saved, params, y)?;
        } else {
            let saved = SavedStats { mean: &mut mean, invstd: &mut invstd };
            bnk::forward_train(gpu, x, &shape, params, running, hyper, y, saved)?;
        }
    }
    if half {
        bn_running_cast(gpu, bn, s, false)?;
    }
    bn.num_batches_tracked += 1;
    Ok(())
}

fn bn_forward_eval<A: Elem>(
    ctx: &mut Ctx<'_>,
    step: &Step,
    bn: &mut BnState,
    x: &CudaView<'_, A>,
    y: &mut CudaViewMut<'_, A>,
    n: usize,
) -> Result<()> {
    let (c, hw, wi, bi, _, dt) = bn_step(step)?;
    let (gpu, shape) = (ctx.gpu, [n, c, hw, 1]);
    let s = &mut *ctx.bn;
    if dt == DType::F16 {
        bn_running_cast(gpu, bn, s, true)?;
    }
    let BnScratch { weight, bias, running_mean, running_var, .. } = s;
    let w = f32_param(gpu, ctx.params, weight, wi, c, dt)?;
    let b = f32_param(gpu, ctx.params, bias, bi, c, dt)?;
    let (rm, rv) = match dt {
        DType::F16 => (slice(running_mean, c)?, slice(running_var, c)?),
        DType::F32 => (view::<f32>(&bn.running_mean, c)?, view::<f32>(&bn.running_var, c)?),
    };
    let params = BnParams { weight: &w, bias: &b };
    bnk::forward_eval(gpu, x, &shape, params, RunningStats { running_mean: &rm, running_var: &rv }, bn.eps, y)
}

/// BatchNorm backward in its two launches, so that SyncBatchNorm can
/// all-reduce the per-channel sums between them. The weight and bias
/// gradients are this rank's (DDP averages them like any other).
#[allow(clippy::too_many_arguments)]
fn bn_backward<A: Elem>(
    ctx: &mut Ctx<'_>,
    step: &Step,
    bn: &BnState,
    x: &CudaView<'_, A>,
    dy: &CudaView<'_, A>,
    dx: Option<&mut CudaViewMut<'_, A>>,
    n: usize,
    hooks: &mut dyn TrainHooks,
) -> Result<()> {
    let (c, hw, wi, bi, sync, dt) = bn_step(step)?;
    let (gpu, shape) = (ctx.gpu, [n, c, hw, 1]);
    let BnScratch { weight, dweight, dbias, sums, .. } = &mut *ctx.bn;
    let (mean, invstd) = (slice(&bn.mean, c)?, slice(&bn.invstd, c)?);
    let saved = SavedStats { mean: &mean, invstd: &invstd };
    let mut sums = slice_mut(sums, 2 * c)?;
    match dt {
        DType::F32 => ctx.params.with_grads::<f32, ()>(&[wi, bi], |g| {
            let [dw, db] = g else { return Err(internal("BatchNorm gradients")) };
            bnk::backward_reduce(gpu, x, dy, &shape, saved, &mut sums, BnGrads { dweight: dw, dbias: db })
        })?,
        // f16 .grad (O3): accumulated in f32, rounded once.
        DType::F16 => ctx.params.with_grads::<f16, ()>(&[wi, bi], |g| {
            let [dw, db] = g else { return Err(internal("BatchNorm gradients")) };
            let (mut dw32, mut db32) = (slice_mut(dweight, c)?, slice_mut(dbias, c)?);
            cast::f16_to_f32(gpu, &*dw, &mut dw32)?;
            cast::f16_to_f32(gpu, &*db, &mut db32)?;
            let grads = BnGrads { dweight: &mut dw32, dbias: &mut db32 };
            bnk::backward_reduce(gpu, x, dy, &shape, saved, &mut sums, grads)?;
            cast::f32_to_f16(gpu, &dw32, dw)?;
            cast::f32_to_f16(gpu, &db32, db)
        })?,
    }
    let Some(dx) = dx else { return Ok(()) };
    let count = if sync {
        hooks.all_reduce_sum(&mut sums, "SyncBatchNorm backward")?;
        hooks.world_size() * n * hw
    } else {
        n * hw
    };
    let w = f32_param(gpu, ctx.params, weight, wi, c, dt)?;
    let reduced = bnk::ReducedSums { sums: &sums.as_view(), count };
    bnk::backward_dx(gpu, x, dy, &shape, saved, &w, reduced, dx)
}
