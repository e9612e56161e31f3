//! Dropout launchers for kernels/dropout.cu, the device twins of `cpu.rs`
//! and of [`crate::rng::philox4x32_10`]: the same mask bit for bit, and
//! the same f32 products.

use super::Mask;
use crate::cuda::{check_len, DeviceFloat, KernelFn, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "dropout.cu";
static DROPOUT_APPLY: TypedKernelFn = typed_kernel!(FILE, "dropout_apply");
static DROPOUT_PHILOX: KernelFn = KernelFn::new(FILE, "dropout_philox");

/// Launches the apply kernel from `x` (read) to `y` (written, may be `x`).
fn launch<T: DeviceFloat>(gpu: &Gpu, op: &str, m: &Mask, xp: u64, yp: u64, n: usize) -> Result<()> {
    let f = gpu.kernel(T::pick(&DROPOUT_APPLY))?;
    let stream = gpu.stream();
    let n64 = n as i64;
    let [k0, k1] = m.draws.key;
    let [c0, c1] = m.draws.ctr_hi;
    let mut b = f.launch_on(stream);
    b.arg(&xp).arg(&yp).arg(&n64).arg(&k0).arg(&k1).arg(&c0).arg(&c1).arg(&m.threshold).arg(&m.scale);
    // SAFETY: the callers checked that x and y hold n elements of T; each
    // thread reads an element before it writes it, so they may alias.
    unsafe { b.launch(launch_1d(n.div_ceil(4))) }.map_err(|e| Error::cuda(op, e))
}

/// `y = x * mask * scale`.
pub fn apply<T: DeviceFloat>(
    gpu: &Gpu,
    m: &Mask,
    x: &impl DevicePtr<T>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let n = x.len();
    check_len("dropout", "y", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    launch::<T>(gpu, "dropout", m, xp, yp, n)
}

/// `v = v * mask * scale` in place (backward turns dy into dx this way).
pub fn apply_<T: DeviceFloat>(gpu: &Gpu, m: &Mask, v: &mut impl DevicePtrMut<T>) -> Result<()> {
    let n = v.len();
    if n == 0 {
        return Ok(());
    }
    let (vp, _v) = v.device_ptr_mut(gpu.stream());
    launch::<T>(gpu, "dropout in place", m, vp, vp, n)
}

/// The raw generator (parity tests): `out[4i..4i+4] = philox4x32_10(ctr[4i..4i+4], key)`.
pub fn philox(
    gpu: &Gpu,
    ctr: &impl DevicePtr<u32>,
    key: [u32; 2],
    out: &mut impl DevicePtrMut<u32>,
) -> Result<()> {
    let len = ctr.len();
    check_len("philox", "out", out.len(), len)?;
    if len % 4 != 0 {
        return Err(Error::shape(format!("philox: {len} counter words, not groups of 4")));
    }
    let n = len / 4;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(&DROPOUT_PHILOX)?;
    let stream = gpu.stream();
    let (cp, _c) = ctr.device_ptr(stream);
    let (op, _o) = out.device_ptr_mut(stream);
    let n64 = n as i64;
    let [k0, k1] = key;
    // SAFETY: ctr and out hold 4n words (checked above).
    unsafe { f.launch_on(stream).arg(&cp).arg(&op).arg(&n64).arg(&k0).arg(&k1).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("philox", e))
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
