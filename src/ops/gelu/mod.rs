//! GELU, PyTorch's `F.gelu(x, approximate=...)`: the exact form
//! `x * Φ(x) = 0.5 x (1 + erf(x / √2))` (`nn.GELU()`), or the tanh form
//! `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (`approximate="tanh"`, GPT-2's).
//!
//! f16 tensors are widened, computed in f32 and rounded once on store.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;

use super::cpu_f32;
use super::half_emu::{any_f16, f32_of};
use crate::error::Result;
use crate::tensor::{written_by, DType, Tensor};
use half::f16;

const OP: &str = "gelu";

pub fn forward(x: &Tensor, tanh: bool) -> Result<Tensor> {
    if x.dtype() == DType::F16 {
        let xs = x.as_f16()?;
        let mut y = vec![f16::ZERO; xs.len()];
        cpu::forward(xs, &mut y, tanh);
        return Tensor::from_f16_vec(x.shape(), y);
    }
    let xs = cpu_f32(OP, "input", x)?;
    let mut y = vec![0f32; xs.len()];
    cpu::forward(xs, &mut y, tanh);
    Tensor::from_vec(x.shape(), y)
}

/// [`forward`] for training: `(y, slope)`, `slope = gelu'(x)` as an f32
/// tensor of x's shape, for [`backward_from_slope`].
pub fn forward_train(x: &Tensor, tanh: bool) -> Result<(Tensor, Tensor)> {
    let n = x.numel();
    let mut slope = Vec::with_capacity(n);
    let slope_out = &mut slope.spare_capacity_mut()[..n];
    // SAFETY (both written_by calls, and slope's length): forward_train
    // writes every element of y and of slope.
    let y = if x.dtype() == DType::F16 {
        let xs = x.as_f16()?;
        let y = unsafe { written_by(n, |y| cpu::forward_train(xs, y, slope_out, tanh)) };
        Tensor::from_f16_vec(x.shape(), y)?
    } else {
        let xs = cpu_f32(OP, "input", x)?;
        let y = unsafe { written_by(n, |y| cpu::forward_train(xs, y, slope_out, tanh)) };
        Tensor::from_vec(x.shape(), y)?
    };
    unsafe { slope.set_len(n) };
    Ok((y, Tensor::from_vec(x.shape(), slope)?))
}

/// dx from [`forward_train`]'s `slope` and the upstream `dy`, in dy's dtype:
/// the bits [`backward`] gives from the input.
pub fn backward_from_slope(slope: &Tensor, dy: &Tensor) -> Result<Tensor> {
    dy.check_shape("gelu backward: dy (must match x)", slope.shape())?;
    let g = cpu_f32(OP, "slope", slope)?;
    // SAFETY (both): backward_from_slope writes every element of dx.
    if dy.dtype() == DType::F16 {
        let dys = dy.as_f16()?;
        let dx = unsafe { written_by(dys.len(), |dx| cpu::backward_from_slope(g, dys, dx)) };
        return Tensor::from_f16_vec(dy.shape(), dx);
    }
    let dys = cpu_f32(OP, "dy", dy)?;
    let dx = unsafe { written_by(dys.len(), |dx| cpu::backward_from_slope(g, dys, dx)) };
    Tensor::from_vec(dy.shape(), dx)
}

/// dx from the forward's input `x` and the upstream `dy`.
pub fn backward(x: &Tensor, dy: &Tensor, tanh: bool) -> Result<Tensor> {
    dy.check_shape("gelu backward: dy (must match x)", x.shape())?;
    if x.dtype() == DType::F16 && dy.dtype() == DType::F16 {
        let (xs, dys) = (x.as_f16()?, dy.as_f16()?);
        let mut dx = vec![f16::ZERO; xs.len()];
        cpu::backward(xs, dys, &mut dx, tanh);
        return Tensor::from_f16_vec(x.shape(), dx);
    }
    if any_f16([Some(x), Some(dy)]) {
        return Ok(backward(&f32_of(x), &f32_of(dy), tanh)?.into_dtype(dy.dtype()));
    }
    let (xs, dys) = (cpu_f32(OP, "input", x)?, cpu_f32(OP, "dy", dy)?);
    let mut dx = vec![0f32; xs.len()];
    cpu::backward(xs, dys, &mut dx, tanh);
    Tensor::from_vec(x.shape(), dx)
}
