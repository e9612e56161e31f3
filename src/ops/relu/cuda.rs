//! ReLU launchers for kernels/relu.cu, the device twins of `cpu.rs` (same
//! comparisons, so NaN and signed zeros come out as on the CPU).

use crate::cuda::{check_len, DeviceFloat, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "relu.cu";
static RELU_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "relu_backward");
static RELU_FORWARD: TypedKernelFn = typed_kernel!(FILE, "relu_forward");

/// `y = relu(x)`.
pub fn forward<T: DeviceFloat>(gpu: &Gpu, x: &impl DevicePtr<T>, y: &mut impl DevicePtrMut<T>) -> Result<()> {
    let n = x.len();
    check_len("relu forward", "y", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&RELU_FORWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    let n64 = n as i64;
    // SAFETY: x and y hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&xp).arg(&yp).arg(&n64).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("relu forward", e))?;
    Ok(())
}

/// `dx = dy` where the forward output `y > 0` (or is NaN), else 0.
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    y: &impl DevicePtr<T>,
    dy: &impl DevicePtr<T>,
    dx: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let n = y.len();
    check_len("relu backward", "dy", dy.len(), n)?;
    check_len("relu backward", "dx", dx.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&RELU_BACKWARD))?;
    let stream = gpu.stream();
    let (yp, _y) = y.device_ptr(stream);
    let (dyp, _dy) = dy.device_ptr(stream);
    let (dxp, _dx) = dx.device_ptr_mut(stream);
    let n64 = n as i64;
    // SAFETY: all three hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&yp).arg(&dyp).arg(&dxp).arg(&n64).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("relu backward", e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
