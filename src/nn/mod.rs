//! The model: a flat list of [`Layer`]s built from the resolved `[model]` config,
//! each holding its parameters under PyTorch's `state_dict()` names. Forward in
//! training mode returns what each layer's backward needs ([`Saved`]); backward
//! walks the layers in reverse and accumulates into each parameter's `.grad`.

pub mod cuda;
mod fuse;
mod init;
mod patch;
mod state;

use fuse::{fusable_bn_relu_f16, fusable_bn_relu_pool};
use patch::{cast_round_trip, patched_backward};
pub use state::{StateEntry, StateValue};

use crate::config::model::{LayerKind, ResolvedLayer};
use crate::error::Result;
use crate::ops::{
    self,
    batch_norm::{BatchNormSaved, BnReluPoolSaved},
    conv2d::Conv2dArgs,
};
use crate::tensor::{DType, Tensor};

/// A learnable tensor and its gradient (same shape, accumulated by backward).
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub value: Tensor,
    pub grad: Tensor,
}

impl Param {
    fn new(name: String, value: Tensor) -> Self {
        let grad = Tensor::zeros(value.shape());
        Param { name, value, grad }
    }
}

#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    pub weight: Param,
    pub bias: Param,
    pub running_mean: Tensor,
    pub running_var: Tensor,
    pub num_batches_tracked: i64,
    pub eps: f32,
    pub momentum: f32,
    /// Set by [`Model::convert_sync_batchnorm`]: statistics are reduced across ranks.
    pub sync: Option<SyncGroup>,
}

/// The ranks a SyncBatchNorm reduces over.
#[derive(Clone)]
pub struct SyncGroup(pub std::sync::Arc<dyn crate::dist::Communicator>);

impl std::fmt::Debug for SyncGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SyncGroup(world size {})", self.0.world_size())
    }
}

#[derive(Debug, Clone)]
pub enum Layer {
    Conv2d { weight: Param, bias: Option<Param>, args: Conv2dArgs },
    BatchNorm2d(Box<BatchNorm2d>),
    Relu,
    MaxPool2d { kernel_size: usize, stride: usize },
    Flatten,
    Linear { weight: Param, bias: Option<Param> },
}

/// Where the model computes, as the amp policy sets it (`amp::cast_model`):
/// the dtype inputs are cast to (apex casts inputs to cast_model_type), and
/// O1's patch (conv and linear run with inputs and weights cast to this
/// dtype per call, their outputs cast back to f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precision {
    pub input: DType,
    pub patch_conv_linear: Option<DType>,
}

impl Default for Precision {
    fn default() -> Self {
        Precision { input: DType::F32, patch_conv_linear: None }
    }
}

/// What a layer's backward needs from its forward.
pub enum Saved {
    Input(Tensor),
    /// `global_count` is set for SyncBatchNorm: the element count per channel over all ranks.
    BatchNorm {
        x: Tensor,
        stats: BatchNormSaved,
        global_count: Option<usize>,
    },
    Output(Tensor),
    MaxPool {
        indices: Vec<u32>,
        x_shape: Vec<usize>,
    },
    Shape(Vec<usize>),
    /// BatchNorm2d fused with the ReLU and 2x2 max-pool after it.
    BnReluPool {
        x: Tensor,
        saved: BnReluPoolSaved,
    },
    /// A layer whose work the previous layer's fused kernel did.
    Fused,
}

impl Layer {
    fn params(&self) -> Vec<&Param> {
        match self {
            Layer::Conv2d { weight, bias, .. } | Layer::Linear { weight, bias } => {
                std::iter::once(weight).chain(bias.as_ref()).collect()
            }
            Layer::BatchNorm2d(bn) => vec![&bn.weight, &bn.bias],
            Layer::Relu | Layer::MaxPool2d { .. } | Layer::Flatten => Vec::new(),
        }
    }

    fn params_mut(&mut self) -> Vec<&mut Param> {
        match self {
            Layer::Conv2d { weight, bias, .. } | Layer::Linear { weight, bias } => {
                std::iter::once(weight).chain(bias.as_mut()).collect()
            }
            Layer::BatchNorm2d(bn) => vec![&mut bn.weight, &mut bn.bias],
            Layer::Relu | Layer::MaxPool2d { .. } | Layer::Flatten => Vec::new(),
        }
    }

