//! The device side of a layer: [`DeviceLayer`], which each layer type
//! implements in its folder (`nn/layers/<type>/cuda.rs`) beside its host
//! side, and what the model hands it. The registry (`nn/layers/mod.rs`)
//! turns the list of types into the dispatch, so a registered type without
//! a device side does not compile.
//!
//! The gradient rule is llm.c's: a layer's backward adds (`+=`) into its
//! parameters' `.grad` and writes (`=`) its dx; the step routes a dx into a
//! gradient that another reader has already written (a residual's input)
//! through a scratch buffer and an add.

pub use super::params::Grads;
use super::params::{wrong_dtype, DevElem, DeviceParams};
use super::workspace::Workspace;
use super::TrainHooks;
use crate::cuda::blas::{Blas, BlasElem};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::nn::{Model, Node};
use crate::rng::NodeDraws;
use crate::tensor::DType;
use cudarc::driver::{CudaView, CudaViewMut};
use half::f16;

/// An activation element type: f32 or f16.
pub trait Elem: DevElem + BlasElem + super::workspace::Region {
    /// `x` as f16 (apex O1's wrapper, `o1.rs`, runs conv and linear in f16;
    /// a copy for f16).
    fn cast_to_f16(gpu: &Gpu, x: &CudaView<'_, Self>, y: &mut CudaViewMut<'_, f16>) -> Result<()>;
    /// f16 `x` as `Self`.
    fn cast_from_f16(gpu: &Gpu, x: &CudaView<'_, f16>, y: &mut CudaViewMut<'_, Self>) -> Result<()>;
}

impl Elem for f32 {
    fn cast_to_f16(gpu: &Gpu, x: &CudaView<'_, f32>, y: &mut CudaViewMut<'_, f16>) -> Result<()> {
        crate::cuda::cast::f32_to_f16(gpu, x, y)
    }
    fn cast_from_f16(gpu: &Gpu, x: &CudaView<'_, f16>, y: &mut CudaViewMut<'_, f32>) -> Result<()> {
        crate::cuda::cast::f16_to_f32(gpu, x, y)
    }
}

impl Elem for f16 {
    fn cast_to_f16(gpu: &Gpu, x: &CudaView<'_, f16>, y: &mut CudaViewMut<'_, f16>) -> Result<()> {
        gpu.stream().memcpy_dtod(x, y).map_err(|e| Error::cuda("copying f16 values", e))
    }
    fn cast_from_f16(gpu: &Gpu, x: &CudaView<'_, f16>, y: &mut CudaViewMut<'_, f16>) -> Result<()> {
        Self::cast_to_f16(gpu, x, y)
    }
}

/// A device-plan error: the model and its device description disagree.
pub fn internal(msg: impl std::fmt::Display) -> Error {
    Error::internal(format!("device model: {msg}"))
}

/// What a layer's plan sees: the resolved node and the batch it is sized for.
pub struct PlanArgs<'a> {
    pub name: &'a str,
    /// The node's index in execution order (its random draws' stream).
    pub node: usize,
    pub in_shape: &'a [usize],
    pub out_shape: &'a [usize],
    pub max_batch: usize,
    /// The dtype the layer computes in: the activations', or f16 for a conv
    /// or linear under O1's wrapper.
    pub compute: DType,
    pub model: &'a Model,
}

impl PlanArgs<'_> {
    pub fn in_numel(&self) -> usize {
        self.in_shape.iter().product()
    }

    pub fn out_numel(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// The host node this plan is for.
    pub fn host(&self) -> &Node {
        &self.model.layers[self.node]
    }

    /// The dtype of the node's parameter `i` (a tied one's owner's).
    pub fn param_dtype(&self, i: usize) -> Result<DType> {
        Ok(self.model.param_value(self.node, i)?.dtype())
    }

    /// A plan error naming the layer and its shapes.
    pub fn bad(&self, what: impl std::fmt::Display) -> Error {
        internal(format!("{} {what}: {:?} to {:?}", self.name, self.in_shape, self.out_shape))
    }

    /// `[C, H, W]` of the input.
    pub fn chw(&self) -> Result<[usize; 3]> {
        match *self.in_shape {
            [c, h, w] => Ok([c, h, w]),
            _ => Err(self.bad("needs a [C, H, W] input")),
        }
    }
}

