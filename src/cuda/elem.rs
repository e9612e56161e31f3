//! What every launcher shares: the element-type trait the kernels are
//! instantiated for and the host-side size checks
//! that keep a wrong length from ever reaching a kernel.

use crate::error::{Error, Result};
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::f16;

/// An element type the kernels are instantiated for: `f32` and `half::f16`
/// (`DDP_INSTANTIATE` entry points end in `_f32` / `_f16`).
pub trait DeviceFloat: DeviceRepr + ValidAsZeroBits + Copy + Default + Unpin + Send + Sync + 'static {
    /// The entry-point suffix: `"f32"` or `"f16"`.
    const SUFFIX: &'static str;
    /// This type's instantiation of `k`.
    fn pick(k: &'static super::TypedKernelFn) -> &'static super::KernelFn;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl DeviceFloat for f32 {
    const SUFFIX: &'static str = "f32";
    fn pick(k: &'static super::TypedKernelFn) -> &'static super::KernelFn {
        &k.f32
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl DeviceFloat for f16 {
    const SUFFIX: &'static str = "f16";
    fn pick(k: &'static super::TypedKernelFn) -> &'static super::KernelFn {
        &k.f16
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// Checks that a device buffer holds exactly `want` elements, so a wrong size
/// never reaches a kernel.
pub fn check_len(op: &str, what: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::shape(format!("{op}: {what} holds {len} elements, expected {want}")))
    }
}

/// A `len` that the kernels index with `long long`.
pub fn as_i64(op: &str, len: usize) -> Result<i64> {
    i64::try_from(len).map_err(|_| Error::shape(format!("{op}: {len} elements is too many for one launch")))
}

/// `rows` rows of `c` values, normalized over `c`: the view of the kernels
/// that reduce a row with one warp (LayerNorm's, RMSNorm's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub rows: usize,
    pub c: usize,
}

impl Rows {
    /// Saturating: a view too large to index fails in [`Rows::args`].
    pub fn numel(&self) -> usize {
        self.rows.saturating_mul(self.c)
    }

    /// The chunks of `per` rows (the last one short) that a parameter
    /// gradient's partial sums take.
    pub fn chunks(&self, per: usize) -> usize {
        self.rows.div_ceil(per.max(1))
    }

    /// `rows` and `c` as the kernels' `long long`, once their product is.
    pub fn args(&self, op: &str) -> Result<(i64, i64)> {
        if self.rows.checked_mul(self.c).is_none() {
            return Err(Error::shape(format!(
                "{op}: {} rows of {} is too many for one launch",
                self.rows, self.c
            )));
        }
        as_i64(op, self.numel())?;
        Ok((as_i64(op, self.rows)?, as_i64(op, self.c)?))
    }
}
