//! BatchNorm2d (training) + ReLU + MaxPool2d(2, 2) as one pass each way, the
//! block every MNIST conv layer ends in. Unfused, the three ops write and
//! re-read five full-size activations per step (normalized, ReLU'd, a copy
//! kept for ReLU's backward, the zeroed pool gradient, the ReLU gradient);
//! fused, the forward reads the BN input once and writes only the pooled
//! quarter, and the backward reads only the pooled gradient and the BN input.
//!
//! Per 2x2 window the forward keeps one byte: the position (0..4, row-major)
//! of the first maximum of the normalized values, or [`KILLED`] when that
//! maximum is not positive. ReLU is monotone, so the max of the ReLU'd
//! values sits where the normalized max does, and ReLU passes gradient only
//! where its output is positive: a killed window sends no gradient to BN.
//! Values and gradients equal the unfused composition's element for element
//! (the same `x * scale + shift` and `k * g + p * x + q` expressions); only
//! the order of the backward sums differs. A window holding a NaN outputs NaN
//! and is killed (the loss is then NaN and the trainer stops).

use super::cpu::{dx_coefficients, sum_planes_per_channel, BackwardSums, PAR_MIN_ELEMS, SAMPLES_PER_JOB};
use crate::ops::Elem;
use rayon::prelude::*;

/// Window code for "no gradient flows back" (max not positive, or NaN).
pub const KILLED: u8 = 4;

#[inline(always)]
fn max2<T: Elem>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// One `h x w` plane (`h`, `w` even) into its `h/2 x w/2` pooled plane and codes.
fn forward_plane<T: Elem>(x: &[T], w: usize, scale: T, shift: T, y: &mut [T], codes: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512::usable() {
        if let (Some(xf), Some(yf)) = (crate::ops::elem::f32s(x), crate::ops::elem::f32s_mut(y)) {
            let (a, b) = (scale.to_f64() as f32, shift.to_f64() as f32);
            return super::avx512::forward_plane(xf, w, a, b, yf, codes);
        }
    }
    forward_plane_generic(x, w, scale, shift, y, codes);
}

/// [`forward_plane`] without the AVX-512 path (whose results equal these bit for bit).
pub(super) fn forward_plane_generic<T: Elem>(
    x: &[T],
    w: usize,
    scale: T,
    shift: T,
    y: &mut [T],
    codes: &mut [u8],
) {
    let ow = w / 2;
    for (oy, (yrow, crow)) in y.chunks_exact_mut(ow).zip(codes.chunks_exact_mut(ow)).enumerate() {
        let top = 2 * oy * w;
        let (r0, r1) = (&x[top..top + w], &x[top + w..top + 2 * w]);
        let cells = r0.chunks_exact(2).zip(r1.chunks_exact(2));
        let mut nan = false;
        for ((yo, co), (a, b)) in yrow.iter_mut().zip(crow.iter_mut()).zip(cells) {
            let z0 = a[0] * scale + shift;
            let z1 = a[1] * scale + shift;
            let z2 = b[0] * scale + shift;
            let z3 = b[1] * scale + shift;
            nan |= z0.is_nan() | z1.is_nan() | z2.is_nan() | z3.is_nan();
            let m = max2(max2(z0, z1), max2(z2, z3));
            // Reverse scan order, so the first maximum wins (PyTorch's argmax).
            let mut c = 3u8;
            c = if z2 == m { 2 } else { c };
            c = if z1 == m { 1 } else { c };
            c = if z0 == m { 0 } else { c };
            let alive = m > T::zero();
            *co = if alive { c } else { KILLED };
            *yo = if alive { m } else { T::zero() };
        }
        if nan {
            for ((yo, co), (a, b)) in
                yrow.iter_mut().zip(crow.iter_mut()).zip(r0.chunks_exact(2).zip(r1.chunks_exact(2)))
            {
                if [a[0], a[1], b[0], b[1]].iter().any(|v| (*v * scale + shift).is_nan()) {
                    *yo = T::nan();
                    *co = KILLED;
                }
            }
        }
    }
}

