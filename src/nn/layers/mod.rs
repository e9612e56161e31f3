//! Every layer type, one folder each, holding everything about it. Its
//! `mod.rs`: config keys and defaults, shape inference and checks, its
//! parameters and buffers under PyTorch's `state_dict()` suffixes with
//! PyTorch's initialization, apex's precision class, its share of the memory
//! estimate, and its CPU forward and backward ([`Layer`]). Its `cuda.rs`:
//! its device side ([`DeviceLayer`]: the plan, the state it keeps on the
//! device, its forward and backward launches). The [`registry!`] at the
//! bottom turns the list of types into the enums the rest of the code
//! matches on ([`LayerKind`], [`LayerSpec`], [`LayerSaved`], [`DeviceOp`],
//! [`DeviceNode`]), with every dispatch written once here and no arm that a
//! new type could fall into silently: a type that lacks any part of
//! [`Layer`] or [`DeviceLayer`] does not compile.
//!
//! Adding a layer: its folder here and its line in `registry!` (which
//! declares the module), its kernel in `kernels/` (docs/ARCHITECTURE.md,
//! "Adding a layer", lists every place).

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::cuda::fused::{BnAddRelu, BnRelu, Fusion, Run};
use super::cuda::layer::{Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, StateArgs};
use super::cuda::params::DevBuf;
use super::{Node, Param, SyncGroup};
use crate::config::layers::RawLayer;
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::rng::NodeDraws;
use crate::tensor::Tensor;

/// A `state_dict()` entry that is not learned (BatchNorm's running statistics
/// and its `num_batches_tracked`).
#[derive(Debug, Clone)]
pub enum BufferValue {
    /// Floating point; cast with the layer's parameters by amp.
    Tensor(Tensor),
    /// An i64 scalar, never cast.
    Count(i64),
}

#[derive(Debug, Clone)]
pub struct Buffer {
    /// Full `state_dict()` name, e.g. `layer1.1.running_mean`.
    pub name: String,
    pub value: BufferValue,
}

/// A layer's parameters and buffers as the model holds them, each in
/// PyTorch's registration order. Everything that walks a model's state
/// (state_dict, DDP's broadcast, amp's cast, device upload and download,
/// checkpoints) walks these, whatever the layer type.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    pub params: Vec<Param>,
    pub buffers: Vec<Buffer>,
}

impl Weights {
    /// Parameter `i`, or an internal error naming the layer type.
    pub fn param(&self, i: usize, ty: &str) -> Result<&Param> {
        self.params.get(i).ok_or_else(|| Error::internal(format!("{ty} has no parameter {i}")))
    }

    /// Float buffer `i`.
    pub fn tensor(&self, i: usize, ty: &str) -> Result<&Tensor> {
        match self.buffers.get(i).map(|b| &b.value) {
            Some(BufferValue::Tensor(t)) => Ok(t),
            _ => Err(Error::internal(format!("{ty} has no tensor buffer {i}"))),
        }
    }
}

/// apex's view of a layer (its FP16_FUNCS / FP32_FUNCS lists and
/// `keep_batchnorm_fp32`): what O1 patches and what O2/O3 cast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmpClass {
    /// Conv and linear: O1 runs them in f16 (inputs and weights cast per
    /// call); O2 and O3 cast their weights with the model.
    Fp16,
    /// Batch normalization: weights and running statistics stay f32 under
    /// `keep_batchnorm_fp32`, else are cast with the model.
    BatchNorm,
    /// apex's FP32_FUNCS with weights (layer_norm, embedding): O1 leaves
    /// them f32; O2 and O3 cast their weights with the model (`model.half()`),
    /// and the op keeps its statistics in f32.
    Fp32,
    /// No parameters; computes in the dtype that reaches it.
    Passthrough,
    /// apex's promote functions (add): operands of different dtypes meet
    /// in the widest.
    Promote,
}

/// What a layer sees of the run besides its weights.
#[derive(Clone, Copy, Default)]
pub struct Ctx<'a> {
    /// Set for SyncBatchNorm: the ranks its statistics are reduced over.
    pub sync: Option<&'a SyncGroup>,
    /// The training forward's random draws for this node (dropout's mask):
    /// the model's [`crate::rng::Draws`] for the micro-batch, at the node's
    /// index. `None` outside a training forward.
    pub draws: Option<NodeDraws>,
    /// Set in a CPU backward that takes parameter gradients off its critical
    /// path (`nn/backward.rs`): a layer may hand them over here instead of
    /// computing them before it returns.
    pub defer: Option<&'a dyn Defer>,
}

