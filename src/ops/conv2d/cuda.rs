//! Launchers for kernels/conv2d.cu: the non-GEMM pieces of a device conv2d
//! (im2col, col2im, bias add, bias gradient), and [`forward`] / [`backward`]
//! chaining them with the cuBLAS GEMMs (src/cuda/blas.rs). Sizes are a [`ConvGeom`] as built by the
//! CPU path's checks; it is re-validated here so that an inconsistent one
//! never reaches a kernel.

use super::cpu::ConvGeom;
use super::out_size;
use crate::cuda::blas::{gemm, gemm_strided_batched, BatchStrides, Blas, BlasElem};
use crate::cuda::{check_len, DeviceFloat, TypedKernelFn};
use crate::cuda::{launch_1d, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig};

const FILE: &str = "conv2d.cu";
static CONV2D_IM2COL: TypedKernelFn = typed_kernel!(FILE, "conv2d_im2col");
static CONV2D_COL2IM: TypedKernelFn = typed_kernel!(FILE, "conv2d_col2im");
static CONV2D_BIAS_ADD: TypedKernelFn = typed_kernel!(FILE, "conv2d_bias_add");
static CONV2D_BIAS_GRAD: TypedKernelFn = typed_kernel!(FILE, "conv2d_bias_grad");
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
    unfold::<T>(gpu, OP, &CONV2D_IM2COL, g, x, layout, col, col_len(g))
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
    unfold::<T>(gpu, OP, &CONV2D_COL2IM, g, col, layout, dx, g.n * g.x_len())
}

/// Shared launch of im2col / col2im (same argument list), one thread per
/// element of the output, `threads` of them.
#[allow(clippy::too_many_arguments)]
fn unfold<T: DeviceFloat>(
    gpu: &Gpu,
    op: &str,
    kernel: &'static TypedKernelFn,
    g: &ConvGeom,
    src: &impl DevicePtr<T>,
    layout: ColLayout,
    dst: &mut impl DevicePtrMut<T>,
    threads: usize,
) -> Result<()> {
    if threads == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(kernel))?;
    let stream = gpu.stream();
    let (sp, _s) = src.device_ptr(stream);
    let (dp, _d) = dst.device_ptr_mut(stream);
    let [n, c, h, w, k, s, p, ho, wo] = dims(g);
    let wide = layout.flag();
    let mut b = f.launch_on(stream);
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
    let f = gpu.kernel(T::pick(&CONV2D_BIAS_ADD))?;
    let stream = gpu.stream();
    let (yp, _y) = y.device_ptr_mut(stream);
    let (bp, _b) = bias.device_ptr(stream);
    let [n64, o64, hw64] = shape.map(|v| v as i64);
    let mut b = f.launch_on(stream);
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
    let f = gpu.kernel(T::pick(&CONV2D_BIAS_GRAD))?;
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
    let mut b = f.launch_on(stream);
    b.arg(&gp).arg(&dbp).arg(&n64).arg(&o64).arg(&hw64).arg(&acc);
    // SAFETY: dy holds n*o*hw and db o elements (checked above); the block
    // size matches the kernel's shared array.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

/// Elements of the scratch [`backward`] swaps `dy` into: `dy`'s own size.
pub fn dy_t_len(g: &ConvGeom) -> usize {
    g.n * g.y_len()
}

/// A view of the first `len` elements of a scratch buffer that may be larger
/// (one scratch serves every conv of a model, sized for the largest).
fn scratch<'b, T>(
    op: &str,
    what: &str,
    buf: &'b mut CudaViewMut<'_, T>,
    len: usize,
) -> Result<CudaViewMut<'b, T>> {
    if buf.len() < len {
        return Err(Error::shape(format!("{op}: {what} holds {} elements, needs at least {len}", buf.len())));
    }
    Ok(buf.slice_mut(0..len))
}

