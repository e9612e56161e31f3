//! The vector kernels of [`super`]: the F(2x2, 5x5) transforms and the
//! per-point GEMMs, 16 channels along the lanes.
//!
//! The matrices come from Toom-Cook over the points 0, 1, -1, 2, -2, inf.
//! F(2, 5) (forward and input gradient) and F(5, 2) (weight gradient) share
//! the data transform `B^T`; everything applied to data is integer (the
//! fractions live in the filter transform, done once per call in f64, and in
//! the weight gradient's final transform), so the data transforms round no
//! more than a sum of the same terms would.

use crate::ops::conv2d::avx512_direct::transpose16;
use std::arch::x86_64::*;

pub(super) const LANES: usize = 16;
/// Points per axis, and transform points per tile.
pub(super) const T: usize = 6;
pub(super) const TT: usize = T * T;

/// F(2, 5)'s filter transform `G` (6 x 5).
pub(super) const G5: [[f64; 5]; T] = [
    [1.0 / 4.0, 0.0, 0.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0, 1.0 / 3.0, 2.0 / 3.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0, -1.0 / 3.0, 2.0 / 3.0],
    [0.0, 0.0, 0.0, 0.0, 1.0],
];

/// F(5, 2)'s output transform `A^T` (5 x 6).
pub(super) const AT5: [[f64; T]; 5] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 0.0],
    [0.0, 1.0, 1.0, 16.0, 16.0, 1.0],
];

/// F(5, 2)'s filter transform is `diag(INV_F5) * G2` with the integer `G2`
/// of [`g2`]; `INV_F5` is applied in the final transform instead.
pub(super) const INV_F5: [f64; T] = [1.0 / 4.0, -1.0 / 6.0, -1.0 / 6.0, 1.0 / 24.0, 1.0 / 24.0, 1.0];

/// `B^T x` for six vectors: rows [4,0,-5,0,1,0], [0,-4,-4,1,1,0],
/// [0,4,-4,-1,1,0], [0,-2,-1,2,1,0], [0,2,-1,-2,1,0], [0,4,0,-5,0,1].
#[inline]
#[target_feature(enable = "avx512f")]
fn bt(x: [__m512; T]) -> [__m512; T] {
    let (four, five, two) = (_mm512_set1_ps(4.0), _mm512_set1_ps(5.0), _mm512_set1_ps(2.0));
    let s12 = _mm512_add_ps(x[1], x[2]);
    let d12 = _mm512_sub_ps(x[1], x[2]);
    let d42 = _mm512_sub_ps(x[4], x[2]);
    let d31 = _mm512_sub_ps(x[3], x[1]);
    [
        _mm512_fmadd_ps(four, x[0], _mm512_fnmadd_ps(five, x[2], x[4])),
        _mm512_fnmadd_ps(four, s12, _mm512_add_ps(x[3], x[4])),
        _mm512_fmadd_ps(four, d12, _mm512_sub_ps(x[4], x[3])),
        _mm512_fmadd_ps(two, d31, d42),
        _mm512_fnmadd_ps(two, d31, d42),
        _mm512_fmadd_ps(four, x[1], _mm512_fnmadd_ps(five, x[3], x[5])),
    ]
}

/// F(2, 5)'s `A^T m`: rows [1,1,1,1,1,0] and [0,1,-1,2,-2,1].
#[inline]
#[target_feature(enable = "avx512f")]
fn at2(m: [__m512; T]) -> [__m512; 2] {
    let two = _mm512_set1_ps(2.0);
    let s = _mm512_add_ps(_mm512_add_ps(m[1], m[2]), _mm512_add_ps(m[3], m[4]));
    let d = _mm512_fmadd_ps(two, _mm512_sub_ps(m[3], m[4]), _mm512_sub_ps(m[1], m[2]));
    [_mm512_add_ps(m[0], s), _mm512_add_ps(d, m[5])]
}

/// `G2 u` with `G2` = rows [1,0], [1,1], [1,-1], [1,2], [1,-2], [0,1].
#[inline]
#[target_feature(enable = "avx512f")]
fn g2(u0: __m512, u1: __m512) -> [__m512; T] {
    let two = _mm512_set1_ps(2.0);
    [
        u0,
        _mm512_add_ps(u0, u1),
        _mm512_sub_ps(u0, u1),
        _mm512_fmadd_ps(two, u1, u0),
        _mm512_fnmadd_ps(two, u1, u0),
        u1,
    ]
}

