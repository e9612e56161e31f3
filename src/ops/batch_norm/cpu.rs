//! BatchNorm2d CPU kernels over NCHW slices, split into the four pieces
//! SyncBatchNorm needs separately: local forward sums, normalize+affine, local
//! backward sums, and dx from (possibly all-reduced) sums and the total count.
//!
//! Accumulation (the numerics contract asks for f32): each reduction sums in
//! `T` across 16 independent lanes over blocks of at most 1,024 elements,
//! then adds the block results in f64. No f32 chain is longer than 64 adds,
//! however large the channel (78,400 values for MNIST's first layer), and the
//! lanes vectorize. The forward sums are taken around a per-channel shift (the
//! channel's first value) so `sum x^2 - n mean^2` does not cancel when
//! |mean| >> std; they are returned shifted back as plain f64 sums, and the
//! statistics are formed from them in f64 and rounded once to `T`. A caller
//! that all-reduces the sums (SyncBatchNorm) should do so in f64 to keep that.

use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many elements per call, rayon's fork/join costs more than the
/// second core saves.
pub(super) const PAR_MIN_ELEMS: usize = 1 << 15;

/// Samples per rayon job at most: rayon otherwise stops splitting at about
/// a quarter of the batch per job, and the other threads wait for the one
/// that runs last (the BN passes were a tenth of the time one thread of a
/// 2-thread step spent waiting).
pub(super) const SAMPLES_PER_JOB: usize = 4;

#[inline(always)]
fn wide<T: Elem>(v: T) -> f64 {
    <T as Elem>::to_f64(v)
}

/// Rounds an f64 statistic to `T` (exact for f64, round-to-nearest for f32).
#[inline(always)]
fn narrow<T: Elem>(v: f64) -> T {
    T::from_f64(v).unwrap_or_else(T::nan)
}

/// Independent accumulators: they vectorize (4 f32 per SSE register, 8 per
/// AVX) and cut each rounding chain 16-fold.
const LANES: usize = 16;
/// Elements summed in `T` before the partial sum moves to f64.
const BLOCK: usize = 1024;

/// Lane partials to f64, summed as a tree (lane `i` with `i + 8`, then
/// `+ 4`, `+ 2`, `+ 1`): the order the AVX-512 kernels reduce a vector in,
/// a few adds deep instead of a 16-add chain per plane.
#[inline(always)]
fn lanes_to_f64<T: Elem>(l: &[T; LANES]) -> f64 {
    let t: [f64; 8] = std::array::from_fn(|i| wide(l[i]) + wide(l[i + 8]));
    let u: [f64; 4] = std::array::from_fn(|i| t[i] + t[i + 4]);
    (u[0] + u[2]) + (u[1] + u[3])
}

/// `(sum (x - shift), sum (x - shift)^2)` of one contiguous (n, c) plane.
pub(super) fn plane_sums<T: Elem>(p: &[T], shift: T) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if let Some(pf) = crate::ops::elem::f32s(p).filter(|_| super::avx512::usable()) {
        return super::avx512::plane_sums(pf, shift.to_f64() as f32);
    }
    plane_sums_generic(p, shift)
}

/// [`plane_sums`] without the AVX-512 path (whose results equal these bit for bit).
pub(super) fn plane_sums_generic<T: Elem>(p: &[T], shift: T) -> (f64, f64) {
    let (mut s_tot, mut q_tot) = (0.0f64, 0.0f64);
    for blk in p.chunks(BLOCK) {
        let mut s = [T::zero(); LANES];
        let mut q = [T::zero(); LANES];
        let chunks = blk.chunks_exact(LANES);
        let rem = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                let v = c[l] - shift;
                s[l] = s[l] + v;
                q[l] = q[l] + v * v;
            }
        }
        // The tail goes to separate scalars: indexing the lanes by a runtime
        // position would force them out of registers for the whole block.
        let (mut rs, mut rq) = (T::zero(), T::zero());
        for &x in rem {
            let v = x - shift;
            rs = rs + v;
            rq = rq + v * v;
        }
        s_tot += wide(rs);
        q_tot += wide(rq);
        s_tot += lanes_to_f64(&s);
        q_tot += lanes_to_f64(&q);
    }
    (s_tot, q_tot)
}

