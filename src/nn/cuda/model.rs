//! [`GpuModel`]: the host [`Model`] on the device. Every buffer a step needs
//! for batches of up to `max_batch` is allocated once, in [`GpuModel::new`]
//! (sizes from [`Plan`]); a training step is launches on the compute stream
//! only, with no host synchronization, and the DDP and SyncBatchNorm
//! communication goes through [`TrainHooks`].

use super::acts::Acts;
use super::layers::{self, Ctx, LayerState};
use super::params::{DevBuf, DevElem, DeviceParams};
use super::plan::{activation_dtype, Plan, Step};
use super::transformer::{LnState, TransformerScratch};
use crate::cuda::blas::{Blas, BlasElem};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::nn::layers::LayerKind;
use crate::nn::Model;
use crate::ops::add::cuda as addk;
use crate::ops::cross_entropy::cuda::{self as xent, CrossEntropyTotals};
use crate::rng::Draws;
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;
use std::sync::Arc;

/// An activation element type: f32 or f16.
pub trait Elem: DevElem + BlasElem {}
impl Elem for f32 {}
impl Elem for f16 {}

/// What a training step asks of its surroundings (DDP, SyncBatchNorm).
pub trait TrainHooks {
    /// The layers whose parameters are `ready` (registration indices) have
    /// launched every kernel writing their gradients: DDP may start the
    /// all-reduce of a bucket they complete.
    fn grads_ready(&mut self, params: &mut DeviceParams, ready: &[usize]) -> Result<()>;
    /// Sum `buf` over all ranks in place, in compute-stream order (SyncBatchNorm).
    fn all_reduce_sum(&mut self, buf: &mut CudaViewMut<'_, f32>, what: &str) -> Result<()>;
    /// Ranks the SyncBatchNorm statistics cover. Every rank's micro-batch has
    /// the same size (DistributedSampler pads the dataset to a multiple of
    /// the world size), so the global element count per channel is
    /// `world_size * n * H * W`, known on the host without reading back the
    /// all-reduced count.
    fn world_size(&self) -> usize;
}

/// World size 1: nothing to reduce (all_reduce_sum leaves buf as is).
pub struct LocalHooks;

impl TrainHooks for LocalHooks {
    fn grads_ready(&mut self, _params: &mut DeviceParams, _ready: &[usize]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum(&mut self, _buf: &mut CudaViewMut<'_, f32>, _what: &str) -> Result<()> {
        Ok(())
    }
    fn world_size(&self) -> usize {
        1
    }
}

/// f32 scratch for BatchNorm, sized for the most channels: f16 parameters
/// and running statistics cast up (O3), f32 gradients accumulated before
/// the one rounding into the f16 `.grad`, and the reduction buffers.
pub(super) struct BnScratch {
    pub weight: CudaSlice<f32>,
    pub bias: CudaSlice<f32>,
    pub running_mean: CudaSlice<f32>,
    pub running_var: CudaSlice<f32>,
    pub dweight: CudaSlice<f32>,
    pub dbias: CudaSlice<f32>,
    /// `[sum dy, sum dy*xhat]`, 2c (backward).
    pub sums: CudaSlice<f32>,
    /// `[count, sum, sumsq]`, 1 + 2c (SyncBatchNorm forward).
    pub totals: CudaSlice<f32>,
}

/// O1's f16 scratch: conv/linear weights and biases cast per call, their
/// f16 gradients before they are added into the f32 `.grad`, and the f16
/// output, dy and dx of one layer.
pub(super) struct HalfScratch {
    pub weight: CudaSlice<f16>,
    pub bias: CudaSlice<f16>,
    pub dweight: CudaSlice<f16>,
    pub dbias: CudaSlice<f16>,
    pub y: CudaSlice<f16>,
    pub dy: CudaSlice<f16>,
    pub dx: CudaSlice<f16>,
}

pub struct GpuModel {
    pub params: DeviceParams,
    /// The key of the training forward's random draws, as the host
    /// model's [`Model::draws`]: the engine sets the micro-batch before
    /// each [`GpuModel::train_batch`].
    pub draws: Draws,
    gpu: Arc<Gpu>,
    blas: Blas,
    plan: Plan,
    /// The dtype of every activation and activation gradient.
    act: DType,
    /// O1: conv and linear compute in f16 on f32 activations.
    o1: bool,
    states: Vec<LayerState>,
    /// Activation buffers (`plan.buffers`; `plan.storage` says which holds
    /// each activation, the input in 0), in `act`.
    acts: Vec<DevBuf>,
    /// The gradient buffers (`plan.grad_buffer` says which holds the
    /// gradient of each activation), in `act`.
    grads: Vec<DevBuf>,
    /// A dx on its way into the gradient of a value with several readers
    /// (one element when no value has several).
    dx_scratch: DevBuf,
    /// Conv's im2col and swapped-dy scratch, in the conv compute dtype.
    col: DevBuf,
    dy_t: DevBuf,
    bn: BnScratch,
    half: Option<HalfScratch>,
    tf: TransformerScratch,
}

pub(super) fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> Result<CudaSlice<T>> {
    gpu.stream().alloc_zeros(n.max(1)).map_err(|e| Error::cuda(format!("allocating {n} device values"), e))
}

impl GpuModel {
    /// Device copy of `host` (already cast by amp, so each param's dtype and
    /// `host.precision` say the opt level). Every buffer for batches of up
    /// to `max_batch` is allocated here, once.
    pub fn new(
        gpu: Arc<Gpu>,
        host: &Model,
        max_batch: usize,
        first_bucket_bytes: usize,
        bucket_cap_bytes: usize,
        allow_tf32: bool,
    ) -> Result<Self> {
        let act = activation_dtype(host)?;
        let o1 = host.precision.patch_conv_linear.is_some();
        let plan = Plan::new(host, max_batch)?;
        let compute = if o1 { DType::F16 } else { act };
        let blas = Blas::new(&gpu, allow_tf32)?;
        let params = DeviceParams::new(&gpu, host, first_bucket_bytes, bucket_cap_bytes)?;
        let g = &*gpu;
        let acts =
            plan.buffers.iter().map(|&k| DevBuf::zeros(g, act, k * max_batch)).collect::<Result<_>>()?;
        let grads = (0..plan.grad_buffers)
            .map(|_| DevBuf::zeros(g, act, plan.grad * max_batch))
            .collect::<Result<_>>()?;
        let dx_scratch = DevBuf::zeros(g, act, if shared_reads(&plan) { plan.grad * max_batch } else { 1 })?;
        let mut states = Vec::with_capacity(plan.layers.len());
        for (lp, layer) in plan.layers.iter().zip(&host.layers) {
            states.push(match &lp.step {
                Step::BatchNorm { channels, .. } => {
                    LayerState::BatchNorm(Box::new(layers::BnState::new(g, layer, *channels)?))
                }
                Step::MaxPool { .. } => LayerState::MaxPool(alloc(g, lp.out_numel * max_batch)?),
                Step::Conv { .. } | Step::Linear { .. } if o1 => {
                    LayerState::HalfInput(alloc(g, lp.in_numel * max_batch)?)
                }
                Step::LayerNorm { c, .. } => {
                    LayerState::LayerNorm(Box::new(LnState::new(g, lp.in_numel / (*c).max(1) * max_batch)?))
                }
                Step::Attention { t, n_head, .. } => {
                    LayerState::Attention(DevBuf::zeros(g, act, n_head * t * t * max_batch)?)
                }
                Step::Conv { .. }
                | Step::Linear { .. }
                | Step::Embedding { .. }
                | Step::Gelu { .. }
                | Step::Relu
                | Step::AvgPool { .. }
                | Step::Flatten
                | Step::Dropout { .. }
                | Step::Add => LayerState::None,
            });
        }
        let c = plan.channels;
        let bn = BnScratch {
            weight: alloc(g, c)?,
            bias: alloc(g, c)?,
            running_mean: alloc(g, c)?,
            running_var: alloc(g, c)?,
            dweight: alloc(g, c)?,
            dbias: alloc(g, c)?,
            sums: alloc(g, 2 * c)?,
            totals: alloc(g, 1 + 2 * c)?,
        };
        let half = if o1 {
            let act_len = plan.grad * max_batch;
            Some(HalfScratch {
                weight: alloc(g, plan.weight)?,
                bias: alloc(g, plan.bias)?,
                dweight: alloc(g, plan.weight)?,
                dbias: alloc(g, plan.bias)?,
                y: alloc(g, act_len)?,
                dy: alloc(g, act_len)?,
                dx: alloc(g, act_len)?,
            })
        } else {
            None
        };
        let tf = TransformerScratch {
            ids: alloc(g, if plan.tokens { plan.acts[0] * max_batch } else { 1 })?,
            ln_workspace: alloc(g, plan.ln_workspace)?,
            att_workspace: DevBuf::zeros(g, act, plan.att * max_batch)?,
        };
        let col = DevBuf::zeros(g, compute, plan.col)?;
        let dy_t = DevBuf::zeros(g, compute, plan.dy_t)?;
        Ok(GpuModel {
            params,
            draws: host.draws,
            gpu,
            blas,
            plan,
            act,
            o1,
            states,
            acts,
            grads,
            dx_scratch,
            col,
            dy_t,
            bn,
            half,
            tf,
        })
    }

