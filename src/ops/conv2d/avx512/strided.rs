//! Strided convolutions on AVX-512 (the ResNets' downsampling convs: 3x3
//! and 1x1, stride 2), direct on pixel-major images with channels along
//! the lanes, as the Winograd kernels lay them out. The GEMM path ran these
//! an image at a time through im2col and GEMMs of 7 to 196 columns, at
//! about 40% of the FMA peak, and they were an eighth of a ResNet-20 step.
//!
//! Every kernel is one register-blocked loop: `Q` pixels of a row (or of
//! one stride class of the input gradient) times `OV` vectors of 16
//! channels, summed over taps and channels, one value broadcast against a
//! vector of weights per FMA.
//!
//! - forward: `y[oh][ow][o] = sum_{tap, c} x[s oh + ki][s ow + kj][c] w[tap][c][o]`,
//!   `x` padded by `p`;
//! - input gradient: pixel `(ih, iw)` of `dx` takes the taps with `ih + p -
//!   ki` and `iw + p - kj` multiples of `s`, the same for every pixel of a
//!   stride class `(ih mod s, iw mod s)`: per class, a stride-1 sum over
//!   `dy` (padded with zeros, so taps off its edge add nothing), and a
//!   class without taps (1x1 stride 2: three of four) writes zeros;
//! - weight gradient: `dW[tap][c][o] += sum_pixels x[s oh + ki][s ow + kj][c] dy[oh][ow][o]`,
//!   a block of channels by output channels in registers over an image's
//!   pixels.
//!
//! Sums run in a different order from the GEMM path (same f32 products).

use super::dw::pixels_sum;
use super::pixel_major::{fill_every_other, fill_pixel_major};
use super::{add_partials, backward_tasks, per_forward_task, per_task};
use crate::ops::conv2d::avx512_direct::to_planes;
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::half_emu::{Act, Pixels};
use rayon::prelude::*;
use std::arch::x86_64::*;

const LANES: usize = 16;
/// Pixels per register block.
const Q: usize = 8;

/// A tap as the kernels walk it: (offset of its source pixel, offset of its
/// weights), in floats.
type Tap = (usize, usize);

/// Whether [`forward`] and [`backward`] take `g`: a stride of 2 or more
/// with at least 8 channels each way (fewer spend most lanes on padding;
/// a 3-channel stem stays on the GEMM path). The caller checked AVX-512.
pub(super) fn fits(g: &ConvGeom) -> bool {
    g.stride >= 2 && g.padding < g.k && g.c >= 8 && g.o >= 8
}

/// An image pixel-major, `[rows][cols][ld]`, its pixels from `(pad, pad)`,
/// zeros around them (and in lanes past the channels).
#[derive(Clone, Copy)]
struct Layout {
    rows: usize,
    cols: usize,
    ld: usize,
    pad: usize,
    ch: usize,
    h: usize,
    w: usize,
    /// Only every other pixel of every other row, `ceil(h / 2) x ceil(w /
    /// 2)` of them: all that a 1x1 stride-2 conv reads (see [`Layout::x`]).
    every_other: bool,
}

impl Layout {
    fn len(&self) -> usize {
        self.rows * self.cols * self.ld
    }

    /// Float offset of pixel `(y, x)` counted from the image's first pixel
    /// (`pad`, `pad`); `y` and `x` may reach into the border.
    fn at(&self, y: isize, x: isize) -> usize {
        let (r, c) = (self.pad as isize + y, self.pad as isize + x);
        debug_assert!(r >= 0 && c >= 0 && (r as usize) < self.rows && (c as usize) < self.cols);
        (r as usize * self.cols + c as usize) * self.ld
    }

    /// Writes `src[ch][h][w]` into `buf` (whose border stays zero).
    fn fill(&self, src: Pixels<'_>, buf: &mut [f32]) {
        if self.every_other {
            fill_every_other(src, (self.ch, self.h, self.w), buf, self.ld);
        } else {
            assert!(self.pad + self.h <= self.rows && self.len() <= buf.len());
            fill_pixel_major(src, (self.ch, self.h, self.w), buf, 0, (self.pad, self.cols, self.ld));
        }
    }

