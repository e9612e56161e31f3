//! LayerNorm launchers for kernels/layer_norm.cu, the device twins of
//! `cpu.rs` over a `[rows, C]` view: the same summation orders (the weight
//! and bias gradients in chunks of [`cpu::ROWS`] rows), so f32 results are
//! the CPU's bits. Activations are `T`; weight, bias, their gradients and
//! the saved mean/rstd are f32 (apex keeps LayerNorm in f32).

use super::cpu;
pub use crate::cuda::Rows;
use crate::cuda::{as_i64, check_len, launch_1d, launch_rows, DeviceFloat, Gpu, KernelFn, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

const FILE: &str = "layer_norm.cu";
static LAYER_NORM_FORWARD: TypedKernelFn = typed_kernel!(FILE, "layer_norm_forward");
static LAYER_NORM_BACKWARD_DX: TypedKernelFn = typed_kernel!(FILE, "layer_norm_backward_dx");
static LAYER_NORM_BACKWARD_PARTIALS: TypedKernelFn = typed_kernel!(FILE, "layer_norm_backward_partials");
static LAYER_NORM_BACKWARD_ACCUMULATE: KernelFn = KernelFn::new(FILE, "layer_norm_backward_accumulate");

/// The f32 scratch [`backward`] needs: the per-chunk partial sums of the
/// weight and bias gradients.
pub fn backward_workspace_len(shape: Rows) -> usize {
    2 * shape.chunks(cpu::ROWS) * shape.c
}

/// The f32 parameters and their gradients; `bias` is `None` for `bias = False`.
pub struct Affine<W> {
    pub weight: W,
    pub bias: Option<W>,
}

/// Each row's mean and 1/sqrt(var + eps), written by forward, read by backward.
pub struct SavedStats<S> {
    pub mean: S,
    pub rstd: S,
}

fn null_or(p: Option<u64>) -> u64 {
    p.unwrap_or(0)
}

/// `y = (x - mean) * rstd * weight (+ bias)` per row (`y`, `mean` and `rstd`
/// overwritten).
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: Rows,
    params: Affine<&CudaView<'_, f32>>,
    eps: f32,
    y: &mut CudaViewMut<'_, T>,
    saved: SavedStats<&mut CudaViewMut<'_, f32>>,
) -> Result<()> {
    const OP: &str = "layer_norm forward";
    let (rows, c) = shape.args(OP)?;
    check_len(OP, "x", x.len(), shape.numel())?;
    check_len(OP, "y", y.len(), shape.numel())?;
    check_len(OP, "weight", params.weight.len(), shape.c)?;
    if let Some(b) = params.bias {
        check_len(OP, "bias", b.len(), shape.c)?;
    }
    check_len(OP, "mean", saved.mean.len(), shape.rows)?;
    check_len(OP, "rstd", saved.rstd.len(), shape.rows)?;
    if shape.numel() == 0 {
        return Ok(());
    }
    let f = gpu.kernel(T::pick(&LAYER_NORM_FORWARD))?;
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (wp, _w) = params.weight.device_ptr(stream);
    let bias = params.bias.map(|b| b.device_ptr(stream));
    let bp = null_or(bias.as_ref().map(|b| b.0));
    let (yp, _y) = y.device_ptr_mut(stream);
    let (mp, _m) = saved.mean.device_ptr_mut(stream);
    let (rp, _r) = saved.rstd.device_ptr_mut(stream);
    let mut b = f.launch_on(stream);
    b.arg(&xp).arg(&wp).arg(&bp).arg(&yp).arg(&mp).arg(&rp).arg(&rows).arg(&c).arg(&eps);
    // SAFETY: every buffer's length was checked against [rows, c] above; a
    // null bias is the kernel's bias = False.
    unsafe { b.launch(launch_rows(shape.rows)) }.map_err(|e| Error::cuda(OP, e))
}

