//! Direct stride-1 convolution on AVX-512 with the output channels along
//! the vector lanes: a tile is `Q` adjacent output pixels of one row (only
//! real pixels, no junk columns) times `OV` vectors of channels. It reads
//! the transposed weight with aligned vector loads and broadcasts scalars of
//! the padded source (a broadcast never splits a cache line, unlike the
//! unaligned pixel vectors of [`super::avx512`]'s GEMM tiles), then
//! [`to_planes`] transposes the pixel-major result back to NCHW.
//!
//! The source is any image in the "wide" layout of [`super::avx512`]: output
//! pixel `(oh, ow)` of reduction row `r` is `src[offs[r] + oh * pitch + ow]`.
//! That covers the forward pass (the zero-padded input) and the input
//! gradient (`dy` padded by `K - 1 - p`, the flipped kernel transposed, its
//! taps in increasing source order).

use super::lines::Lines;
use crate::ops::half_emu::{Planes, Store16};
use std::arch::x86_64::*;

const LANES: usize = 16;

/// A weight matrix `[rows][lanes]`, each row padded with zeros to whole
/// cache-line aligned vectors (read with aligned loads).
pub(super) struct LaneWeights {
    v: Lines,
    /// Vectors per row.
    nv: usize,
    rows: usize,
}

impl LaneWeights {
    /// `at(r, l)` is the weight of reduction row `r` for output lane `l`.
    pub(super) fn new(rows: usize, lanes: usize, at: impl Fn(usize, usize) -> f32) -> Self {
        let nv = lanes.div_ceil(LANES);
        let mut v = Lines::zeroed(rows * nv * LANES);
        for (r, row) in v.chunks_exact_mut(LANES * nv.max(1)).enumerate() {
            for (l, x) in row.iter_mut().take(lanes).enumerate() {
                *x = at(r, l);
            }
        }
        LaneWeights { v, nv, rows }
    }

    /// Floats per pixel in the output of [`conv_image`].
    pub(super) fn ld(&self) -> usize {
        self.nv * LANES
    }
}

/// The output pixels of one image: `rows x cols`, source row pitch `pitch`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Grid {
    pub rows: usize,
    pub cols: usize,
    pub pitch: usize,
}

/// Tile starts along one axis: every `t`, the last one moved back to end at
/// `n` (it recomputes some pixels of its neighbour, with identical sums).
fn starts(n: usize, t: usize) -> impl Iterator<Item = usize> {
    (0..n.div_ceil(t)).map(move |i| (i * t).min(n - t))
}

/// `y[l][p] = out[p * ld + l] (+ bias[l])` for `l < lanes`, `p < npix`: the
/// pixel-major tile output back to planes, in 16 x 16 blocks transposed in
/// registers (a scalar loop took as long as the convolution for MNIST's
/// conv1), f16 planes rounded as they are stored.
pub(super) fn to_planes(out: &[f32], npix: usize, ld: usize, bias: Option<&[f32]>, y: Planes<'_>) {
    if npix == 0 {
        return;
    }
    let lanes = y.len() / npix;
    assert!(ld.is_multiple_of(LANES) && lanes <= ld && out.len() >= npix * ld && y.len() == lanes * npix);
    assert!(bias.is_none_or(|b| b.len() >= lanes));
    // SAFETY: the asserts bound `planes_avx512`'s reads and writes, which
    // only store (never read) `y`. AVX-512F/BW/VL: see `avx512::usable`.
    unsafe {
        match y {
            Planes::F32(y) => planes_avx512(out, npix, ld, lanes, bias, y.as_mut_ptr().cast::<f32>()),
            Planes::F16(y) => planes_avx512(out, npix, ld, lanes, bias, y.as_mut_ptr().cast::<half::f16>()),
        }
    }
}

/// Pixels between a store of [`planes_avx512`] and the line it fetches.
const AHEAD: usize = 64;