    /// The input's layout for `g`: padded by `p`, or, for a 1x1 stride-2
    /// kernel without padding, only the pixels it reads, a quarter of them
    /// (the pixel-major copy of the whole image took most of ResNet-20's
    /// projection shortcuts' time). The kernels then step one pixel (and
    /// one row) where they stepped two; the sums are the same.
    fn x(g: &ConvGeom) -> Self {
        let (ld, p) = (g.c.next_multiple_of(LANES), g.padding);
        let (h, w) = (g.h, g.w);
        if g.k == 1 && g.stride == 2 && p == 0 {
            let (rows, cols) = (h.div_ceil(2), w.div_ceil(2));
            return Layout { rows, cols, ld, pad: 0, ch: g.c, h, w, every_other: true };
        }
        Layout { rows: h + 2 * p, cols: w + 2 * p, ld, pad: p, ch: g.c, h, w, every_other: false }
    }

    /// Floats from pixel `(y, x)` of the input to pixel `(y, x + 1)` of
    /// the same stride-`s` window row, and to the next window row.
    fn steps(&self, s: usize) -> (usize, usize) {
        if self.every_other {
            (self.ld, self.cols * self.ld)
        } else {
            (s * self.ld, s * self.cols * self.ld)
        }
    }
}

/// `dst[q * dst_step + 16 v + l] = sum_{(s_off, w_off) in taps} sum_{i < n}
/// src[s_off + q * src_step + i] * w[w_off + i * ldw + 16 v + l]` for `QB`
/// pixels `q` and `OV` vectors `v`.
///
/// # Safety
/// Every read and write lies inside its buffer; AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const QB: usize, const OV: usize>(
    src: *const f32,
    src_step: usize,
    taps: &[Tap],
    n: usize,
    w: *const f32,
    ldw: usize,
    dst: *mut f32,
    dst_step: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); OV]; QB];
    for &(so, wo) in taps {
        let (s, wt) = (src.add(so), w.add(wo));
        for i in 0..n {
            let wv: [__m512; OV] = std::array::from_fn(|v| _mm512_loadu_ps(wt.add(i * ldw + v * LANES)));
            for (q, row) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*s.add(q * src_step + i));
                for (a, x) in row.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(b, *x, *a);
                }
            }
        }
    }
    for (q, row) in acc.iter().enumerate() {
        for (v, a) in row.iter().enumerate() {
            _mm512_storeu_ps(dst.add(q * dst_step + v * LANES), *a);
        }
    }
}

/// [`block`] over a run of `count` pixels (`src_step`, `dst_step` apart)
/// and every lane vector of `ld_out` (`OV` = 2, then 1 for an odd one):
/// whole blocks of [`Q`] pixels, then the rest.
///
/// # Safety
/// As [`block`], for every pixel and lane of the run; AVX-512F.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    count: usize,
    src: *const f32,
    src_step: usize,
    taps: &[Tap],
    n: usize,
    w: *const f32,
    ldw: usize,
    dst: *mut f32,
    dst_step: usize,
    ld_out: usize,
) {
    macro_rules! tail {
        ($ov:literal, $s:expr, $d:expr, $w:expr, $rest:expr) => {
            match $rest {
                1 => block::<1, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                2 => block::<2, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                3 => block::<3, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                4 => block::<4, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                5 => block::<5, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                6 => block::<6, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                7 => block::<7, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
                _ => block::<Q, $ov>($s, src_step, taps, n, $w, ldw, $d, dst_step),
            }
        };
    }
    let mut v0 = 0;
    while v0 < ld_out {
        let two = ld_out - v0 >= 2 * LANES;
        let mut q0 = 0;
        while q0 < count {
            let rest = (count - q0).min(Q);
            let (s, d, wv) = (src.add(q0 * src_step), dst.add(q0 * dst_step + v0), w.add(v0));
            if two {
                tail!(2, s, d, wv, rest);
            } else {
                tail!(1, s, d, wv, rest);
            }
            q0 += rest;
        }
        v0 += if two { 2 * LANES } else { LANES };
    }
}