/// `y = maxpool2x2(relu(x * scale[c] + shift[c]))` over `x[n, c, h, w]`
/// (`h`, `w` even), with one window code per output element.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Elem>(
    x: &[T],
    c: usize,
    h: usize,
    w: usize,
    scale: &[T],
    shift: &[T],
    y: &mut [T],
    codes: &mut [u8],
) {
    let (ip, op) = (h * w, (h / 2) * (w / 2));
    if ip == 0 || op == 0 || c == 0 {
        return;
    }
    let (xs, ys) = (c * ip, c * op);
    let per_sample = |((xi, yi), ci): ((&[T], &mut [T]), &mut [u8])| {
        let planes = xi.chunks_exact(ip).zip(yi.chunks_exact_mut(op)).zip(ci.chunks_exact_mut(op));
        for (ch, ((xp, yp), cp)) in planes.enumerate() {
            forward_plane(xp, w, scale[ch], shift[ch], yp, cp);
        }
    };
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(xs)
            .zip(y.par_chunks_mut(ys))
            .zip(codes.par_chunks_mut(ys))
            .with_max_len(SAMPLES_PER_JOB)
            .for_each(per_sample);
    } else {
        x.chunks(xs).zip(y.chunks_mut(ys)).zip(codes.chunks_mut(ys)).for_each(per_sample);
    }
}

/// Flat position in the input plane of the live `code` of window
/// (`oy`, `ox`).
#[inline(always)]
fn source(oy: usize, ox: usize, code: u8, w: usize) -> usize {
    (2 * oy + usize::from(code >> 1)) * w + 2 * ox + usize::from(code & 1)
}

/// BN's backward sums `(sum dz, sum dz * xhat)` per channel, where `dz` (the
/// gradient at the BN output) is `dy` at each live window's source and zero
/// elsewhere. Each pooled row is summed in `T` and moved to f64.
#[allow(clippy::too_many_arguments)]
pub fn backward_sums<T: Elem>(
    x: &[T],
    dy: &[T],
    codes: &[u8],
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    mean: &[T],
    invstd: &[T],
) -> BackwardSums {
    let (ow, op, ip) = (w / 2, (h / 2) * (w / 2), h * w);
    if ow == 0 {
        let zeros = vec![0.0; c];
        return BackwardSums { sum_dy: zeros.clone(), sum_dy_xhat: zeros };
    }
    let per = sum_planes_per_channel(n, c, x.len(), |i, ch| {
        let k = i * c + ch;
        plane_sums(&x[k * ip..][..ip], &dy[k * op..][..op], &codes[k * op..][..op], w, mean[ch])
    });
    let per = per.into_iter().enumerate().map(|(ch, (s, q))| (s, q * invstd[ch].to_f64()));
    let (sum_dy, sum_dy_xhat) = per.unzip();
    BackwardSums { sum_dy, sum_dy_xhat }
}

/// One plane's `(sum dz, sum dz * (x - mean))`, see [`backward_sums`].
fn plane_sums<T: Elem>(xp: &[T], dp: &[T], cp: &[u8], w: usize, mean: T) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512::usable() {
        if let (Some(xf), Some(df)) = (crate::ops::elem::f32s(xp), crate::ops::elem::f32s(dp)) {
            return super::avx512::pool_plane_sums(xf, df, cp, w, mean.to_f64() as f32);
        }
    }
    plane_sums_generic(xp, dp, cp, w, mean)
}

