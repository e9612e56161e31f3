//! O1's patched layers, conv and linear (apex's per-call casts to f16): operands
//! and results rounded to f16, gradients accumulated into the fp32 `.grad`.

use super::layers::{Ctx, LayerKind, LayerSaved, Weights};
use super::Param;
use crate::error::Result;
use crate::ops;
use crate::tensor::{DType, Tensor};

/// `grad += g` (g holding the f16 values of O1's per-call cast), accumulated in
/// the grad's dtype like PyTorch's `.grad` accumulation.
fn accumulate_grad(grad: &mut Tensor, g: &Tensor) -> Result<()> {
    let mut acc = grad.to_f32_vec();
    for (a, v) in acc.iter_mut().zip(g.to_f32_vec()) {
        *a += v;
    }
    grad.copy_from_f32(&acc)
}

/// `t` as f32 holding the values of its cast to `dt`: O1's per-call cast
/// to f16 and back, rounded in place. The CPU's f16 conv and linear are
/// their f32 kernels on widened operands with the results rounded (the
/// numerics contract, checked bit for bit in `ops::tests_f16_staged`), so
/// running the f32 kernels on these values and rounding their results the
/// same way gives the f16 op's bits without an f16 copy of every operand
/// and result, or the f16 kernels' staging.
pub(super) fn cast_round_trip(t: Tensor, dt: DType) -> Result<Tensor> {
    match (t.dtype(), dt) {
        (DType::F32, DType::F16) => {
            let mut t = t;
            ops::half_emu::round_trip(t.as_f32_mut()?);
            Ok(t)
        }
        _ => Ok(t.into_dtype(DType::F32)),
    }
}

/// A layer's parameters cast to `dt` and back for one call (O1), with
/// zeroed f32 gradients for the call's own.
pub(super) fn cast_weights(w: &Weights, dt: DType) -> Result<Weights> {
    let params = w
        .params
        .iter()
        .map(|p| Ok(Param::new(p.name.clone(), cast_round_trip(p.value.clone(), dt)?)))
        .collect::<Result<_>>()?;
    Ok(Weights { params, buffers: w.buffers.clone() })
}

/// O1's backward of a layer run in `dt`: gradients computed as in `dt` (so
/// they overflow where the GPU's would), then accumulated into the fp32 `.grad`.
pub(super) fn backward(
    kind: &LayerKind,
    w: &mut Weights,
    saved: LayerSaved,
    dy: Tensor,
    need_dx: &[bool],
    dt: DType,
    cx: Ctx<'_>,
) -> Result<Vec<Option<Tensor>>> {
    let mut call = cast_weights(w, dt)?;
    let dxs = kind.backward(&mut call, saved, cast_round_trip(dy, dt)?, need_dx, cx)?;
    for (p, g) in w.params.iter_mut().zip(call.params) {
        accumulate_grad(&mut p.grad, &cast_round_trip(g.grad, dt)?)?;
    }
    dxs.into_iter().map(|dx| dx.map(|d| cast_round_trip(d, dt)).transpose()).collect()
}