/// Scratch a layer uses while it runs, as lengths of typed regions in the
/// order it takes them from the [`Workspace`] (f32 ones and f16 ones each
/// counted apart). The model's workspace is the largest of each region over
/// its layers, allocated once before step 1.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scratch {
    pub f32: Vec<usize>,
    pub f16: Vec<usize>,
}

impl Scratch {
    /// One more region of `len` values of `dt`.
    pub fn push(&mut self, dt: DType, len: usize) -> &mut Self {
        match dt {
            DType::F32 => self.f32.push(len),
            DType::F16 => self.f16.push(len),
        }
        self
    }

    /// Grows each region to hold `other`'s too.
    pub fn fit(&mut self, other: &Scratch) {
        for (mine, theirs) in [(&mut self.f32, &other.f32), (&mut self.f16, &other.f16)] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (m, &t) in mine.iter_mut().zip(theirs) {
                *m = (*m).max(t);
            }
        }
    }
}

/// How a layer's dx reaches its inputs' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grad {
    /// Its backward computes dx (and its parameters' gradients).
    Backward,
    /// dx is dy for every input (the residual add): the step copies it or
    /// adds it into each input's gradient.
    Identity,
    /// Its output is its input's buffer (flatten): dx is dy, in place, and
    /// its forward launches nothing.
    Alias,
}

/// What a layer asks of the model's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Needs {
    /// Which activations its backward reads: whatever else it needs it keeps
    /// in its own state, so a value no backward reads is dead once its last
    /// reader's forward has run.
    pub reads_input: bool,
    pub reads_output: bool,
    pub grad: Grad,
    pub scratch: Scratch,
    /// It reads the model input's token ids (a token embedding).
    pub tokens: bool,
}

impl Needs {
    /// A layer whose backward reads neither activation and that needs no scratch.
    pub fn new() -> Needs {
        Needs {
            reads_input: false,
            reads_output: false,
            grad: Grad::Backward,
            scratch: Scratch::default(),
            tokens: false,
        }
    }

    pub fn reads_input(mut self) -> Self {
        self.reads_input = true;
        self
    }

    pub fn reads_output(mut self) -> Self {
        self.reads_output = true;
        self
    }

    pub fn grad(mut self, g: Grad) -> Self {
        self.grad = g;
        self
    }

    pub fn scratch(mut self, s: Scratch) -> Self {
        self.scratch = s;
        self
    }
}

impl Default for Needs {
    fn default() -> Self {
        Needs::new()
    }
}

/// What a layer's state is allocated from, once, before step 1.
pub struct StateArgs<'a> {
    pub gpu: &'a Gpu,
    pub node: &'a Node,
    pub max_batch: usize,
    /// The activations' dtype.
    pub act: DType,
    pub in_numel: usize,
    pub out_numel: usize,
}

/// A layer's parameters as its launches see them, by the layer's own index
/// (0 the weight, 1 the bias).
pub enum Params<'a> {
    /// The model's parameters, at the layer's registration indices (a tied
    /// weight's is its owner's).
    Model { all: &'a mut DeviceParams, ids: &'a [usize] },
    /// O1's f16 copies of an f32 layer's parameters (the backward casts the
    /// weight alone), and f16 gradients that the wrapper adds into the f32
    /// `.grad` afterwards.
    Half { values: Vec<CudaView<'a, f16>>, dw: CudaViewMut<'a, f16>, db: Option<CudaViewMut<'a, f16>> },
}

