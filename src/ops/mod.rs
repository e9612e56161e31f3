//! One folder per op family: `mod.rs` dispatches on the tensor's dtype,
//! `cpu.rs` holds the CPU kernels (generic over [`Elem`] so the tests can run
//! them in f64), and `cuda.rs` its device twin, the launchers of
//! `kernels/<family>.cu`.

use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};

pub mod elem;
pub use elem::Elem;

pub mod add;
pub mod attention;
pub mod avg_pool2d;
pub mod batch_norm;
pub mod conv2d;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod exp;
pub mod gelu;
pub mod gemm;
pub(crate) mod half_emu;
pub mod layer_norm;
pub mod linear;
pub mod max_pool2d;
pub mod relu;
pub mod warp_order;

/// The host f32 data of `t`, or `Unsupported` naming the op, the operand and
/// its dtype (f16 and device tensors have their own kernels elsewhere).
pub(crate) fn cpu_f32<'a>(op: &str, what: &str, t: &'a Tensor) -> Result<&'a [f32]> {
    match t.storage() {
        CpuStorage::F32(v) => Ok(v),
        _ => Err(Error::Unsupported(format!("{op}: {what} of dtype {:?} on this device", t.dtype()))),
    }
}

pub(crate) fn cpu_f32_mut<'a>(op: &str, what: &str, t: &'a mut Tensor) -> Result<&'a mut [f32]> {
    cpu_f32(op, what, t)?;
    t.as_f32_mut()
}

#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests_f16_staged;
#[cfg(test)]
mod tests_half_emu;
