//! BatchNorm2d (training) + ReLU + MaxPool2d(2, 2) over f16 activations with
//! f32 parameters (apex O2's keep_batchnorm_fp32), one pass each way.
//!
//! The three f16 ops in sequence wrote BatchNorm's output, kept ReLU's
//! output for its backward, wrote the zeroed max-pool gradient and the ReLU
//! gradient: four full-size f16 tensors per block and step, each widened and
//! rounded again by the next op. Here the forward reads the BN input once and
//! writes the pooled quarter with one code per window, and the backward
//! rebuilds the gradient at BatchNorm's output plane by plane in cache.
//!
//! Every value is the one the ops in sequence give: BatchNorm's output is
//! rounded to f16 before ReLU sees it, the max-pool takes its max and argmax
//! on those rounded values (rows holding a NaN by its exact scan), ReLU's
//! mask is read at the argmax (a NaN passes its gradient, as in PyTorch),
//! and the backward sums add the same per-element terms (zeros included) in
//! BatchNorm's own order. So, unlike the f32 block in [`super::fused_cpu`],
//! the results are bit for bit those of the unfused ops.

use super::cpu::{self, BackwardSums, PAR_MIN_ELEMS, SAMPLES_PER_JOB};
use super::fused_cpu::KILLED;
use crate::ops::half_emu::{round_into, round_trip, scratch, widen_into, Act};
use crate::ops::max_pool2d::cpu::{forward as pool_forward, Geometry};
use half::f16;
use rayon::prelude::*;
use std::cell::RefCell;

/// A task's scratch: the widened pooled gradient, BatchNorm's output
/// gradient of one plane, and what the generic kernels stage.
#[derive(Default)]
pub(super) struct Scratch {
    g: Vec<f32>,
    dz: Vec<f32>,
    f: Vec<f32>,
    idx: Vec<u32>,
}

std::thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx512::usable()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The window code of a pooled value `m` taken from flat position `at` of
/// the plane (row `oy`, column `ox` of the pooled plane): the position in
/// the window, or [`KILLED`] where ReLU's output there is not positive.
fn code_of(m: f32, at: usize, oy: usize, ox: usize, w: usize) -> u8 {
    if m <= 0.0 {
        return KILLED;
    }
    let (r, col) = (at / w - 2 * oy, at % w - 2 * ox);
    (2 * r + col) as u8
}

/// One `h x w` f16 plane into its pooled plane and window codes, as the
/// three f16 ops compute them: widened, normalized (`x * scale + shift`),
/// rounded to f16, ReLU, the f32 max-pool, its maxima rounded back.
pub(super) fn forward_plane_generic(
    x: &[f16],
    w: usize,
    (scale, shift): (f32, f32),
    y: &mut [f16],
    codes: &mut [u8],
    s: &mut Scratch,
) {
    let (ip, op, ow) = (x.len(), y.len(), w / 2);
    let buf = scratch(&mut s.f, ip + op);
    let (z, yf) = buf.split_at_mut(ip);
    widen_into(x, z);
    for v in z.iter_mut() {
        *v = *v * scale + shift;
    }
    round_trip(z);
    crate::ops::relu::cpu::forward_inplace(z);
    s.idx.resize(op, 0);
    pool_forward(z, Geometry { h: ip / w, w, kernel: 2, stride: 2 }, yf, &mut s.idx);
    round_into(yf, y);
    for (o, ((c, &at), &m)) in codes.iter_mut().zip(&s.idx).zip(yf.iter()).enumerate() {
        *c = code_of(m, at as usize, o / ow, o % ow, w);
    }
}

fn forward_plane(x: &[f16], w: usize, ab: (f32, f32), y: &mut [f16], codes: &mut [u8], s: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    if avx512() && !super::avx512_f16::forward_plane(x, w, ab.0, ab.1, y, codes) {
        return;
    }
    forward_plane_generic(x, w, ab, y, codes, s);
}

/// `y = maxpool2x2(relu(round_f16(x * scale[c] + shift[c])))` over f16
/// `x[n, c, h, w]` (`h`, `w` even), with one window code per output.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    x: &[f16],
    c: usize,
    h: usize,
    w: usize,
    scale: &[f32],
    shift: &[f32],
    y: &mut [f16],
    codes: &mut [u8],
) {
    let (ip, op) = (h * w, (h / 2) * (w / 2));
    if ip == 0 || op == 0 || c == 0 {
        return;
    }
    let per_sample = |s: &mut Scratch, ((xi, yi), ci): ((&[f16], &mut [f16]), &mut [u8])| {
        let planes = xi.chunks_exact(ip).zip(yi.chunks_exact_mut(op)).zip(ci.chunks_exact_mut(op));
        for (ch, ((xp, yp), cp)) in planes.enumerate() {
            forward_plane(xp, w, (scale[ch], shift[ch]), yp, cp, s);
        }
    };
    let (xs, ys) = (c * ip, c * op);
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(xs)
            .zip(y.par_chunks_mut(ys))
            .zip(codes.par_chunks_mut(ys))
            .with_max_len(SAMPLES_PER_JOB)
            .for_each_init(Scratch::default, per_sample);
    } else {
        let mut s = Scratch::default();
        x.chunks(xs).zip(y.chunks_mut(ys)).zip(codes.chunks_mut(ys)).for_each(|t| per_sample(&mut s, t));
    }
}