/// [`to_planes`] once checked: reads `out[p * ld + l]` for `p < npix`, `l <
/// ld` (rounded to vectors), writes `y[l * npix + p]` for `l < lanes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn planes_avx512<D: Store16>(
    out: &[f32],
    npix: usize,
    ld: usize,
    lanes: usize,
    bias: Option<&[f32]>,
    y: *mut D,
) {
    for p0 in (0..npix).step_by(LANES) {
        let np = (npix - p0).min(LANES);
        let mask: __mmask16 = ((1u32 << np) - 1) as u16;
        for l0 in (0..lanes).step_by(LANES) {
            let nl = (lanes - l0).min(LANES);
            // A fixed count of loads keeps `m` in registers (a count of `np`
            // put it on the stack); pixels past `np` repeat the last one and
            // land in lanes the mask drops.
            let mut m: [__m512; LANES] =
                std::array::from_fn(|i| _mm512_loadu_ps(out.as_ptr().add((p0 + i.min(np - 1)) * ld + l0)));
            transpose16(&mut m);
            for (l, v) in m.iter().enumerate() {
                if l < nl {
                    // The planes' lines a few blocks on, fetched ahead of
                    // their stores: 16 to 64 planes at once are more
                    // streams than the hardware prefetcher follows.
                    if p0 + AHEAD < npix {
                        _mm_prefetch::<_MM_HINT_T0>(y.add((l0 + l) * npix + p0 + AHEAD).cast());
                    }
                    let b = bias.map_or(0.0, |b| b[l0 + l]);
                    D::store16(y.add((l0 + l) * npix + p0), mask, _mm512_add_ps(*v, _mm512_set1_ps(b)));
                }
            }
        }
    }
}

/// Transposes a 16 x 16 matrix held as 16 row vectors.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn transpose16(m: &mut [__m512; LANES]) {
    let mut t = [_mm512_setzero_ps(); LANES];
    // 2 x 2 blocks, then 4 x 4 within each 128-bit lane.
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]);
    }
    for i in 0..4 {
        let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        m[4 * i] = _mm512_shuffle_ps::<0x44>(a, c);
        m[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(a, c);
        m[4 * i + 2] = _mm512_shuffle_ps::<0x44>(b, d);
        m[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(b, d);
    }
    // Then the 4 x 4 grid of 128-bit lanes.
    for h in 0..2 {
        for j in 0..4 {
            t[8 * h + j] = _mm512_shuffle_f32x4::<0x88>(m[8 * h + j], m[8 * h + 4 + j]);
            t[8 * h + 4 + j] = _mm512_shuffle_f32x4::<0xDD>(m[8 * h + j], m[8 * h + 4 + j]);
        }
    }
    for j in 0..8 {
        m[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[8 + j]);
        m[8 + j] = _mm512_shuffle_f32x4::<0xDD>(t[j], t[8 + j]);
    }
}

/// One row of `Q` pixels times `OV` channel vectors for a `K`-wide kernel,
/// reduction rows taken `K` at a time: group `g` is the kernel row
/// `(c, ki)`, whose `K` taps read `src[gofs[g] + j + kj]`. Each source value
/// is broadcast once and feeds up to `K` pixels, so a group needs `Q + K - 1`
/// broadcasts and `K * OV` weight loads for `Q * K * OV` FMAs. (One tap at
/// a time, a broadcast per FMA when `OV = 1`, ran 30% slower.)
#[target_feature(enable = "avx512f")]
unsafe fn row_tile<const Q: usize, const K: usize, const OV: usize>(
    gofs: &[usize],
    src: *const f32,
    w: *const f32,
    ldw: usize,
    out: *mut f32,
    ld: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); OV]; Q];
    for (g, &off) in gofs.iter().enumerate() {
        let b = src.add(off);
        let mut wv = [[_mm512_setzero_ps(); OV]; K];
        for (kj, wk) in wv.iter_mut().enumerate() {
            for (v, x) in wk.iter_mut().enumerate() {
                *x = _mm512_load_ps(w.add((g * K + kj) * ldw + v * LANES));
            }
        }
        // Written tap by tap (constant indices once unrolled); the compiler
        // merges the repeated loads of a source value into one broadcast.
        for (kj, wk) in wv.iter().enumerate() {
            for (j, px) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*b.add(j + kj));
                for (s, wvv) in px.iter_mut().zip(wk) {
                    *s = _mm512_fmadd_ps(xv, *wvv, *s);
                }
            }
        }
    }
    for (j, px) in acc.iter().enumerate() {
        for (v, s) in px.iter().enumerate() {
            _mm512_storeu_ps(out.add(j * ld + v * LANES), *s);
        }
    }
}