    fn forward_train(&mut self, x: Tensor, prec: Precision) -> Result<(Tensor, Saved)> {
        if let (Some(dt), Layer::Conv2d { .. } | Layer::Linear { .. }) = (prec.patch_conv_linear, &*self) {
            let x = cast_round_trip(x, dt)?;
            let y = self.forward_patched(&x, dt)?;
            return Ok((y, Saved::Input(x)));
        }
        Ok(match self {
            Layer::Conv2d { weight, bias, args } => {
                let y = ops::conv2d::forward(&x, &weight.value, bias.as_ref().map(|b| &b.value), *args)?;
                (y, Saved::Input(x))
            }
            Layer::BatchNorm2d(bn) => {
                let bn = &mut **bn;
                let (y, stats, global_count) = match &bn.sync {
                    Some(SyncGroup(group)) => {
                        let (y, stats, count) = ops::batch_norm::sync::forward_train(
                            &x,
                            &bn.weight.value,
                            &bn.bias.value,
                            &mut bn.running_mean,
                            &mut bn.running_var,
                            bn.momentum,
                            bn.eps,
                            &mut |buf| sum_over_ranks(group.as_ref(), buf, "SyncBatchNorm forward"),
                        )?;
                        (y, stats, Some(count))
                    }
                    None => {
                        let (y, stats) = ops::batch_norm::forward_train(
                            &x,
                            &bn.weight.value,
                            &bn.bias.value,
                            &mut bn.running_mean,
                            &mut bn.running_var,
                            bn.momentum,
                            bn.eps,
                        )?;
                        (y, stats, None)
                    }
                };
                bn.num_batches_tracked += 1;
                (y, Saved::BatchNorm { x, stats, global_count })
            }
            Layer::Relu => {
                let mut y = x;
                ops::relu::forward_(&mut y)?;
                (y.clone(), Saved::Output(y))
            }
            Layer::MaxPool2d { kernel_size, stride } => {
                let (y, indices) = ops::max_pool2d::forward(&x, *kernel_size, *stride)?;
                (y, Saved::MaxPool { indices, x_shape: x.shape().to_vec() })
            }
            Layer::Flatten => {
                let shape = x.shape().to_vec();
                let n = shape[0];
                (x.reshape(&[n, shape[1..].iter().product()])?, Saved::Shape(shape))
            }
            Layer::Linear { weight, bias } => {
                let y = ops::linear::forward(&x, &weight.value, bias.as_ref().map(|b| &b.value))?;
                (y, Saved::Input(x))
            }
        })
    }

    /// O1's conv or linear: run on `x` (already [`cast_round_trip`]) with
    /// the parameters cast to `dt` for this call, the output cast to `dt`
    /// and back to f32.
    fn forward_patched(&self, x: &Tensor, dt: DType) -> Result<Tensor> {
        let cast = |p: &Param| cast_round_trip(p.value.clone(), dt);
        let y = match self {
            Layer::Conv2d { weight, bias, args } => {
                let b = bias.as_ref().map(cast).transpose()?;
                ops::conv2d::forward(x, &cast(weight)?, b.as_ref(), *args)?
            }
            Layer::Linear { weight, bias } => {
                let b = bias.as_ref().map(cast).transpose()?;
                ops::linear::forward(x, &cast(weight)?, b.as_ref())?
            }
            _ => {
                return Err(crate::Error::Training(
                    "internal error: only conv and linear layers run patched (O1)".into(),
                ))
            }
        };
        cast_round_trip(y, dt)
    }

