//! What the device model allocates, worked out on the host from the layers
//! and their resolved shapes: activation buffers shared by values whose
//! lives do not overlap (Flatten's output is its input), gradient buffers
//! reused the same way, one im2col scratch for the largest conv, and the
//! per-layer state backward needs. Pure, so it is tested without a GPU.

use crate::error::{Error, Result};
use crate::nn::layers::{AmpClass, LayerKind};
use crate::nn::Model;
use crate::ops::avg_pool2d::AvgPool2dArgs;
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::out_size;
use crate::ops::embedding::cuda::Table;
use crate::tensor::DType;

/// One layer's device work.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `geom.n` is 0 here; each batch fills in its own.
    Conv {
        geom: ConvGeom,
        weight: usize,
        bias: Option<usize>,
    },
    /// `hw` is H*W of the input; `param_dtype` that of weight, bias and the
    /// running statistics (f16 under O3).
    BatchNorm {
        channels: usize,
        hw: usize,
        weight: usize,
        bias: usize,
        sync: bool,
        param_dtype: DType,
    },
    Relu,
    /// `shape` is the input's `[C, H, W]`.
    MaxPool {
        shape: [usize; 3],
        kernel: usize,
        stride: usize,
    },
    /// `shape` is the input's `[C, H, W]`; average pooling and global
    /// average pooling alike.
    AvgPool {
        shape: [usize; 3],
        args: AvgPool2dArgs,
    },
    Flatten,
    /// `nn.Dropout(p)`: its mask drawn from the node's Philox counters
    /// (`node` is its index in execution order), in forward and again in
    /// backward.
    Dropout {
        p: f64,
        node: usize,
    },
    /// The residual add of its inputs (`srcs`), same shape.
    Add,
    /// `rows` is how many rows of `in_features` a sample holds: 1 for
    /// `[in]`, T for a transformer's `[T, C]` (the same GEMM over `n * T` rows).
    Linear {
        in_features: usize,
        out_features: usize,
        rows: usize,
        weight: usize,
        bias: Option<usize>,
    },
    /// Token ids (the model input, as f32) or, with `positions`, the
    /// position of each of a sample's `rows` outputs.
    Embedding {
        table: Table,
        rows: usize,
        positions: bool,
        weight: usize,
    },
    /// Over the last `c` values of each row; `param_dtype` that of weight and
    /// bias (f16 under O2, run on f32 copies as the CPU widens them).
    LayerNorm {
        c: usize,
        eps: f32,
        weight: usize,
        bias: Option<usize>,
        param_dtype: DType,
    },
    Gelu {
        tanh: bool,
    },
    /// `[T, 3C]` to `[T, C]`; its softmax `[H, T, T]` kept for backward.
    /// `dropout_p` drops softmax probabilities with the mask of the node's
    /// Philox counters (`node`, as [`Step::Dropout`]).
    Attention {
        t: usize,
        c: usize,
        n_head: usize,
        dropout_p: f64,
        node: usize,
    },
}

