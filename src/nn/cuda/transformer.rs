//! The transformer layers of [`super::model::GpuModel`] (embedding,
//! LayerNorm, GELU, causal self-attention): their plan steps, the state
//! backward reads, and forward and backward over the model's buffers, the
//! device twins of the layers in src/nn/layers with the CPU's amp rules.
//! LayerNorm with f16 parameters (O2) runs on f32 copies and rounds its
//! gradients back once, as `ops::layer_norm` widens them on the CPU.

use super::acts::Acts;
use super::layers::{f32_param, internal, io, no_state, slice, slice_mut, view, view_mut, Ctx, LayerState};
use super::model::{BnScratch, Elem};
use super::params::DevBuf;
use super::plan::{LayerPlan, Plan, Step};
use crate::config::model::ResolvedLayer;
use crate::cuda::{cast, Gpu};
use crate::error::Result;
use crate::nn::layers::LayerKind;
use crate::nn::Model;
use crate::ops::attention::cpu::Dims;
use crate::ops::attention::cuda as attk;
use crate::ops::dropout::Mask;
use crate::ops::embedding::cuda::{self as embk, Lookup, Table};
use crate::ops::gelu::cuda as gelk;
use crate::ops::layer_norm::cuda::{self as lnk, Affine, Rows, SavedStats};
use crate::tensor::DType;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;

/// The scratch the transformer layers share: the model input's token ids
/// in f32 (whatever the activation dtype: an id above 2048 has no f16),
/// LayerNorm's backward partial sums, and attention's backward scores.
pub(super) struct TransformerScratch {
    pub ids: CudaSlice<f32>,
    pub ln_workspace: CudaSlice<f32>,
    pub att_workspace: DevBuf,
}

/// A LayerNorm's per-row mean and 1/sqrt(var + eps) of the last training forward.
pub(super) struct LnState {
    mean: CudaSlice<f32>,
    rstd: CudaSlice<f32>,
}

impl LnState {
    pub fn new(gpu: &Gpu, rows: usize) -> Result<Self> {
        Ok(LnState { mean: super::model::alloc(gpu, rows)?, rstd: super::model::alloc(gpu, rows)? })
    }
}

/// The step of transformer layer `node` (resolved as `r`), growing the
/// plan's scratch sizes to fit it.
pub(super) fn plan_step(
    plan: &mut Plan,
    model: &Model,
    node: usize,
    r: &ResolvedLayer,
    weight: Option<usize>,
    bias: Option<usize>,
) -> Result<Step> {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let (in_numel, out_numel) = (numel(&r.in_shape), numel(&r.out_shape));
    let bad =
        |what: String| internal(format!("plan: {} {what}: {:?} to {:?}", r.name, r.in_shape, r.out_shape));
    let weight = || weight.ok_or_else(|| internal(format!("plan: {} has no weight", r.name)));
    match &r.kind {
        LayerKind::Embedding(e) => {
            let table = Table { num_embeddings: e.num_embeddings, dim: e.embedding_dim };
            if out_numel != in_numel * e.embedding_dim {
                return Err(bad(format!("embedding of width {}", e.embedding_dim)));
            }
            plan.tokens |= !e.positions;
            Ok(Step::Embedding { table, rows: in_numel, positions: e.positions, weight: weight()? })
        }
        LayerKind::LayerNorm(ln) => {
            let c = ln.normalized_shape;
            let rows = in_numel / c.max(1);
            if rows * c != in_numel || out_numel != in_numel {
                return Err(bad(format!("layernorm over {c}")));
            }
            plan.channels = plan.channels.max(c);
            let batch = Rows { rows: plan.max_batch * rows, c };
            plan.ln_workspace = plan.ln_workspace.max(lnk::backward_workspace_len(batch));
            let param_dtype = model.param_value(node, 0)?.dtype();
            Ok(Step::LayerNorm { c, eps: ln.eps, weight: weight()?, bias, param_dtype })
        }
        LayerKind::Gelu(g) => Ok(Step::Gelu { tanh: g.approximate == "tanh" }),
        LayerKind::CausalSelfAttention(a) => {
            let (c, n_head) = (a.n_embd, a.n_head);
            let t = r.in_shape.first().copied().unwrap_or(0);
            if r.in_shape != [t, 3 * c] || r.out_shape != [t, c] || n_head == 0 || c % n_head != 0 {
                return Err(bad(format!("attention of width {c} over {n_head} heads")));
            }
            plan.att = plan.att.max(n_head * t * t);
            Ok(Step::Attention { t, c, n_head, dropout_p: a.dropout_p, node })
        }
        other => Err(internal(format!("plan: {} is not a transformer layer", other.type_name()))),
    }
}