/// A layer's parameter gradients left for later: given the node's `.grad`
/// tensors in parameter order, it accumulates into them.
pub type GradJob = Box<dyn FnOnce(&mut [Tensor]) -> Result<()> + Send>;

/// Runs a layer's parameter gradients off the critical path ([`Ctx::defer`]).
pub trait Defer {
    /// Starts `job` on the `.grad` tensors of `w`, which leave `w` until the
    /// job is done (the backward puts them back before anything reads them).
    /// Called once per layer backward, before the layer computes its dx, so
    /// that a core has the job to work on meanwhile.
    fn spawn(&self, w: &mut Weights, job: GradJob);
}

/// Sizes a layer's share of the memory estimate is computed from (bytes
/// and counts as u128; `None` from a method means the figure overflowed).
#[derive(Debug, Clone, Copy)]
pub struct MemoryArgs<'a> {
    pub in_shape: &'a [usize],
    pub out_shape: &'a [usize],
    /// Bytes per activation value (2 or 4).
    pub act: u128,
    pub batch: u128,
    /// CPU tasks that hold their own scratch.
    pub threads: u128,
    pub on_gpu: bool,
}

/// One layer type. The type itself is the resolved layer (its PyTorch
/// constructor arguments, input sizes included), made from its config table
/// by [`Layer::resolve`].
pub trait Layer: Clone + fmt::Debug + PartialEq + fmt::Display + Serialize {
    /// The keys of a `[[model.layers]]` table of this type, defaults filled in.
    type Config: Clone + fmt::Debug + PartialEq + Serialize;
    /// What backward needs from the training forward.
    type Saved;

    /// `type = "..."` in the config.
    const TYPE: &'static str;
    /// The keys a table of this type accepts (unknown-key messages list them).
    const KEYS: &'static [&'static str];
    /// The meanings of keys only this type takes, for `ddptrain keys`
    /// (docs/CONFIG.md): `(key, meaning)`. Keys several types share have
    /// theirs in `config/key_docs.rs`.
    const DOCS: &'static [(&'static str, &'static str)] = &[];

    /// The config from the table's keys, with PyTorch's defaults.
    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Self::Config, E>;

    /// The layer taking per-sample inputs of `shape`, and its output shape;
    /// errors name `key` (the table's config key) or one of its fields.
    fn resolve(cfg: &Self::Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)>;

    /// Learnable parameters as (suffix, shape), in registration order.
    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        Vec::new()
    }

    /// Buffers as (suffix, shape), in `state_dict()` order.
    fn buffers(&self) -> Vec<(&'static str, Vec<usize>)> {
        Vec::new()
    }

    /// PyTorch's initial parameter values (in [`Layer::params`] order) and
    /// buffers, drawn from `rng`; nothing for a layer without state.
    fn init(&self, _rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        Ok((Vec::new(), Vec::new()))
    }

    fn amp_class(&self) -> AmpClass;

    /// Whether SyncBatchNorm's conversion applies (its statistics are
    /// reduced across ranks).
    fn syncs_statistics(&self) -> bool {
        false
    }

    /// Bytes per sample that the training forward keeps for backward.
    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128>;

    /// Scratch the layer's kernels hold while it runs.
    fn scratch_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        Some(0)
    }

    /// Training-mode forward over a batch `[N, ...]`.
    fn forward_train(&self, w: &mut Weights, x: Tensor, cx: Ctx<'_>) -> Result<(Tensor, Self::Saved)>;

    /// Evaluation-mode forward.
    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor>;

    /// Accumulates the parameters' gradients (`+=` into `.grad`) and
    /// returns dx when `need_dx`.
    fn backward(
        &self,
        w: &mut Weights,
        saved: Self::Saved,
        dy: Tensor,
        need_dx: bool,
        cx: Ctx<'_>,
    ) -> Result<Option<Tensor>>;
}