/// `(sum dy, sum dy * (x - mean))` of one plane.
pub(super) fn plane_backward_sums<T: Elem>(x: &[T], dy: &[T], mean: T) -> (f64, f64) {
    debug_assert_eq!(x.len(), dy.len());
    let (mut s_tot, mut q_tot) = (0.0f64, 0.0f64);
    for (xb, db) in x.chunks(BLOCK).zip(dy.chunks(BLOCK)) {
        let mut s = [T::zero(); LANES];
        let mut q = [T::zero(); LANES];
        let (xc, dc) = (xb.chunks_exact(LANES), db.chunks_exact(LANES));
        let (xr, dr) = (xc.remainder(), dc.remainder());
        for (xa, da) in xc.zip(dc) {
            for (((sl, ql), &xv), &g) in s.iter_mut().zip(q.iter_mut()).zip(xa).zip(da) {
                *sl = *sl + g;
                *ql = *ql + g * (xv - mean);
            }
        }
        let (mut rs, mut rq) = (T::zero(), T::zero());
        for (&xv, &g) in xr.iter().zip(dr) {
            rs = rs + g;
            rq = rq + g * (xv - mean);
        }
        s_tot += lanes_to_f64(&s) + wide(rs);
        q_tot += lanes_to_f64(&q) + wide(rq);
    }
    (s_tot, q_tot)
}

/// Per channel `ch`, the sum over samples `i` (in order, from `(0, 0)`) of
/// `plane(i, ch)`, the pair of sums of plane `(i, ch)` of an `[n, c, ...]`
/// batch; on both cores when the tensor (`total` elements) is large. The
/// planes are visited sample by sample, in memory order: a channel's planes
/// are strided through the batch, and reading them channel by channel left
/// the hardware prefetcher behind (a third of BatchNorm's time on MNIST's
/// 14x14 planes). The sums per channel are added in the same order either
/// way, so the results do not depend on the visiting order.
pub(super) fn sum_planes_per_channel(
    n: usize,
    c: usize,
    total: usize,
    plane: impl Fn(usize, usize) -> (f64, f64) + Sync + Send,
) -> Vec<(f64, f64)> {
    let one = |k: usize| plane(k / c, k % c);
    let per: Vec<(f64, f64)> = if total >= PAR_MIN_ELEMS {
        (0..n * c)
            .into_par_iter()
            .with_min_len(c.max(1))
            .with_max_len(SAMPLES_PER_JOB * c.max(1))
            .map(one)
            .collect()
    } else {
        (0..n * c).map(one).collect()
    };
    (0..c)
        .map(|ch| {
            (0..n).fold((0.0, 0.0), |(s, q), i| {
                let (ps, pq) = per[i * c + ch];
                (s + ps, q + pq)
            })
        })
        .collect()
}

/// (a) The local per-channel forward reductions of a `[n, c, hw]` batch.
/// `count` is the number of elements per channel.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalSums {
    pub count: usize,
    pub sum: Vec<f64>,
    pub sumsq: Vec<f64>,
}

pub fn local_sums<T: Elem>(x: &[T], n: usize, c: usize, hw: usize) -> LocalSums {
    debug_assert_eq!(x.len(), n * c * hw);
    let shift = |ch: usize| if n * hw > 0 { x[ch * hw] } else { T::zero() };
    local_sums_with(n, c, hw, shift, |i, ch, k| plane_sums(&x[(i * c + ch) * hw..][..hw], k))
}

/// [`local_sums`] with plane `(i, ch)`'s shifted sums taken by `plane(i, ch,
/// shift(ch))`, for callers whose planes are not `T` slices (f16 activations).
pub(super) fn local_sums_with<T: Elem>(
    n: usize,
    c: usize,
    hw: usize,
    shift: impl Fn(usize) -> T + Sync + Send,
    plane: impl Fn(usize, usize, T) -> (f64, f64) + Sync + Send,
) -> LocalSums {
    let count = n * hw;
    let per = sum_planes_per_channel(n, c, n * c * hw, |i, ch| plane(i, ch, shift(ch)));
    let (sum, sumsq) = per
        .into_iter()
        .enumerate()
        .map(|(ch, (s, q))| {
            // Undo the shift: sum x = s + n k, sum x^2 = q + 2 k s + n k^2.
            let (k, m) = (wide(shift(ch)), count as f64);
            (s + m * k, q + 2.0 * k * s + m * k * k)
        })
        .unzip();
    LocalSums { count, sum, sumsq }
}