/// Forward of a transformer layer over `n` samples; `train` turns
/// attention dropout on (the others have no training-mode difference).
pub(super) fn forward<A: Elem>(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    state: &mut LayerState,
    acts: &mut Acts<'_>,
    n: usize,
    train: bool,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    match (&lp.step, state) {
        (&Step::Embedding { table, rows, positions, weight }, _) => {
            let (_, mut y) = io::<A>(acts, lp, n)?;
            let w = ctx.params.value::<A>(weight)?;
            let ids = slice(&ctx.tf.ids, n * rows)?;
            embk::forward(gpu, lookup(&ids, n, rows, positions), &w, table, &mut y)
        }
        (&Step::LayerNorm { c, eps, weight, bias, param_dtype }, state) => {
            let LayerState::LayerNorm(s) = state else { return Err(no_state(lp)) };
            let (x, mut y) = io::<A>(acts, lp, n)?;
            let rows = n * lp.in_numel / c;
            let BnScratch { weight: ws, bias: bs, .. } = &mut *ctx.bn;
            let w = f32_param(gpu, ctx.params, ws, weight, c, param_dtype)?;
            let b = bias.map(|b| f32_param(gpu, ctx.params, bs, b, c, param_dtype)).transpose()?;
            let saved = SavedStats {
                mean: &mut slice_mut(&mut s.mean, rows)?,
                rstd: &mut slice_mut(&mut s.rstd, rows)?,
            };
            let params = Affine { weight: &w, bias: b.as_ref() };
            lnk::forward(gpu, &x, Rows { rows, c }, params, eps, &mut y, saved)
        }
        (&Step::Gelu { tanh }, _) => {
            let (x, mut y) = io::<A>(acts, lp, n)?;
            gelk::forward(gpu, &x, &mut y, tanh)
        }
        (&Step::Attention { t, c, n_head, dropout_p, node }, state) => {
            let LayerState::Attention(att) = state else { return Err(no_state(lp)) };
            let (x, mut y) = io::<A>(acts, lp, n)?;
            let len = n * n_head * t * t;
            let mut att = view_mut::<A>(att, len)?;
            // Backward's workspace is free during forward: it holds the dropped softmax.
            let mask = Mask::new(dropout_p, ctx.draws.node(node));
            let mut ws = view_mut::<A>(&mut ctx.tf.att_workspace, len)?;
            let dropout =
                (train && dropout_p > 0.0).then_some(attk::Dropout { mask: &mask, workspace: &mut ws });
            attk::forward(gpu, blas, &x, Dims { n, t, c, h: n_head }, &mut y, &mut att, dropout)
        }
        (other, _) => Err(internal(format!("{other:?} run as a transformer layer"))),
    }
}

fn lookup<'a, 'b>(ids: &'a CudaView<'b, f32>, n: usize, rows: usize, positions: bool) -> Lookup<'a, 'b> {
    if positions {
        Lookup::Positions { rows: n * rows, t: rows }
    } else {
        Lookup::Tokens(ids)
    }
}