/// The per-image layouts: `x` padded by `p`; `dy` with a border of `K`
/// zeros, wide enough for every tap of the input gradient.
fn layouts(g: &ConvGeom) -> (Layout, Layout) {
    let ldo = g.o.next_multiple_of(LANES);
    let x = Layout::x(g);
    // dx pixel (ih, iw) reads dy at ((ih + p - ki) / s, ...): from -(K - 1)
    // / s up to (H - 1 + p) / s, under K + H / s + 1 either way.
    let b = g.k + 1;
    let rows = b + g.h.max(g.ho) + b;
    let cols = b + g.w.max(g.wo) + b;
    let dy = Layout { rows, cols, ld: ldo, pad: b, ch: g.o, h: g.ho, w: g.wo, every_other: false };
    (x, dy)
}

/// `w[O][C][K][K]` as `[K K][rows][ld]` with `rows` the input side: the
/// forward's `wt[tap][c][o]` or (`transpose`: input and output swapped) the
/// input gradient's `wt[tap][o][c]`, lanes past the channels zero.
fn weights(g: &ConvGeom, w: &[f32], transpose: bool) -> Vec<f32> {
    let kk = g.k * g.k;
    let (rows, cols) = if transpose { (g.o, g.c) } else { (g.c, g.o) };
    let ld = cols.next_multiple_of(LANES);
    let mut t = vec![0f32; kk * rows * ld];
    for o in 0..g.o {
        for c in 0..g.c {
            for tap in 0..kk {
                let (r, l) = if transpose { (o, c) } else { (c, o) };
                t[(tap * rows + r) * ld + l] = w[(o * g.c + c) * kk + tap];
            }
        }
    }
    t
}

/// `y[N, O, Ho, Wo] = conv(x, w) + bias` for [`fits`] geometries.
pub(super) fn forward<X: Act>(g: &ConvGeom, x: &[X], w: &[f32], bias: Option<&[f32]>, y: &mut [X::Out]) {
    let (xl, _) = layouts(g);
    let ldo = g.o.next_multiple_of(LANES);
    let wt = weights(g, w, false);
    let (s, k, hw) = (g.stride, g.k, g.out_hw());
    let (step, row) = xl.steps(s);
    let taps: Vec<Tap> = (0..k * k)
        .map(|t| (xl.at((t / k) as isize, (t % k) as isize) - xl.at(0, 0), t * g.c * ldo))
        .collect();
    let pt = per_forward_task(g.n);
    y.par_chunks_mut(pt * g.y_len()).zip(x.par_chunks(pt * g.x_len())).for_each(|(yc, xc)| {
        let (mut xp, mut out) = (vec![0f32; xl.len()], vec![0f32; hw * ldo]);
        for (yi, xi) in yc.chunks_exact_mut(g.y_len()).zip(xc.chunks_exact(g.x_len())) {
            xl.fill(X::pixels(xi), &mut xp);
            for oh in 0..g.ho {
                // Window (oh, 0) starts at padded pixel (s oh, 0) (pixel
                // (oh, 0) of an every-other-pixel layout).
                let src = xl.at(-(g.padding as isize), -(g.padding as isize)) + oh * row;
                // SAFETY: window (oh, ow) reads padded pixels up to (s oh + K
                // - 1, s ow + K - 1) < (H + 2p, W + 2p), inside `xp` (the
                // every-other layout: pixel (oh, ow) < (Ho, Wo), its whole
                // extent); `out` holds Ho Wo pixels of `ldo`. AVX-512F: `usable`.
                unsafe {
                    run(
                        g.wo,
                        xp.as_ptr().add(src),
                        step,
                        &taps,
                        g.c,
                        wt.as_ptr(),
                        ldo,
                        out.as_mut_ptr().add(oh * g.wo * ldo),
                        ldo,
                        ldo,
                    )
                };
            }
            to_planes(&out, hw, ldo, bias, X::planes(yi));
        }
    });
}