/// Batch statistics derived from (possibly globally reduced) sums.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStats<T> {
    pub mean: Vec<T>,
    /// `1 / sqrt(biased_var + eps)`: what normalization and backward use.
    pub invstd: Vec<T>,
    /// `biased_var * count / (count - 1)`: what the running variance tracks.
    pub var_unbiased: Vec<T>,
}

/// `count` must be > 1 (the caller checks, as PyTorch does in training).
pub fn batch_stats<T: Elem>(sum: &[f64], sumsq: &[f64], count: usize, eps: f64) -> BatchStats<T> {
    let nf = count as f64;
    let mut st = BatchStats {
        mean: Vec::with_capacity(sum.len()),
        invstd: Vec::with_capacity(sum.len()),
        var_unbiased: Vec::with_capacity(sum.len()),
    };
    for (&s, &q) in sum.iter().zip(sumsq) {
        let mean = s / nf;
        // Rounding can push E[x^2] - mean^2 a hair below zero for a constant channel.
        let var = (q / nf - mean * mean).max(0.0);
        st.mean.push(narrow(mean));
        st.invstd.push(narrow(1.0 / (var + eps).sqrt()));
        st.var_unbiased.push(narrow(var * nf / (nf - 1.0)));
    }
    st
}

/// `running = (1 - momentum) * running + momentum * batch`, PyTorch's update.
pub fn update_running<T: Elem>(
    running_mean: &mut [T],
    running_var: &mut [T],
    stats: &BatchStats<T>,
    momentum: T,
) {
    let keep = T::one() - momentum;
    for (r, &m) in running_mean.iter_mut().zip(&stats.mean) {
        *r = keep * *r + momentum * m;
    }
    for (r, &v) in running_var.iter_mut().zip(&stats.var_unbiased) {
        *r = keep * *r + momentum * v;
    }
}

/// Calls `f(plane_index_in_sample, x_plane, out_plane)` over every (n, c)
/// plane, splitting the batch across cores when it is large.
fn for_each_plane<T: Elem>(
    x: &[T],
    out: &mut [T],
    c: usize,
    hw: usize,
    f: impl Fn(usize, &[T], &mut [T]) + Sync + Send,
) {
    let sample = c * hw;
    if sample == 0 {
        return;
    }
    let per_sample = |(xs, os): (&[T], &mut [T])| {
        for (ch, (xp, op)) in xs.chunks_exact(hw).zip(os.chunks_exact_mut(hw)).enumerate() {
            f(ch, xp, op);
        }
    };
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(sample).zip(out.par_chunks_mut(sample)).for_each(per_sample);
    } else {
        x.chunks(sample).zip(out.chunks_mut(sample)).for_each(per_sample);
    }
}

/// Per channel `(scale, shift)` with `out = x * scale + shift`.
pub fn affine_coefficients<T: Elem>(
    c: usize,
    mean: &[T],
    invstd: &[T],
    weight: &[T],
    bias: &[T],
) -> (Vec<T>, Vec<T>) {
    let scale: Vec<T> = (0..c).map(|ch| weight[ch] * invstd[ch]).collect();
    let shift: Vec<T> = (0..c).map(|ch| bias[ch] - mean[ch] * scale[ch]).collect();
    (scale, shift)
}

/// (b) `out = (x - mean) * invstd * weight + bias`, folded into one
/// multiply-add per element with per-channel scale and shift.
#[allow(clippy::too_many_arguments)]
pub fn normalize_affine<T: Elem>(
    x: &[T],
    c: usize,
    hw: usize,
    mean: &[T],
    invstd: &[T],
    weight: &[T],
    bias: &[T],
    out: &mut [T],
) {
    debug_assert_eq!(x.len(), out.len());
    let (scale, shift) = affine_coefficients(c, mean, invstd, weight, bias);
    for_each_plane(x, out, c, hw, |ch, xp, op| {
        let (a, b) = (scale[ch], shift[ch]);
        for (o, &v) in op.iter_mut().zip(xp) {
            *o = v * a + b;
        }
    });
}

