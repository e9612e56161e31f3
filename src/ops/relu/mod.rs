//! ReLU, with in-place variants so the trainer can reuse its activation and
//! gradient buffers instead of allocating per step.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_f16;
pub mod cpu;
pub mod cuda;

#[cfg(target_arch = "x86_64")]
use super::half_emu::avx512_usable;
use super::half_emu::{any_f16, f32_acc, f32_of, map_inplace, store, zip_map_inplace};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, DType, Tensor};

fn unsupported(op: &str, t: &Tensor) -> Error {
    Error::Unsupported(format!(
        "relu {op} on {:?} tensors: this path takes host f32 (f16 is widened before it)",
        t.dtype()
    ))
}

fn is_cpu_f32(t: &Tensor) -> bool {
    matches!(t.storage(), CpuStorage::F32(_))
}

pub fn forward(x: &Tensor) -> Result<Tensor> {
    if any_f16([Some(x)]) {
        return Ok(forward(&f32_of(x))?.into_dtype(x.dtype()));
    }
    match x.storage() {
        CpuStorage::F32(xs) => {
            let mut y = vec![0.0f32; xs.len()];
            cpu::forward(xs, &mut y);
            Tensor::from_vec(x.shape(), y)
        }
        _ => Err(unsupported("forward", x)),
    }
}

/// `x = relu(x)` in place.
pub fn forward_(x: &mut Tensor) -> Result<()> {
    if x.dtype() == DType::F16 {
        #[cfg(target_arch = "x86_64")]
        if avx512_usable() {
            avx512_f16::forward_inplace(x.as_f16_mut()?);
            return Ok(());
        }
        map_inplace(x.as_f16_mut()?, cpu::forward_inplace);
        return Ok(());
    }
    if any_f16([Some(&*x)]) {
        let mut acc = f32_acc(x);
        forward_(&mut acc)?;
        return store(x, &acc);
    }
    if !is_cpu_f32(x) {
        return Err(unsupported("forward_", x));
    }
    cpu::forward_inplace(x.as_f32_mut()?);
    Ok(())
}

/// `dx = dy` where the output `y > 0`, else 0.
pub fn backward(y: &Tensor, dy: &Tensor) -> Result<Tensor> {
    dy.check_shape("relu backward: dy (must match y)", y.shape())?;
    if any_f16([Some(y), Some(dy)]) {
        return Ok(backward(&f32_of(y), &f32_of(dy))?.into_dtype(dy.dtype()));
    }
    match (y.storage(), dy.storage()) {
        (CpuStorage::F32(ys), CpuStorage::F32(dys)) => {
            let mut dx = vec![0.0f32; ys.len()];
            cpu::backward(ys, dys, &mut dx);
            Tensor::from_vec(y.shape(), dx)
        }
        (CpuStorage::F32(_), _) => Err(unsupported("backward", dy)),
        _ => Err(unsupported("backward", y)),
    }
}

/// `dy` becomes the dx of `dy + other` in place: the gradient of a ReLU
/// output read twice (a residual block's input), its readers' gradients
/// summed as `ops::add::accumulate_` sums them, then ReLU's [`backward_`].
/// One pass for f16 on AVX-512, the two ops otherwise; the same bits.
pub fn add_backward_(y: &Tensor, dy: &mut Tensor, other: &Tensor) -> Result<()> {
    dy.check_shape("relu backward_: dy (must match y)", y.shape())?;
    other.check_shape("relu backward_: the other reader's dy (must match y)", y.shape())?;
    #[cfg(target_arch = "x86_64")]
    if avx512_usable() && [y.dtype(), dy.dtype(), other.dtype()] == [DType::F16; 3] {
        avx512_f16::add_backward_inplace(y.as_f16()?, dy.as_f16_mut()?, other.as_f16()?);
        return Ok(());
    }
    super::add::accumulate_(dy, other)?;
    backward_(y, dy)
}

/// `dy` becomes dx in place.
pub fn backward_(y: &Tensor, dy: &mut Tensor) -> Result<()> {
    dy.check_shape("relu backward_: dy (must match y)", y.shape())?;
    if (y.dtype(), dy.dtype()) == (DType::F16, DType::F16) {
        #[cfg(target_arch = "x86_64")]
        if avx512_usable() {
            avx512_f16::backward_inplace(y.as_f16()?, dy.as_f16_mut()?);
            return Ok(());
        }
        zip_map_inplace(y.as_f16()?, dy.as_f16_mut()?, cpu::backward_inplace);
        return Ok(());
    }
    if any_f16([Some(y), Some(&*dy)]) {
        let mut acc = f32_acc(dy);
        backward_(&f32_of(y), &mut acc)?;
        return store(dy, &acc);
    }
    if !is_cpu_f32(dy) {
        return Err(unsupported("backward_", dy));
    }
    match y.storage() {
        CpuStorage::F32(ys) => {
            cpu::backward_inplace(ys, dy.as_f32_mut()?);
            Ok(())
        }
        _ => Err(unsupported("backward_", y)),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
