//! The model: a flat list of [`Node`]s built from the resolved `[model]`
//! config, each a layer of one of the types in [`layers`] holding its
//! parameters and buffers under PyTorch's `state_dict()` names. Forward in
//! training mode returns what each layer's backward needs ([`Saved`]);
//! backward walks the layers in reverse and accumulates into each
//! parameter's `.grad`.

mod backward;
pub mod cuda;
mod fuse;
pub(crate) mod init;
pub mod layers;
mod patch;
mod state;
mod tie;

use fuse::{fusable_bn_add_relu, fusable_bn_relu_f16, fusable_bn_relu_pool};
use layers::{AmpClass, Ctx, LayerKind, LayerSaved, Weights};
use patch::cast_round_trip;
pub use state::{StateEntry, StateValue};

use crate::config::model::ResolvedLayer;
use crate::error::{Error, Result};
use crate::ops;
use crate::ops::batch_norm::{BatchNormSaved, BnGrads, BnHyper, BnParams, BnReluPoolSaved, RunningStats};
use crate::rng::{Draws, NodeDraws};
use crate::tensor::{DType, Tensor};

/// A learnable tensor and its gradient (same shape, accumulated by backward).
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub value: Tensor,
    pub grad: Tensor,
}

impl Param {
    pub(crate) fn new(name: String, value: Tensor) -> Self {
        let grad = Tensor::zeros(value.shape());
        Param { name, value, grad }
    }
}

/// The ranks a SyncBatchNorm reduces over.
#[derive(Clone)]
pub struct SyncGroup(pub std::sync::Arc<dyn crate::dist::Communicator>);

impl std::fmt::Debug for SyncGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SyncGroup(world size {})", self.0.world_size())
    }
}

/// One layer of the model with its state.
#[derive(Debug, Clone)]
pub struct Node {
    pub kind: LayerKind,
    pub weights: Weights,
    /// Set by [`Model::convert_sync_batchnorm`]: statistics are reduced across ranks.
    pub sync: Option<SyncGroup>,
    /// The earlier node's parameter this node's weight is (`tie.rs`).
    pub tie: Option<crate::config::Tie>,
}

/// Where the model computes, as the amp policy sets it (`amp::cast_model`):
/// the dtype inputs are cast to (apex casts inputs to cast_model_type), and
/// O1's patch (the [`AmpClass::Fp16`] layers run with inputs and weights
/// cast to this dtype per call, their outputs cast back to f32).
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
    Layer(LayerSaved),
    /// BatchNorm2d fused with the ReLU and 2x2 max-pool after it.
    BnReluPool {
        x: Tensor,
        saved: BnReluPoolSaved,
    },
    /// BatchNorm2d fused with the ReLU after it, whose output is not kept:
    /// the backward recomputes ReLU's mask from BatchNorm's input.
    BnRelu {
        x: Tensor,
        stats: BatchNormSaved,
    },
    /// A layer whose work the previous layer's fused kernel did.
    Fused,
}

impl Node {
    /// O1 patches this layer to `dt` (apex's FP16_FUNCS).
    fn patched(&self, prec: Precision) -> Option<DType> {
        prec.patch_conv_linear.filter(|_| self.kind.amp_class() == AmpClass::Fp16)
    }

    /// `draws`: the node's random draws in this micro-batch (dropout).
    fn forward_train(
        &mut self,
        xs: Vec<Tensor>,
        prec: Precision,
        draws: NodeDraws,
    ) -> Result<(Tensor, Saved)> {
        let cx = Ctx { sync: self.sync.as_ref(), draws: Some(draws), defer: None };
        if let Some(dt) = self.patched(prec) {
            let xs = xs.into_iter().map(|x| cast_round_trip(x, dt)).collect::<Result<_>>()?;
            let mut w = patch::cast_weights(&self.weights, dt)?;
            let (y, s) = self.kind.forward_train(&mut w, xs, cx)?;
            return Ok((cast_round_trip(y, dt)?, Saved::Layer(s)));
        }
        let (y, s) = self.kind.forward_train(&mut self.weights, xs, cx)?;
        Ok((y, Saved::Layer(s)))
    }

    fn forward_eval(&self, xs: Vec<Tensor>, prec: Precision) -> Result<Tensor> {
        if let Some(dt) = self.patched(prec) {
            let w = patch::cast_weights(&self.weights, dt)?;
            let xs = xs.into_iter().map(|x| cast_round_trip(x, dt)).collect::<Result<_>>()?;
            return cast_round_trip(self.kind.forward_eval(&w, xs)?, dt);
        }
        self.kind.forward_eval(&self.weights, xs)
    }