/// Flat position in the input plane of window (`oy`, `ox`)'s `code`.
#[inline(always)]
fn source(oy: usize, ox: usize, code: u8, w: usize) -> usize {
    (2 * oy + usize::from(code >> 1)) * w + 2 * ox + usize::from(code & 1)
}

/// The gradient at BatchNorm's output of one plane, as the max-pool and ReLU
/// backward leave it: `0 + g` (added into the zeroed max-pool gradient) at
/// each live window's source, `+0` elsewhere.
pub(super) fn dz_plane_generic(g: &[f32], codes: &[u8], w: usize, dz: &mut [f32]) {
    dz.fill(0.0);
    let ow = w / 2;
    for (o, (&gv, &c)) in g.iter().zip(codes).enumerate() {
        if c < KILLED {
            dz[source(o / ow, o % ow, c, w)] = 0.0 + gv;
        }
    }
}

fn dz_plane<G: Act>(dy: &[G], codes: &[u8], w: usize, dz: &mut [f32], buf: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if let (crate::ops::half_emu::Pixels::F16(g), true) = (G::pixels(dy), avx512()) {
        return super::avx512_f16::dz_plane(g, codes, w, dz);
    }
    dz_plane_generic(G::widened(dy, buf), codes, w, dz);
}

/// One plane's `(sum dz, sum dz * (x - mean))`, as BatchNorm's f16 backward
/// sums its widened planes.
fn plane_sums<G: Act>(x: &[f16], dy: &[G], codes: &[u8], w: usize, mean: f32, s: &mut Scratch) -> (f64, f64) {
    let dz = scratch(&mut s.dz, x.len());
    dz_plane(dy, codes, w, dz, &mut s.g);
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        return super::avx512_f16::plane_backward_sums(x, dz, mean);
    }
    let xw = scratch(&mut s.f, x.len());
    widen_into(x, xw);
    cpu::plane_backward_sums(xw, dz, mean)
}

/// BatchNorm's backward sums per channel for the pooled gradient `dy` (f16,
/// or f32 when the layer after the block hands back f32).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_sums<G: Act>(
    x: &[f16],
    dy: &[G],
    codes: &[u8],
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    mean: &[f32],
    invstd: &[f32],
) -> BackwardSums {
    let (ip, op) = (h * w, (h / 2) * (w / 2));
    cpu::backward_sums_with(n, c, ip, invstd, |i, ch| {
        let k = i * c + ch;
        let (xp, dp, cp) = (&x[k * ip..][..ip], &dy[k * op..][..op], &codes[k * op..][..op]);
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => plane_sums(xp, dp, cp, w, mean[ch], &mut s),
            // Only a nested use lands here; it gets scratch of its own.
            Err(_) => plane_sums(xp, dp, cp, w, mean[ch], &mut Scratch::default()),
        })
    })
}

/// `x` becomes `dx = round(k * dz + p * x + q)`, BatchNorm's f16 dx.
pub(super) fn dx_plane_generic(xdx: &mut [f16], dz: &[f32], (k, p, q): (f32, f32, f32), buf: &mut Vec<f32>) {
    let xw = scratch(buf, xdx.len());
    widen_into(xdx, xw);
    for (o, &g) in xw.iter_mut().zip(dz) {
        *o = k * g + p * *o + q;
    }
    round_into(xw, xdx);
}

fn dx_plane(xdx: &mut [f16], dz: &[f32], kpq: (f32, f32, f32), buf: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        return super::avx512_f16::dx_plane(xdx, dz, kpq);
    }
    dx_plane_generic(xdx, dz, kpq, buf);
}

/// BatchNorm's f16 `dx[n, c, h, w]` for the pooled gradient `dy`, written
/// over the input `x` it is computed from (its last use), given
/// [`backward_sums`] and the per-channel `count`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_dx<G: Act>(
    x: &mut [f16],
    dy: &[G],
    codes: &[u8],
    c: usize,
    h: usize,
    w: usize,
    mean: &[f32],
    invstd: &[f32],
    weight: &[f32],
    sums: &BackwardSums,
    count: usize,
) {
    let (ip, op) = (h * w, (h / 2) * (w / 2));
    if ip == 0 || op == 0 || c == 0 {
        return;
    }
    let coef = cpu::dx_coefficients(c, mean, invstd, weight, sums, count);
    let per_sample = |s: &mut Scratch, ((xi, di), ci): ((&mut [f16], &[G]), &[u8])| {
        let planes = xi.chunks_exact_mut(ip).zip(di.chunks_exact(op)).zip(ci.chunks_exact(op));
        for (ch, ((xp, dp), cp)) in planes.enumerate() {
            let dz = scratch(&mut s.dz, ip);
            dz_plane(dp, cp, w, dz, &mut s.g);
            dx_plane(xp, dz, coef[ch], &mut s.f);
        }
    };
    let (xs, ys) = (c * ip, c * op);
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks_mut(xs)
            .zip(dy.par_chunks(ys))
            .zip(codes.par_chunks(ys))
            .with_max_len(SAMPLES_PER_JOB)
            .for_each_init(Scratch::default, per_sample);
    } else {
        let mut s = Scratch::default();
        x.chunks_mut(xs).zip(dy.chunks(ys)).zip(codes.chunks(ys)).for_each(|t| per_sample(&mut s, t));
    }
}
