//! What the device model allocates, worked out on the host from the layers
//! and their resolved shapes: each node's device plan and needs (its
//! type's `cuda.rs`), runs of nodes fused into one (`fused/`), activation buffers shared by values whose lives do
//! not overlap (Flatten's output is its input), gradient buffers reused the
//! same way, each dx's route into its input's gradient (written, or added
//! to what another reader wrote), and the workspace as the largest scratch
//! any layer asks for. Pure, so it is tested without a GPU.

use super::layer::{internal, Grad, Needs, PlanArgs, Scratch};
use crate::error::{Error, Result};
use crate::nn::layers::{AmpClass, DeviceOp};
use crate::nn::Model;
use crate::tensor::DType;

/// How a dx reaches the gradient of the value it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// No gradient: the model input's.
    None,
    /// The first dx into that gradient (`=`).
    Write,
    /// Another reader's dx is there already: added (`+=`).
    Add,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    pub name: String,
    pub op: DeviceOp,
    pub needs: Needs,
    /// apex O1's wrapper: a conv or linear run in f16 on f32 activations (`o1.rs`).
    pub o1: bool,
    /// The activations (values) read and written (0 is the model input);
    /// the same value for Flatten, which only renames the shape. `src` is
    /// the first of `srcs` (the one input of every layer but the add).
    /// [`Plan::storage`] says which buffer holds each.
    pub src: usize,
    pub srcs: Vec<usize>,
    pub dst: usize,
    /// How each input's dx reaches its gradient, in `srcs` order.
    pub routes: Vec<Route>,
    /// Elements per sample of the input and the output.
    pub in_numel: usize,
    pub out_numel: usize,
    /// Registration indices of the layer's parameters (weight, then bias);
    /// a tied weight's is its owner's.
    pub params: Vec<usize>,
    /// The parameters the layer owns (all but a tied weight): DDP hears
    /// they are ready after its backward, a tied one after its owner's,
    /// which backward reaches later.
    pub ready: Vec<usize>,
    /// The host nodes it runs: one, or a fused group's members (`fused/`).
    pub nodes: std::ops::Range<usize>,
}