impl Params<'_> {
    /// How many parameters the layer has: a weight, and a bias or none.
    pub fn len(&self) -> usize {
        match self {
            Params::Model { ids, .. } => ids.len(),
            Params::Half { db, .. } => 1 + usize::from(db.is_some()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parameter `i`'s value.
    pub fn value<T: DevElem>(&self, i: usize) -> Result<CudaView<'_, T>> {
        match self {
            Params::Model { all, ids } => all.value::<T>(ids[i]),
            Params::Half { values, .. } => Ok(as_elem::<T>(&values[i])?.slice(..)),
        }
    }

    /// Runs `f` with the weight's value and the writable `.grad`s of the
    /// weight and the bias.
    pub fn with_weight_and_grads<T: DevElem, G: DevElem, R>(
        &mut self,
        f: impl FnOnce(&CudaView<'_, T>, Grads<'_, '_, G>) -> Result<R>,
    ) -> Result<R> {
        match self {
            Params::Model { all, ids } => all.with_value_and_grads(ids[0], weight_bias(ids), f),
            Params::Half { values, dw, db } => {
                let w = as_elem::<T>(&values[0])?;
                f(w, half_grads(dw, db)?)
            }
        }
    }

    /// Runs `f` with the writable `.grad`s of the weight and the bias.
    pub fn with_grads<G: DevElem, R>(&mut self, f: impl FnOnce(Grads<'_, '_, G>) -> Result<R>) -> Result<R> {
        match self {
            Params::Model { all, ids } => all.with_grads(weight_bias(ids), f),
            Params::Half { dw, db, .. } => f(half_grads(dw, db)?),
        }
    }
}

/// The registration indices of a layer's weight and bias.
fn weight_bias(ids: &[usize]) -> (usize, Option<usize>) {
    (ids[0], ids.get(1).copied())
}

/// An O1 f16 copy as a view of `T` (f16 only).
fn as_elem<'v, 'a, T: DevElem>(v: &'v CudaView<'a, f16>) -> Result<&'v CudaView<'a, T>> {
    T::from_f16(v).ok_or_else(|| wrong_dtype::<T>("an O1 parameter copy", DType::F16))
}

fn half_grads<'s, 'v, G: DevElem>(
    dw: &'s mut CudaViewMut<'v, f16>,
    db: &'s mut Option<CudaViewMut<'v, f16>>,
) -> Result<Grads<'s, 'v, G>> {
    let dw = G::from_f16_mut(dw).ok_or_else(|| wrong_dtype::<G>("an O1 gradient", DType::F16))?;
    let db = match db {
        Some(db) => Some(G::from_f16_mut(db).ok_or_else(|| wrong_dtype::<G>("an O1 gradient", DType::F16))?),
        None => None,
    };
    Ok((dw, db))
}

/// A layer's forward over a batch of `n` samples.
pub struct Forward<'a, A: Elem> {
    pub gpu: &'a Gpu,
    pub blas: &'a Blas,
    pub n: usize,
    /// Training mode (batch statistics, dropout), else evaluation.
    pub train: bool,
    /// The node's random draws for this micro-batch (dropout's mask).
    pub draws: NodeDraws,
    pub params: Params<'a>,
    /// The input (the first, for a join), and a join's others.
    pub x: CudaView<'a, A>,
    pub rest: Vec<CudaView<'a, A>>,
    pub y: CudaViewMut<'a, A>,
    pub ws: Workspace<'a>,
    /// The model input's token ids in f32 (one element unless a layer needs them).
    pub ids: CudaView<'a, f32>,
    pub hooks: &'a mut dyn TrainHooks,
}

/// A layer's backward over a batch of `n` samples.
pub struct Backward<'a, A: Elem> {
    pub gpu: &'a Gpu,
    pub blas: &'a Blas,
    pub n: usize,
    pub draws: NodeDraws,
    pub params: Params<'a>,
    /// The forward's input and output, where [`Needs`] asked for them.
    pub x: Option<CudaView<'a, A>>,
    pub y: Option<CudaView<'a, A>>,
    pub dy: CudaView<'a, A>,
    /// Where dx is written, when an input needs it.
    pub dx: Option<CudaViewMut<'a, A>>,
    /// The gradients of a fused group's other inputs (the residual add's
    /// second operand), in `srcs` order after the first; empty for a layer.
    pub rest: Vec<RestDx<'a, A>>,
    pub ws: Workspace<'a>,
    pub ids: CudaView<'a, f32>,
    pub hooks: &'a mut dyn TrainHooks,
}

