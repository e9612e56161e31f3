//! AvgPool2d launchers for kernels/avg_pool2d.cu, the device twins of
//! `cpu.rs`: the same summation orders, so f32 results are the CPU's bits.

use super::AvgPool2dArgs;
use crate::cuda::{check_len, DeviceFloat, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "avg_pool2d.cu";
static AVG_POOL2D_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "avg_pool2d_backward");
static AVG_POOL2D_FORWARD: TypedKernelFn = typed_kernel!(FILE, "avg_pool2d_forward");

/// The output shape `[N, C, OH, OW]` for an input `[N, C, H, W]`, after the
/// checks of [`AvgPool2dArgs::out_hw`].
pub fn out_shape(x_shape: [usize; 4], args: AvgPool2dArgs) -> Result<[usize; 4]> {
    let [n, c, h, w] = x_shape;
    let (oh, ow) = args.out_hw(h, w)?;
    Ok([n, c, oh, ow])
}

/// The kernels' size arguments: planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw.
/// Every value is a dimension of a buffer whose length was checked, or fits
/// in i32 (`out_hw`), so the casts are exact.
fn sizes(x_shape: [usize; 4], out: [usize; 4], args: AvgPool2dArgs) -> [i64; 11] {
    let [n, c, h, w] = x_shape;
    let AvgPool2dArgs { kernel: [kh, kw], stride: [sh, sw], padding: [ph, pw] } = args;
    [n * c, h, w, out[2], out[3], kh, kw, sh, sw, ph, pw].map(|v| v as i64)
}

/// Launches `kernel` over `threads` threads with (`src`, `dst`, the sizes),
/// the parameter list both kernels share.
fn launch<T: DeviceFloat>(
    gpu: &Gpu,
    op: &str,
    kernel: &'static TypedKernelFn,
    src: &impl DevicePtr<T>,
    dst: &mut impl DevicePtrMut<T>,
    sizes: [i64; 11],
    threads: usize,
) -> Result<()> {
    let f = gpu.kernel(T::pick(kernel))?;
    let stream = gpu.stream();
    let (sp, _s) = src.device_ptr(stream);
    let (dp, _d) = dst.device_ptr_mut(stream);
    let mut b = f.launch_on(stream);
    b.arg(&sp).arg(&dp);
    for v in &sizes {
        b.arg(v);
    }
    // SAFETY: the callers checked both buffers' lengths against the
    // geometry in `sizes`; the kernels read only inside the unpadded input.
    unsafe { b.launch(launch_1d(threads)) }.map_err(|e| Error::cuda(op, e))
}

/// Pools `x` (`[N, C, H, W]`) into `y` (`[N, C, OH, OW]`, overwritten).
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &impl DevicePtr<T>,
    x_shape: [usize; 4],
    args: AvgPool2dArgs,
    y: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let out = out_shape(x_shape, args)?;
    let len: usize = out.iter().product();
    check_len("avg_pool2d forward", "x", x.len(), x_shape.iter().product())?;
    check_len("avg_pool2d forward", "y", y.len(), len)?;
    if len == 0 {
        return Ok(());
    }
    launch(gpu, "avg_pool2d forward", &AVG_POOL2D_FORWARD, x, y, sizes(x_shape, out, args), len)
}

/// `dx` (`[N, C, H, W]`, every element overwritten) from `dy`
/// (`[N, C, OH, OW]`).
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    dy: &impl DevicePtr<T>,
    x_shape: [usize; 4],
    args: AvgPool2dArgs,
    dx: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let out = out_shape(x_shape, args)?;
    let x_len: usize = x_shape.iter().product();
    check_len("avg_pool2d backward", "dy", dy.len(), out.iter().product())?;
    check_len("avg_pool2d backward", "dx", dx.len(), x_len)?;
    if x_len == 0 {
        return Ok(());
    }
    launch(gpu, "avg_pool2d backward", &AVG_POOL2D_BACKWARD, dy, dx, sizes(x_shape, out, args), x_len)
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