/// An op of the graph's wiring that reads several values (the residual
/// add): no parameters, no config table, not a PyTorch module.
pub trait Join: Clone + fmt::Debug + PartialEq + fmt::Display + Serialize {
    type Saved;
    /// The node type `ddptrain check` shows.
    const TYPE: &'static str;

    /// How many values it reads.
    fn arity(&self) -> usize;

    fn amp_class(&self) -> AmpClass;

    /// Bytes per sample that the training forward keeps for backward.
    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128>;

    fn forward_train(&self, xs: Vec<Tensor>) -> Result<(Tensor, Self::Saved)>;

    fn forward_eval(&self, xs: Vec<Tensor>) -> Result<Tensor>;

    /// Each operand's dx, where `need_dx` asks for it.
    fn backward(&self, saved: Self::Saved, dy: Tensor, need_dx: &[bool]) -> Result<Vec<Option<Tensor>>>;
}

/// The one input of a layer that reads one value.
fn one(xs: Vec<Tensor>, ty: &str) -> Result<Tensor> {
    let n = xs.len();
    let mut xs = xs.into_iter();
    match (xs.next(), xs.next()) {
        (Some(x), None) => Ok(x),
        _ => Err(Error::internal(format!("{ty} given {n} inputs"))),
    }
}

/// `{ type = "...", name = "...", <the config's keys> }`, as written back by
/// `ddptrain check` and hashed into the config fingerprint.
#[derive(Serialize)]
struct Table<'a, C: Serialize> {
    #[serde(rename = "type")]
    ty: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(flatten)]
    cfg: &'a C,
    #[serde(skip_serializing_if = "Option::is_none")]
    tie: Option<&'a str>,
}

