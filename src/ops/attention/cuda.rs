//! Causal self-attention on the device, the twin of `cpu.rs`: per head,
//! cuBLAS strided-batched GEMMs over the batch for `q k^T * scale` and
//! `att v`, and kernels/attention.cu's causal softmax between them; backward
//! the same way in reverse.
//!
//! Attention dropout multiplies the softmax by the mask kernels/dropout.cu
//! draws, element `e` of `[N, H, T, T]` from the same Philox counter as the
//! CPU's element `e`, so both drop the same probabilities. The dropped copy
//! lives in a caller's workspace only while a GEMM reads it: forward keeps
//! the undropped softmax (what the softmax backward needs) and backward
//! draws the mask again, as the dropout layer does.
//!
//! q, k and v are read in place from `qkv[N, T, 3C]` (head h's q at columns
//! `h*hd..`, k at `C + h*hd..`, v at `2C + h*hd..`, leading dimension 3C), and
//! each head's output goes straight into its columns of `y[N, T, C]` and
//! `dqkv[N, T, 3C]`, so no split or merge copies are needed.
//!
//! Numerics: the softmax kernels follow the CPU's order bit for bit, but the
//! GEMMs sum in cuBLAS's order (the CPU sums each dot product left to right),
//! so f32 results agree to rounding (~1e-6 relative), not to the bit. With f16
//! the scores and probabilities are stored in f16 between the GEMMs (the CPU
//! keeps them in f32), so f16 agrees to f16's rounding.

use super::cpu::Dims;
use crate::cuda::blas::{gemm_strided_batched, BatchStrides, Blas, BlasElem};
use crate::cuda::{as_i64, check_len, launch_rows, DeviceFloat, Gpu, TypedKernelFn};
use crate::error::{Error, Result};
use crate::ops::dropout::{cuda as dropk, Mask};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

const FILE: &str = "attention.cu";
static CAUSAL_SOFTMAX_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "causal_softmax_backward");
static CAUSAL_SOFTMAX_FORWARD: TypedKernelFn = typed_kernel!(FILE, "causal_softmax_forward");

/// The element types the launchers take: a kernel type cuBLAS also takes.
pub trait AttnFloat: DeviceFloat + BlasElem {}
impl<T: DeviceFloat + BlasElem> AttnFloat for T {}

/// Head width, `1/sqrt(hd)` as the CPU computes it, and the checked sizes.
struct Geometry {
    hd: usize,
    scale: f32,
    /// `[N, T, 3C]`, `[N, T, C]` and `[N, H, T, T]` element counts.
    qkv: usize,
    y: usize,
    att: usize,
}

fn geometry(op: &str, d: Dims) -> Result<Geometry> {
    let Dims { n, t, c, h } = d;
    if h == 0 || c % h != 0 {
        return Err(Error::shape(format!("{op}: width {c} does not split into {h} heads")));
    }
    let hd = c / h;
    let g = Geometry {
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        qkv: n * t * 3 * c,
        y: n * t * c,
        att: n * h * t * t,
    };
    as_i64(op, g.qkv.max(g.att))?;
    Ok(g)
}

/// A GEMM operand inside a larger buffer: head `h`'s matrix starts
/// `h * head_step` past the operand's offset, rows `ld` apart, samples
/// `stride` apart.
struct Operand<'v, 'a, T> {
    buf: &'v CudaView<'a, T>,
    head_step: usize,
    ld: usize,
    stride: usize,
}

