//! LayerNorm's CPU kernels, generic over f32/f64. Rows are independent in
//! forward and in dx (parallel over rows), each row's sums in the device's
//! warp order (`ops::warp_order`); the weight and bias gradients sum
//! over rows in row order per chunk, chunks then added in order, so the sum
//! does not depend on the thread count.

use crate::ops::warp_order::{butterfly, lane_sums_of, LANES};
use crate::ops::Elem;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Rows per parallel task, and per partial sum of the weight and bias
/// gradients (kernels/layer_norm.cu takes the same chunks, so the sums agree).
pub const ROWS: usize = 64;

#[allow(clippy::too_many_arguments)]
pub fn forward<T: Elem>(
    c: usize,
    x: &[T],
    w: &[T],
    b: Option<&[T]>,
    eps: f32,
    y: &mut [MaybeUninit<T>],
    mean: &mut [T],
    rstd: &mut [T],
) {
    let eps = <T as Elem>::from_f32(eps);
    let inv_c = T::one() / T::from_usize(c).unwrap_or_else(T::one);
    y.par_chunks_mut(c).zip(x.par_chunks(c)).zip(mean.par_iter_mut().zip(rstd.par_iter_mut())).for_each(
        |((y, x), (m, r))| {
            let mu = butterfly(lane_sums_of(-T::zero(), x, |v| v)) * inv_c;
            let var = butterfly(lane_sums_of(-T::zero(), x, |v| (v - mu) * (v - mu))) * inv_c;
            let rs = T::one() / (var + eps).sqrt();
            for (k, (y, &v)) in y.iter_mut().zip(x).enumerate() {
                let h = (v - mu) * rs * w[k];
                y.write(match b {
                    Some(b) => h + b[k],
                    None => h,
                });
            }
            (*m, *r) = (mu, rs);
        },
    );
}

/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * w`;
/// `dw += sum(dy * xhat)`, `db += sum(dy)` over rows.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    c: usize,
    x: &[T],
    w: &[T],
    mean: &[T],
    rstd: &[T],
    dy: &[T],
    dx: &mut [MaybeUninit<T>],
    dw: &mut [T],
    db: Option<&mut [T]>,
) {
    let inv_c = T::one() / T::from_usize(c).unwrap_or_else(T::one);
    let partials: Vec<(Vec<T>, Vec<T>)> = dx
        .par_chunks_mut(c * ROWS)
        .zip(x.par_chunks(c * ROWS).zip(dy.par_chunks(c * ROWS)))
        .enumerate()
        .map(|(chunk, (dx, (x, dy)))| {
            let (mut pw, mut pb) = (vec![T::zero(); c], vec![T::zero(); c]);
            for (r, ((dx, x), dy)) in dx.chunks_mut(c).zip(x.chunks(c)).zip(dy.chunks(c)).enumerate() {
                let row = chunk * ROWS + r;
                let (mu, rs) = (mean[row], rstd[row]);
                let (mut sg, mut sgx) = ([T::zero(); LANES], [T::zero(); LANES]);
                // Blocks of 32 columns, column k in lane k % 32 (the warp's
                // order), as slices the compiler vectorizes.
                for base in (0..c).step_by(LANES) {
                    let len = (c - base).min(LANES);
                    let cols = base..base + len;
                    let (pw, pb) = (&mut pw[cols.clone()], &mut pb[cols.clone()]);
                    let lanes =
                        sg[..len].iter_mut().zip(&mut sgx[..len]).zip(pw.iter_mut().zip(pb.iter_mut()));
                    let vals = x[cols.clone()].iter().zip(&dy[cols.clone()]).zip(&w[cols]);
                    for (((sg, sgx), (pw, pb)), ((&x, &dy), &w)) in lanes.zip(vals) {
                        let xhat = (x - mu) * rs;
                        let g = dy * w;
                        *sg = *sg + g;
                        *sgx = *sgx + g * xhat;
                        *pw = *pw + dy * xhat;
                        *pb = *pb + dy;
                    }
                }
                let (mg, mgx) = (butterfly(sg) * inv_c, butterfly(sgx) * inv_c);
                for (dx, ((&x, &dy), &w)) in dx.iter_mut().zip(x.iter().zip(dy).zip(w)) {
                    let xhat = (x - mu) * rs;
                    dx.write(rs * (dy * w - mg - xhat * mgx));
                }
            }
            (pw, pb)
        })
        .collect();
    let mut db = db;
    for (pw, pb) in partials {
        for (d, p) in dw.iter_mut().zip(pw) {
            *d = *d + p;
        }
        if let Some(db) = db.as_deref_mut() {
            for (d, p) in db.iter_mut().zip(pb) {
                *d = *d + p;
            }
        }
    }
}