/// `dst[((pad + y) * cols + pad + x) * ld + c] = src[(c * h + y) * w + x]`
/// for `c < ch`, and zero for `ch <= c < ld`: planes to pixel-major, in
/// 16 x 16 blocks transposed in registers (a gather per pixel took a tenth
/// of a training step).
///
/// # Safety
/// `src` has `ch * h * w` floats; `dst` holds the pixels up to
/// `(pad + h - 1) * cols + pad + w - 1` (`ld` floats each); `ch <= ld`,
/// `ld` a multiple of 16; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn to_pixel_major(
    src: *const f32,
    (ch, h, w): (usize, usize, usize),
    dst: *mut f32,
    (pad, cols, ld): (usize, usize, usize),
) {
    let hw = h * w;
    for p0 in (0..hw).step_by(LANES) {
        let np = (hw - p0).min(LANES);
        let mask = ((1u32 << np) - 1) as u16;
        for c0 in (0..ld).step_by(LANES) {
            let mut m = [_mm512_setzero_ps(); LANES];
            for (i, v) in m.iter_mut().enumerate().take(ch.saturating_sub(c0)) {
                *v = _mm512_maskz_loadu_ps(mask, src.add((c0 + i) * hw + p0));
            }
            transpose16(&mut m);
            for (i, v) in m.iter().take(np).enumerate() {
                let (y, x) = ((p0 + i) / w, (p0 + i) % w);
                _mm512_storeu_ps(dst.add(((pad + y) * cols + pad + x) * ld + c0), *v);
            }
        }
    }
}

/// `m[j][a]` as `[a][j]`.
#[inline]
fn transpose<const R: usize>(m: [[__m512; R]; T]) -> [[__m512; T]; R] {
    std::array::from_fn(|a| std::array::from_fn(|j| m[j][a]))
}

/// Tiles of the output grid and how a tile finds its data: tile `t = ty *
/// tx + j` reads the 6 x 6 patch at pixel `(2 ty, 2 j)` of a pixel-major
/// source (`cols` pixels per row, `ld` floats per pixel).
#[derive(Clone, Copy, Debug)]
pub(super) struct TileGrid {
    pub ty: usize,
    pub tx: usize,
    pub cols: usize,
    pub ld: usize,
}

impl TileGrid {
    pub(super) fn count(&self) -> usize {
        self.ty * self.tx
    }
}

/// `v[(p * nt + t) * ld + l] = (B^T d B)[p]` for the patch `d` of every tile
/// `t` (`nt` tiles) and lane `l < ld`.
///
/// # Safety
/// `src` holds every patch (`(2 ty + 5) * cols + 2 tx + 5` pixels of `ld`
/// floats) and `v` has `TT * nt * ld` floats; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn input_transform(src: *const f32, g: TileGrid, v: *mut f32) {
    let nt = g.count();
    for ty in 0..g.ty {
        for tx in 0..g.tx {
            let t = ty * g.tx + tx;
            for l0 in (0..g.ld).step_by(LANES) {
                let base = src.add((2 * ty * g.cols + 2 * tx) * g.ld + l0);
                // cols[j][a] = (B^T d)[a][j], then each row a through B.
                let cols: [[__m512; T]; T] = std::array::from_fn(|j| {
                    bt(std::array::from_fn(|i| _mm512_loadu_ps(base.add((i * g.cols + j) * g.ld))))
                });
                for (a, row) in transpose(cols).into_iter().enumerate() {
                    for (b, x) in bt(row).into_iter().enumerate() {
                        _mm512_storeu_ps(v.add(((a * T + b) * nt + t) * g.ld + l0), x);
                    }
                }
            }
        }
    }
}

