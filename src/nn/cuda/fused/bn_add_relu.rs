//! A residual block's end, BatchNorm2d + the add + ReLU (SyncBatchNorm too),
//! as one node reading BatchNorm's input and the add's other operand. The
//! forward's normalizing pass stores ReLU's output of the sum (batch_norm.cu's
//! `_add_relu` twins): BatchNorm's output and the sum are never stored, and
//! the add's and ReLU's forward launches go. Backward is ReLU's pass, written
//! straight into the other operand's gradient when it is the first there
//! (the add's dx is its dy for both operands), then BatchNorm's launches
//! reading it: the add's two copies go too. The bits are those of the three
//! layers run one by one.

use super::{Fusion, Run};
use crate::error::Result;
use crate::nn::cuda::layer::{others, read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, RestDx};
use crate::nn::layers::batchnorm2d::cuda::{forward_with, BnState};
use crate::nn::layers::{BatchNorm2d, LayerKind};
use crate::ops::add::cuda as addk;
use crate::ops::batch_norm::cuda::Epilogue;
use crate::ops::relu::cuda as relu;

use super::bn_relu::BnReluPlan;

/// The group's BatchNorm2d (the add and ReLU have no settings).
pub struct BnAddRelu(BatchNorm2d);

impl Fusion for BnAddRelu {
    const TYPE: &'static str = "batchnorm2d+add+relu";

    /// BatchNorm's output read by the add alone, the sum by ReLU alone, and
    /// the add's other operand not BatchNorm's input (the two dx would go to
    /// one gradient).
    fn matches(run: &Run<'_>) -> Option<(Self, usize)> {
        let (Some(LayerKind::BatchNorm2d(bn)), Some(LayerKind::Add(_)), Some(LayerKind::Relu(_))) =
            (run.kind(0), run.kind(1), run.kind(2))
        else {
            return None;
        };
        let (norm, add) = (&run.layers[0], &run.layers[1]);
        let other = add.srcs.iter().copied().filter(|&s| s != norm.dst).collect::<Vec<_>>();
        let fits =
            run.read_only_by_next(0) && run.feeds_only_next(1) && other.len() == 1 && other[0] != norm.src;
        fits.then(|| (BnAddRelu(bn.clone()), 3))
    }
}

impl DeviceLayer for BnAddRelu {
    head_batchnorm!();

    fn forward<A: Elem>(p: &BnReluPlan, s: &mut BnState, mut f: Forward<'_, A>) -> Result<()> {
        f.ws.take::<A, 1>([0])?;
        let ([r], _) = others::<_, 1>(std::mem::take(&mut f.rest))?;
        forward_with(&p.bn, s, f, Epilogue::AddRelu(&r))
    }

    fn backward<A: Elem>(p: &BnReluPlan, s: &BnState, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, blas, n, draws, params, x, y, dy, dx, mut rest, mut ws, ids, hooks } = b;
        let [mut g] = ws.take::<A, 1>([n.saturating_mul(p.numel)])?;
        let y = read(y, "output")?;
        let mut other = rest.pop().unwrap_or(RestDx::None);
        match &mut other {
            RestDx::Write(to) => relu::backward(gpu, &y, &dy, to)?,
            RestDx::Add(to) => {
                relu::backward(gpu, &y, &dy, &mut g)?;
                addk::accumulate(gpu, to, &g.as_view())?;
            }
            RestDx::None => relu::backward(gpu, &y, &dy, &mut g)?,
        }
        let dy = match &other {
            RestDx::Write(to) => to.as_view(),
            _ => g.as_view(),
        };
        let b = Backward { gpu, blas, n, draws, params, x, y: None, dy, dx, rest, ws, ids, hooks };
        BatchNorm2d::backward(&p.bn, s, b)
    }
}