    fn forward_eval(&self, x: Tensor, prec: Precision) -> Result<Tensor> {
        if let (Some(dt), Layer::Conv2d { .. } | Layer::Linear { .. }) = (prec.patch_conv_linear, self) {
            return self.forward_patched(&cast_round_trip(x, dt)?, dt);
        }
        match self {
            Layer::BatchNorm2d(bn) => ops::batch_norm::forward_eval(
                &x,
                &bn.weight.value,
                &bn.bias.value,
                &bn.running_mean,
                &bn.running_var,
                bn.eps,
            ),
            Layer::Relu => {
                let mut y = x;
                ops::relu::forward_(&mut y)?;
                Ok(y)
            }
            Layer::Conv2d { weight, bias, args } => {
                ops::conv2d::forward(&x, &weight.value, bias.as_ref().map(|b| &b.value), *args)
            }
            Layer::MaxPool2d { kernel_size, stride } => {
                Ok(ops::max_pool2d::forward(&x, *kernel_size, *stride)?.0)
            }
            Layer::Flatten => {
                let n = x.shape()[0];
                let rest = x.shape()[1..].iter().product::<usize>();
                x.reshape(&[n, rest])
            }
            Layer::Linear { weight, bias } => {
                ops::linear::forward(&x, &weight.value, bias.as_ref().map(|b| &b.value))
            }
        }
    }

    /// Accumulates parameter gradients; returns dx when `need_dx`.
    fn backward(
        &mut self,
        saved: Saved,
        dy: Tensor,
        need_dx: bool,
        prec: Precision,
    ) -> Result<Option<Tensor>> {
        if let Some(dt) = prec.patch_conv_linear {
            match (&mut *self, &saved) {
                (Layer::Conv2d { weight, bias, args }, Saved::Input(x)) => {
                    let (args, dy) = (*args, cast_round_trip(dy, dt)?);
                    return patched_backward(weight, bias.as_mut(), dt, |w, dw, db| {
                        ops::conv2d::backward(x, w, &dy, args, dw, db, need_dx)
                    });
                }
                (Layer::Linear { weight, bias }, Saved::Input(x)) => {
                    let dy = cast_round_trip(dy, dt)?;
                    return patched_backward(weight, bias.as_mut(), dt, |w, dw, db| {
                        ops::linear::backward(x, w, &dy, dw, db, need_dx)
                    });
                }
                _ => {}
            }
        }
        match (self, saved) {
            (Layer::Conv2d { weight, bias, args }, Saved::Input(x)) => ops::conv2d::backward(
                &x,
                &weight.value,
                &dy,
                *args,
                &mut weight.grad,
                bias.as_mut().map(|b| &mut b.grad),
                need_dx,
            ),
            (Layer::BatchNorm2d(bn), Saved::BatchNorm { x, stats, global_count }) => {
                let BatchNorm2d { weight, bias, sync, .. } = &mut **bn;
                let dx = match (sync.as_ref(), global_count) {
                    (Some(SyncGroup(group)), Some(count)) => ops::batch_norm::sync::backward(
                        &x,
                        &weight.value,
                        &stats,
                        count,
                        &dy,
                        &mut weight.grad,
                        &mut bias.grad,
                        &mut |buf| sum_over_ranks(group.as_ref(), buf, "SyncBatchNorm backward"),
                    )?,
                    _ => ops::batch_norm::backward(
                        &x,
                        &weight.value,
                        &stats,
                        &dy,
                        &mut weight.grad,
                        &mut bias.grad,
                    )?,
                };
                Ok(Some(dx))
            }
            (Layer::BatchNorm2d(bn), Saved::BnReluPool { x, saved }) => {
                let BatchNorm2d { weight, bias, .. } = &mut **bn;
                let dx = ops::batch_norm::backward_relu_maxpool2(
                    x,
                    &weight.value,
                    &saved,
                    &dy,
                    &mut weight.grad,
                    &mut bias.grad,
                )?;
                Ok(Some(dx))
            }
            (Layer::Relu | Layer::MaxPool2d { .. }, Saved::Fused) => Ok(Some(dy)),
            (Layer::Relu, Saved::Output(y)) => {
                let mut dx = dy;
                ops::relu::backward_(&y, &mut dx)?;
                Ok(Some(dx))
            }
            (Layer::MaxPool2d { .. }, Saved::MaxPool { indices, x_shape }) => {
                Ok(Some(ops::max_pool2d::backward(&dy, &indices, &x_shape)?))
            }
            (Layer::Flatten, Saved::Shape(shape)) => Ok(Some(dy.reshape(&shape)?)),
            (Layer::Linear { weight, bias }, Saved::Input(x)) => ops::linear::backward(
                &x,
                &weight.value,
                &dy,
                &mut weight.grad,
                bias.as_mut().map(|b| &mut b.grad),
                need_dx,
            ),
            _ => Err(crate::Error::Training(
                "internal error: a layer's saved state does not match the layer".into(),
            )),
        }
    }
}