/// Gradients of [`forward`]: `dw`, `db` added into, every element of `dx`
/// (when asked for) written.
pub(super) fn backward<X: Act>(
    g: &ConvGeom,
    x: &[X],
    w: &[f32],
    dy: &[X],
    dw: &mut [f32],
    db: Option<&mut [f32]>,
    dx: Option<&mut [X::Out]>,
) {
    let (xl, dl) = layouts(g);
    let (ldc, ldo) = (xl.ld, dl.ld);
    let (s, k, p, kk) = (g.stride, g.k, g.padding as isize, g.k * g.k);
    let (x_step, x_row) = xl.steps(s);
    let wdx = dx.is_some().then(|| weights(g, w, true));
    // The input gradient's stride classes: (a, b) and their taps as (dy
    // offset, weight offset), dy pixel (i + (a + p - ki) / s, ...) for
    // class pixel (a + s i, b + s j), the offset that of row i = 0.
    let classes: Vec<((usize, usize), Vec<Tap>)> = (0..s * s)
        .map(|cl| {
            let (a, b) = (cl / s, cl % s);
            let mut taps = Vec::new();
            for ki in 0..k {
                for kj in 0..k {
                    let (di, dj) = (a as isize + p - ki as isize, b as isize + p - kj as isize);
                    if di.rem_euclid(s as isize) == 0 && dj.rem_euclid(s as isize) == 0 {
                        // From the start of `dyp` (the border keeps it >= 0).
                        let off = dl.at(di.div_euclid(s as isize), dj.div_euclid(s as isize));
                        taps.push((off, (ki * k + kj) * g.o * ldc));
                    }
                }
            }
            ((a, b), taps)
        })
        .collect();
    let need_db = db.is_some();
    let (xlen, ylen, hw) = (g.x_len(), g.y_len(), g.out_hw());
    let partials = backward_tasks(g, per_task(g.n), dx, |first, imgs, mut dxt| {
        let mut dwt = vec![0f32; kk * g.c * ldo];
        let mut db_t = vec![0f32; if need_db { g.o } else { 0 }];
        let (mut xp, mut dyp) = (vec![0f32; xl.len()], vec![0f32; dl.len()]);
        let mut dxp = vec![0f32; if dxt.is_some() { g.h * g.w * ldc } else { 0 }];
        for i in 0..imgs {
            let img = first + i;
            let dyi = X::pixels(&dy[img * ylen..(img + 1) * ylen]);
            xl.fill(X::pixels(&x[img * xlen..(img + 1) * xlen]), &mut xp);
            dl.fill(dyi, &mut dyp);
            for (o, acc) in db_t.iter_mut().enumerate() {
                *acc += pixels_sum(dyi.slice(o * hw..(o + 1) * hw));
            }
            for tap in 0..kk {
                let (ki, kj) = ((tap / k) as isize, (tap % k) as isize);
                // SAFETY: pixel (oh, ow)'s tap reads padded x pixel (s oh +
                // ki, s ow + kj), inside `xp` (the every-other layout's
                // pixel (oh, ow)); dy pixels inside `dyp`; `dwt` holds [K
                // K][C][ldo]. AVX-512F: `usable`.
                unsafe {
                    dw_image(
                        g,
                        xp.as_ptr().add(xl.at(ki - p, kj - p)),
                        x_step,
                        x_row,
                        dyp.as_ptr().add(dl.at(0, 0)),
                        dl.cols * ldo,
                        dwt.as_mut_ptr().add(tap * g.c * ldo),
                        ldo,
                    )
                };
            }
            if let (Some(dxt), Some(wdx)) = (dxt.as_deref_mut(), wdx.as_deref()) {
                for ((a, b), taps) in &classes {
                    let (rows, cols) = ((g.h - a).div_ceil(s), (g.w - b).div_ceil(s));
                    for r in 0..rows {
                        // SAFETY: class pixel (a + s r, b + s j) reads dy
                        // pixels within (K + 1) of dy's own (the border of
                        // `dl`), and writes dx pixel (a + s r, b + s j)
                        // inside the H x W pixels of `dxp`. AVX-512F: `usable`.
                        unsafe {
                            run(
                                cols,
                                dyp.as_ptr().add(r * dl.cols * ldo),
                                ldo,
                                taps,
                                g.o,
                                wdx.as_ptr(),
                                ldc,
                                dxp.as_mut_ptr().add(((a + s * r) * g.w + b) * ldc),
                                s * ldc,
                                ldc,
                            )
                        };
                    }
                }
                to_planes(&dxp, g.h * g.w, ldc, None, X::planes(&mut dxt[i * xlen..(i + 1) * xlen]));
            }
        }
        (dwt, db_t)
    });
    let mut dwt = vec![0f32; kk * g.c * ldo];
    add_partials(&partials, &mut dwt, db);
    for o in 0..g.o {
        for c in 0..g.c {
            for tap in 0..kk {
                dw[(o * g.c + c) * kk + tap] += dwt[(tap * g.c + c) * ldo + o];
            }
        }
    }
}