    /// Every buffer a DDP replica keeps in step (BatchNorm running statistics).
    pub fn buffers_mut(&mut self) -> Vec<&mut DevBuf> {
        self.states
            .iter_mut()
            .flat_map(|s| match s {
                LayerState::BatchNorm(bn) => bn.running_mut().into_iter().collect(),
                LayerState::None
                | LayerState::MaxPool(_)
                | LayerState::HalfInput(_)
                | LayerState::LayerNorm(_)
                | LayerState::Attention(_) => Vec::new(),
            })
            .collect()
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Parameters and buffers (BatchNorm running statistics and
    /// num_batches_tracked) from `host`.
    pub fn upload(&mut self, host: &Model) -> Result<()> {
        self.check_layers(host)?;
        self.params.upload(&self.gpu, host)?;
        for (state, layer) in self.states.iter_mut().zip(&host.layers) {
            if let LayerState::BatchNorm(s) = state {
                s.upload(&self.gpu, layer)?;
            }
        }
        Ok(())
    }

    /// Parameters and buffers into `host` (waits for the stream).
    pub fn download(&self, host: &mut Model) -> Result<()> {
        self.check_layers(host)?;
        self.params.download(&self.gpu, host)?;
        for (state, layer) in self.states.iter().zip(&mut host.layers) {
            if let LayerState::BatchNorm(s) = state {
                s.download(&self.gpu, layer)?;
            }
        }
        Ok(())
    }

    fn check_layers(&self, host: &Model) -> Result<()> {
        let same = host.layers.len() == self.states.len()
            && host.layers.iter().zip(&self.states).all(|(l, s)| {
                matches!(l.kind, LayerKind::BatchNorm2d(_)) == matches!(s, LayerState::BatchNorm(_))
            });
        if same {
            Ok(())
        } else {
            Err(Error::internal("the host model does not match its device copy's layers"))
        }
    }

    fn check_batch(&self, op: &str, x: usize, labels: usize, n: usize) -> Result<()> {
        if n == 0 || n > self.plan.max_batch {
            return Err(Error::shape(format!(
                "{op}: a batch of {n} images, but the device model holds 1 to {}",
                self.plan.max_batch
            )));
        }
        let (per, positions) = (self.plan.acts[0], self.plan.positions);
        if x != n * per || labels != n * positions {
            return Err(Error::shape(format!(
                "{op}: {x} input values and {labels} labels for {n} samples of {per} values and {positions} labels each"
            )));
        }
        Ok(())
    }

    /// One micro-batch: training-mode forward, softmax cross-entropy with
    /// `grad_scale` (one device f32: the loss scale / accumulation steps)
    /// adding loss sum and hits to `totals`, and backward accumulating into
    /// every parameter's `.grad`, with `hooks.grads_ready` after each layer
    /// with parameters. `x` is f32 `[n, C, H, W]`, `labels` u32 `[n]`.
    pub fn train_batch(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        grad_scale: &CudaView<'_, f32>,
        totals: &mut CrossEntropyTotals,
        hooks: &mut dyn TrainHooks,
    ) -> Result<()> {
        self.check_batch("train_batch", x.len(), labels.len(), n)?;
        match self.act {
            DType::F32 => self.train::<f32>(x, labels, n, grad_scale, totals, hooks),
            DType::F16 => self.train::<f16>(x, labels, n, grad_scale, totals, hooks),
        }
    }

    /// Evaluation-mode forward (running statistics) and the loss sum and
    /// correct count added to `totals`.
    pub fn eval_batch(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        totals: &mut CrossEntropyTotals,
    ) -> Result<()> {
        self.check_batch("eval_batch", x.len(), labels.len(), n)?;
        match self.act {
            DType::F32 => self.eval::<f32>(x, labels, n, totals),
            DType::F16 => self.eval::<f16>(x, labels, n, totals),
        }
    }

    /// Logits of the last batch, widened to f32 (tests; waits for the stream).
    pub fn logits_f32(&self, n: usize) -> Result<Vec<f32>> {
        if n > self.plan.max_batch {
            return Err(Error::shape(format!(
                "logits_f32: {n} rows, but the device model holds at most {}",
                self.plan.max_batch
            )));
        }
        let logits = self.plan.storage.get(self.plan.logits()).and_then(|&b| self.acts.get(b));
        logits.ok_or_else(|| Error::internal("device model: the logits have no buffer"))?.read_f32(
            &self.gpu,
            0,
            n * self.plan.positions * self.plan.classes,
        )
    }

    /// The step's shared context and the buffers the layers read and write.
    #[allow(clippy::type_complexity)]
    fn parts(&mut self) -> (Ctx<'_>, Acts<'_>, Grads<'_>, &mut [LayerState], &Plan) {
        let GpuModel {
            params,
            draws,
            gpu,
            blas,
            plan,
            o1,
            states,
            acts,
            grads,
            dx_scratch,
            col,
            dy_t,
            bn,
            half,
            tf,
            ..
        } = self;
        let ctx = Ctx { gpu, draws: *draws, blas, params, o1: *o1, col, dy_t, bn, half: half.as_mut(), tf };
        let acts = Acts { bufs: acts, storage: &plan.storage };
        (ctx, acts, Grads { bufs: grads, scratch: dx_scratch }, states, &*plan)
    }

    /// The model input: `x` converted to the activation dtype into buffer 0,
    /// and as it is into the token ids a token embedding reads.
    fn load_input(ctx: &mut Ctx<'_>, plan: &Plan, acts: &mut Acts<'_>, x: &CudaView<'_, f32>) -> Result<()> {
        let (gpu, len) = (ctx.gpu, x.len());
        if plan.tokens {
            gpu.stream()
                .memcpy_dtod(x, &mut ctx.tf.ids.slice_mut(0..len))
                .map_err(|e| Error::cuda("copying the token ids", e))?;
        }
        match acts.get_mut(0)? {
            DevBuf::F32(b) => gpu
                .stream()
                .memcpy_dtod(x, &mut b.slice_mut(0..len))
                .map_err(|e| Error::cuda("copying the input batch", e)),
            DevBuf::F16(b) => crate::cuda::cast::f32_to_f16(gpu, x, &mut b.slice_mut(0..len)),
        }
    }

    fn train<A: Elem>(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        grad_scale: &CudaView<'_, f32>,
        totals: &mut CrossEntropyTotals,
        hooks: &mut dyn TrainHooks,
    ) -> Result<()> {
        let (mut ctx, mut acts, grads, states, plan) = self.parts();
        Self::load_input(&mut ctx, plan, &mut acts, x)?;
        for (lp, state) in plan.layers.iter().zip(states.iter_mut()) {
            layers::forward::<A>(&mut ctx, lp, state, &mut acts, n, true, hooks)?;
        }
        let (classes, rows) = (plan.classes, n * plan.positions);
        let Grads { bufs: grads, scratch } = grads;
        let count = grads.len();
        let slot = |b: usize| {
            plan.grad_buffer.get(b).copied().filter(|&s| s < count).ok_or_else(|| {
                Error::internal(format!("device model: activation {b} has no gradient buffer"))
            })
        };
        {
            let logits = layers::view::<A>(acts.get(plan.logits())?, rows * classes)?;
            let mut dlogits = layers::view_mut::<A>(&mut grads[slot(plan.logits())?], rows * classes)?;
            let shape = [rows, classes];
            xent::forward_backward(ctx.gpu, &logits, labels, shape, grad_scale, &mut dlogits, totals)?;
        }
        // Which gradient buffers hold a value's gradient yet: the first dx
        // into a buffer is written (`=`), a later reader's is added (`+=`).
        let mut written = vec![false; plan.acts.len()];
        written[plan.logits()] = true;
        for (lp, state) in plan.layers.iter().zip(states.iter()).rev() {
            let len = n * lp.in_numel;
            match lp.step {
                // dx is dy, in the same buffer.
                Step::Flatten => {}
                Step::Add => {
                    for &s in lp.srcs.iter().filter(|&&s| s > 0) {
                        let (dy, dx) = pair(grads, slot(lp.dst)?, slot(s)?)?;
                        let dy = layers::view::<A>(dy, len)?;
                        let mut dx = layers::view_mut::<A>(dx, len)?;
                        if written[s] {
                            addk::accumulate(ctx.gpu, &mut dx, &dy)?;
                        } else {
                            ctx.gpu
                                .stream()
                                .memcpy_dtod(&dy, &mut dx)
                                .map_err(|e| Error::cuda(format!("add {} backward", lp.name), e))?;
                            written[s] = true;
                        }
                    }
                }
                Step::Conv { .. }
                | Step::Linear { .. }
                | Step::BatchNorm { .. }
                | Step::Relu
                | Step::MaxPool { .. }
                | Step::AvgPool { .. }
                | Step::Dropout { .. }
                | Step::Embedding { .. }
                | Step::LayerNorm { .. }
                | Step::Gelu { .. }
                | Step::Attention { .. } => {
                    // The model input needs no gradient.
                    let need_dx = lp.src > 0;
                    let dst = slot(lp.dst)?;
                    if need_dx && written[lp.src] {
                        let src = slot(lp.src)?;
                        let io = (&grads[dst], &mut *scratch);
                        layers::backward::<A>(&mut ctx, lp, state, &acts, io, n, true, hooks)?;
                        let (from, mut to) =
                            (layers::view::<A>(scratch, len)?, layers::view_mut::<A>(&mut grads[src], len)?);
                        addk::accumulate(ctx.gpu, &mut to, &from)?;
                    } else if need_dx {
                        let io = pair(grads, dst, slot(lp.src)?)?;
                        layers::backward::<A>(&mut ctx, lp, state, &acts, io, n, true, hooks)?;
                        written[lp.src] = true;
                    } else if !lp.params.is_empty() {
                        // No dx: the buffer passed for it is never touched.
                        let io = (&grads[dst], &mut *scratch);
                        layers::backward::<A>(&mut ctx, lp, state, &acts, io, n, false, hooks)?;
                    }
                }
            }
            if !lp.ready.is_empty() {
                hooks.grads_ready(ctx.params, &lp.ready)?;
            }
        }
        Ok(())
    }

    fn eval<A: Elem>(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        n: usize,
        totals: &mut CrossEntropyTotals,
    ) -> Result<()> {
        let (mut ctx, mut acts, _, states, plan) = self.parts();
        Self::load_input(&mut ctx, plan, &mut acts, x)?;
        for (lp, state) in plan.layers.iter().zip(states.iter_mut()) {
            layers::forward::<A>(&mut ctx, lp, state, &mut acts, n, false, &mut LocalHooks)?;
        }
        let rows = n * plan.positions;
        let logits = layers::view::<A>(acts.get(plan.logits())?, rows * plan.classes)?;
        xent::forward(ctx.gpu, &logits, labels, [rows, plan.classes], totals)
    }
}

/// The gradient buffers of one step and the dx scratch.
struct Grads<'a> {
    bufs: &'a mut [DevBuf],
    scratch: &'a mut DevBuf,
}

/// Gradient buffer `read` (a node's dy) and `write` (its input's dx): two
/// gradients live at once, so two different buffers.
fn pair(bufs: &mut [DevBuf], read: usize, write: usize) -> Result<(&DevBuf, &mut DevBuf)> {
    super::acts::read_and_write(bufs, read, write)
        .ok_or_else(|| Error::internal(format!("device model: dy in gradient buffer {read}, dx in {write}")))
}

/// Whether some activation buffer has several readers (a residual's input),
/// so that a dx may need adding into a gradient instead of writing it.
fn shared_reads(plan: &Plan) -> bool {
    let mut reads = vec![0usize; plan.acts.len()];
    for lp in plan.layers.iter().filter(|lp| lp.step != Step::Flatten) {
        for &s in &lp.srcs {
            if let Some(r) = reads.get_mut(s) {
                *r += 1;
            }
        }
    }
    reads.iter().any(|&r| r > 1)
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
