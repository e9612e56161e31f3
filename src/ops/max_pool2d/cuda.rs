//! MaxPool2d launchers for kernels/max_pool2d.cu, the device twins of
//! `cpu.rs`: the same window scan (first maximum wins, a NaN is taken) and
//! the same u32 indices. The backward gathers instead of scattering (see the
//! kernel), so it needs the pooling geometry as well as the indices.

use super::cpu::Geometry;
use crate::cuda::{check_len, DeviceFloat, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{DevicePtr, DevicePtrMut};

const FILE: &str = "max_pool2d.cu";
static MAX_POOL2D_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "max_pool2d_backward");
static MAX_POOL2D_FORWARD: TypedKernelFn = typed_kernel!(FILE, "max_pool2d_forward");

/// The output shape `[N, C, OH, OW]` for an input `[N, C, H, W]`, after the
/// checks the CPU path makes (positive sizes, window inside the input,
/// planes small enough for u32 indices).
pub fn out_shape(x_shape: [usize; 4], kernel_size: usize, stride: usize) -> Result<[usize; 4]> {
    let [n, c, h, w] = x_shape;
    if kernel_size == 0 || stride == 0 {
        return Err(Error::shape(format!(
            "max_pool2d: kernel_size and stride must be positive, got kernel_size {kernel_size}, stride {stride}"
        )));
    }
    if kernel_size > h || kernel_size > w {
        return Err(Error::shape(format!(
            "max_pool2d: kernel_size {kernel_size} is larger than the {h}x{w} input (H x W)"
        )));
    }
    if u32::try_from(h * w).is_err() {
        return Err(Error::shape(format!("max_pool2d: a {h}x{w} plane is too large for u32 indices")));
    }
    let (oh, ow) = Geometry { h, w, kernel: kernel_size, stride }.out_hw();
    Ok([n, c, oh, ow])
}

/// The kernels' size arguments: planes, h, w, oh, ow, k, s.
fn sizes(x_shape: [usize; 4], out: [usize; 4], kernel_size: usize, stride: usize) -> [i64; 7] {
    let [n, c, h, w] = x_shape;
    [(n * c) as i64, h as i64, w as i64, out[2] as i64, out[3] as i64, kernel_size as i64, stride as i64]
}

/// Pools `x` (`[N, C, H, W]`) into `y` and writes, per output element, the
/// flat index of the chosen input within its `H * W` plane. Returns the
/// output shape.
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &impl DevicePtr<T>,
    x_shape: [usize; 4],
    kernel_size: usize,
    stride: usize,
    y: &mut impl DevicePtrMut<T>,
    indices: &mut impl DevicePtrMut<u32>,
) -> Result<[usize; 4]> {
    let out = out_shape(x_shape, kernel_size, stride)?;
    let len: usize = out.iter().product();
    check_len("max_pool2d forward", "x", x.len(), x_shape.iter().product())?;
    check_len("max_pool2d forward", "y", y.len(), len)?;
    check_len("max_pool2d forward", "indices", indices.len(), len)?;
    if len == 0 {
        return Ok(out);
    }
    let f = gpu.kernel(T::pick(&MAX_POOL2D_FORWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (yp, _y) = y.device_ptr_mut(stream);
    let (ip, _i) = indices.device_ptr_mut(stream);
    let [planes, h, w, oh, ow, k, s] = sizes(x_shape, out, kernel_size, stride);
    let mut b = f.launch_on(stream);
    b.arg(&xp).arg(&yp).arg(&ip).arg(&planes).arg(&h).arg(&w).arg(&oh).arg(&ow).arg(&k).arg(&s);
    // SAFETY: every buffer's length was checked against the geometry above.
    unsafe { b.launch(launch_1d(len)) }.map_err(|e| Error::cuda("max_pool2d forward", e))?;
    Ok(out)
}

/// `dx` (`[N, C, H, W]`, overwritten) from `dy` and the forward's indices;
/// inputs chosen by several overlapping windows receive the sum.
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    dy: &impl DevicePtr<T>,
    indices: &impl DevicePtr<u32>,
    x_shape: [usize; 4],
    kernel_size: usize,
    stride: usize,
    dx: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    let out = out_shape(x_shape, kernel_size, stride)?;
    let len: usize = out.iter().product();
    let x_len: usize = x_shape.iter().product();
    check_len("max_pool2d backward", "dy", dy.len(), len)?;
    check_len("max_pool2d backward", "indices", indices.len(), len)?;
    check_len("max_pool2d backward", "dx", dx.len(), x_len)?;
    if x_len == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&MAX_POOL2D_BACKWARD))?;
    let stream = gpu.stream();
    let (gp, _g) = dy.device_ptr(stream);
    let (ip, _i) = indices.device_ptr(stream);
    let (dxp, _dx) = dx.device_ptr_mut(stream);
    let [planes, h, w, oh, ow, k, s] = sizes(x_shape, out, kernel_size, stride);
    let mut b = f.launch_on(stream);
    b.arg(&gp).arg(&ip).arg(&dxp).arg(&planes).arg(&h).arg(&w).arg(&oh).arg(&ow).arg(&k).arg(&s);
    // SAFETY: every buffer's length was checked against the geometry above.
    unsafe { b.launch(launch_1d(x_len)) }.map_err(|e| Error::cuda("max_pool2d backward", e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
