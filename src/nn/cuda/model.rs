//! [`GpuModel`]: the host [`Model`] on the device. Every buffer a step needs
//! for batches of up to `max_batch` is allocated once, in [`GpuModel::new`]
//! (sizes from [`Plan`]); a training step is launches on the compute stream
//! only, with no host synchronization, and the DDP and SyncBatchNorm
//! communication goes through [`TrainHooks`].

pub use super::layer::Elem;
use super::layer::StateArgs;
use super::params::{DevBuf, DevElem, DeviceParams};
#[cfg(doc)]
use super::plan::Route;
use super::plan::{activation_dtype, Plan};
use super::workspace::Scratchpad;
use crate::cuda::blas::Blas;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::nn::layers::DeviceNode;
use crate::nn::Model;
use crate::ops::cross_entropy::cuda::CrossEntropyTotals;
use crate::rng::Draws;
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;
use std::sync::Arc;

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

pub struct GpuModel {
    pub params: DeviceParams,
    /// The key of the training forward's random draws, as the host
    /// model's [`Model::draws`]: the engine sets the micro-batch before
    /// each [`GpuModel::train_batch`].
    pub draws: Draws,
    pub(super) gpu: Arc<Gpu>,
    pub(super) blas: Blas,
    pub(super) plan: Plan,
    /// The dtype of every activation and activation gradient.
    pub(super) act: DType,
    /// Each node's device plan and state, in execution order.
    pub(super) nodes: Vec<DeviceNode>,
    /// O1's f16 copy of a wrapped node's input, which its backward reads.
    pub(super) o1_inputs: Vec<Option<CudaSlice<f16>>>,
    /// Activation buffers (`plan.buffers`; `plan.storage` says which holds
    /// each activation, the input in 0), in `act`.
    pub(super) acts: Vec<DevBuf>,
    /// The gradient buffers (`plan.grad_buffer` says which holds the
    /// gradient of each activation), in `act`.
    pub(super) grads: Vec<DevBuf>,
    /// A dx on its way into a gradient another reader wrote ([`Route::Add`];
    /// one element when no dx takes that route).
    pub(super) dx_scratch: DevBuf,
    /// The layers' shared scratch.
    pub(super) scratch: Scratchpad,
    /// The model input's token ids in f32 (whatever the activation dtype: an
    /// id above 2048 has no f16), for a token embedding.
    pub(super) ids: CudaSlice<f32>,
}

/// The first `len` values of an activation or state buffer, as `T`. Every
/// buffer is allocated before step 1 for the largest batch, which
/// `check_batch` holds each step to, so `len` fits.
pub(crate) fn view<T: DevElem>(b: &DevBuf, len: usize) -> Result<CudaView<'_, T>> {
    Ok(b.typed::<T>("a device buffer")?.slice(0..len))
}

pub(crate) fn view_mut<T: DevElem>(b: &mut DevBuf, len: usize) -> Result<CudaViewMut<'_, T>> {
    Ok(b.typed_mut::<T>("a device buffer")?.slice_mut(0..len))
}

pub(crate) fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    n: usize,
) -> Result<CudaSlice<T>> {
    gpu.stream().alloc_zeros(n.max(1)).map_err(|e| Error::cuda(format!("allocating {n} device values"), e))
}

fn mismatch() -> Error {
    Error::internal("the host model does not match its device copy's layers")
}

/// The host node a device node's state comes from: its own, or a fused
/// group's head's.
fn host_node<'m>(host: &'m Model, lp: &super::plan::LayerPlan) -> Result<&'m crate::nn::Node> {
    host.layers.get(lp.nodes.start).ok_or_else(mismatch)
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
        let plan = Plan::new(host, max_batch)?;
        let blas = Blas::new(&gpu, allow_tf32)?;
        let params = DeviceParams::new(&gpu, host, first_bucket_bytes, bucket_cap_bytes)?;
        let g = &*gpu;
        let acts =
            plan.buffers.iter().map(|&k| DevBuf::zeros(g, act, k * max_batch)).collect::<Result<_>>()?;
        let grads = (0..plan.grad_buffers)
            .map(|_| DevBuf::zeros(g, act, plan.grad * max_batch))
            .collect::<Result<_>>()?;
        let dx_scratch = DevBuf::zeros(g, act, if plan.dx_scratch { plan.grad * max_batch } else { 1 })?;
        let (mut nodes, mut o1_inputs) = (Vec::with_capacity(plan.layers.len()), Vec::new());
        for lp in &plan.layers {
            let node = host_node(host, lp)?;
            let a =
                StateArgs { gpu: g, node, max_batch, act, in_numel: lp.in_numel, out_numel: lp.out_numel };
            nodes.push(lp.op.clone().allocate(&a)?);
            o1_inputs.push(if lp.o1 { Some(alloc(g, lp.in_numel * max_batch)?) } else { None });
        }
        let scratch = Scratchpad::new(g, &plan.scratch)?;
        let ids = alloc(g, if plan.tokens { plan.acts[0] * max_batch } else { 1 })?;
        Ok(GpuModel {
            params,
            draws: host.draws,
            gpu,
            blas,
            plan,
            act,
            nodes,
            o1_inputs,
            acts,
            grads,
            dx_scratch,
            scratch,
            ids,
        })
    }

    /// Every buffer a DDP replica keeps in step (BatchNorm running statistics).
    pub fn buffers_mut(&mut self) -> Vec<&mut DevBuf> {
        self.nodes.iter_mut().flat_map(DeviceNode::buffers_mut).collect()
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
        for (node, lp) in self.nodes.iter_mut().zip(&self.plan.layers) {
            node.upload(&self.gpu, host_node(host, lp)?)?;
        }
        Ok(())
    }

    /// Parameters and buffers into `host` (waits for the stream).
    pub fn download(&self, host: &mut Model) -> Result<()> {
        self.check_layers(host)?;
        self.params.download(&self.gpu, host)?;
        for (node, lp) in self.nodes.iter().zip(&self.plan.layers) {
            let layer = host.layers.get_mut(lp.nodes.start).ok_or_else(mismatch)?;
            node.download(&self.gpu, layer)?;
        }
        Ok(())
    }

    /// The host model has the nodes the plan was made for: each device
    /// node's type is its members' types (a fused group's joined by `+`).
    fn check_layers(&self, host: &Model) -> Result<()> {
        let covered = self.plan.layers.last().map_or(0, |l| l.nodes.end);
        let same = host.layers.len() == covered
            && self.plan.layers.iter().zip(&self.nodes).all(|(lp, d)| {
                let types: Vec<&str> = host
                    .layers
                    .get(lp.nodes.clone())
                    .unwrap_or(&[])
                    .iter()
                    .map(|l| l.kind.type_name())
                    .collect();
                types.join("+") == d.type_name()
            });
        if same {
            Ok(())
        } else {
            Err(mismatch())
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
        let logits = &self.acts[self.plan.storage[self.plan.logits()]];
        logits.read_f32(&self.gpu, 0, n * self.plan.positions * self.plan.classes)
    }
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