macro_rules! registry {
    (
        layers: [$($module:ident :: $Ty:ident),+ $(,)?],
        joins: [$($jmodule:ident :: $J:ident),+ $(,)?],
        fused: [$($F:ident),+ $(,)?] $(,)?
    ) => {
        $(pub mod $module; pub use $module::$Ty;)+
        $(pub mod $jmodule; pub use $jmodule::$J;)+

        /// A resolved node of any registered type: a layer, or a join of the graph.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum LayerKind {
            $($Ty($module::$Ty),)+
            $($J($jmodule::$J),)+
        }

        /// The config table of a layer of any registered type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum LayerSpec {
            $($Ty(<$module::$Ty as Layer>::Config)),+
        }

        /// What the backward of a node of any registered type needs.
        pub enum LayerSaved {
            $($Ty(<$module::$Ty as Layer>::Saved),)+
            $($J(<$jmodule::$J as Join>::Saved),)+
        }

        /// Every layer `type`, in registry order (error messages list them).
        pub const TYPES: &[&str] = &[$(<$module::$Ty as Layer>::TYPE),+];

        impl LayerSpec {
            /// The keys a table of layer type `ty` accepts; `None` for no layer type.
            pub fn keys(ty: &str) -> Option<&'static [&'static str]> {
                $(if ty == <$module::$Ty as Layer>::TYPE {
                    return Some(<$module::$Ty as Layer>::KEYS);
                })+
                None
            }

            /// The meanings layer type `ty` gives its own keys ([`Layer::DOCS`]).
            pub fn docs(ty: &str) -> &'static [(&'static str, &'static str)] {
                $(if ty == <$module::$Ty as Layer>::TYPE {
                    return <$module::$Ty as Layer>::DOCS;
                })+
                &[]
            }

            /// The config of layer type `ty` from a table's keys; `None` for no layer type.
            pub fn from_raw<E: serde::de::Error>(ty: &str, raw: &RawLayer) -> Option<Result<Self, E>> {
                $(if ty == <$module::$Ty as Layer>::TYPE {
                    return Some(<$module::$Ty as Layer>::config(raw).map(LayerSpec::$Ty));
                })+
                None
            }

            pub fn type_name(&self) -> &'static str {
                match self {
                    $(LayerSpec::$Ty(_) => <$module::$Ty as Layer>::TYPE),+
                }
            }

            /// The layer for per-sample inputs of `shape`, and its output shape.
            pub fn resolve(&self, shape: &[usize], key: &str) -> Result<(LayerKind, Vec<usize>)> {
                match self {
                    $(LayerSpec::$Ty(c) => {
                        let (l, out) = <$module::$Ty as Layer>::resolve(c, shape, key)?;
                        Ok((LayerKind::$Ty(l), out))
                    })+
                }
            }

            /// The table as written back, `name` included.
            pub fn serialize_table<S: serde::Serializer>(&self, name: Option<&str>, tie: Option<&str>, s: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(LayerSpec::$Ty(cfg) => Table { ty: <$module::$Ty as Layer>::TYPE, name, cfg, tie }.serialize(s)),+
                }
            }
        }

        impl LayerKind {
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(LayerKind::$Ty(_) => <$module::$Ty as Layer>::TYPE,)+
                    $(LayerKind::$J(_) => <$jmodule::$J as Join>::TYPE,)+
                }
            }

            /// How many values the node reads.
            pub fn arity(&self) -> usize {
                match self {
                    $(LayerKind::$Ty(_) => 1,)+
                    $(LayerKind::$J(j) => j.arity(),)+
                }
            }

            pub fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
                match self {
                    $(LayerKind::$Ty(l) => l.params(),)+
                    $(LayerKind::$J(_) => Vec::new(),)+
                }
            }

            pub fn buffers(&self) -> Vec<(&'static str, Vec<usize>)> {
                match self {
                    $(LayerKind::$Ty(l) => l.buffers(),)+
                    $(LayerKind::$J(_) => Vec::new(),)+
                }
            }

            pub fn amp_class(&self) -> AmpClass {
                match self {
                    $(LayerKind::$Ty(l) => l.amp_class(),)+
                    $(LayerKind::$J(j) => j.amp_class(),)+
                }
            }

            pub fn syncs_statistics(&self) -> bool {
                match self {
                    $(LayerKind::$Ty(l) => l.syncs_statistics(),)+
                    $(LayerKind::$J(_) => false,)+
                }
            }

            pub fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
                match self {
                    $(LayerKind::$Ty(l) => l.saved_bytes(m),)+
                    $(LayerKind::$J(j) => j.saved_bytes(m),)+
                }
            }

            pub fn scratch_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
                match self {
                    $(LayerKind::$Ty(l) => l.scratch_bytes(m),)+
                    $(LayerKind::$J(_) => Some(0),)+
                }
            }

            /// Parameters and buffers named under module path `path`, initialized from `rng`.
            pub fn init_weights(&self, path: &str, rng: &mut ChaCha8Rng) -> Result<Weights> {
                let (values, buffers) = match self {
                    $(LayerKind::$Ty(l) => l.init(rng)?,)+
                    $(LayerKind::$J(_) => (Vec::new(), Vec::new()),)+
                };
                let (pspec, bspec) = (self.params(), self.buffers());
                if values.len() != pspec.len() || buffers.len() != bspec.len() {
                    return Err(Error::internal(format!("{} initialized the wrong number of tensors", self.type_name())));
                }
                Ok(Weights {
                    params: pspec.iter().zip(values).map(|((s, _), v)| Param::new(format!("{path}.{s}"), v)).collect(),
                    buffers: bspec
                        .iter()
                        .zip(buffers)
                        .map(|((s, _), value)| Buffer { name: format!("{path}.{s}"), value })
                        .collect(),
                })
            }

            pub fn forward_train(&self, w: &mut Weights, xs: Vec<Tensor>, cx: Ctx<'_>) -> Result<(Tensor, LayerSaved)> {
                match self {
                    $(LayerKind::$Ty(l) => {
                        let (y, s) = l.forward_train(w, one(xs, <$module::$Ty as Layer>::TYPE)?, cx)?;
                        Ok((y, LayerSaved::$Ty(s)))
                    })+
                    $(LayerKind::$J(j) => {
                        let (y, s) = j.forward_train(xs)?;
                        Ok((y, LayerSaved::$J(s)))
                    })+
                }
            }

            pub fn forward_eval(&self, w: &Weights, xs: Vec<Tensor>) -> Result<Tensor> {
                match self {
                    $(LayerKind::$Ty(l) => l.forward_eval(w, one(xs, <$module::$Ty as Layer>::TYPE)?),)+
                    $(LayerKind::$J(j) => j.forward_eval(xs),)+
                }
            }

            /// The parameters' gradients accumulated, and each input's dx where `need_dx` asks.
            pub fn backward(
                &self,
                w: &mut Weights,
                saved: LayerSaved,
                dy: Tensor,
                need_dx: &[bool],
                cx: Ctx<'_>,
            ) -> Result<Vec<Option<Tensor>>> {
                match (self, saved) {
                    $((LayerKind::$Ty(l), LayerSaved::$Ty(s)) => {
                        let need = need_dx.first().copied().unwrap_or(false);
                        Ok(vec![l.backward(w, s, dy, need, cx)?])
                    })+
                    $((LayerKind::$J(j), LayerSaved::$J(s)) => j.backward(s, dy, need_dx),)+
                    #[allow(unreachable_patterns)]
                    (kind, _) => Err(Error::internal(format!(
                        "{} backward was handed another node type's saved state", kind.type_name()
                    ))),
                }
            }
        }

        /// A node's device plan (`nn/layers/<type>/cuda.rs`), made on the host.
        #[derive(Debug, Clone, PartialEq)]
        pub enum DeviceOp {
            $($Ty(<$module::$Ty as DeviceLayer>::Plan),)+
            $($J(<$jmodule::$J as DeviceLayer>::Plan),)+
            $($F(<$F as DeviceLayer>::Plan),)+
        }

        /// A node of the device model: its plan and the state it keeps on the device.
        pub enum DeviceNode {
            $($Ty(<$module::$Ty as DeviceLayer>::Plan, <$module::$Ty as DeviceLayer>::State),)+
            $($J(<$jmodule::$J as DeviceLayer>::Plan, <$jmodule::$J as DeviceLayer>::State),)+
            $($F(<$F as DeviceLayer>::Plan, <$F as DeviceLayer>::State),)+
        }

        /// The first fused group (`nn/cuda/fused/`) whose rule takes the run
        /// at its head: its plan, its needs and how many nodes it spans.
        pub fn fuse_at(run: &Run<'_>) -> Result<Option<(DeviceOp, Needs, usize)>> {
            $(if let Some((g, len)) = <$F as Fusion>::matches(run) {
                let name = run.name(len);
                if let Some(a) = run.args(len, &name) {
                    let (p, needs) = g.plan(&a)?;
                    return Ok(Some((DeviceOp::$F(p), needs, len)));
                }
            })+
            Ok(None)
        }

        impl LayerKind {
            /// The node's device plan and what it asks of the model's.
            pub fn device_plan(&self, a: &PlanArgs<'_>) -> Result<(DeviceOp, Needs)> {
                match self {
                    $(LayerKind::$Ty(l) => l.plan(a).map(|(p, n)| (DeviceOp::$Ty(p), n)),)+
                    $(LayerKind::$J(j) => j.plan(a).map(|(p, n)| (DeviceOp::$J(p), n)),)+
                }
            }
        }

        impl DeviceOp {
            /// The node with its device state, allocated.
            pub fn allocate(self, a: &StateArgs<'_>) -> Result<DeviceNode> {
                match self {
                    $(DeviceOp::$Ty(p) => {
                        let s = <$module::$Ty as DeviceLayer>::state(&p, a)?;
                        Ok(DeviceNode::$Ty(p, s))
                    })+
                    $(DeviceOp::$J(p) => {
                        let s = <$jmodule::$J as DeviceLayer>::state(&p, a)?;
                        Ok(DeviceNode::$J(p, s))
                    })+
                    $(DeviceOp::$F(p) => {
                        let s = <$F as DeviceLayer>::state(&p, a)?;
                        Ok(DeviceNode::$F(p, s))
                    })+
                }
            }
        }

        impl DeviceNode {
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(DeviceNode::$Ty(..) => <$module::$Ty as Layer>::TYPE,)+
                    $(DeviceNode::$J(..) => <$jmodule::$J as Join>::TYPE,)+
                    $(DeviceNode::$F(..) => <$F as Fusion>::TYPE,)+
                }
            }

            pub fn forward<A: Elem>(&mut self, f: Forward<'_, A>) -> Result<()> {
                match self {
                    $(DeviceNode::$Ty(p, s) => <$module::$Ty as DeviceLayer>::forward(p, s, f),)+
                    $(DeviceNode::$J(p, s) => <$jmodule::$J as DeviceLayer>::forward(p, s, f),)+
                    $(DeviceNode::$F(p, s) => <$F as DeviceLayer>::forward(p, s, f),)+
                }
            }

            pub fn backward<A: Elem>(&self, b: Backward<'_, A>) -> Result<()> {
                match self {
                    $(DeviceNode::$Ty(p, s) => <$module::$Ty as DeviceLayer>::backward(p, s, b),)+
                    $(DeviceNode::$J(p, s) => <$jmodule::$J as DeviceLayer>::backward(p, s, b),)+
                    $(DeviceNode::$F(p, s) => <$F as DeviceLayer>::backward(p, s, b),)+
                }
            }

            pub fn upload(&mut self, gpu: &Gpu, node: &Node) -> Result<()> {
                match self {
                    $(DeviceNode::$Ty(_, s) => <$module::$Ty as DeviceLayer>::upload(s, gpu, node),)+
                    $(DeviceNode::$J(_, s) => <$jmodule::$J as DeviceLayer>::upload(s, gpu, node),)+
                    $(DeviceNode::$F(_, s) => <$F as DeviceLayer>::upload(s, gpu, node),)+
                }
            }

            pub fn download(&self, gpu: &Gpu, node: &mut Node) -> Result<()> {
                match self {
                    $(DeviceNode::$Ty(_, s) => <$module::$Ty as DeviceLayer>::download(s, gpu, node),)+
                    $(DeviceNode::$J(_, s) => <$jmodule::$J as DeviceLayer>::download(s, gpu, node),)+
                    $(DeviceNode::$F(_, s) => <$F as DeviceLayer>::download(s, gpu, node),)+
                }
            }

            pub fn buffers_mut(&mut self) -> Vec<&mut DevBuf> {
                match self {
                    $(DeviceNode::$Ty(_, s) => <$module::$Ty as DeviceLayer>::buffers_mut(s),)+
                    $(DeviceNode::$J(_, s) => <$jmodule::$J as DeviceLayer>::buffers_mut(s),)+
                    $(DeviceNode::$F(_, s) => <$F as DeviceLayer>::buffers_mut(s),)+
                }
            }
        }

        /// PyTorch's module repr, e.g. `Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1))`.
        impl fmt::Display for LayerKind {
            fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
                match self {
                    $(LayerKind::$Ty(l) => fmt::Display::fmt(l, f),)+
                    $(LayerKind::$J(j) => fmt::Display::fmt(j, f),)+
                }
            }
        }
    };
}

