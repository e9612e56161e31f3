//! Elementwise add: the residual connection's `a + b` and the `+=` that sums
//! the gradients of a value read twice. Mixed dtypes follow apex's "promote"
//! (the f16 operand is widened and the result is f32); f16 is added in f32
//! and rounded once.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_f16;
pub mod cpu;
pub mod cuda;

#[cfg(target_arch = "x86_64")]
use super::half_emu::avx512_usable;
use super::half_emu::{f32_of, round_into, scratch, widen_into, zip_map_inplace, BLOCK};
use crate::error::{Error, Result};
use crate::tensor::{written_by, CpuStorage, DType, Tensor};
use half::f16;
use rayon::prelude::*;

fn same_shape(op: &str, a: &Tensor, b: &Tensor, names: (&str, &str)) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::shape(format!(
            "add {op}: {} has shape {:?} but {} has shape {:?} (no broadcasting)",
            names.0,
            a.shape(),
            names.1,
            b.shape()
        )));
    }
    Ok(())
}

/// `a + b`, same shape. f16 + f16 stays f16; any f32 operand makes the
/// result f32.
pub fn forward(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    same_shape("forward", a, b, ("a", "b"))?;
    match (a.dtype(), b.dtype()) {
        (DType::F16, DType::F16) => {
            #[cfg(target_arch = "x86_64")]
            if avx512_usable() {
                return Tensor::from_f16_vec(a.shape(), avx512_f16::forward(a.as_f16()?, b.as_f16()?));
            }
            let mut y = a.clone();
            accumulate_(&mut y, b)?;
            Ok(y)
        }
        _ => {
            let (a, b) = (f32_of(a), f32_of(b));
            let (xa, xb) = (a.as_f32()?, b.as_f32()?);
            // SAFETY: cpu::forward writes every element (same_shape: equal lengths).
            let y = unsafe { written_by(xa.len(), |y| cpu::forward(xa, xb, y)) };
            Tensor::from_vec(a.shape(), y)
        }
    }
}

/// `dst += src`, in `dst`'s dtype: the sum is taken in f32 and, for an f16
/// `dst`, rounded once.
pub fn accumulate_(dst: &mut Tensor, src: &Tensor) -> Result<()> {
    same_shape("accumulate_", dst, src, ("dst", "src"))?;
    match src.storage() {
        CpuStorage::F16(s) if dst.dtype() == DType::F16 => {
            #[cfg(target_arch = "x86_64")]
            if avx512_usable() {
                avx512_f16::accumulate(dst.as_f16_mut()?, s);
                return Ok(());
            }
            zip_map_inplace(s, dst.as_f16_mut()?, |s, d| cpu::accumulate(d, s));
        }
        CpuStorage::F32(s) if dst.dtype() == DType::F16 => {
            accumulate_f32_into_f16(dst.as_f16_mut()?, s);
        }
        _ => cpu::accumulate(dst.as_f32_mut()?, f32_of(src).as_f32()?),
    }
    Ok(())
}

/// `dst += src` for an f16 `dst` and an f32 `src`: each block of `dst` is
/// widened, added to in f32 and rounded back once.
fn accumulate_f32_into_f16(dst: &mut [f16], src: &[f32]) {
    dst.par_chunks_mut(BLOCK).zip(src.par_chunks(BLOCK)).for_each_init(Vec::new, |buf, (d, s)| {
        let acc = scratch(buf, d.len());
        widen_into(d, acc);
        cpu::accumulate(acc, s);
        round_into(acc, d);
    });
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