/// `d[(p * nt + t) * ld + l] = (G2 u G2^T)[p]` for the 2 x 2 pixels `u` at
/// `(2 ty, 2 tx)` of every tile of `g` (the weight gradient's filter side).
///
/// # Safety
/// `src` holds pixels up to `(2 ty - 1) * cols + 2 tx - 1` (`ld` floats
/// each), `d` has `TT * nt * ld` floats; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dy_transform(src: *const f32, g: TileGrid, d: *mut f32) {
    let nt = g.count();
    for ty in 0..g.ty {
        for tx in 0..g.tx {
            let t = ty * g.tx + tx;
            for l0 in (0..g.ld).step_by(LANES) {
                let at = |i: usize, j: usize| {
                    _mm512_loadu_ps(src.add(((2 * ty + i) * g.cols + 2 * tx + j) * g.ld + l0))
                };
                let (c0, c1) = (g2(at(0, 0), at(1, 0)), g2(at(0, 1), at(1, 1)));
                for a in 0..T {
                    for (b, x) in g2(c0[a], c1[a]).into_iter().enumerate() {
                        _mm512_storeu_ps(d.add(((a * T + b) * nt + t) * g.ld + l0), x);
                    }
                }
            }
        }
    }
}

/// `out[(oh * wo + ow) * ld + l] = (A^T m A)` of every tile of `ty x tx`
/// tiles, `m[(p * nt + t) * ld + l]`, for the output pixels inside `ho x wo`.
///
/// # Safety
/// `m` has `TT * ty * tx * ld` floats, `out` `ho * wo * ld`, `2 ty >= ho`,
/// `2 tx >= wo`; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn output_transform(
    m: *const f32,
    (ty, tx, ld): (usize, usize, usize),
    (ho, wo): (usize, usize),
    out: *mut f32,
) {
    let nt = ty * tx;
    for y in 0..ty {
        for x in 0..tx {
            let t = y * tx + x;
            for l0 in (0..ld).step_by(LANES) {
                // cols[j][a] = (A^T m)[a][j], then each row a through A.
                let cols: [[__m512; 2]; T] = std::array::from_fn(|j| {
                    at2(std::array::from_fn(|i| _mm512_loadu_ps(m.add(((i * T + j) * nt + t) * ld + l0))))
                });
                for (a, row) in transpose(cols).into_iter().enumerate() {
                    let oh = 2 * y + a;
                    for (b, v) in at2(row).into_iter().enumerate() {
                        let ow = 2 * x + b;
                        if oh < ho && ow < wo {
                            _mm512_storeu_ps(out.add((oh * wo + ow) * ld + l0), v);
                        }
                    }
                }
            }
        }
    }
}

/// `m[q * ldm + 16 v + l] = sum_{c < nc} v[q * ldv + c] * u[c * ldu + 16 v + l]`
/// for `Q` tiles `q` and `OV` lane vectors: one point's GEMM, a tile block
/// at a time, the tile's value broadcast against 16 output channels.
#[target_feature(enable = "avx512f")]
unsafe fn gemm_tile<const Q: usize, const OV: usize>(
    nc: usize,
    vp: *const f32,
    ldv: usize,
    u: *const f32,
    ldu: usize,
    m: *mut f32,
    ldm: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); OV]; Q];
    for c in 0..nc {
        let uv: [__m512; OV] = std::array::from_fn(|v| _mm512_loadu_ps(u.add(c * ldu + v * LANES)));
        for (q, row) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*vp.add(q * ldv + c));
            for (s, w) in row.iter_mut().zip(&uv) {
                *s = _mm512_fmadd_ps(b, *w, *s);
            }
        }
    }
    for (q, row) in acc.iter().enumerate() {
        for (v, s) in row.iter().enumerate() {
            _mm512_storeu_ps(m.add(q * ldm + v * LANES), *s);
        }
    }
}

/// Tiles per [`gemm_tile`] block: 7 x 2 vectors of accumulators.
const QT: usize = 7;