impl LayerPlan {
    /// Whether the backward runs: a dx is wanted or parameters learn.
    pub fn runs_backward(&self) -> bool {
        self.needs.grad == Grad::Backward
            && (self.routes.first() != Some(&Route::None) || !self.params.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub max_batch: usize,
    pub layers: Vec<LayerPlan>,
    /// Elements per sample of each activation (value); 0 is the input.
    pub acts: Vec<usize>,
    /// The buffer holding each activation, reused by liveness: a value
    /// lives from its producer's forward to its last reader's forward, or
    /// to the end of the step when a backward reads it (the logits and the
    /// input too), and a buffer no live value holds takes the next one.
    pub storage: Vec<usize>,
    /// Elements per sample of each activation buffer: its largest value.
    pub buffers: Vec<usize>,
    /// Elements per sample of the largest activation: the size of every
    /// gradient buffer, and of the scratch a dx is written to before it is
    /// added into a gradient ([`Route::Add`]).
    pub grad: usize,
    /// The gradient buffer of each activation buffer (`usize::MAX` for
    /// the input's, which is never computed), reused by liveness: a
    /// gradient lives from its last reader's backward to its producer's,
    /// so a chain ping-pongs between two buffers and each open residual
    /// holds one more.
    pub grad_buffer: Vec<usize>,
    /// How many gradient buffers that takes.
    pub grad_buffers: usize,
    /// Whether some layer's dx is added into a gradient ([`Route::Add`]
    /// from a backward), which takes the dx scratch.
    pub dx_scratch: bool,
    /// The workspace: each region's largest size over the layers.
    pub scratch: Scratch,
    /// Logits per sample are `[positions, classes]`: a language model's
    /// `[T, V]` (a label per position), else `[classes]` (positions 1).
    pub classes: usize,
    pub positions: usize,
    /// Whether a token embedding reads the model input's ids.
    pub tokens: bool,
}

impl Plan {
    /// The plan for `model` and batches of up to `max_batch`.
    pub fn new(model: &Model, max_batch: usize) -> Result<Plan> {
        if max_batch == 0 {
            return Err(Error::shape("device model: max_batch must be at least 1"));
        }
        if model.layers.len() != model.resolved.len() || model.layers.is_empty() {
            return Err(internal(format!(
                "{} layers but {} resolved descriptions",
                model.layers.len(),
                model.resolved.len()
            )));
        }
        let numel = |s: &[usize]| s.iter().product::<usize>();
        let mut plan = Plan {
            max_batch,
            layers: Vec::new(),
            acts: vec![numel(&model.resolved[0].in_shape)],
            grad: 0,
            storage: Vec::new(),
            buffers: Vec::new(),
            grad_buffer: Vec::new(),
            grad_buffers: 0,
            dx_scratch: false,
            scratch: Scratch::default(),
            classes: 0,
            positions: 1,
            tokens: false,
        };
        let o1 = model.precision.patch_conv_linear;
        let mut next_param = 0;
        let mut index_of: Vec<Vec<usize>> = Vec::with_capacity(model.layers.len());
        let mut layers = Vec::with_capacity(model.layers.len());
        // The activation buffer of each value (0 the input, i + 1 node i's output).
        let mut buffer_of = vec![0usize];
        for (node, (layer, r)) in model.layers.iter().zip(&model.resolved).enumerate() {
            let (in_numel, out_numel) = (numel(&r.in_shape), numel(&r.out_shape));
            // resolve reads only values made before, at least one, and
            // Model::new ties a weight only to an earlier node's parameter.
            let srcs: Vec<usize> = r.inputs.iter().map(|&v| buffer_of[v]).collect();
            let src = srcs[0];
            for &s in &srcs {
                if in_numel != plan.acts[s] {
                    return Err(internal(format!(
                        "layer {} takes {:?} but its input holds {} values",
                        r.name, r.in_shape, plan.acts[s]
                    )));
                }
            }
            // Registration indices: a tied weight is its owner's parameter.
            let (mut params, mut ready) = (Vec::new(), Vec::new());
            for k in 0..layer.weights.params.len() {
                match layer.tie.as_ref().filter(|t| t.slot == k) {
                    Some(t) => params.push(index_of[t.node][t.param]),
                    None => {
                        params.push(next_param);
                        ready.push(next_param);
                        next_param += 1;
                    }
                }
            }
            index_of.push(params.clone());
            let wrapped = o1.filter(|_| layer.kind.amp_class() == AmpClass::Fp16);
            let a = PlanArgs {
                name: &r.name,
                node,
                in_shape: &r.in_shape,
                out_shape: &r.out_shape,
                max_batch,
                compute: wrapped.unwrap_or(model.precision.input),
                model,
            };
            let (op, mut needs) = layer.kind.device_plan(&a)?;
            if wrapped.is_some() {
                needs = super::o1::needs(needs, &a, params.len())?;
            }
            let dst = if needs.grad == Grad::Alias {
                src
            } else {
                plan.acts.push(out_numel);
                plan.acts.len() - 1
            };
            layers.push(LayerPlan {
                name: r.name.clone(),
                op,
                needs,
                o1: wrapped.is_some(),
                src,
                routes: Vec::new(),
                srcs,
                dst,
                in_numel,
                out_numel,
                params,
                ready,
                nodes: node..node + 1,
            });
            buffer_of.push(dst);
        }
        plan.layers = super::fused::fuse(model, layers, plan.acts.len(), max_batch)?;
        plan.drop_unused_values();
        for lp in &plan.layers {
            plan.scratch.fit(&lp.needs.scratch);
            plan.tokens |= lp.needs.tokens;
        }
        plan.grad = plan.acts.iter().copied().max().unwrap_or(0);
        let out = &model.resolved[model.resolved.len() - 1].out_shape;
        plan.classes = out.last().copied().unwrap_or(1);
        plan.positions = plan.acts[plan.logits()] / plan.classes.max(1);
        plan.assign_grad_buffers();
        plan.assign_routes();
        plan.assign_storage();
        Ok(plan)
    }

    /// Renumbers the values, leaving out those no node reads or writes (a
    /// fused group's inner ones), so every value left has a buffer.
    fn drop_unused_values(&mut self) {
        let mut used = vec![false; self.acts.len()];
        used[0] = true;
        for lp in &self.layers {
            for &v in lp.srcs.iter().chain([&lp.dst]) {
                used[v] = true;
            }
        }
        let mut index = vec![usize::MAX; self.acts.len()];
        let mut acts = Vec::with_capacity(self.acts.len());
        for (v, &u) in used.iter().enumerate() {
            if u {
                index[v] = acts.len();
                acts.push(self.acts[v]);
            }
        }
        self.acts = acts;
        for lp in &mut self.layers {
            lp.src = index[lp.src];
            lp.dst = index[lp.dst];
            for s in &mut lp.srcs {
                *s = index[*s];
            }
        }
    }

    /// [`LayerPlan::routes`]: walks backward's order; the first dx into a
    /// value's gradient is written, a later reader's is added.
    fn assign_routes(&mut self) {
        let mut written = vec![false; self.acts.len()];
        written[self.logits()] = true;
        let mut dx_scratch = false;
        for lp in self.layers.iter_mut().rev() {
            lp.routes = match lp.needs.grad {
                Grad::Alias => vec![Route::None; lp.srcs.len()],
                Grad::Identity | Grad::Backward => lp
                    .srcs
                    .iter()
                    .map(|&s| match (s, written[s]) {
                        (0, _) => Route::None,
                        (_, true) => Route::Add,
                        (_, false) => {
                            written[s] = true;
                            Route::Write
                        }
                    })
                    .collect(),
            };
            dx_scratch |= lp.needs.grad == Grad::Backward && lp.routes.contains(&Route::Add);
        }
        self.dx_scratch = dx_scratch;
    }

    /// [`Plan::storage`]: walks forward's order; a node's output takes the
    /// smallest free buffer that holds it (else the largest free one,
    /// grown, else a new one) before its inputs are freed, so no kernel
    /// writes over what it reads.
    fn assign_storage(&mut self) {
        let end = self.layers.len();
        let mut last = vec![0usize; self.acts.len()];
        last[0] = end;
        let logits = self.logits();
        last[logits] = end;
        for (i, lp) in self.layers.iter().enumerate() {
            let (reads_x, reads_y) = (lp.needs.reads_input, lp.needs.reads_output);
            for &s in &lp.srcs {
                last[s] = last[s].max(if reads_x { end } else { i });
            }
            last[lp.dst] = last[lp.dst].max(if reads_y { end } else { i });
        }
        let mut storage = vec![usize::MAX; self.acts.len()];
        let (mut sizes, mut free) = (vec![self.acts[0]], Vec::<usize>::new());
        storage[0] = 0;
        for (i, lp) in self.layers.iter().enumerate() {
            if storage[lp.dst] == usize::MAX {
                let need = self.acts[lp.dst];
                let fits = free
                    .iter()
                    .enumerate()
                    .filter(|&(_, &b)| sizes[b] >= need)
                    .min_by_key(|&(_, &b)| sizes[b]);
                let pick =
                    fits.or_else(|| free.iter().enumerate().max_by_key(|&(_, &b)| sizes[b])).map(|(k, _)| k);
                storage[lp.dst] = match pick {
                    Some(k) => {
                        let b = free.swap_remove(k);
                        sizes[b] = sizes[b].max(need);
                        b
                    }
                    None => {
                        sizes.push(need);
                        sizes.len() - 1
                    }
                };
            }
            let mut dead: Vec<usize> =
                lp.srcs.iter().chain([&lp.dst]).copied().filter(|&v| last[v] == i).collect();
            dead.sort_unstable();
            dead.dedup();
            free.extend(dead.into_iter().map(|v| storage[v]));
        }
        self.storage = storage;
        self.buffers = sizes;
    }

    /// [`Plan::grad_buffer`]: walks backward's order, giving each gradient
    /// a free buffer when its first dx is written and freeing it once its
    /// producer has read it as dy.
    fn assign_grad_buffers(&mut self) {
        let mut of = vec![usize::MAX; self.acts.len()];
        let (mut free, mut count) = (Vec::new(), 0usize);
        let mut take = |free: &mut Vec<usize>| {
            free.pop().unwrap_or_else(|| {
                count += 1;
                count - 1
            })
        };
        of[self.logits()] = take(&mut free);
        for lp in self.layers.iter().rev() {
            // Flatten's dx is its dy, in the same buffer.
            if lp.needs.grad == Grad::Alias {
                continue;
            }
            for &s in lp.srcs.iter().filter(|&&s| s > 0) {
                if of[s] == usize::MAX {
                    of[s] = take(&mut free);
                }
            }
            if of[lp.dst] != usize::MAX {
                free.push(of[lp.dst]);
            }
        }
        self.grad_buffer = of;
        self.grad_buffers = count;
    }

    /// The activation buffer holding the logits.
    pub fn logits(&self) -> usize {
        self.layers.last().map_or(0, |l| l.dst)
    }
}

/// The dtype every activation has on the device (the amp input dtype: O1's
/// conv and linear cast their output back to it), after checking that the
/// model's parameters fit a combination the device path runs: conv and
/// linear weights in that dtype (O1: f32 with f16 compute), BatchNorm in
/// f32 or f16.
pub fn activation_dtype(model: &Model) -> Result<DType> {
    let act = model.precision.input;
    if let Some(dt) = model.precision.patch_conv_linear {
        if dt != DType::F16 || act != DType::F32 {
            return Err(Error::Unsupported(format!(
                "device model: conv and linear patched to {dt:?} on {act:?} inputs (apex O1 patches f32 models to f16)"
            )));
        }
    }
    for layer in &model.layers {
        if layer.kind.amp_class() != AmpClass::Fp16 {
            continue;
        }
        for p in &layer.weights.params {
            if p.value.dtype() != act {
                return Err(Error::Unsupported(format!(
                    "device model: {} is {:?} but the model's inputs are {:?} (amp casts them together)",
                    p.name,
                    p.value.dtype(),
                    act
                )));
            }
        }
    }
    Ok(act)
}

#[cfg(test)]
#[path = "tests_plan.rs"]
pub(crate) mod tests_plan;