fn sum_over_ranks(group: &dyn crate::dist::Communicator, buf: Vec<f32>, what: &str) -> Result<Vec<f32>> {
    group.all_reduce(crate::dist::Buffer::F32(buf), crate::dist::ReduceOp::Sum, what)?.into_f32()
}

/// Every step allocates the same few multi-megabyte activations and frees
/// them again. glibc serves blocks that large with fresh mmap()s, so each
/// step page-faulted (and had the kernel zero) ~20 MB: 15% of a step's time,
/// measured. Raising the mmap and trim thresholds keeps freed activations in
/// the heap for the next step. Process-wide and idempotent; a no-op off
/// glibc.
fn keep_activation_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // 32 MiB is glibc's largest mmap threshold on 64-bit; the trim
            // threshold only bounds how much free heap is kept.
            // SAFETY: mallopt only adjusts allocator tunables; it is safe to
            // call at any time, from any thread.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
            }
        });
    }
}

/// The model: layers in execution order, with their resolved descriptions.
pub struct Model {
    pub layers: Vec<Layer>,
    pub resolved: Vec<ResolvedLayer>,
    pub precision: Precision,
}

impl Model {
    /// Builds the layers with PyTorch's default initialization, drawn from `seed`.
    pub fn new(resolved: &[ResolvedLayer], seed: u64) -> Result<Self> {
        keep_activation_memory();
        let mut layers = Vec::with_capacity(resolved.len());
        for (i, r) in resolved.iter().enumerate() {
            let mut rng = crate::rng::stream(seed, crate::rng::Purpose::Init, i as u64);
            let pname = |p: &str| format!("{}.{p}", r.name);
            let layer = match &r.kind {
                LayerKind::Conv2d { in_channels, out_channels, kernel_size, stride, padding, bias } => {
                    let fan_in = in_channels * kernel_size * kernel_size;
                    let wshape = [*out_channels, *in_channels, *kernel_size, *kernel_size];
                    let weight =
                        Param::new(pname("weight"), init::kaiming_uniform(&mut rng, &wshape, fan_in)?);
                    let bias = if *bias {
                        Some(Param::new(
                            pname("bias"),
                            init::fan_in_uniform(&mut rng, &[*out_channels], fan_in)?,
                        ))
                    } else {
                        None
                    };
                    Layer::Conv2d { weight, bias, args: Conv2dArgs { stride: *stride, padding: *padding } }
                }
                LayerKind::BatchNorm2d { num_features, eps, momentum } => {
                    let c = [*num_features];
                    Layer::BatchNorm2d(Box::new(BatchNorm2d {
                        weight: Param::new(pname("weight"), Tensor::full(&c, 1.0)),
                        bias: Param::new(pname("bias"), Tensor::zeros(&c)),
                        running_mean: Tensor::zeros(&c),
                        running_var: Tensor::full(&c, 1.0),
                        num_batches_tracked: 0,
                        eps: *eps,
                        momentum: *momentum,
                        sync: None,
                    }))
                }
                LayerKind::Relu => Layer::Relu,
                LayerKind::MaxPool2d { kernel_size, stride } => {
                    Layer::MaxPool2d { kernel_size: *kernel_size, stride: *stride }
                }
                LayerKind::Flatten => Layer::Flatten,
                LayerKind::Linear { in_features, out_features, bias } => {
                    let wshape = [*out_features, *in_features];
                    let weight =
                        Param::new(pname("weight"), init::kaiming_uniform(&mut rng, &wshape, *in_features)?);
                    let bias = if *bias {
                        Some(Param::new(
                            pname("bias"),
                            init::fan_in_uniform(&mut rng, &[*out_features], *in_features)?,
                        ))
                    } else {
                        None
                    };
                    Layer::Linear { weight, bias }
                }
            };
            layers.push(layer);
        }
        Ok(Model { layers, resolved: resolved.to_vec(), precision: Precision::default() })
    }

    /// Parameters in registration order (the order of `parameters()` in PyTorch).
    pub fn params(&self) -> Vec<&Param> {
        self.layers.iter().flat_map(|l| l.params()).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.layers.iter_mut().flat_map(|l| l.params_mut()).collect()
    }

