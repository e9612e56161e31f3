//! AvgPool2d CPU kernels (floor mode, zero padding counted in the divisor),
//! one (n, c) plane at a time; planes are independent, so they split across
//! cores. The forward sums each window row-major and divides once, the
//! backward gathers `dy / divisor` over the windows holding each input in
//! output order: kernels/avg_pool2d.cu adds in the same orders, so f32 agrees
//! bit for bit.

use super::AvgPool2dArgs;
use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many input elements a single core beats rayon's fork/join.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Spatial geometry of one pooling call, already checked by
/// [`AvgPool2dArgs::out_hw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub args: AvgPool2dArgs,
}

impl Geometry {
    /// `kh * kw`: with `count_include_pad` and floor mode every window lies
    /// inside the padded input, so every window has this divisor.
    pub fn divisor<T: Elem>(&self) -> T {
        let [kh, kw] = self.args.kernel;
        // `out_hw` bounds the kernel by i32, so the product fits in u64.
        T::from_u64(kh as u64 * kw as u64).unwrap_or_else(T::nan)
    }
}

/// The input rows (or columns) window `o` covers along one axis, clipped to
/// the unpadded input: the padded zeros add nothing to a sum.
#[inline(always)]
fn span(o: usize, k: usize, s: usize, p: usize, n: usize) -> std::ops::Range<usize> {
    let start = o * s;
    let end = (start + k).saturating_sub(p).min(n);
    start.saturating_sub(p).min(end)..end
}

/// The windows along one axis that hold padded position `i + p`: those `o`
/// with `o * s <= i + p < o * s + k`, clipped to the `n` outputs.
#[inline(always)]
fn windows(i: usize, k: usize, s: usize, p: usize, n: usize) -> std::ops::Range<usize> {
    let at = i + p;
    let lo = if at >= k { (at - k) / s + 1 } else { 0 };
    let hi = (at / s + 1).min(n);
    lo.min(hi)..hi
}

fn forward_plane<T: Elem>(x: &[T], g: Geometry, y: &mut [T]) {
    let AvgPool2dArgs { kernel: [kh, kw], stride: [sh, sw], padding: [ph, pw] } = g.args;
    let div = g.divisor::<T>();
    for (oy, yrow) in y.chunks_exact_mut(g.ow).enumerate() {
        let rows = span(oy, kh, sh, ph, g.h);
        for (ox, yo) in yrow.iter_mut().enumerate() {
            let cols = span(ox, kw, sw, pw, g.w);
            let mut sum = T::zero();
            for iy in rows.clone() {
                for &v in &x[iy * g.w..][cols.clone()] {
                    sum = sum + v;
                }
            }
            *yo = sum / div;
        }
    }
}

fn backward_plane<T: Elem>(dy: &[T], g: Geometry, dx: &mut [T]) {
    let AvgPool2dArgs { kernel: [kh, kw], stride: [sh, sw], padding: [ph, pw] } = g.args;
    let div = g.divisor::<T>();
    for (iy, dxrow) in dx.chunks_exact_mut(g.w).enumerate() {
        let oys = windows(iy, kh, sh, ph, g.oh);
        for (ix, d) in dxrow.iter_mut().enumerate() {
            let oxs = windows(ix, kw, sw, pw, g.ow);
            let mut acc = T::zero();
            for oy in oys.clone() {
                for &v in &dy[oy * g.ow..][oxs.clone()] {
                    acc = acc + v / div;
                }
            }
            *d = acc;
        }
    }
}

/// `f` on each plane of `src` (`sp` elements) and the matching plane of
/// `dst` (`dp` elements), across cores when there is enough work.
fn per_plane<T: Elem>(src: &[T], sp: usize, dst: &mut [T], dp: usize, f: impl Fn(&[T], &mut [T]) + Sync) {
    debug_assert_eq!(src.len() / sp, dst.len() / dp);
    let run = |(s, d): (&[T], &mut [T])| f(s, d);
    if src.len().max(dst.len()) >= PAR_MIN_ELEMS {
        src.par_chunks(sp).zip(dst.par_chunks_mut(dp)).for_each(run);
    } else {
        src.chunks(sp).zip(dst.chunks_mut(dp)).for_each(run);
    }
}

/// `x` holds whole `h * w` planes; `y` (fully overwritten) the matching
/// `oh * ow` planes.
pub fn forward<T: Elem>(x: &[T], g: Geometry, y: &mut [T]) {
    let (ip, op) = (g.h * g.w, g.oh * g.ow);
    if ip == 0 || op == 0 {
        // No input: every window holds only padding.
        y.fill(T::zero());
        return;
    }
    per_plane(x, ip, y, op, |xp, yp| forward_plane(xp, g, yp));
}

/// `dx` (whole `h * w` planes, fully overwritten) from `dy` (`oh * ow`
/// planes): a gather, so no zeroing and no shared writes between planes.
pub fn backward<T: Elem>(dy: &[T], g: Geometry, dx: &mut [T]) {
    let (ip, op) = (g.h * g.w, g.oh * g.ow);
    if ip == 0 || op == 0 {
        dx.fill(T::zero());
        return;
    }
    per_plane(dy, op, dx, ip, |gp, dxp| backward_plane(gp, g, dxp));
}