impl Step {
    /// Which activations this step's backward reads: `(its inputs, its
    /// output)`. Whatever else it needs it keeps in its own state (pooling
    /// indices, BatchNorm's batch statistics, O1's f16 copy of a conv or
    /// linear input, dropout's counters), so a value no backward reads is
    /// dead once its last reader's forward has run.
    pub fn backward_reads(&self, o1: bool) -> (bool, bool) {
        match self {
            Step::Conv { .. } | Step::Linear { .. } => (!o1, false),
            Step::BatchNorm { .. } | Step::LayerNorm { .. } | Step::Gelu { .. } | Step::Attention { .. } => {
                (true, false)
            }
            // The ids it reads are the model input's f32 copy, kept all step.
            Step::Embedding { .. } => (false, false),
            Step::Relu => (false, true),
            Step::MaxPool { .. }
            | Step::AvgPool { .. }
            | Step::Flatten
            | Step::Dropout { .. }
            | Step::Add => (false, false),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    pub name: String,
    pub step: Step,
    /// The activations (values) read and written (0 is the model input);
    /// the same value for Flatten, which only renames the shape. `src` is
    /// the first of `srcs` (the one input of every layer but the add).
    /// [`Plan::storage`] says which buffer holds each.
    pub src: usize,
    pub srcs: Vec<usize>,
    pub dst: usize,
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
    /// added (`+=`) into the gradient of a value with several readers.
    pub grad: usize,
    /// The gradient buffer of each activation buffer (`usize::MAX` for
    /// the input's, which is never computed), reused by liveness: a
    /// gradient lives from its last reader's backward to its producer's,
    /// so a chain ping-pongs between two buffers and each open residual
    /// holds one more.
    pub grad_buffer: Vec<usize>,
    /// How many gradient buffers that takes.
    pub grad_buffers: usize,
    /// The im2col scratch and conv's swapped-dy scratch for `max_batch`,
    /// sized for the largest conv (0 without convs).
    pub col: usize,
    pub dy_t: usize,
    /// The largest conv/linear weight and bias (O1's per-call f16 copies).
    pub weight: usize,
    pub bias: usize,
    /// The most channels of any BatchNorm or LayerNorm (their f32 scratch).
    pub channels: usize,
    /// Logits per sample are `[positions, classes]`: a language model's
    /// `[T, V]` (a label per position), else `[classes]` (positions 1).
    pub classes: usize,
    pub positions: usize,
    /// The largest LayerNorm backward workspace for `max_batch` (f32s).
    pub ln_workspace: usize,
    /// The largest attention matrix per sample (`H * T * T`).
    pub att: usize,
    /// Whether a token embedding reads the model input's ids.
    pub tokens: bool,
}

fn internal(msg: String) -> Error {
    Error::internal(format!("device model plan: {msg}"))
}

fn chw(name: &str, shape: &[usize]) -> Result<[usize; 3]> {
    match *shape {
        [c, h, w] => Ok([c, h, w]),
        _ => Err(internal(format!("layer {name} needs a [C, H, W] input, got {shape:?}"))),
    }
}

/// An average pooling's step, its output checked against the resolved shape.
fn avg_pool(name: &str, in_shape: &[usize], out_shape: &[usize], args: AvgPool2dArgs) -> Result<Step> {
    let shape = chw(name, in_shape)?;
    let [c, h, w] = shape;
    let (oh, ow) = args.out_hw(h, w)?;
    if out_shape != [c, oh, ow] {
        return Err(internal(format!("avg_pool {name} gives {:?}, not {out_shape:?}", [c, oh, ow])));
    }
    Ok(Step::AvgPool { shape, args })
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
            layers: Vec::with_capacity(model.layers.len()),
            acts: vec![numel(&model.resolved[0].in_shape)],
            grad: 0,
            storage: Vec::new(),
            buffers: Vec::new(),
            grad_buffer: Vec::new(),
            grad_buffers: 0,
            col: 0,
            dy_t: 0,
            weight: 0,
            bias: 0,
            channels: 0,
            classes: 0,
            positions: 1,
            ln_workspace: 0,
            att: 0,
            tokens: false,
        };
        let mut next_param = 0;
        let mut index_of: Vec<Vec<usize>> = Vec::with_capacity(model.layers.len());
        // The activation buffer of each value (0 the input, i + 1 node i's output).
        let mut buffer_of = vec![0usize];
        for (node, (layer, r)) in model.layers.iter().zip(&model.resolved).enumerate() {
            let (in_numel, out_numel) = (numel(&r.in_shape), numel(&r.out_shape));
            let srcs = r
                .inputs
                .iter()
                .map(|&v| {
                    buffer_of.get(v).copied().ok_or_else(|| {
                        internal(format!("layer {} reads value {v}, which is not made before it", r.name))
                    })
                })
                .collect::<Result<Vec<usize>>>()?;
            let src = *srcs.first().ok_or_else(|| internal(format!("layer {} reads nothing", r.name)))?;
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
                    Some(t) => params.push(
                        index_of
                            .get(t.node)
                            .and_then(|ps: &Vec<usize>| ps.get(t.param))
                            .copied()
                            .ok_or_else(|| {
                                internal(format!("layer {} is tied to no earlier parameter", r.name))
                            })?,
                    ),
                    None => {
                        params.push(next_param);
                        ready.push(next_param);
                        next_param += 1;
                    }
                }
            }
            index_of.push(params.clone());
            let (weight, bias) = (params.first().copied(), params.get(1).copied());
            let step = match &layer.kind {
                LayerKind::Embedding(_)
                | LayerKind::LayerNorm(_)
                | LayerKind::Gelu(_)
                | LayerKind::CausalSelfAttention(_) => {
                    super::transformer::plan_step(&mut plan, model, node, r, weight, bias)?
                }
                LayerKind::Conv2d(conv) => {
                    let [c, h, wd] = chw(&r.name, &r.in_shape)?;
                    let (o, k, s, p) = (conv.out_channels, conv.kernel_size, conv.stride, conv.padding);
                    let (ho, wo) = (out_size(h, k, s, p), out_size(wd, k, s, p));
                    if conv.in_channels != c || ho * wo == 0 || r.out_shape != [o, ho, wo] {
                        return Err(internal(format!(
                            "conv {} ({conv}) does not take {:?} to {:?}",
                            r.name, r.in_shape, r.out_shape
                        )));
                    }
                    let geom = ConvGeom { n: 0, c, h, w: wd, o, k, stride: s, padding: p, ho, wo };
                    let batch = ConvGeom { n: max_batch, ..geom };
                    plan.col = plan.col.max(crate::ops::conv2d::cuda::col_len(&batch));
                    plan.dy_t = plan.dy_t.max(crate::ops::conv2d::cuda::dy_t_len(&batch));
                    let weight = weight.ok_or_else(|| internal(format!("conv {} has no weight", r.name)))?;
                    Step::Conv { geom, weight, bias }
                }
                LayerKind::BatchNorm2d(_) => {
                    let [c, h, w] = chw(&r.name, &r.in_shape)?;
                    let w_ = &layer.weights;
                    let weight_value = model.param_value(node, 0)?;
                    let dt = weight_value.dtype();
                    let same = [
                        w_.param(1, "batchnorm2d")?.value.dtype(),
                        w_.tensor(0, "batchnorm2d")?.dtype(),
                        w_.tensor(1, "batchnorm2d")?.dtype(),
                    ];
                    if same.iter().any(|&d| d != dt) || weight_value.numel() != c {
                        return Err(internal(format!(
                            "BatchNorm {} parameters and running statistics must be {c} values of one dtype",
                            r.name
                        )));
                    }
                    plan.channels = plan.channels.max(c);
                    let (Some(weight), Some(bias)) = (weight, bias) else {
                        return Err(internal(format!("BatchNorm {} has no weight and bias", r.name)));
                    };
                    Step::BatchNorm {
                        channels: c,
                        hw: h * w,
                        weight,
                        bias,
                        sync: layer.sync.is_some(),
                        param_dtype: dt,
                    }
                }
                LayerKind::Relu(_) => Step::Relu,
                LayerKind::MaxPool2d(pool) => {
                    let shape = chw(&r.name, &r.in_shape)?;
                    let [c, h, w] = shape;
                    let (kernel, stride) = (pool.kernel_size, pool.stride);
                    let out = crate::ops::max_pool2d::cuda::out_shape([max_batch, c, h, w], kernel, stride)?;
                    if out[1..] != r.out_shape[..] {
                        return Err(internal(format!(
                            "max_pool {} gives {:?}, not {:?}",
                            r.name, out, r.out_shape
                        )));
                    }
                    Step::MaxPool { shape, kernel, stride }
                }
                LayerKind::AvgPool2d(pool) => avg_pool(&r.name, &r.in_shape, &r.out_shape, pool.args())?,
                LayerKind::AdaptiveAvgPool2d(pool) => {
                    avg_pool(&r.name, &r.in_shape, &r.out_shape, pool.args())?
                }
                LayerKind::Flatten(_) => Step::Flatten,
                LayerKind::Dropout(d) => {
                    if out_numel != in_numel {
                        return Err(internal(format!(
                            "dropout {} of {:?} to {:?}",
                            r.name, r.in_shape, r.out_shape
                        )));
                    }
                    Step::Dropout { p: d.p, node }
                }
                LayerKind::Add(_) => {
                    if srcs.len() < 2 || out_numel != in_numel {
                        return Err(internal(format!(
                            "add {} of {} inputs {:?}",
                            r.name,
                            srcs.len(),
                            r.in_shape
                        )));
                    }
                    Step::Add
                }
                LayerKind::Linear(lin) => {
                    let (in_features, out_features) = (lin.in_features, lin.out_features);
                    let rows = in_numel / in_features.max(1);
                    if rows * in_features != in_numel || rows * out_features != out_numel {
                        return Err(internal(format!(
                            "linear {} ({lin}) does not take {:?} to {:?}",
                            r.name, r.in_shape, r.out_shape
                        )));
                    }
                    let weight =
                        weight.ok_or_else(|| internal(format!("linear {} has no weight", r.name)))?;
                    Step::Linear { in_features, out_features, rows, weight, bias }
                }
            };
            if let Step::Conv { .. } | Step::Linear { .. } = step {
                for (i, p) in layer.weights.params.iter().enumerate() {
                    let slot = if i == 0 { &mut plan.weight } else { &mut plan.bias };
                    *slot = (*slot).max(p.value.numel());
                }
            }
            let dst = if step == Step::Flatten {
                src
            } else {
                plan.acts.push(out_numel);
                plan.acts.len() - 1
            };
            plan.layers.push(LayerPlan {
                name: r.name.clone(),
                step,
                src,
                srcs,
                dst,
                in_numel,
                out_numel,
                params,
                ready,
            });
            buffer_of.push(dst);
        }
        plan.grad = plan.acts.iter().copied().max().unwrap_or(0);
        let out = &model.resolved[model.resolved.len() - 1].out_shape;
        plan.classes = out.last().copied().unwrap_or(1);
        plan.positions = plan.acts[plan.logits()] / plan.classes.max(1);
        plan.assign_grad_buffers();
        plan.assign_storage(model.precision.patch_conv_linear.is_some());
        Ok(plan)
    }

    /// [`Plan::storage`]: walks forward's order; a node's output takes the
    /// smallest free buffer that holds it (else the largest free one,
    /// grown, else a new one) before its inputs are freed, so no kernel
    /// writes over what it reads.
    fn assign_storage(&mut self, o1: bool) {
        let end = self.layers.len();
        let mut last = vec![0usize; self.acts.len()];
        last[0] = end;
        let logits = self.logits();
        last[logits] = end;
        for (i, lp) in self.layers.iter().enumerate() {
            let (reads_x, reads_y) = lp.step.backward_reads(o1);
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
            if lp.step == Step::Flatten {
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
