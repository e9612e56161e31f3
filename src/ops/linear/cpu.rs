//! CPU linear layer: one GEMM per product, split across the rayon pool only
//! when it is large enough to pay for the fork (see [`par`]).

use crate::ops::gemm::{gemm, Par};
use crate::ops::Elem;

/// How a product of `m * n * k` multiply-adds runs: MNIST's classifier
/// (100 x 10 x 1568, 1.6 M) took 2.4x longer split over 2 threads than on
/// one (its backward, 0.66 vs 0.27 ms per step, measured in training).
fn par(m: usize, n: usize, k: usize) -> Par {
    if m.saturating_mul(n).saturating_mul(k) >= 1 << 23 {
        Par::Rayon(0)
    } else {
        Par::Seq
    }
}

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
    gemm(n, out_f, in_f, x, false, w, true, y, bias.is_some(), par(n, out_f, in_f));
}

/// Gradients of [`forward`] for upstream `dy[n, out]`: `dw += dy^T x`,
/// `db += sum_rows(dy)` (accumulated, like `.grad`), `dx = dy w` (overwritten).
/// The `dw` and `dx` products run side by side on the pool (each on one
/// thread, as [`par`] picks for MNIST's classifier): the same two sums, in
/// half the time when a second worker is free.
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
    let weight_grad = || {
        gemm(out_f, in_f, n, dy, true, x, false, dw, true, par(out_f, in_f, n));
        if let Some(db) = db {
            for row in dy.chunks(out_f.max(1)).take(n) {
                for (acc, v) in db.iter_mut().zip(row) {
                    *acc = *acc + *v;
                }
            }
        }
    };
    match dx {
        Some(dx) => {
            rayon::join(weight_grad, || {
                gemm(n, in_f, out_f, dy, false, w, false, dx, false, par(n, in_f, out_f))
            });
        }
        None => weight_grad(),
    }
}
