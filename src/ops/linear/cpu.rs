//! CPU linear layer: one GEMM per product. The batch is small next to the
//! convolutions, so the GEMM crate decides itself whether to split a product.

use crate::ops::gemm::{gemm, Par};
use crate::ops::Elem;

/// `y[n, out] = x[n, in] * w[out, in]^T + bias[out]`.
pub fn forward<T: Elem>(
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    y: &mut [T],
) {
    if let Some(b) = bias {
        for row in y.chunks_mut(out_f.max(1)).take(n) {
            row.copy_from_slice(&b[..out_f]);
        }
    }
    gemm(n, out_f, in_f, x, false, w, true, y, bias.is_some(), Par::Rayon(0));
}

/// Gradients of [`forward`] for upstream `dy[n, out]`: `dw += dy^T x`,
/// `db += sum_rows(dy)` (accumulated, like `.grad`), `dx = dy w` (overwritten).
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &[T],
    w: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
    dx: Option<&mut [T]>,
) {
    gemm(out_f, in_f, n, dy, true, x, false, dw, true, Par::Rayon(0));
    if let Some(db) = db {
        for row in dy.chunks(out_f.max(1)).take(n) {
            for (acc, v) in db.iter_mut().zip(row) {
                *acc = *acc + *v;
            }
        }
    }
    if let Some(dx) = dx {
        gemm(n, in_f, out_f, dy, false, w, false, dx, false, Par::Rayon(0));
    }
}