/// One batched GEMM per head over the samples: `C = alpha op(A) op(B)`
/// (beta 0: C written), C given as (offset, head step, ldc, sample stride).
#[allow(clippy::too_many_arguments)]
fn per_head<T: AttnFloat>(
    blas: &Blas,
    d: Dims,
    (trans_a, trans_b): (bool, bool),
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    (a, a_off): (Operand<'_, '_, T>, usize),
    (b, b_off): (Operand<'_, '_, T>, usize),
    c: &mut CudaViewMut<'_, T>,
    (c_off, c_step, ldc, c_stride): (usize, usize, usize, usize),
) -> Result<()> {
    for head in 0..d.h {
        let av = a.buf.slice(a_off + head * a.head_step..);
        let bv = b.buf.slice(b_off + head * b.head_step..);
        let mut cv = c.slice_mut(c_off + head * c_step..);
        let strides = BatchStrides { batch: d.n, stride_a: a.stride, stride_b: b.stride, stride_c: c_stride };
        gemm_strided_batched(
            blas, trans_a, trans_b, m, n, k, alpha, &av, a.ld, &bv, b.ld, 0.0, &mut cv, ldc, strides,
        )?;
    }
    Ok(())
}

/// Launches one of the softmax kernels over the `N * H * T` rows of `rows`.
fn softmax_rows<T: AttnFloat>(
    gpu: &Gpu,
    op: &str,
    kernel: &'static TypedKernelFn,
    att: Option<&CudaView<'_, T>>,
    rows: &mut CudaViewMut<'_, T>,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let n_rows = d.n * d.h * d.t;
    if n_rows == 0 {
        return Ok(());
    }
    let f = gpu.kernel(<T as DeviceFloat>::pick(kernel))?;
    let stream = gpu.stream();
    let a = att.map(|a| a.device_ptr(stream));
    let (rp, _r) = rows.device_ptr_mut(stream);
    let (nr, t) = (n_rows as i64, d.t as i64);
    let mut b = f.launch_on(stream);
    if let Some((ap, _)) = &a {
        b.arg(ap);
    }
    b.arg(&rp).arg(&nr).arg(&t);
    if a.is_some() {
        b.arg(&scale);
    }
    // SAFETY: the callers checked `rows` (and `att`) hold N*H*T rows of T.
    unsafe { b.launch(launch_rows(n_rows)) }.map_err(|e| Error::cuda(op, e))
}

/// Attention dropout in training: the mask, and `N * H * T * T` elements of
/// workspace for the dropped softmax.
pub struct Dropout<'m, 'w, 'a, T> {
    pub mask: &'m Mask,
    pub workspace: &'w mut CudaViewMut<'a, T>,
}

/// `y[N, T, C]` (overwritten) and the softmax `att[N, H, T, T]` (0 above the
/// diagonal, kept for backward, undropped) from `qkv[N, T, 3C]`; with
/// `dropout`, `y` is the dropped softmax times v.
pub fn forward<T: AttnFloat>(
    gpu: &Gpu,
    blas: &Blas,
    qkv: &CudaView<'_, T>,
    d: Dims,
    y: &mut CudaViewMut<'_, T>,
    att: &mut CudaViewMut<'_, T>,
    dropout: Option<Dropout<'_, '_, '_, T>>,
) -> Result<()> {
    const OP: &str = "attention forward";
    let g = geometry(OP, d)?;
    check_len(OP, "qkv", qkv.len(), g.qkv)?;
    check_len(OP, "y", y.len(), g.y)?;
    check_len(OP, "att", att.len(), g.att)?;
    if g.y == 0 {
        return Ok(());
    }
    let Dims { t, c, h, .. } = d;
    let (tt, c3) = (t * t, 3 * c);
    let qkv_op = || Operand { buf: qkv, head_step: g.hd, ld: c3, stride: t * c3 };
    // att = q k^T * scale
    per_head(
        blas,
        d,
        (false, true),
        (t, t, g.hd),
        g.scale,
        (qkv_op(), 0),
        (qkv_op(), c),
        att,
        (0, tt, t, h * tt),
    )?;
    softmax_rows(gpu, OP, &CAUSAL_SOFTMAX_FORWARD, None, att, d, 1.0)?;
    // y = att v, or dropped(att) v
    let att_v = match dropout.filter(|dr| !dr.mask.keeps_all()) {
        Some(Dropout { mask, workspace }) => {
            check_len(OP, "dropout workspace", workspace.len(), g.att)?;
            dropk::apply(gpu, mask, &att.as_view(), workspace)?;
            workspace.as_view()
        }
        None => att.as_view(),
    };
    let att_op = Operand { buf: &att_v, head_step: tt, ld: t, stride: h * tt };
    per_head(
        blas,
        d,
        (false, false),
        (t, g.hd, t),
        1.0,
        (att_op, 0),
        (qkv_op(), 2 * c),
        y,
        (0, g.hd, c, t * c),
    )
}

