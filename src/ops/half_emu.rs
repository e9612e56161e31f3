//! f16 on the CPU, per the numerics contract: f16 operands are widened to f32
//! (exactly), the f32 kernel runs, and results are rounded to f16 on store
//! (round-to-nearest-even), so overflow to inf, underflow and rounding happen
//! where they will on the GPU. Gradients that accumulate into an f16 tensor
//! are accumulated in f32 and rounded once.

use std::borrow::Cow;

use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// Whether any operand is f16 (then the op takes its f16 arm).
pub(crate) fn any_f16<'a>(ts: impl IntoIterator<Item = Option<&'a Tensor>>) -> bool {
    ts.into_iter().flatten().any(|t| t.dtype() == DType::F16)
}

/// `t` itself when f32, else an exact f32 copy.
pub(crate) fn f32_of(t: &Tensor) -> Cow<'_, Tensor> {
    match t.dtype() {
        DType::F32 => Cow::Borrowed(t),
        DType::F16 => Cow::Owned(t.to_dtype(DType::F32)),
    }
}

/// An f32 working copy of an accumulation target (e.g. a `.grad`).
pub(crate) fn f32_acc(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32)
}

/// Stores the f32 working copy back into `target`, rounding once for f16.
pub(crate) fn store(target: &mut Tensor, acc: &Tensor) -> Result<()> {
    target.copy_from_f32(acc.as_f32()?)
}