/// Pixels per tile row for one and for two channel vectors: `Q * OV` plus
/// `K * OV` weights and a broadcast fit in the 32 vector registers.
const Q1: usize = 14;
const Q2: usize = 7;

/// Whether [`conv_image`] takes this pass: a `k`-wide kernel (5 is the only
/// width with a tile), `cols` output pixels per row (at least one tile) and
/// `rows_r` reduction rows. With few reduction rows the pixel-major output
/// and its transpose cost more than the wide layout's junk columns: MNIST's
/// conv1 (25 rows) took 2.6-3.3 ms per 100 images here against 1.7-2.4 ms
/// for [`super::avx512`]'s GEMM tiles (conv2's 400 rows: 6.6-7.2 against
/// 7.1-8.4, its input gradient's 800: 5.6-6.5 against 6.5-7.3).
pub(super) fn fits(k: usize, cols: usize, rows_r: usize) -> bool {
    k == 5 && cols >= Q1 && rows_r >= 100
}

/// `out[p][l] = sum_r src[offs[r] + pixel p] * w[r][l]` for every pixel
/// `p = oh * cols + ow` of the grid (`out` has `w.ld()` floats per pixel),
/// where every kernel row's `k` taps sit at consecutive source offsets
/// (`offs[g * k + kj] = offs[g * k] + kj`). Only for [`fits`] geometries.
pub(super) fn conv_image(src: &[f32], offs: &[usize], k: usize, g: Grid, w: &LaneWeights, out: &mut [f32]) {
    const K: usize = 5;
    let ld = w.ld();
    // These checks are what make the raw reads and writes below sound.
    assert!(k == K && g.rows > 0 && g.cols >= Q1 && offs.len().is_multiple_of(K));
    assert!(offs.len() == w.rows && w.v.len() == w.rows * w.nv * LANES && out.len() >= g.rows * g.cols * ld);
    assert!(offs.chunks_exact(K).all(|t| t.iter().enumerate().all(|(kj, &o)| o == t[0] + kj)));
    let gofs: Vec<usize> = offs.iter().step_by(K).copied().collect();
    let reach = (g.rows - 1) * g.pitch + g.cols + K - 1;
    assert!(gofs.iter().all(|&o| o + reach <= src.len()));
    let mut v0 = 0;
    while v0 < w.nv {
        let ov = if w.nv - v0 >= 2 { 2 } else { 1 };
        let q = if ov == 2 { Q2 } else { Q1 };
        for oh in 0..g.rows {
            for ow in starts(g.cols, q) {
                // SAFETY: reads src[gofs[i] + oh * pitch + ow + col] with col
                // < q + K - 1 and ow + q <= cols: inside `reach`; weight rows
                // i * K + kj < offs.len() = w.rows, vectors v0 + v < nv;
                // writes pixels oh * cols + ow + j, j < q, of out. AVX-512F:
                // see `avx512::usable`.
                unsafe {
                    let s = src.as_ptr().add(oh * g.pitch + ow);
                    let wp = w.v.as_ptr().add(v0 * LANES);
                    let o = out.as_mut_ptr().add((oh * g.cols + ow) * ld + v0 * LANES);
                    if ov == 2 {
                        row_tile::<Q2, K, 2>(&gofs, s, wp, w.nv * LANES, o, ld);
                    } else {
                        row_tile::<Q1, K, 1>(&gofs, s, wp, w.nv * LANES, o, ld);
                    }
                }
            }
        }
        v0 += ov;
    }
}