/// `dqkv[N, T, 3C]` (every element overwritten) from `dy[N, T, C]`, the
/// forward's `qkv` and `att` (undropped) and its dropout `mask`;
/// `workspace` holds `N * H * T * T` elements.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: AttnFloat>(
    gpu: &Gpu,
    blas: &Blas,
    qkv: &CudaView<'_, T>,
    att: &CudaView<'_, T>,
    d: Dims,
    dy: &CudaView<'_, T>,
    dqkv: &mut CudaViewMut<'_, T>,
    workspace: &mut CudaViewMut<'_, T>,
    mask: Option<&Mask>,
) -> Result<()> {
    const OP: &str = "attention backward";
    let g = geometry(OP, d)?;
    check_len(OP, "qkv", qkv.len(), g.qkv)?;
    check_len(OP, "att", att.len(), g.att)?;
    check_len(OP, "dy", dy.len(), g.y)?;
    check_len(OP, "dqkv", dqkv.len(), g.qkv)?;
    check_len(OP, "workspace", workspace.len(), g.att)?;
    if g.y == 0 {
        return Ok(());
    }
    let Dims { t, c, h, .. } = d;
    let (tt, c3) = (t * t, 3 * c);
    let qkv_op = || Operand { buf: qkv, head_step: g.hd, ld: c3, stride: t * c3 };
    let dy_op = || Operand { buf: dy, head_step: g.hd, ld: c, stride: t * c };
    let att_op = || Operand { buf: att, head_step: tt, ld: t, stride: h * tt };
    let dqkv_at = |off| (off, g.hd, c3, t * c3);
    let mask = mask.filter(|m| !m.keeps_all());
    // dv = dropped(att)^T dy, first: the dropped softmax is drawn into the
    // workspace that d(att) then overwrites.
    match mask {
        Some(m) => {
            dropk::apply(gpu, m, att, workspace)?;
            let dropped = workspace.as_view();
            let op = Operand { buf: &dropped, head_step: tt, ld: t, stride: h * tt };
            per_head(blas, d, (true, false), (t, g.hd, t), 1.0, (op, 0), (dy_op(), 0), dqkv, dqkv_at(2 * c))?;
        }
        None => per_head(
            blas,
            d,
            (true, false),
            (t, g.hd, t),
            1.0,
            (att_op(), 0),
            (dy_op(), 0),
            dqkv,
            dqkv_at(2 * c),
        )?,
    }
    // d(att) = dy v^T (through the mask), into the workspace.
    per_head(
        blas,
        d,
        (false, true),
        (t, t, g.hd),
        1.0,
        (dy_op(), 0),
        (qkv_op(), 2 * c),
        workspace,
        (0, tt, t, h * tt),
    )?;
    if let Some(m) = mask {
        dropk::apply_(gpu, m, workspace)?;
    }
    // The workspace becomes the scores' gradient, scale included.
    softmax_rows(gpu, OP, &CAUSAL_SOFTMAX_BACKWARD, Some(att), workspace, d, g.scale)?;
    let ds_v = workspace.as_view();
    let ds_op = || Operand { buf: &ds_v, head_step: tt, ld: t, stride: h * tt };
    // dq = ds k, dk = ds^T q
    per_head(blas, d, (false, false), (t, g.hd, t), 1.0, (ds_op(), 0), (qkv_op(), c), dqkv, dqkv_at(0))?;
    per_head(blas, d, (true, false), (t, g.hd, t), 1.0, (ds_op(), 0), (qkv_op(), 0), dqkv, dqkv_at(c))
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
