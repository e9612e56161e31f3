//! RMSNorm's CPU kernels, generic over f32/f64, and the twins of
//! kernels/rmsnorm.cu: each row's sums in the warp's order
//! (`ops::warp_order`), the weight gradient summed over rows in row order
//! per chunk of [`ROWS`], the chunks then added in order, so f32 results are
//! the device's bits and do not depend on the thread count.

use crate::ops::warp_order::{butterfly, lane_sums_of, LANES};
use crate::ops::Elem;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Rows per parallel task and per partial sum of the weight gradient (the
/// kernels take the same chunks).
pub const ROWS: usize = 64;

fn inv<T: Elem>(c: usize) -> T {
    T::one() / T::from_usize(c).unwrap_or_else(T::one)
}

/// `y = x * rstd (* w)` per row of `c`, `rstd = 1 / sqrt(mean(x^2) + eps)`
/// saved for backward.
pub fn forward<T: Elem>(c: usize, x: &[T], w: Option<&[T]>, eps: f32, y: &mut [MaybeUninit<T>], rstd: &mut [T]) {
    let (eps, inv_c) = (<T as Elem>::from_f32(eps), inv::<T>(c));
    y.par_chunks_mut(c).zip(x.par_chunks(c)).zip(rstd.par_iter_mut()).for_each(|((y, x), r)| {
        let ms = butterfly(lane_sums_of(-T::zero(), x, |v| v * v)) * inv_c;
        let rs = T::one() / (ms + eps).sqrt();
        for (k, (y, &v)) in y.iter_mut().zip(x).enumerate() {
            y.write(match w {
                Some(w) => v * rs * w[k],
                None => v * rs,
            });
        }
        *r = rs;
    });
}

/// `dx = rstd * (g - xhat * mean(g * xhat))` with `g = dy (* w)` and
/// `xhat = x * rstd`, where `dx` is asked for; `dw += sum(dy * xhat)` over
/// rows where there is a weight.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    c: usize,
    x: &[T],
    w: Option<&[T]>,
    rstd: &[T],
    dy: &[T],
    dx: Option<&mut [MaybeUninit<T>]>,
    dw: Option<&mut [T]>,
) {
    if let Some(dx) = dx {
        let inv_c = inv::<T>(c);
        dx.par_chunks_mut(c).zip(x.par_chunks(c).zip(dy.par_chunks(c))).zip(rstd).for_each(|((dx, (x, dy)), &rs)| {
            let g = |k: usize| match w {
                Some(w) => dy[k] * w[k],
                None => dy[k],
            };
            let mut s = [T::zero(); LANES];
            for k in 0..c {
                s[k % LANES] = s[k % LANES] + g(k) * (x[k] * rs);
            }
            let mgx = butterfly(s) * inv_c;
            for (k, dx) in dx.iter_mut().enumerate() {
                dx.write(rs * (g(k) - x[k] * rs * mgx));
            }
        });
    }
    let Some(dw) = dw else { return };
    let partials: Vec<Vec<T>> = x
        .par_chunks(c * ROWS)
        .zip(dy.par_chunks(c * ROWS))
        .zip(rstd.par_chunks(ROWS))
        .map(|((x, dy), rstd)| {
            let mut p = vec![T::zero(); c];
            for ((x, dy), &rs) in x.chunks(c).zip(dy.chunks(c)).zip(rstd) {
                for ((p, &x), &dy) in p.iter_mut().zip(x).zip(dy) {
                    *p = *p + dy * (x * rs);
                }
            }
            p
        })
        .collect();
    for p in partials {
        for (d, p) in dw.iter_mut().zip(p) {
            *d = *d + p;
        }
    }
}