/// For every point `p`: `m[p][t][..ldo] = v[p][t][..nc] * u[p][..nc][..ldo]`,
/// `nt` tiles (`v` row stride `ldv`, `u` `[TT][nc][ldo]`).
///
/// # Safety
/// `v` has `TT * nt * ldv` floats with `nc <= ldv`, `u` `TT * nc * ldo`,
/// `m` `TT * nt * ldo`, `ldo` a multiple of 16; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn point_gemms(
    nt: usize,
    nc: usize,
    v: *const f32,
    ldv: usize,
    u: *const f32,
    ldo: usize,
    m: *mut f32,
) {
    for p in 0..TT {
        let (vp, up, mp) = (v.add(p * nt * ldv), u.add(p * nc * ldo), m.add(p * nt * ldo));
        let mut o0 = 0;
        while o0 < ldo {
            let two = ldo - o0 >= 2 * LANES;
            let mut t0 = 0;
            while t0 < nt {
                let (vq, uq, mq) = (vp.add(t0 * ldv), up.add(o0), mp.add(t0 * ldo + o0));
                match (nt - t0 >= QT, two) {
                    (true, true) => gemm_tile::<QT, 2>(nc, vq, ldv, uq, ldo, mq, ldo),
                    (true, false) => gemm_tile::<QT, 1>(nc, vq, ldv, uq, ldo, mq, ldo),
                    (false, true) => gemm_tile::<1, 2>(nc, vq, ldv, uq, ldo, mq, ldo),
                    (false, false) => gemm_tile::<1, 1>(nc, vq, ldv, uq, ldo, mq, ldo),
                }
                t0 += if nt - t0 >= QT { QT } else { 1 };
            }
            o0 += if two { 2 * LANES } else { LANES };
        }
    }
}

/// `acc[c * lda + 16 v + l] += sum_{t < nt} v[t * ldv + c] * d[t * ldd + 16 v + l]`
/// for `QC` channels `c` and `OV` lane vectors: one point's weight-gradient
/// GEMM, the sum over tiles in the inner loop.
#[target_feature(enable = "avx512f")]
unsafe fn dw_tile<const QC: usize, const OV: usize>(
    nt: usize,
    vp: *const f32,
    ldv: usize,
    d: *const f32,
    ldd: usize,
    acc_mem: *mut f32,
    lda: usize,
) {
    let mut acc: [[__m512; OV]; QC] =
        std::array::from_fn(|c| std::array::from_fn(|v| _mm512_loadu_ps(acc_mem.add(c * lda + v * LANES))));
    for t in 0..nt {
        let dv: [__m512; OV] = std::array::from_fn(|v| _mm512_loadu_ps(d.add(t * ldd + v * LANES)));
        for (c, row) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*vp.add(t * ldv + c));
            for (s, w) in row.iter_mut().zip(&dv) {
                *s = _mm512_fmadd_ps(b, *w, *s);
            }
        }
    }
    for (c, row) in acc.iter().enumerate() {
        for (v, s) in row.iter().enumerate() {
            _mm512_storeu_ps(acc_mem.add(c * lda + v * LANES), *s);
        }
    }
}

/// Channels per [`dw_tile`] block: 8 x 2 vectors of accumulators.
const QC: usize = 8;

/// For every point `p`: `acc[p][c][..ldo] += sum_t v[p][t][c] * d[p][t][..ldo]`
/// for `c < ldc` (`v` and `acc` padded to `ldc`, a multiple of 16).
///
/// # Safety
/// `v` has `TT * nt * ldc` floats, `d` `TT * nt * ldo`, `acc` `TT * ldc *
/// ldo`, `ldc` and `ldo` multiples of 16; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn point_dw(
    nt: usize,
    v: *const f32,
    ldc: usize,
    d: *const f32,
    ldo: usize,
    acc: *mut f32,
) {
    for p in 0..TT {
        let (vp, dp, ap) = (v.add(p * nt * ldc), d.add(p * nt * ldo), acc.add(p * ldc * ldo));
        for c0 in (0..ldc).step_by(QC) {
            let mut o0 = 0;
            while o0 < ldo {
                let (vq, dq, aq) = (vp.add(c0), dp.add(o0), ap.add(c0 * ldo + o0));
                if ldo - o0 >= 2 * LANES {
                    dw_tile::<QC, 2>(nt, vq, ldc, dq, ldo, aq, ldo);
                    o0 += 2 * LANES;
                } else {
                    dw_tile::<QC, 1>(nt, vq, ldc, dq, ldo, aq, ldo);
                    o0 += LANES;
                }
            }
        }
    }
}