/// Backward of a transformer layer: parameter gradients added into
/// `.grad`, and dx written into `dx` (an embedding has none: its input is
/// the model's ids).
pub(super) fn backward<A: Elem>(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    state: &LayerState,
    acts: &Acts<'_>,
    dy: &CudaView<'_, A>,
    dx: Option<&mut CudaViewMut<'_, A>>,
    n: usize,
) -> Result<()> {
    let (gpu, blas) = (ctx.gpu, ctx.blas);
    match (&lp.step, state) {
        (&Step::Embedding { table, rows, positions, weight }, _) => {
            let ids = slice(&ctx.tf.ids, n * rows)?;
            ctx.params.with_grads::<A, ()>(&[weight], |g| {
                embk::backward(gpu, lookup(&ids, n, rows, positions), dy, table, &mut g[0])
            })
        }
        (Step::LayerNorm { .. }, state) => {
            let LayerState::LayerNorm(s) = state else { return Err(no_state(lp)) };
            let x = view::<A>(acts.get(lp.src)?, n * lp.in_numel)?;
            ln_backward(ctx, lp, s, &x, dy, dx_of(lp, dx)?, n)
        }
        (&Step::Gelu { tanh }, _) => {
            let x = view::<A>(acts.get(lp.src)?, n * lp.in_numel)?;
            gelk::backward(gpu, &x, dy, dx_of(lp, dx)?, tanh)
        }
        (&Step::Attention { t, c, n_head, dropout_p, node }, state) => {
            let LayerState::Attention(att) = state else { return Err(no_state(lp)) };
            let qkv = view::<A>(acts.get(lp.src)?, n * lp.in_numel)?;
            let len = n * n_head * t * t;
            let att = view::<A>(att, len)?;
            let mut ws = view_mut::<A>(&mut ctx.tf.att_workspace, len)?;
            let mask = (dropout_p > 0.0).then(|| Mask::new(dropout_p, ctx.draws.node(node)));
            let d = Dims { n, t, c, h: n_head };
            attk::backward(gpu, blas, &qkv, &att, d, dy, dx_of(lp, dx)?, &mut ws, mask.as_ref())
        }
        (other, _) => Err(internal(format!("{other:?} run as a transformer layer"))),
    }
}

fn dx_of<'d, 'v, A>(
    lp: &LayerPlan,
    dx: Option<&'d mut CudaViewMut<'v, A>>,
) -> Result<&'d mut CudaViewMut<'v, A>> {
    dx.ok_or_else(|| internal(format!("{} backward without dx", lp.name)))
}

fn ln_backward<A: Elem>(
    ctx: &mut Ctx<'_>,
    lp: &LayerPlan,
    s: &LnState,
    x: &CudaView<'_, A>,
    dy: &CudaView<'_, A>,
    dx: &mut CudaViewMut<'_, A>,
    n: usize,
) -> Result<()> {
    let Step::LayerNorm { c, weight, bias, param_dtype, .. } = lp.step else {
        return Err(no_state(lp));
    };
    let gpu = ctx.gpu;
    let rows = n * lp.in_numel / c;
    let shape = Rows { rows, c };
    let (mean, rstd) = (slice(&s.mean, rows)?, slice(&s.rstd, rows)?);
    let saved = SavedStats { mean: &mean, rstd: &rstd };
    let mut ws = slice_mut(&mut ctx.tf.ln_workspace, lnk::backward_workspace_len(shape))?;
    let BnScratch { weight: w32, dweight, dbias, .. } = &mut *ctx.bn;
    let ids: Vec<usize> = std::iter::once(weight).chain(bias).collect();
    match param_dtype {
        DType::F32 => ctx.params.with_params::<f32, f32, ()>(&[weight], &ids, |w, g| {
            let (dw, db) = super::layers::weight_and_bias(g)?;
            let grads = Affine { weight: dw, bias: db };
            lnk::backward(gpu, x, shape, &w[0], saved, dy, dx, grads, &mut ws)
        }),
        // f16 .grad (O2): accumulated in f32, rounded once.
        DType::F16 => {
            cast::f16_to_f32(gpu, &ctx.params.value::<f16>(weight)?, &mut slice_mut(w32, c)?)?;
            let w = slice(w32, c)?;
            ctx.params.with_grads::<f16, ()>(&ids, |g| {
                let (dw, db) = super::layers::weight_and_bias(g)?;
                let (mut dw32, mut db32) = (slice_mut(dweight, c)?, slice_mut(dbias, c)?);
                cast::f16_to_f32(gpu, &*dw, &mut dw32)?;
                if let Some(db) = &db {
                    cast::f16_to_f32(gpu, &**db, &mut db32)?;
                }
                let grads = Affine { weight: &mut dw32, bias: db.is_some().then_some(&mut db32) };
                lnk::backward(gpu, x, shape, &w, saved, dy, dx, grads, &mut ws)?;
                cast::f32_to_f16(gpu, &dw32, dw)?;
                match db {
                    Some(db) => cast::f32_to_f16(gpu, &db32, db),
                    None => Ok(()),
                }
            })
        }
    }
}
