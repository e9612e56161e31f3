//! Launchers for kernels/conv2d.cu: the non-GEMM pieces of a device conv2d
//! (im2col, col2im, bias add, bias gradient). The GEMMs between them come
//! from cuBLAS (src/cuda/blas.rs). Sizes are a [`ConvGeom`] as built by the
//! CPU path's checks; it is re-validated here so that an inconsistent one
//! never reaches a kernel.

use super::cpu::ConvGeom;
use super::out_size;
use crate::cuda::{check_len, entry, DeviceFloat};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

const FILE: &str = "conv2d.cu";
/// Threads per block of `conv2d_bias_grad` (its shared array is this size).
const BIAS_GRAD_THREADS: u32 = 256;

/// How the im2col matrices of a batch are laid out (row r = (c*K + ki)*K +
/// kj, column q = oh*Wo + ow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColLayout {
    /// `[N][C*K*K][Ho*Wo]`: one matrix per image, back to back (a
    /// strided-batched GEMM, or one GEMM per image).
    PerImage,
    /// `[C*K*K][N*Ho*Wo]`: the images side by side (one GEMM for the batch).
    Wide,
}

impl ColLayout {
    fn flag(self) -> i32 {
        match self {
            ColLayout::PerImage => 0,
            ColLayout::Wide => 1,
        }
    }
}

/// Elements of the im2col buffer for the whole batch of `g`.
pub fn col_len(g: &ConvGeom) -> usize {
    g.n * g.ckk() * g.out_hw()
}

fn check_geom(op: &str, g: &ConvGeom) -> Result<()> {
    let sizes_ok = g.c > 0 && g.h > 0 && g.w > 0 && g.o > 0 && g.k > 0 && g.stride > 0;
    let out_ok = g.ho > 0
        && g.wo > 0
        && g.ho == out_size(g.h, g.k, g.stride, g.padding)
        && g.wo == out_size(g.w, g.k, g.stride, g.padding);
    if sizes_ok && out_ok {
        Ok(())
    } else {
        Err(Error::shape(format!("{op}: inconsistent convolution geometry {g:?}")))
    }
}

/// The size arguments the im2col/col2im kernels share: n, c, h, w, k, s, p, ho, wo.
fn dims(g: &ConvGeom) -> [i64; 9] {
    [g.n, g.c, g.h, g.w, g.k, g.stride, g.padding, g.ho, g.wo].map(|v| v as i64)
}

/// Unfolds `x` (`[N, C, H, W]`) into `col` (zero padding included).
pub fn im2col<T: DeviceFloat>(
    gpu: &Gpu,
    g: &ConvGeom,
    x: &impl DevicePtr<T>,
    layout: ColLayout,
    col: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    const OP: &str = "conv2d im2col";
    check_geom(OP, g)?;
    check_len(OP, "x", x.len(), g.n * g.x_len())?;
    check_len(OP, "col", col.len(), col_len(g))?;
    unfold::<T>(gpu, OP, "conv2d_im2col", g, x, layout, col, col_len(g))
}

/// `dx` (`[N, C, H, W]`, overwritten) = the adjoint of [`im2col`] applied to
/// `col`: each pixel gets the sum of the column entries that read it.
pub fn col2im<T: DeviceFloat>(
    gpu: &Gpu,
    g: &ConvGeom,
    col: &impl DevicePtr<T>,
    layout: ColLayout,
    dx: &mut impl DevicePtrMut<T>,
) -> Result<()> {
    const OP: &str = "conv2d col2im";
    check_geom(OP, g)?;
    check_len(OP, "col", col.len(), col_len(g))?;
    check_len(OP, "dx", dx.len(), g.n * g.x_len())?;
    unfold::<T>(gpu, OP, "conv2d_col2im", g, col, layout, dx, g.n * g.x_len())
}

/// Shared launch of im2col / col2im (same argument list), one thread per
/// element of the output, `threads` of them.
#[allow(clippy::too_many_arguments)]
fn unfold<T: DeviceFloat>(
    gpu: &Gpu,
    op: &str,
    kernel: &str,
    g: &ConvGeom,
    src: &impl DevicePtr<T>,
    layout: ColLayout,
    dst: &mut impl DevicePtrMut<T>,
    threads: usize,
) -> Result<()> {
    if threads == 0 {
        return Ok(());
    }
    let f = gpu.function(FILE, &entry::<T>(kernel))?;
    let stream = gpu.stream();
    let (sp, _s) = src.device_ptr(stream);
    let (dp, _d) = dst.device_ptr_mut(stream);
    let [n, c, h, w, k, s, p, ho, wo] = dims(g);
    let wide = layout.flag();
    let mut b = stream.launch_builder(&f);
    b.arg(&sp).arg(&dp).arg(&n).arg(&c).arg(&h).arg(&w).arg(&k).arg(&s).arg(&p).arg(&ho).arg(&wo).arg(&wide);
    // SAFETY: the caller checked both buffers against the validated geometry.
    unsafe { b.launch(launch_1d(threads)) }.map_err(|e| Error::cuda(op, e))?;
    Ok(())
}

/// `y[N, O, HW] += bias[O]` in place; `shape` is `[N, O, HW]`.
pub fn bias_add<T: DeviceFloat>(
    gpu: &Gpu,
    shape: [usize; 3],
    y: &mut impl DevicePtrMut<T>,
    bias: &impl DevicePtr<T>,
) -> Result<()> {
    const OP: &str = "conv2d bias_add";
    let [n, o, hw] = shape;
    check_len(OP, "y", y.len(), n * o * hw)?;
    check_len(OP, "bias", bias.len(), o)?;
    if n * o * hw == 0 {
        return Ok(());
    }
    let f = gpu.function(FILE, &entry::<T>("conv2d_bias_add"))?;
    let stream = gpu.stream();
    let (yp, _y) = y.device_ptr_mut(stream);
    let (bp, _b) = bias.device_ptr(stream);
    let [n64, o64, hw64] = shape.map(|v| v as i64);
    let mut b = stream.launch_builder(&f);
    b.arg(&yp).arg(&bp).arg(&n64).arg(&o64).arg(&hw64);
    // SAFETY: y holds n*o*hw and bias o elements (checked above).
    unsafe { b.launch(launch_1d(n * o * hw)) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

/// `db[O]` = (or += with `accumulate`) the sum of `dy[N, O, HW]` over N and
/// HW, accumulated in f32 in a fixed order (deterministic).
pub fn bias_grad<T: DeviceFloat>(
    gpu: &Gpu,
    shape: [usize; 3],
    dy: &impl DevicePtr<T>,
    db: &mut impl DevicePtrMut<T>,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "conv2d bias_grad";
    let [n, o, hw] = shape;
    check_len(OP, "dy", dy.len(), n * o * hw)?;
    check_len(OP, "db", db.len(), o)?;
    if o == 0 {
        return Ok(());
    }
    let f = gpu.function(FILE, &entry::<T>("conv2d_bias_grad"))?;
    let stream = gpu.stream();
    let (gp, _g) = dy.device_ptr(stream);
    let (dbp, _db) = db.device_ptr_mut(stream);
    let [n64, o64, hw64] = shape.map(|v| v as i64);
    let acc = i32::from(accumulate);
    let cfg = LaunchConfig {
        grid_dim: (o.min(65_535) as u32, 1, 1),
        block_dim: (BIAS_GRAD_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(&f);
    b.arg(&gp).arg(&dbp).arg(&n64).arg(&o64).arg(&hw64).arg(&acc);
    // SAFETY: dy holds n*o*hw and db o elements (checked above); the block
    // size matches the kernel's shared array.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