/// The whole forward: `y[N, O, Ho, Wo] = conv(x, w) + bias`, overwritten.
/// `col` is scratch of at least [`col_len`] elements. im2col per image, then
/// one strided-batched GEMM `y[img] = W[O, CKK] col[img][CKK, HoWo]` with
/// the weight shared; with a bias, `y` starts as the broadcast bias and the
/// GEMM adds onto it, so an f16 output is rounded once, as on the CPU.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: DeviceFloat + BlasElem>(
    gpu: &Gpu,
    blas: &Blas,
    g: &ConvGeom,
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    bias: Option<&CudaView<'_, T>>,
    col: &mut CudaViewMut<'_, T>,
    y: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    const OP: &str = "conv2d forward";
    check_geom(OP, g)?;
    check_len(OP, "x", x.len(), g.n * g.x_len())?;
    check_len(OP, "weight", w.len(), g.o * g.ckk())?;
    if let Some(b) = bias {
        check_len(OP, "bias", b.len(), g.o)?;
    }
    check_len(OP, "y", y.len(), g.n * g.y_len())?;
    let mut col = scratch(OP, "col", col, col_len(g))?;
    if g.n == 0 {
        return Ok(());
    }
    im2col(gpu, g, x, ColLayout::PerImage, &mut col)?;
    let beta = match bias {
        Some(b) => {
            gpu.stream().memset_zeros(y).map_err(|e| Error::cuda(OP, e))?;
            bias_add(gpu, [g.n, g.o, g.out_hw()], y, b)?;
            1.0
        }
        None => 0.0,
    };
    let (hw, ckk) = (g.out_hw(), g.ckk());
    let strides = BatchStrides { batch: g.n, stride_a: 0, stride_b: ckk * hw, stride_c: g.o * hw };
    gemm_strided_batched(
        blas,
        false,
        false,
        g.o,
        hw,
        ckk,
        1.0,
        w,
        ckk,
        &col.as_view(),
        hw,
        beta,
        y,
        hw,
        strides,
    )
}

/// The whole backward: `dw += dy . col(x)^T` and `db +=` the sums of `dy`
/// (PyTorch's `.grad` accumulation; f16 rounds once, after the add), and
/// `dx` (overwritten) when asked. `col` ([`col_len`]) and `dy_t`
/// ([`dy_t_len`]) are scratch. The batch is one GEMM per product: `dy` is
/// swapped to `[O, N*HoWo]` and `x` unfolded side by side
/// ([`ColLayout::Wide`], `[CKK, N*HoWo]`), so the weight gradient sums over
/// images inside one f32-accumulated GEMM.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: DeviceFloat + BlasElem>(
    gpu: &Gpu,
    blas: &Blas,
    g: &ConvGeom,
    x: &CudaView<'_, T>,
    w: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    col: &mut CudaViewMut<'_, T>,
    dy_t: &mut CudaViewMut<'_, T>,
    dw: &mut CudaViewMut<'_, T>,
    db: Option<&mut CudaViewMut<'_, T>>,
    dx: Option<&mut CudaViewMut<'_, T>>,
) -> Result<()> {
    const OP: &str = "conv2d backward";
    check_geom(OP, g)?;
    check_len(OP, "x", x.len(), g.n * g.x_len())?;
    check_len(OP, "weight", w.len(), g.o * g.ckk())?;
    check_len(OP, "dy", dy.len(), g.n * g.y_len())?;
    check_len(OP, "dweight", dw.len(), g.o * g.ckk())?;
    if let Some(db) = &db {
        check_len(OP, "dbias", db.len(), g.o)?;
    }
    if let Some(dx) = &dx {
        check_len(OP, "dx", dx.len(), g.n * g.x_len())?;
    }
    let mut col = scratch(OP, "col", col, col_len(g))?;
    let mut dy_t = scratch(OP, "dy_t", dy_t, dy_t_len(g))?;
    if g.n == 0 {
        return Ok(());
    }
    let (hw, ckk, nhw) = (g.out_hw(), g.ckk(), g.n * g.out_hw());
    im2col(gpu, g, x, ColLayout::Wide, &mut col)?;
    crate::cuda::cast::swap_outer(gpu, [g.n, g.o, hw], dy, &mut dy_t)?;
    // dw[O, CKK] += dy_t[O, N*HW] col[CKK, N*HW]^T
    gemm(blas, false, true, g.o, ckk, nhw, 1.0, &dy_t.as_view(), nhw, &col.as_view(), nhw, 1.0, dw, ckk)?;
    if let Some(db) = db {
        bias_grad(gpu, [g.n, g.o, hw], dy, db, true)?;
    }
    if let Some(dx) = dx {
        // dcol[CKK, N*HW] = w[O, CKK]^T dy_t[O, N*HW], into the col scratch
        // (its unfolded x was consumed by the GEMM above, in stream order).
        gemm(blas, true, false, ckk, nhw, g.o, 1.0, w, ckk, &dy_t.as_view(), nhw, 0.0, &mut col, nhw)?;
        col2im(gpu, g, &col, ColLayout::Wide, dx)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
