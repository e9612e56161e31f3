//! CPU linear layer: one GEMM per product, split across the rayon pool only
//! when it is large enough to pay for the fork (see [`par`]).
//!
//! A split product runs as one sequential GEMM per block of rows (of y and
//! dx, or of dweight), a block per thread; y and dx start uninitialized (the
//! GEMM only writes them), where zeroing them first was a serial pass over
//! memory. Every element is the same sum as one call would give: the
//! `gemm` crate's K blocking depends on K alone, never on how many rows or
//! columns a call has. Against the crate's own threading this is 10-20%
//! faster on a baby GPT's forward products (768 rows by 128 to 512 columns,
//! `linear_timing` in tests.rs), and as fast on their backward.

use crate::ops::gemm::{gemm, gemm_into, gemm_ld, Par};
use crate::ops::Elem;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Whether a product of `m * n * k` multiply-adds is split: MNIST's
/// classifier (100 x 10 x 1568, 1.6 M) took 2.4x longer split over 2 threads
/// than on one (its backward, 0.66 vs 0.27 ms per step, measured in training).
fn par(m: usize, n: usize, k: usize) -> bool {
    m.saturating_mul(n).saturating_mul(k) >= 1 << 23 && rayon::current_num_threads() > 1
}

/// Rows per block when `rows` are split over the pool: one block per thread,
/// a multiple of 16 rows (whole microkernel tiles).
fn block_rows(rows: usize) -> usize {
    rows.div_ceil(rayon::current_num_threads().max(1)).next_multiple_of(16).max(16)
}

/// `y[n, out] = x[n, in] * w[out, in]^T + bias[out]`, every element of
/// `y[..n * out]` written (it may start uninitialized).
pub fn forward<T: Elem>(
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    y: &mut [MaybeUninit<T>],
) {
    if n == 0 || out_f == 0 {
        return;
    }
    let block = |rows: usize, x: &[T], y: &mut [MaybeUninit<T>]| {
        let Some(b) = bias else {
            return gemm_into(rows, out_f, in_f, x, false, w, true, y, Par::Seq);
        };
        for row in y.chunks_mut(out_f) {
            for (e, &v) in row.iter_mut().zip(b) {
                e.write(v);
            }
        }
        // SAFETY: each row of out_f elements took the bias's out_f values.
        let y = unsafe { &mut *(y as *mut [MaybeUninit<T>] as *mut [T]) };
        gemm(rows, out_f, in_f, x, false, w, true, y, true, Par::Seq)
    };
    let y = &mut y[..n * out_f];
    if !par(n, out_f, in_f) {
        return block(n, x, y);
    }
    let rows = block_rows(n);
    y.par_chunks_mut(rows * out_f)
        .zip(x.par_chunks(rows * in_f.max(1)))
        .for_each(|(y, x)| block(y.len() / out_f, x, y));
}

/// Gradients of [`forward`] for upstream `dy[n, out]`: `dw += dy^T x`,
/// `db += sum_rows(dy)` (accumulated, like `.grad`), `dx = dy w` (every
/// element of `dx[..n * in]` written; it may start uninitialized). The `dw`
/// and `dx` products run side by side on the pool, each split into blocks of
/// rows when large.
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
    dx: Option<&mut [MaybeUninit<T>]>,
) {
    match dx {
        Some(dx) => {
            rayon::join(
                || backward_params(n, in_f, out_f, x, dy, dw, db),
                || backward_input(n, in_f, out_f, w, dy, dx),
            );
        }
        None => backward_params(n, in_f, out_f, x, dy, dw, db),
    }
}

/// [`backward`]'s parameter half: `dw += dy^T x` (split into blocks of
/// output features when large, each block reading those columns of dy) and
/// `db += sum_rows(dy)`.
pub fn backward_params<T: Elem>(
    n: usize,
    in_f: usize,
    out_f: usize,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    db: Option<&mut [T]>,
) {
    if par(out_f, in_f, n) {
        let rows = block_rows(out_f);
        dw[..out_f * in_f].par_chunks_mut(rows * in_f).enumerate().for_each(|(b, dw)| {
            let dy = (&dy[b * rows..], out_f, true);
            gemm_ld(dw.len() / in_f, in_f, n, dy, (x, in_f, false), (dw, in_f), true, Par::Seq)
        });
    } else {
        gemm(out_f, in_f, n, dy, true, x, false, dw, true, Par::Seq);
    }
    if let Some(db) = db {
        for row in dy.chunks(out_f.max(1)).take(n) {
            for (acc, v) in db.iter_mut().zip(row) {
                *acc = *acc + *v;
            }
        }
    }
}

/// [`backward`]'s input half: `dx = dy w`, every element of `dx[..n * in]`
/// written (split into blocks of rows when large).
pub fn backward_input<T: Elem>(
    n: usize,
    in_f: usize,
    out_f: usize,
    w: &[T],
    dy: &[T],
    dx: &mut [MaybeUninit<T>],
) {
    if n == 0 || in_f == 0 {
        return;
    }
    let block = |rows: usize, dy: &[T], dx: &mut [MaybeUninit<T>]| {
        gemm_into(rows, in_f, out_f, dy, false, w, false, dx, Par::Seq)
    };
    let dx = &mut dx[..n * in_f];
    if !par(n, in_f, out_f) {
        return block(n, dy, dx);
    }
    let rows = block_rows(n);
    let blocks = dx.par_chunks_mut(rows * in_f).zip(dy.par_chunks(rows * out_f.max(1)));
    blocks.for_each(|(dx, dy)| block(dx.len() / in_f, dy, dx));
}