    pub fn num_params(&self) -> usize {
        self.params().iter().map(|p| p.value.numel()).sum()
    }

    pub fn zero_grad(&mut self) -> Result<()> {
        for p in self.params_mut() {
            p.grad.fill_(0.0);
        }
        Ok(())
    }

    /// Training-mode forward: logits and the saved state of every layer.
    pub fn forward_train(&mut self, x: Tensor) -> Result<(Tensor, Vec<Saved>)> {
        let mut saved = Vec::with_capacity(self.layers.len());
        let prec = self.precision;
        let mut cur = x.into_dtype(prec.input);
        let mut i = 0;
        while i < self.layers.len() {
            if let Some(bn) = fusable_bn_relu_pool(&mut self.layers[i..], &cur) {
                let (y, s) = ops::batch_norm::forward_train_relu_maxpool2(
                    &cur,
                    &bn.weight.value,
                    &bn.bias.value,
                    &mut bn.running_mean,
                    &mut bn.running_var,
                    bn.momentum,
                    bn.eps,
                )?;
                bn.num_batches_tracked += 1;
                saved.extend([Saved::BnReluPool { x: cur, saved: s }, Saved::Fused, Saved::Fused]);
                cur = y;
                i += 3;
                continue;
            }
            if let Some(bn) = fusable_bn_relu_f16(&mut self.layers[i..], &cur) {
                let (y, stats) = ops::batch_norm::forward_train_relu(
                    &cur,
                    &bn.weight.value,
                    &bn.bias.value,
                    &mut bn.running_mean,
                    &mut bn.running_var,
                    bn.momentum,
                    bn.eps,
                )?;
                bn.num_batches_tracked += 1;
                saved.extend([
                    Saved::BatchNorm { x: cur, stats, global_count: None },
                    Saved::Output(y.clone()),
                ]);
                cur = y;
                i += 2;
                continue;
            }
            let (y, s) = self.layers[i].forward_train(cur, prec)?;
            saved.push(s);
            cur = y;
            i += 1;
        }
        Ok((cur, saved))
    }

    /// Evaluation-mode forward (BatchNorm uses running statistics).
    pub fn forward_eval(&self, x: Tensor) -> Result<Tensor> {
        let mut cur = x.into_dtype(self.precision.input);
        for layer in &self.layers {
            cur = layer.forward_eval(cur, self.precision)?;
        }
        Ok(cur)
    }

    /// Backward from dlogits, accumulating into every parameter's grad.
    /// The input gradient of the first layer is never computed.
    pub fn backward(&mut self, saved: Vec<Saved>, dlogits: Tensor) -> Result<()> {
        self.backward_hooked(saved, dlogits, &mut |_, _| Ok(()))
    }

    /// [`Model::backward`] that calls `on_ready(param_index, grad)` for each
    /// parameter (registration order) as soon as its layer's backward is done,
    /// so DDP can start reducing a bucket while backward goes on.
    pub fn backward_hooked(
        &mut self,
        saved: Vec<Saved>,
        dlogits: Tensor,
        on_ready: &mut dyn FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let mut first_param = Vec::with_capacity(self.layers.len());
        let mut count = 0;
        for layer in &self.layers {
            first_param.push(count);
            count += layer.params().len();
        }
        let prec = self.precision;
        let mut dy = Some(dlogits);
        for (i, (layer, s)) in self.layers.iter_mut().zip(saved).enumerate().rev() {
            let Some(g) = dy.take() else { break };
            dy = layer.backward(s, g, i > 0, prec)?;
            for (k, p) in layer.params().into_iter().enumerate() {
                on_ready(first_param[i] + k, &p.grad)?;
            }
        }
        Ok(())
    }

    /// PyTorch's `SyncBatchNorm.convert_sync_batchnorm`: every BatchNorm2d
    /// computes its batch statistics over all ranks of `group`.
    pub fn convert_sync_batchnorm(&mut self, group: std::sync::Arc<dyn crate::dist::Communicator>) {
        for layer in &mut self.layers {
            if let Layer::BatchNorm2d(bn) = layer {
                bn.sync = Some(SyncGroup(group.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests_o1;