    /// Accumulates parameter gradients (or leaves them in `defer`, where the
    /// layer can); returns each input's dx where `need_dx` asks. The output's
    /// gradient is `dy` plus each of `more` (from its other readers, in the
    /// order they came), summed first as `ops::add::accumulate_` sums them,
    /// or, for one more into a ReLU, in ReLU's own pass.
    fn backward(
        &mut self,
        saved: Saved,
        mut dy: Tensor,
        more: Vec<Tensor>,
        need_dx: &[bool],
        prec: Precision,
        defer: Option<&dyn layers::Defer>,
    ) -> Result<Vec<Option<Tensor>>> {
        if let ([other], Saved::Layer(LayerSaved::Relu(y))) = (&more[..], &saved) {
            ops::relu::add_backward_(y, &mut dy, other)?;
            return Ok(vec![Some(dy)]);
        }
        for other in &more {
            ops::add::accumulate_(&mut dy, other)?;
        }
        let cx = Ctx { sync: self.sync.as_ref(), draws: None, defer };
        match saved {
            Saved::Layer(s) => match self.patched(prec) {
                // O1 adds the call's gradients into the fp32 ones on return.
                Some(dt) => {
                    let cx = Ctx { defer: None, ..cx };
                    patch::backward(&self.kind, &mut self.weights, s, dy, need_dx, dt, cx)
                }
                None => self.kind.backward(&mut self.weights, s, dy, need_dx, cx),
            },
            Saved::BnReluPool { x, saved } => {
                let p = layers::batchnorm2d::parts(&mut self.weights)?;
                let grads = BnGrads { dweight: &mut p.weight.grad, dbias: &mut p.bias.grad };
                let dx = ops::batch_norm::backward_relu_maxpool2(x, &p.weight.value, &saved, &dy, grads)?;
                Ok(vec![Some(dx)])
            }
            Saved::BnRelu { x, stats } => {
                let p = layers::batchnorm2d::parts(&mut self.weights)?;
                let params = BnParams { weight: &p.weight.value, bias: &p.bias.value };
                let grads = BnGrads { dweight: &mut p.weight.grad, dbias: &mut p.bias.grad };
                let dx = ops::batch_norm::backward_relu(&x, params, &stats, &dy, grads)?;
                Ok(vec![Some(dx)])
            }
            Saved::Fused => Ok(vec![Some(dy)]),
        }
    }
}

/// The activations of one forward pass: each value until its last reader
/// has taken it (moved to the last, cloned for the others).
struct Values {
    values: Vec<Option<Tensor>>,
    readers: Vec<usize>,
}

impl Values {
    fn new(x: Tensor, readers: Vec<usize>) -> Self {
        let mut values: Vec<Option<Tensor>> = readers.iter().map(|_| None).collect();
        if let Some(v) = values.first_mut() {
            *v = Some(x);
        }
        Values { values, readers }
    }

    fn take(&mut self, v: usize) -> Result<Tensor> {
        let missing =
            || Error::internal(format!("value {v} read before it was made, or after its last reader"));
        let left = self.readers.get_mut(v).ok_or_else(missing)?;
        *left = left.checked_sub(1).ok_or_else(missing)?;
        let slot = self.values.get_mut(v).ok_or_else(missing)?;
        if *left == 0 {
            slot.take().ok_or_else(missing)
        } else {
            slot.clone().ok_or_else(missing)
        }
    }

    fn inputs(&mut self, ids: &[usize]) -> Result<Vec<Tensor>> {
        ids.iter().map(|&v| self.take(v)).collect()
    }

    fn put(&mut self, v: usize, t: Tensor) -> Result<()> {
        *self.values.get_mut(v).ok_or_else(|| Error::internal(format!("no value {v}")))? = Some(t);
        Ok(())
    }
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
    pub layers: Vec<Node>,
    pub resolved: Vec<ResolvedLayer>,
    pub precision: Precision,
    /// The key of the training forward's random draws (dropout's masks):
    /// the run seed from [`Model::new`], the rank (set when the run joins
    /// its job) and the micro-batch (set by the engine before each
    /// training forward). Node `i` draws from `draws.node(i)`.
    pub draws: Draws,
}

