//! BatchNorm2d + ReLU (SyncBatchNorm too) as one node. The forward's
//! normalizing pass stores ReLU's output (batch_norm.cu's `_relu` twins), so
//! BatchNorm's output is never stored and ReLU's forward launch goes: one
//! pass over the activations fewer, and no buffer for the value between
//! them. Backward is ReLU's then BatchNorm's launches, ReLU's dx in the
//! group's scratch instead of a gradient buffer: BatchNorm's per-channel
//! reduction is its slowest kernel, and reading ReLU's output there as a
//! third tensor costs more than ReLU's pass (the modeled H100 says so). The
//! bits are those of the two layers run one by one.

use super::{Fusion, Run};
use crate::error::Result;
use crate::nn::cuda::layer::{read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch};
use crate::nn::layers::batchnorm2d::cuda::{forward_with, BatchNormPlan, BnState};
use crate::nn::layers::{BatchNorm2d, LayerKind};
use crate::ops::batch_norm::cuda::Epilogue;
use crate::ops::relu::cuda as relu;
use crate::tensor::DType;

/// BatchNorm's `needs` with a first scratch region of the activations'
/// dtype before its own: one batch of the group's output, for ReLU's dx.
pub(super) fn scratch_first(needs: Needs, a: &PlanArgs<'_>) -> Needs {
    let mut scratch = Scratch::default();
    scratch.push(a.compute, a.max_batch.saturating_mul(a.out_numel()));
    for &len in &needs.scratch.f32 {
        scratch.push(DType::F32, len);
    }
    for &len in &needs.scratch.f16 {
        scratch.push(DType::F16, len);
    }
    needs.scratch(scratch)
}

/// The group's BatchNorm2d (ReLU has no settings).
pub struct BnRelu(BatchNorm2d);

impl Fusion for BnRelu {
    const TYPE: &'static str = "batchnorm2d+relu";

    fn matches(run: &Run<'_>) -> Option<(Self, usize)> {
        let (Some(LayerKind::BatchNorm2d(bn)), Some(LayerKind::Relu(_))) = (run.kind(0), run.kind(1)) else {
            return None;
        };
        run.feeds_only_next(0).then(|| (BnRelu(bn.clone()), 2))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BnReluPlan {
    pub bn: BatchNormPlan,
    /// Values per sample (ReLU's dx takes one batch of them in the scratch).
    pub numel: usize,
}

impl DeviceLayer for BnRelu {
    head_batchnorm!();

    fn forward<A: Elem>(p: &BnReluPlan, s: &mut BnState, mut f: Forward<'_, A>) -> Result<()> {
        f.ws.take::<A, 1>([0])?;
        forward_with(&p.bn, s, f, Epilogue::Relu)
    }

    fn backward<A: Elem>(p: &BnReluPlan, s: &BnState, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, blas, n, draws, params, x, y, dy, dx, rest, mut ws, ids, hooks } = b;
        let [mut g] = ws.take::<A, 1>([n.saturating_mul(p.numel)])?;
        relu::backward(gpu, &read(y, "output")?, &dy, &mut g)?;
        let dy = g.as_view();
        let b = Backward { gpu, blas, n, draws, params, x, y: None, dy, dx, rest, ws, ids, hooks };
        BatchNorm2d::backward(&p.bn, s, b)
    }
}