/// [`plane_sums`] without the AVX-512 path (which sums in another order).
pub(super) fn plane_sums_generic<T: Elem>(xp: &[T], dp: &[T], cp: &[u8], w: usize, mean: T) -> (f64, f64) {
    let (mut s, mut q) = (0.0f64, 0.0f64);
    for (row, (drow, crow)) in dp.chunks_exact(w / 2).zip(cp.chunks_exact(w / 2)).enumerate() {
        let (mut rs, mut rq) = (T::zero(), T::zero());
        for (j, (&g, &code)) in drow.iter().zip(crow).enumerate() {
            if code < KILLED {
                let xv = xp[source(row, j, code, w)];
                rs = rs + g;
                rq = rq + g * (xv - mean);
            }
        }
        s += rs.to_f64();
        q += rq.to_f64();
    }
    (s, q)
}

/// One plane of [`backward_dx`], in place: `x` becomes `dx = p * x + q`,
/// plus `k * dy` at live sources.
fn plane_dx<T: Elem>(xdx: &mut [T], dp: &[T], cp: &[u8], w: usize, (k, p, q): (T, T, T)) {
    #[cfg(target_arch = "x86_64")]
    if super::avx512::usable() {
        if let (Some(xf), Some(df)) = (crate::ops::elem::f32s_mut(xdx), crate::ops::elem::f32s(dp)) {
            let kpq = (k.to_f64() as f32, p.to_f64() as f32, q.to_f64() as f32);
            return super::avx512::pool_plane_dx(xf, df, cp, w, kpq);
        }
    }
    plane_dx_generic(xdx, dp, cp, w, (k, p, q));
}

/// [`plane_dx`] without the AVX-512 path (whose results equal these bit for
/// bit). Window by window, so each `x` is read before its `dx` replaces it.
pub(super) fn plane_dx_generic<T: Elem>(xdx: &mut [T], dp: &[T], cp: &[u8], w: usize, (k, p, q): (T, T, T)) {
    let ow = w / 2;
    for (oy, (drow, crow)) in dp.chunks_exact(ow).zip(cp.chunks_exact(ow)).enumerate() {
        for (ox, (&g, &code)) in drow.iter().zip(crow).enumerate() {
            for pos in 0..4u8 {
                let at = source(oy, ox, pos, w);
                let xv = xdx[at];
                // Where dz = 0 the unfused `k * 0 + p * x + q` is `p * x + q`.
                xdx[at] = if pos == code { k * g + p * xv + q } else { p * xv + q };
            }
        }
    }
}

/// One sample's `((x, dy), codes)`, as the zipped iterators yield them.
type SampleSlices<'a, T> = ((&'a mut [T], &'a [T]), &'a [u8]);

/// BN's `dx[n, c, h, w]` for the pooled gradient `dy`, written over the
/// input `x` it is computed from (its last use: no zero-filled 4x-sized
/// buffer per step), given [`backward_sums`] (possibly all-reduced) and the
/// per-channel `count`.
#[allow(clippy::too_many_arguments)]
pub fn backward_dx<T: Elem>(
    x: &mut [T],
    dy: &[T],
    codes: &[u8],
    c: usize,
    h: usize,
    w: usize,
    mean: &[T],
    invstd: &[T],
    weight: &[T],
    sums: &BackwardSums,
    count: usize,
) {
    let (op, ip) = ((h / 2) * (w / 2), h * w);
    if ip == 0 || op == 0 || c == 0 {
        return;
    }
    let coef = dx_coefficients(c, mean, invstd, weight, sums, count);
    let per_sample = |((xi, di), ci): SampleSlices<'_, T>| {
        let planes = xi.chunks_exact_mut(ip).zip(di.chunks_exact(op)).zip(ci.chunks_exact(op));
        for (ch, ((xp, dp), cp)) in planes.enumerate() {
            plane_dx(xp, dp, cp, w, coef[ch]);
        }
    };
    let (xs, ys) = (c * ip, c * op);
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks_mut(xs)
            .zip(dy.par_chunks(ys))
            .zip(codes.par_chunks(ys))
            .with_max_len(SAMPLES_PER_JOB)
            .for_each(per_sample);
    } else {
        x.chunks_mut(xs).zip(dy.chunks(ys)).zip(codes.chunks(ys)).for_each(per_sample);
    }
}
