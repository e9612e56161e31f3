//! GELU launchers for kernels/gelu.cu, the device twins of `cpu.rs`: the
//! function and its slope in f64, rounded once to f32, as the CPU does.

use crate::cuda::{check_len, launch_1d, DeviceFloat, Gpu, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "gelu.cu";
static GELU_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "gelu_backward");
static GELU_FORWARD: TypedKernelFn = typed_kernel!(FILE, "gelu_forward");

/// `y = gelu(x)` (`approximate="tanh"` when `tanh`), every element written.
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &impl DevicePtr<T>,
    y: &mut impl DevicePtrMut<T>,
    tanh: bool,
) -> Result<()> {
    let n = x.len();
    check_len("gelu forward", "y", y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&GELU_FORWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    let (n64, form) = (n as i64, i32::from(tanh));
    // SAFETY: x and y hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&xp).arg(&yp).arg(&n64).arg(&form).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("gelu forward", e))
}

/// `dx = dy * gelu'(x)` (`=`), from the forward's input `x`.
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &impl DevicePtr<T>,
    dy: &impl DevicePtr<T>,
    dx: &mut impl DevicePtrMut<T>,
    tanh: bool,
) -> Result<()> {
    let n = x.len();
    check_len("gelu backward", "dy", dy.len(), n)?;
    check_len("gelu backward", "dx", dx.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&GELU_BACKWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (dyp, _dy) = dy.device_ptr(stream);
    let (dxp, _dx) = dx.device_ptr_mut(stream);
    let (n64, form) = (n as i64, i32::from(tanh));
    // SAFETY: all three hold n elements of T (checked above).
    unsafe { f.launch_on(stream).arg(&xp).arg(&dyp).arg(&dxp).arg(&n64).arg(&form).launch(launch_1d(n)) }
        .map_err(|e| Error::cuda("gelu backward", e))
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
