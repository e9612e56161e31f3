//! CUDA linear layer (CPU twin: `cpu.rs`): the products through cuBLAS
//! ([`crate::cuda::blas`]), the bias broadcast and the bias gradient in
//! `kernels/linear.cu`. Everything is enqueued on the cuBLAS handle's stream,
//! so one layer's launches need no cross-stream ordering.
//!
//! f16 tensors: f16 operands, f32 accumulation, one rounding per output
//! element, as the CPU twin's "widen, f32 kernel, round" path.

use crate::cuda::blas::{gemm, Blas, BlasElem};
use crate::cuda::{Gpu, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;

const FILE: &str = "linear.cu";
static LINEAR_BIAS_FILL: TypedKernelFn = typed_kernel!(FILE, "linear_bias_fill");
static LINEAR_BIAS_BACKWARD: TypedKernelFn = typed_kernel!(FILE, "linear_bias_backward");

/// Every buffer must hold exactly its matrix: `(name, have, want)`.
fn check_lens(op: &str, lens: &[(&str, Option<usize>, usize)]) -> Result<()> {
    for &(name, have, want) in lens {
        if let Some(have) = have {
            if have != want {
                return Err(Error::shape(format!("{op}: {name} has {have} elements, expected {want}")));
            }
        }
    }
    Ok(())
}

fn dims_note(n: usize, in_f: usize, out_f: usize) -> String {
    format!("linear (N={n}, in={in_f}, out={out_f})")
}

/// `y[n, out] = x[n, in] w[out, in]^T + bias[out]`; `y` is overwritten.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: BlasElem>(
    gpu: &Gpu,
    blas: &Blas,
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &CudaView<T>,
    w: &CudaView<T>,
    bias: Option<&CudaView<T>>,
    y: &mut CudaViewMut<T>,
) -> Result<()> {
    let op = format!("{} forward", dims_note(n, in_f, out_f));
    check_lens(
        &op,
        &[
            ("input", Some(x.len()), n * in_f),
            ("weight", Some(w.len()), out_f * in_f),
            ("bias", bias.map(|b| b.len()), out_f),
            ("output", Some(y.len()), n * out_f),
        ],
    )?;
    if n * out_f == 0 {
        return Ok(());
    }
    // With a bias, y starts as the broadcast bias and the GEMM adds onto it
    // (beta = 1), so f16 rounds once, after the bias, like the CPU twin.
    if let Some(b) = bias {
        let k = T::pick(&LINEAR_BIAS_FILL);
        let f = gpu.kernel(k)?;
        let (rows, cols) = (n as i64, out_f as i64);
        let mut launch = f.launch_on(blas.stream());
        launch.arg(b).arg(&mut *y).arg(&rows).arg(&cols);
        // SAFETY: bias holds out_f and y n * out_f elements (checked above).
        unsafe { launch.launch(crate::cuda::launch_1d(n * out_f)) }
            .map_err(|e| Error::cuda(format!("{op}: {}", k.name()), e))?;
    }
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    gemm(blas, false, true, n, out_f, in_f, 1.0, x, in_f, w, in_f, beta, y, out_f)
}

/// Gradients for upstream `dy[n, out]`: `dw += dy^T x` and `db += column
/// sums of dy` (accumulated, like `.grad`), `dx = dy w` (overwritten).
#[allow(clippy::too_many_arguments)]
pub fn backward<T: BlasElem>(
    gpu: &Gpu,
    blas: &Blas,
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &CudaView<T>,
    w: &CudaView<T>,
    dy: &CudaView<T>,
    dw: &mut CudaViewMut<T>,
    db: Option<&mut CudaViewMut<T>>,
    dx: Option<&mut CudaViewMut<T>>,
) -> Result<()> {
    let op = format!("{} backward", dims_note(n, in_f, out_f));
    check_lens(
        &op,
        &[
            ("input", Some(x.len()), n * in_f),
            ("weight", Some(w.len()), out_f * in_f),
            ("dy", Some(dy.len()), n * out_f),
            ("dweight", Some(dw.len()), out_f * in_f),
            ("dbias", db.as_ref().map(|b| b.len()), out_f),
            ("dx", dx.as_ref().map(|b| b.len()), n * in_f),
        ],
    )?;
    // dw[out, in] += dy[n, out]^T x[n, in]
    gemm(blas, true, false, out_f, in_f, n, 1.0, dy, out_f, x, in_f, 1.0, dw, in_f)?;
    if let Some(dx) = dx {
        // dx[n, in] = dy[n, out] w[out, in]
        gemm(blas, false, false, n, in_f, out_f, 1.0, dy, out_f, w, in_f, 0.0, dx, in_f)?;
    }
    if let Some(db) = db {
        if out_f > 0 {
            bias_backward(gpu, blas, &op, n, out_f, dy, db)?;
        }
    }
    Ok(())
}

/// `db[out] += sum over rows of dy[n, out]` (kernel `linear_bias_backward`).
fn bias_backward<T: BlasElem>(
    gpu: &Gpu,
    blas: &Blas,
    op: &str,
    n: usize,
    out_f: usize,
    dy: &CudaView<T>,
    db: &mut CudaViewMut<T>,
) -> Result<()> {
    let k = T::pick(&LINEAR_BIAS_BACKWARD);
    let f = gpu.kernel(k)?;
    // The kernel's DDP_DB_COLS x DDP_DB_ROWS block; columns loop past the grid cap.
    let cfg = LaunchConfig {
        grid_dim: (out_f.div_ceil(32).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let (rows, cols) = (n as i64, out_f as i64);
    let mut launch = f.launch_on(blas.stream());
    launch.arg(dy).arg(db).arg(&rows).arg(&cols);
    // SAFETY: dy holds n * out_f and db out_f elements (checked by the caller).
    unsafe { launch.launch(cfg) }.map_err(|e| Error::cuda(format!("{op}: {}", k.name()), e))?;
    Ok(())
}