/// How the dx of a fused group's later input reaches its gradient.
pub enum RestDx<'a, A> {
    /// No gradient (the model input's).
    None,
    /// The first dx into it: written (`=`).
    Write(CudaViewMut<'a, A>),
    /// Another reader's dx is there: added (`+=`).
    Add(CudaViewMut<'a, A>),
}

/// The first `K` of a join's other inputs (`Forward::rest`: the add's
/// second operand on), and any after them.
pub fn others<V, const K: usize>(mut rest: Vec<V>) -> Result<([V; K], Vec<V>)> {
    let more = rest.split_off(K.min(rest.len()));
    let n = rest.len();
    <[V; K]>::try_from(rest)
        .map(|first| (first, more))
        .map_err(|_| internal(format!("a join given {} inputs reads at least {}", n + 1, K + 1)))
}

/// What a backward reads (`Backward::x`, `y`, `dx`), or an error naming it
/// when its [`Needs`] did not ask for it.
pub fn read<V>(v: Option<V>, what: &str) -> Result<V> {
    v.ok_or_else(|| internal(format!("a backward used its {what} without planning for it")))
}

/// A normalization's parameter `i` as the f32 view its launchers take: the
/// value itself, or (f16 parameters: BatchNorm's O3, LayerNorm's O2) its
/// copy cast up into `scratch`.
pub fn f32_param<'b>(
    gpu: &Gpu,
    params: &'b Params<'_>,
    scratch: &'b mut CudaViewMut<'_, f32>,
    i: usize,
    dt: DType,
) -> Result<CudaView<'b, f32>> {
    match dt {
        DType::F32 => params.value::<f32>(i),
        DType::F16 => {
            crate::cuda::cast::f16_to_f32(gpu, &params.value::<f16>(i)?, scratch)?;
            Ok(scratch.as_view())
        }
    }
}

/// One layer type on the device. The plan is worked out on the host (no
/// GPU needed, so it is tested anywhere); the state is allocated once,
/// before step 1, and lives as long as the device model.
pub trait DeviceLayer {
    /// The sizes and flags its launches take, for batches of up to `max_batch`.
    type Plan: Clone + std::fmt::Debug + PartialEq;
    /// What it keeps on the device between forward and backward, and any
    /// buffers it owns (BatchNorm's running statistics).
    type State;

    /// Its plan and what it asks of the model's.
    fn plan(&self, a: &PlanArgs<'_>) -> Result<(Self::Plan, Needs)>;

    fn state(plan: &Self::Plan, a: &StateArgs<'_>) -> Result<Self::State>;

    fn forward<A: Elem>(plan: &Self::Plan, state: &mut Self::State, f: Forward<'_, A>) -> Result<()>;

    fn backward<A: Elem>(plan: &Self::Plan, state: &Self::State, b: Backward<'_, A>) -> Result<()>;

    /// Its buffers from the host node (BatchNorm's running statistics).
    fn upload(_state: &mut Self::State, _gpu: &Gpu, _node: &Node) -> Result<()> {
        Ok(())
    }

    /// Its buffers into the host node (waits for the stream).
    fn download(_state: &Self::State, _gpu: &Gpu, _node: &mut Node) -> Result<()> {
        Ok(())
    }

    /// The buffers a DDP replica keeps equal to rank 0's (broadcast_buffers).
    fn buffers_mut(_state: &mut Self::State) -> Vec<&mut super::params::DevBuf> {
        Vec::new()
    }
}