impl Model {
    /// Builds the layers with PyTorch's default initialization, drawn from `seed`.
    pub fn new(resolved: &[ResolvedLayer], seed: u64) -> Result<Self> {
        keep_activation_memory();
        let mut layers = Vec::with_capacity(resolved.len());
        for (i, r) in resolved.iter().enumerate() {
            let mut rng = crate::rng::stream(seed, crate::rng::Purpose::Init, i as u64);
            let weights = r.kind.init_weights(&r.name, &mut rng)?;
            layers.push(Node { kind: r.kind.clone(), weights, sync: None, tie: r.tie.clone() });
        }
        let draws = Draws { seed, ..Draws::default() };
        let mut model = Model { layers, resolved: resolved.to_vec(), precision: Precision::default(), draws };
        model.tie_weights()?;
        Ok(model)
    }

    /// Parameters in registration order (the order of `parameters()` in
    /// PyTorch, a tied one once).
    pub fn params(&self) -> Vec<&Param> {
        self.layers.iter().flat_map(Node::own_params).collect()
    }

    pub fn params_mut(&mut self) -> Vec<&mut Param> {
        self.layers.iter_mut().flat_map(Node::own_params_mut).collect()
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

    /// The values node `i` reads (0 is the model input, `j + 1` node `j`'s output).
    fn inputs(&self, i: usize) -> Result<&[usize]> {
        self.resolved
            .get(i)
            .map(|r| r.inputs.as_slice())
            .ok_or_else(|| Error::internal(format!("layer {i} has no resolved description")))
    }

    /// How many nodes read each value; the last node's output is read once,
    /// as the model's output.
    fn readers(&self) -> Result<Vec<usize>> {
        let mut readers = vec![0usize; self.layers.len() + 1];
        if let Some(out) = readers.last_mut() {
            *out = 1;
        }
        for i in 0..self.layers.len() {
            for &v in self.inputs(i)? {
                *readers
                    .get_mut(v)
                    .ok_or_else(|| Error::internal(format!("layer {i} reads value {v}")))? += 1;
            }
        }
        Ok(readers)
    }

    /// Nodes `i + 1 .. i + len` each read only the previous node's output,
    /// which nothing else reads: a chain a fused kernel may take whole.
    fn chain(&self, i: usize, len: usize, readers: &[usize]) -> bool {
        (i + 1..i + len).all(|j| {
            j < self.layers.len() && self.inputs(j).is_ok_and(|ins| ins == [j]) && readers.get(j) == Some(&1)
        })
    }

    /// The other operand of a residual block's end at node `i`: BatchNorm,
    /// an add of its output (read by nothing else) and one other value,
    /// and ReLU, the only reader of the sum.
    fn bn_add_relu_other(&self, i: usize, readers: &[usize]) -> Option<usize> {
        let (add, relu) = (self.inputs(i + 1).ok()?, self.inputs(i + 2).ok()?);
        let &[a, b] = add else { return None };
        let other = if a == i + 1 { b } else { a };
        let fits = (a == i + 1) != (b == i + 1)
            && readers.get(i + 1) == Some(&1)
            && relu == [i + 2]
            && readers.get(i + 2) == Some(&1);
        fits.then_some(other)
    }

    /// The input as the model takes it: cast to `dt` as apex casts
    /// floating inputs, unless every reader is an embedding (token ids,
    /// which PyTorch holds as integers and apex leaves alone).
    fn cast_input(&self, x: Tensor, dt: DType) -> Result<Tensor> {
        let mut readers =
            (0..self.layers.len()).filter(|&i| self.inputs(i).is_ok_and(|ins| ins.contains(&0)));
        let ids = readers.all(|i| matches!(self.layers[i].kind, LayerKind::Embedding(_)));
        Ok(if ids { x } else { x.into_dtype(dt) })
    }

    /// Training-mode forward: logits and the saved state of every layer.
    pub fn forward_train(&mut self, x: Tensor) -> Result<(Tensor, Vec<Saved>)> {
        let prec = self.precision;
        let readers = self.readers()?;
        let n = self.layers.len();
        let mut values = Values::new(self.cast_input(x, prec.input)?, readers.clone());
        let mut saved = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            let mut xs = values.inputs(self.inputs(i)?)?;
            let single = xs.len() == 1;
            if single && self.chain(i, 3, &readers) {
                if let Some((bn, p)) = fusable_bn_relu_pool(&mut self.layers[i..], &xs[0]) {
                    let cur = xs.remove(0);
                    let (y, s) = ops::batch_norm::forward_train_relu_maxpool2(
                        &cur,
                        BnParams { weight: &p.weight.value, bias: &p.bias.value },
                        RunningStats { running_mean: &mut *p.running_mean, running_var: &mut *p.running_var },
                        BnHyper { momentum: bn.momentum, eps: bn.eps },
                    )?;
                    *p.num_batches_tracked += 1;
                    saved.extend([Saved::BnReluPool { x: cur, saved: s }, Saved::Fused, Saved::Fused]);
                    values.put(i + 3, y)?;
                    i += 3;
                    continue;
                }
            }
            if single && self.chain(i, 2, &readers) {
                if let Some((bn, p)) = fusable_bn_relu_f16(&mut self.layers[i..], &xs[0]) {
                    let cur = xs.remove(0);
                    let (y, stats) = ops::batch_norm::forward_train_relu(
                        &cur,
                        BnParams { weight: &p.weight.value, bias: &p.bias.value },
                        RunningStats { running_mean: &mut *p.running_mean, running_var: &mut *p.running_var },
                        BnHyper { momentum: bn.momentum, eps: bn.eps },
                    )?;
                    *p.num_batches_tracked += 1;
                    let params = BnParams { weight: &p.weight.value, bias: &p.bias.value };
                    if ops::batch_norm::backward_relu_fits(&cur, params) {
                        saved.extend([Saved::BnRelu { x: cur, stats }, Saved::Fused]);
                    } else {
                        let bn_saved = layers::batchnorm2d::Saved { x: cur, stats, global_count: None };
                        saved.extend([
                            Saved::Layer(LayerSaved::BatchNorm2d(bn_saved)),
                            Saved::Layer(LayerSaved::Relu(y.clone())),
                        ]);
                    }
                    values.put(i + 2, y)?;
                    i += 2;
                    continue;
                }
            }
            if single && i + 2 < n {
                if let Some(other) = self.bn_add_relu_other(i, &readers) {
                    let add_reads = self.inputs(i + 1)?.to_vec();
                    if let Some((bn, p)) = fusable_bn_add_relu(&mut self.layers[i..], &xs[0]) {
                        let cur = xs.remove(0);
                        let s = values.take(other)?;
                        // The add saves its operands' dtypes in its own order.
                        let dtypes =
                            add_reads.iter().map(|&v| if v == other { s.dtype() } else { cur.dtype() });
                        let dtypes = dtypes.collect();
                        let (y, stats) = ops::batch_norm::forward_train_add_relu(
                            &cur,
                            &s,
                            BnParams { weight: &p.weight.value, bias: &p.bias.value },
                            RunningStats {
                                running_mean: &mut *p.running_mean,
                                running_var: &mut *p.running_var,
                            },
                            BnHyper { momentum: bn.momentum, eps: bn.eps },
                        )?;
                        *p.num_batches_tracked += 1;
                        #[cfg(test)]
                        fuse::ADD_RELU_FUSED.with(|c| c.set(c.get() + 1));
                        let bn_saved = layers::batchnorm2d::Saved { x: cur, stats, global_count: None };
                        saved.extend([
                            Saved::Layer(LayerSaved::BatchNorm2d(bn_saved)),
                            Saved::Layer(LayerSaved::Add(dtypes)),
                            Saved::Layer(LayerSaved::Relu(y.clone())),
                        ]);
                        values.put(i + 3, y)?;
                        i += 3;
                        continue;
                    }
                }
            }
            let draws = self.draws.node(i);
            self.swap_tied(i)?;
            let out = self.layers[i].forward_train(xs, prec, draws);
            self.swap_tied(i)?;
            let (y, s) = out?;
            saved.push(s);
            values.put(i + 1, y)?;
            i += 1;
        }
        Ok((values.take(n)?, saved))
    }

    /// Evaluation-mode forward (BatchNorm uses running statistics).
    pub fn forward_eval(&self, x: Tensor) -> Result<Tensor> {
        let mut values = Values::new(self.cast_input(x, self.precision.input)?, self.readers()?);
        for i in 0..self.layers.len() {
            let xs = values.inputs(self.inputs(i)?)?;
            values.put(i + 1, self.lent(i)?.forward_eval(xs, self.precision)?)?;
        }
        values.take(self.layers.len())
    }

    /// PyTorch's `SyncBatchNorm.convert_sync_batchnorm`: every batch
    /// normalization computes its batch statistics over all ranks of `group`.
    pub fn convert_sync_batchnorm(&mut self, group: std::sync::Arc<dyn crate::dist::Communicator>) {
        for layer in &mut self.layers {
            if layer.kind.syncs_statistics() {
                layer.sync = Some(SyncGroup(group.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests_backward;
#[cfg(test)]
mod tests_fuse;
#[cfg(test)]
mod tests_o1;
#[cfg(test)]
mod tests_tie;