/// `1 / sqrt(running_var + eps)` for evaluation mode.
pub fn invstd_from_var<T: Elem>(var: &[T], eps: T) -> Vec<T> {
    var.iter().map(|&v| T::one() / (v + eps).sqrt()).collect()
}

/// (c) The local per-channel backward reductions: `sum dy` (= dbias) and
/// `sum dy * xhat` (= dweight), with `xhat = (x - mean) * invstd`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardSums {
    pub sum_dy: Vec<f64>,
    pub sum_dy_xhat: Vec<f64>,
}

pub fn backward_sums<T: Elem>(
    x: &[T],
    dy: &[T],
    n: usize,
    c: usize,
    hw: usize,
    mean: &[T],
    invstd: &[T],
) -> BackwardSums {
    debug_assert_eq!(x.len(), dy.len());
    backward_sums_with(n, c, hw, invstd, |i, ch| {
        let off = (i * c + ch) * hw;
        plane_backward_sums(&x[off..][..hw], &dy[off..][..hw], mean[ch])
    })
}

/// [`backward_sums`] with plane `(i, ch)`'s sums taken by `plane(i, ch)`.
pub(super) fn backward_sums_with<T: Elem>(
    n: usize,
    c: usize,
    hw: usize,
    invstd: &[T],
    plane: impl Fn(usize, usize) -> (f64, f64) + Sync + Send,
) -> BackwardSums {
    let per = sum_planes_per_channel(n, c, n * c * hw, plane);
    let (sum_dy, sum_dy_xhat) =
        per.into_iter().enumerate().map(|(ch, (s, q))| (s, q * wide(invstd[ch]))).unzip();
    BackwardSums { sum_dy, sum_dy_xhat }
}

/// Per channel `(k, p, q)` with `dx = k*dy + p*x + q` (see [`backward_dx`]),
/// formed in f64 and rounded once.
pub fn dx_coefficients<T: Elem>(
    c: usize,
    mean: &[T],
    invstd: &[T],
    weight: &[T],
    sums: &BackwardSums,
    count: usize,
) -> Vec<(T, T, T)> {
    let m = count as f64;
    (0..c)
        .map(|ch| {
            let istd = wide(invstd[ch]);
            let k = wide(weight[ch]) * istd;
            let a = sums.sum_dy[ch] / m;
            let b = istd * sums.sum_dy_xhat[ch] / m;
            let p = -k * b;
            let q = k * (wide(mean[ch]) * b - a);
            (narrow(k), narrow(p), narrow(q))
        })
        .collect()
}

/// (d) `dx = weight * invstd * (dy - sum_dy/M - xhat * sum_dy_xhat/M)` with
/// `M = count` the (global) number of elements per channel. Expanded per
/// channel into `dx = k*dy + p*x + q` so each element costs two multiply-adds.
#[allow(clippy::too_many_arguments)]
pub fn backward_dx<T: Elem>(
    x: &[T],
    dy: &[T],
    c: usize,
    hw: usize,
    mean: &[T],
    invstd: &[T],
    weight: &[T],
    sums: &BackwardSums,
    count: usize,
    dx: &mut [T],
) {
    debug_assert_eq!(x.len(), dy.len());
    debug_assert_eq!(x.len(), dx.len());
    let coef = dx_coefficients(c, mean, invstd, weight, sums, count);
    let sample = c * hw;
    if sample == 0 {
        return;
    }
    let per_sample = |((xs, ds), os): ((&[T], &[T]), &mut [T])| {
        let planes = xs.chunks_exact(hw).zip(ds.chunks_exact(hw)).zip(os.chunks_exact_mut(hw));
        for (ch, ((xp, dp), op)) in planes.enumerate() {
            let (k, p, q) = coef[ch];
            for ((o, &xv), &g) in op.iter_mut().zip(xp).zip(dp) {
                *o = k * g + p * xv + q;
            }
        }
    };
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(sample).zip(dy.par_chunks(sample)).zip(dx.par_chunks_mut(sample)).for_each(per_sample);
    } else {
        x.chunks(sample).zip(dy.chunks(sample)).zip(dx.chunks_mut(sample)).for_each(per_sample);
    }
}