/// `dx` (`=`, where asked: not for the model input) and
/// `grads.weight`/`grads.bias` (`+=`) from `dy`, using
/// `workspace` ([`backward_workspace_len`] f32s) for the partial sums.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: Rows,
    weight: &CudaView<'_, f32>,
    saved: SavedStats<&CudaView<'_, f32>>,
    dy: &CudaView<'_, T>,
    dx: Option<&mut CudaViewMut<'_, T>>,
    grads: Affine<&mut CudaViewMut<'_, f32>>,
    workspace: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "layer_norm backward";
    let (rows, c) = shape.args(OP)?;
    for (what, len) in [("x", x.len()), ("dy", dy.len())] {
        check_len(OP, what, len, shape.numel())?;
    }
    if let Some(dx) = &dx {
        check_len(OP, "dx", dx.len(), shape.numel())?;
    }
    check_len(OP, "weight", weight.len(), shape.c)?;
    check_len(OP, "weight.grad", grads.weight.len(), shape.c)?;
    if let Some(db) = grads.bias.as_ref() {
        check_len(OP, "bias.grad", db.len(), shape.c)?;
    }
    check_len(OP, "mean", saved.mean.len(), shape.rows)?;
    check_len(OP, "rstd", saved.rstd.len(), shape.rows)?;
    check_len(OP, "workspace", workspace.len(), backward_workspace_len(shape))?;
    if shape.numel() == 0 {
        return Ok(());
    }
    let stream = gpu.stream();
    let (xp, _x) = x.device_ptr(stream);
    let (wp, _w) = weight.device_ptr(stream);
    let (mp, _m) = saved.mean.device_ptr(stream);
    let (rp, _r) = saved.rstd.device_ptr(stream);
    let (gp, _g) = dy.device_ptr(stream);
    if let Some(dx) = dx {
        let (dxp, _dx) = dx.device_ptr_mut(stream);
        let f = gpu.kernel(T::pick(&LAYER_NORM_BACKWARD_DX))?;
        let mut b = f.launch_on(stream);
        b.arg(&xp).arg(&wp).arg(&mp).arg(&rp).arg(&gp).arg(&dxp).arg(&rows).arg(&c);
        // SAFETY: x, dy, dx are [rows, c], weight [c], mean/rstd [rows] (checked).
        unsafe { b.launch(launch_rows(shape.rows)) }.map_err(|e| Error::cuda(format!("{OP} (dx)"), e))?;
    }
    let chunks = shape.chunks(cpu::ROWS);
    let (mut pw, mut pb) = workspace.split_at_mut(chunks * shape.c);
    let (pwp, _pw) = pw.device_ptr_mut(stream);
    let (pbp, _pb) = pb.device_ptr_mut(stream);
    let chunk_rows = cpu::ROWS as i64;
    {
        let f = gpu.kernel(T::pick(&LAYER_NORM_BACKWARD_PARTIALS))?;
        let mut b = f.launch_on(stream);
        b.arg(&xp).arg(&mp).arg(&rp).arg(&gp).arg(&pwp).arg(&pbp).arg(&rows).arg(&c).arg(&chunk_rows);
        // SAFETY: as above; pw and pb hold chunks * c each (the workspace's length was checked).
        unsafe { b.launch(launch_1d(chunks * shape.c)) }
            .map_err(|e| Error::cuda(format!("{OP} (partials)"), e))?;
    }
    let (dwp, _dw) = grads.weight.device_ptr_mut(stream);
    let db = grads.bias.map(|b| b.device_ptr_mut(stream));
    let dbp = null_or(db.as_ref().map(|b| b.0));
    let chunks = as_i64(OP, chunks)?;
    let f = gpu.kernel(&LAYER_NORM_BACKWARD_ACCUMULATE)?;
    let mut b = f.launch_on(stream);
    b.arg(&pwp).arg(&pbp).arg(&dwp).arg(&dbp).arg(&chunks).arg(&c);
    // SAFETY: the partials were written above; dw and db hold c (checked); a
    // null db is bias = False.
    unsafe { b.launch(launch_1d(shape.c)) }.map_err(|e| Error::cuda(format!("{OP} (accumulate)"), e))
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