registry! {
    layers: [
        conv2d::Conv2d,
        batchnorm2d::BatchNorm2d,
        relu::Relu,
        maxpool2d::MaxPool2d,
        avgpool2d::AvgPool2d,
        adaptive_avgpool2d::AdaptiveAvgPool2d,
        flatten::Flatten,
        linear::Linear,
        dropout::Dropout,
        embedding::Embedding,
        layernorm::LayerNorm,
        rmsnorm::RmsNorm,
        gelu::Gelu,
        attention::CausalSelfAttention,
    ],
    joins: [add::Add],
    fused: [BnAddRelu, BnRelu],
}

impl LayerKind {
    /// Number of learnable scalars.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
}

/// `v` must be at least 1, else an error naming `key.field`.
pub(crate) fn positive(v: usize, key: &str, field: &str) -> Result<()> {
    if v == 0 {
        return Err(config_err(format!("{key}.{field}"), "must be at least 1"));
    }
    Ok(())
}

/// A `[model]` error; `config::model` replaces the placeholder file with the real source.
pub(crate) fn config_err(key: impl Into<String>, msg: impl Into<String>) -> Error {
    Error::config(crate::config::model::MODEL_FILE, key, msg)
}

/// `[C, H, W]`, or an error naming the layer type that needs it.
pub(crate) fn chw(shape: &[usize], ty: &str, key: &str) -> Result<(usize, usize, usize)> {
    match *shape {
        [c, h, w] => Ok((c, h, w)),
        _ => Err(config_err(key, format!("{ty} needs a [C, H, W] input, but its input is {shape:?}"))),
    }
}

pub(crate) use crate::config::memory::mul;

/// The element count of `shape` as u128.
pub(crate) fn numel128(shape: &[usize]) -> Option<u128> {
    mul(&shape.iter().map(|&d| d as u128).collect::<Vec<_>>())
}