/// Channels per weight-gradient block: 8 x 2 vectors of accumulators.
const QC: usize = 8;

/// `acc[c][o] += sum_{oh, ow} x[oh * x_row + ow * x_step + c] * dy[oh *
/// dy_row + ow * ldo + o]` over the image's output pixels, for every
/// channel `c < C` and lane `o < ldo` (`acc` row stride `lda`).
///
/// # Safety
/// Every read lies inside `x` and `dy`, `acc` holds `C` rows; AVX-512F.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_image(
    g: &ConvGeom,
    x: *const f32,
    x_step: usize,
    x_row: usize,
    dy: *const f32,
    dy_row: usize,
    acc: *mut f32,
    lda: usize,
) {
    let ldo = g.o.next_multiple_of(LANES);
    let mut c0 = 0;
    while c0 < g.c {
        let nc = (g.c - c0).min(QC);
        let mut o0 = 0;
        while o0 < ldo {
            let a = acc.add(c0 * lda + o0);
            let (xs, ds) = (x.add(c0), dy.add(o0));
            if ldo - o0 >= 2 * LANES {
                dw_block::<2>(g, nc, xs, x_step, x_row, ds, dy_row, ldo, a, lda);
                o0 += 2 * LANES;
            } else {
                dw_block::<1>(g, nc, xs, x_step, x_row, ds, dy_row, ldo, a, lda);
                o0 += LANES;
            }
        }
        c0 += nc;
    }
}

/// [`dw_image`] for channels `c0..c0 + nc` (`nc <= QC`) and `OV` vectors.
///
/// # Safety
/// As [`dw_image`]; AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_block<const OV: usize>(
    g: &ConvGeom,
    nc: usize,
    x: *const f32,
    x_step: usize,
    x_row: usize,
    dy: *const f32,
    dy_row: usize,
    ldo: usize,
    acc: *mut f32,
    lda: usize,
) {
    // Lanes past `nc` broadcast channel c0 again and are not stored.
    let mut s: [[__m512; OV]; QC] = std::array::from_fn(|c| {
        std::array::from_fn(|v| _mm512_loadu_ps(acc.add(c.min(nc - 1) * lda + v * LANES)))
    });
    for oh in 0..g.ho {
        for ow in 0..g.wo {
            let (xp, dp) = (x.add(oh * x_row + ow * x_step), dy.add(oh * dy_row + ow * ldo));
            let d: [__m512; OV] = std::array::from_fn(|v| _mm512_loadu_ps(dp.add(v * LANES)));
            for (c, row) in s.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*xp.add(c.min(nc - 1)));
                for (a, dv) in row.iter_mut().zip(&d) {
                    *a = _mm512_fmadd_ps(b, *dv, *a);
                }
            }
        }
    }
    for (c, row) in s.iter().enumerate().take(nc) {
        for (v, a) in row.iter().enumerate() {
            _mm512_storeu_ps(acc.add(c * lda + v * LANES), *a);
        }
    }
}
