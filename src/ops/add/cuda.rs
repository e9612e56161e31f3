//! Elementwise add launchers for kernels/add.cu, the device twins of
//! `cpu.rs` (one f32 addition per element, so the results are the CPU's).
//! Both operands share one dtype here: a caller holding a mixed pair casts
//! the f16 one first (`crate::cuda::cast`), as the CPU path widens it.

use crate::cuda::{as_i64, check_len, DeviceFloat, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "add.cu";
static ADD_ACCUMULATE: TypedKernelFn = typed_kernel!(FILE, "add_accumulate");
static ADD_FORWARD: TypedKernelFn = typed_kernel!(FILE, "add_forward");

/// `y = a + b`.
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    a: &impl DevicePtr<T>,
    b: &impl DevicePtr<T>,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let n = a.len();
    check_len("add forward", "b", b.len(), n)?;
    check_len("add forward", "y", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let n64 = as_i64("add forward", n)?;
    let f = gpu.kernel(T::pick(&ADD_FORWARD))?;
    let stream = gpu.stream();
    let (ap, _a) = a.device_ptr(stream);
    let (bp, _b) = b.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    // SAFETY: a, b and y hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&ap).arg(&bp).arg(&yp).arg(&n64).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("add forward", e))?;
    Ok(())
}

/// `dst += src`.
pub fn accumulate<T: DeviceFloat>(
    gpu: &Gpu,
    dst: &mut impl DevicePtrMut<T>,
    src: &impl DevicePtr<T>,
) -> Result<()> {
    let n = dst.len();
    check_len("add accumulate", "src", src.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let n64 = as_i64("add accumulate", n)?;
    let f = gpu.kernel(T::pick(&ADD_ACCUMULATE))?;
    let stream = gpu.stream();
    let (dp, _d) = dst.device_ptr_mut(stream);
    let (sp, _s) = src.device_ptr(stream);
    // SAFETY: dst and src hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&dp).arg(&sp).arg(&n64).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("add accumulate", e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
