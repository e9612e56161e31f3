//! The vector kernels of [`super`]: the F(4x4, 5x5) and F(6x6, 3x3)
//! transforms and the per-point GEMMs, 16 channels along the lanes.
//!
//! The matrices come from Toom-Cook over the points 0, 1, -1, 2, -2, 1/2,
//! -1/2, inf. `B^T` depends on the eight points only, so F(4, 5) and
//! F(6, 3) (forward and input gradient) and F(5, 4) and F(3, 6) (weight
//! gradient) all share the data transform `B^T`. Every coefficient applied to
//! data is a multiple of a power of two with at most five significant bits
//! (21/4, 17/4, 5/2, ...); the other fractions live in the filter transform,
//! done once per call in f64, and in the weight gradient's final transform.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

pub(super) const LANES: usize = 16;
/// Points per axis (a tile's input patch side, `M + K - 1` for output tiles
/// of `M x M` pixels: 4 + 5 - 1 and 6 + 3 - 1), and transform points per
/// tile.
pub(super) const T: usize = 8;
pub(super) const TT: usize = T * T;

/// The seven finite points `a_j` (the eighth is at infinity).
const POINTS: [f64; T - 1] = [0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5];

/// Entry `(j, k)` of the filter transform `G` (`T x taps`) of F(T + 1 -
/// taps, taps): `a_j^k / f_j` for `f_j = prod_{l != j} (a_j - a_l)`
/// ([`INV_F`]), and the last tap for the point at infinity. The points are
/// powers of two (or 0), so each entry is `1 / f_j` rounded once and scaled
/// exactly: the tables F(4, 5) and F(6, 3) were written out as, bit for bit.
pub(super) fn g(taps: usize, j: usize, k: usize) -> f64 {
    if j == T - 1 {
        return if k + 1 == taps { 1.0 } else { 0.0 };
    }
    POINTS[j].powi(k as i32) * INV_F[j]
}

/// Entry `(i, j)` of the output transform `A^T` (`rows x T`) of F(rows,
/// T + 1 - rows): `a_j^i` (exact), and the point at infinity in the last row.
pub(super) fn at(rows: usize, i: usize, j: usize) -> f64 {
    if j == T - 1 {
        return if i + 1 == rows { 1.0 } else { 0.0 };
    }
    POINTS[j].powi(i as i32)
}

/// `1 / f_j` for the finite points (see [`g`]), and 1 for infinity. The
/// weight gradient's filter side, F(K, M)'s filter transform, is `diag(INV_F)`
/// times the power-of-two rows of [`g_rows`]; `INV_F` is applied in its
/// final transform instead.
pub(super) const INV_F: [f64; T] =
    [-1.0, -2.0 / 9.0, -2.0 / 9.0, 1.0 / 90.0, 1.0 / 90.0, 32.0 / 45.0, 32.0 / 45.0, 1.0];

/// `B^T x` for eight vectors, the rows
/// [-1, 0, 21/4, 0, -21/4, 0, 1, 0], [0, 1, 1, -17/4, -17/4, 1, 1, 0],
/// [0, -1, 1, 17/4, -17/4, -1, 1, 0], [0, 1/2, 1/4, -5/2, -5/4, 2, 1, 0],
/// [0, -1/2, 1/4, 5/2, -5/4, -2, 1, 0], [0, 2, 4, -5/2, -5, 1/2, 1, 0],
/// [0, -2, 4, 5/2, -5, -1/2, 1, 0], [0, -1, 0, 21/4, 0, -21/4, 0, 1],
/// as even and odd halves of each pair of rows.
#[inline]
#[target_feature(enable = "avx512f")]
fn bt(x: [__m512; T]) -> [__m512; T] {
    let c = _mm512_set1_ps;
    let e1 = _mm512_fmadd_ps(c(-4.25), x[4], _mm512_add_ps(x[2], x[6]));
    let o1 = _mm512_fmadd_ps(c(-4.25), x[3], _mm512_add_ps(x[1], x[5]));
    let e3 = _mm512_fmadd_ps(c(-1.25), x[4], _mm512_fmadd_ps(c(0.25), x[2], x[6]));
    let o3 = _mm512_fmadd_ps(c(-2.5), x[3], _mm512_fmadd_ps(c(0.5), x[1], _mm512_add_ps(x[5], x[5])));
    let e5 = _mm512_fmadd_ps(c(-5.0), x[4], _mm512_fmadd_ps(c(4.0), x[2], x[6]));
    let o5 = _mm512_fmadd_ps(c(-2.5), x[3], _mm512_fmadd_ps(c(0.5), x[5], _mm512_add_ps(x[1], x[1])));
    [
        _mm512_fmadd_ps(c(5.25), _mm512_sub_ps(x[2], x[4]), _mm512_sub_ps(x[6], x[0])),
        _mm512_add_ps(e1, o1),
        _mm512_sub_ps(e1, o1),
        _mm512_add_ps(e3, o3),
        _mm512_sub_ps(e3, o3),
        _mm512_add_ps(e5, o5),
        _mm512_sub_ps(e5, o5),
        _mm512_fmadd_ps(c(5.25), _mm512_sub_ps(x[3], x[5]), _mm512_sub_ps(x[7], x[1])),
    ]
}

/// `A^T m` of F(M, T + 1 - M): the rows `a_j^i` for i < M (powers of two:
/// 1, 1/2, 1/4, ... at the halves), with the point at infinity in the last.
/// `M` is 4 or 6; the loop unrolls to the sums as written out per size.
#[inline]
#[target_feature(enable = "avx512f")]
fn at_rows<const M: usize>(m: [__m512; T]) -> [__m512; M] {
    let c = _mm512_set1_ps;
    let (s1, d1) = (_mm512_add_ps(m[1], m[2]), _mm512_sub_ps(m[1], m[2]));
    let (s2, d2) = (_mm512_add_ps(m[3], m[4]), _mm512_sub_ps(m[3], m[4]));
    let (s3, d3) = (_mm512_add_ps(m[5], m[6]), _mm512_sub_ps(m[5], m[6]));
    let mut out = [_mm512_add_ps(_mm512_add_ps(m[0], s1), _mm512_add_ps(s2, s3)); M];
    for (i, row) in out.iter_mut().enumerate().skip(1) {
        // Odd rows take the differences of each +-a pair, even rows the sums.
        let (one, two, half) = if i % 2 == 1 { (d1, d2, d3) } else { (s1, s2, s3) };
        let p = (1u32 << i) as f32;
        *row = _mm512_fmadd_ps(c(p), two, _mm512_fmadd_ps(c(1.0 / p), half, one));
    }
    out[M - 1] = _mm512_add_ps(out[M - 1], m[7]);
    out
}

/// `(G_N u)` without [`INV_F`], F(T + 1 - N, N)'s filter side for the
/// weight gradient's `N x N` `dy` tiles: the rows `a_j^k` for k < N (powers
/// of two, exact), and the last value for the point at infinity. `N` is 4
/// or 6; the loops unroll to the sums as written out per size.
#[inline]
#[target_feature(enable = "avx512f")]
fn g_rows<const N: usize>(u: [__m512; N]) -> [__m512; T] {
    let c = _mm512_set1_ps;
    // Even and odd taps: e1 + o1 and e1 - o1 at +-1, e2/o2 at +-2, e3/o3 at +-1/2.
    let (mut e1, mut e2, mut e3) = (u[0], u[0], u[0]);
    let (mut o1, mut o2, mut o3) = (u[1], _mm512_add_ps(u[1], u[1]), _mm512_mul_ps(c(0.5), u[1]));
    for (k, &uk) in u.iter().enumerate().skip(2) {
        let p = (1u32 << k) as f32;
        let (s1, s2, s3) = if k % 2 == 0 { (&mut e1, &mut e2, &mut e3) } else { (&mut o1, &mut o2, &mut o3) };
        *s1 = _mm512_add_ps(*s1, uk);
        *s2 = _mm512_fmadd_ps(c(p), uk, *s2);
        *s3 = _mm512_fmadd_ps(c(1.0 / p), uk, *s3);
    }
    [
        u[0],
        _mm512_add_ps(e1, o1),
        _mm512_sub_ps(e1, o1),
        _mm512_add_ps(e2, o2),
        _mm512_sub_ps(e2, o2),
        _mm512_add_ps(e3, o3),
        _mm512_sub_ps(e3, o3),
        u[N - 1],
    ]
}

/// Floats per transform point in the transformed buffers (`v`, `d`, `m`):
/// `nt` tiles of `ld`, plus one vector so that the 64 points of a tile do
/// not sit a power of two apart (16 tiles of 16 lanes are 4 KB, and a
/// tile's 64 stores then all fell into one L1 set).
pub(super) const fn point_len(nt: usize, ld: usize) -> usize {
    nt * ld + LANES
}

/// Tiles of the output grid and how a tile finds its data: tile `t = ty *
/// tx + j` reads the 8 x 8 patch at pixel `(M ty, M j)` of a pixel-major
/// source (`cols` pixels per row, `ld` floats per pixel), `M` the tile side
/// of the kernels' const parameter.
#[derive(Clone, Copy, Debug)]
pub(super) struct TileGrid {
    pub ty: usize,
    pub tx: usize,
    pub cols: usize,
    pub ld: usize,
    /// Floats per transform point in the transformed buffer:
    /// `point_len(tiles, ld)` for the tiles of all the images it holds.
    pub ps: usize,
}

impl TileGrid {
    pub(super) fn count(&self) -> usize {
        self.ty * self.tx
    }

    /// This grid in a transformed buffer that holds the tiles of `images`
    /// images one after the other (the kernels then write one image's tiles
    /// from where the caller points them).
    pub(super) fn batched(self, images: usize) -> TileGrid {
        TileGrid { ps: point_len(images * self.count(), self.ld), ..self }
    }
}

/// `v[p * point_len + t * ld + l] = (B^T d B)[p]` for the patch `d` of every tile
/// `t` (`nt` tiles, `M` apart) and lane `l < ld`.
///
/// # Safety
/// `src` holds every patch (`(M ty + 7 - M) * cols + M tx + 7 - M` pixels of
/// `ld` floats) and `v` has `TT * point_len(nt, ld)` floats; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn input_transform<const M: usize>(src: *const f32, g: TileGrid, v: *mut f32) {
    patch_transform::<M, T>(src, g, v, |x| bt(x))
}

/// `d[p * point_len + t * ld + l] = (G_M u G_M^T)[p]` for the M x M pixels
/// `u` at `(M ty, M tx)` of every tile of `g` (F(T + 1 - M, M)'s filter
/// side, see [`g_rows`]).
///
/// # Safety
/// `src` holds pixels up to `(M ty - 1) * cols + M tx - 1` (`ld` floats
/// each), `d` has `TT * point_len(nt, ld)` floats; `M` is 4 or 6; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dy_transform<const M: usize>(src: *const f32, g: TileGrid, d: *mut f32) {
    patch_transform::<M, M>(src, g, d, |u| g_rows(u))
}

/// Source columns a run of [`patch_transform`] keeps: `TX * M + T - M`
/// for the largest tile side `M` (6).
const RUN_COLS: usize = 4 * 6 + T - 6;

/// `out[p * point_len + t * ld + l] = (F x F^T)[p]` for the `N x N` pixels
/// `x` at `(M ty, M tx)` of every tile of `g`, where `f` applies `F` to a
/// column: the columns through `f`, then each row of the result.
///
/// # Safety
/// `src` holds pixels up to `(M ty + N - M - 1) * cols + M tx + N - M - 1`
/// (`ld` floats each), `out` has `TT * point_len(nt, ld)` floats; `M <= 6`,
/// `N <= T`; AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn patch_transform<const M: usize, const N: usize>(
    src: *const f32,
    g: TileGrid,
    out: *mut f32,
    f: impl Fn([__m512; N]) -> [__m512; T],
) {
    let ps = g.ps;
    // cols[a][x] = (F x)[a] of source column x of a run of up to TX tiles:
    // neighbouring 8 x 8 patches share four columns, whose pass then runs
    // once. (As arrays moved through `from_fn` and a transpose, the compiler
    // copied them around the stack: 1.5x the time.)
    // Uninitialized: zero-filled it was a 10 KB memset per call. Each run
    // writes columns `..M * run + N - M` before the rows read them.
    const TX: usize = 4;
    debug_assert!(TX * M + N - M <= RUN_COLS);
    let mut cols = [[MaybeUninit::<__m512>::uninit(); RUN_COLS]; T];
    for ty in 0..g.ty {
        for l0 in (0..g.ld).step_by(LANES) {
            for tx0 in (0..g.tx).step_by(TX) {
                let run = (g.tx - tx0).min(TX);
                let base = src.add((M * ty * g.cols + M * tx0) * g.ld + l0);
                for x in 0..M * run + N - M {
                    let mut v = [_mm512_setzero_ps(); N];
                    for (i, e) in v.iter_mut().enumerate() {
                        *e = _mm512_loadu_ps(base.add((i * g.cols + x) * g.ld));
                    }
                    for (row, e) in cols.iter_mut().zip(f(v)) {
                        row[x] = MaybeUninit::new(e);
                    }
                }
                for k in 0..run {
                    let t = ty * g.tx + tx0 + k;
                    for (a, ca) in cols.iter().enumerate() {
                        // SAFETY: M * k + j < M * run + N - M: written above.
                        let row: [__m512; N] = std::array::from_fn(|j| ca[M * k + j].assume_init());
                        for (b, v) in f(row).into_iter().enumerate() {
                            _mm512_storeu_ps(out.add((a * T + b) * ps + t * g.ld + l0), v);
                        }
                    }
                }
            }
        }
    }
}

/// Where [`output_transform`] puts the pixels of a grid of tiles laid over
/// a mosaic of `gy x gx` images `pitch` pixels apart (see `super::Mosaic`):
/// grid pixel `(y, x)` is pixel `(y % py, x % px)` of the image in row `y /
/// py` and column `x / px` of the mosaic, kept when it lies inside that
/// image's `h x w` and the image inside the mosaic, at index `rows[y] +
/// cols[x]` of `out` (image by image, `h * w` pixels each). One image (`gy
/// = gx = 1`) keeps the pixels inside `h x w`. Worked out per row and
/// column once: a division per pixel stored took 1.2% of a ResNet-20 step.
pub(super) struct Slots {
    rows: Vec<Option<usize>>,
    cols: Vec<Option<usize>>,
}

impl Slots {
    /// For a grid of `ny x nx` pixels over images of `h x w`.
    pub(super) fn new(
        (h, w): (usize, usize),
        pitch: (usize, usize),
        (gy, gx): (usize, usize),
        (ny, nx): (usize, usize),
    ) -> Self {
        let rows = (0..ny)
            .map(|y| {
                let (sy, oh) = (y / pitch.0, y % pitch.0);
                (oh < h && sy < gy).then(|| (sy * gx * h + oh) * w)
            })
            .collect();
        let cols = (0..nx)
            .map(|x| {
                let (sx, ow) = (x / pitch.1, x % pitch.1);
                (ow < w && sx < gx).then(|| sx * h * w + ow)
            })
            .collect();
        Slots { rows, cols }
    }
}

/// `out[pix * ld + l] = (A^T m A)` of every tile of `ty x tx` tiles of `M x
/// M` pixels (F(M, T + 1 - M)), `m[p * ps + t * ld + l]`, for the grid
/// pixels `slots` keeps, `pix` the index it gives them (`tiles` is `(ty,
/// tx, ld, ps)`).
///
/// # Safety
/// `m` has `63 * ps + ty * tx * ld` floats, `ps >= point_len(ty * tx, ld)`,
/// `out` `gy * gx * h * w * ld` (of `slots`), `slots` made for `M ty x M
/// tx` pixels; `M` is 4 or 6; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn output_transform<const M: usize>(
    m: *const f32,
    (ty, tx, ld, ps): (usize, usize, usize, usize),
    slots: &Slots,
    out: *mut f32,
) {
    let nt = ty * tx;
    debug_assert!(ps >= point_len(nt, ld));
    // cols[a][j] = (A^T m)[a][j], then each row a through A (see `patch_transform`).
    let mut cols = [[_mm512_setzero_ps(); T]; M];
    for y in 0..ty {
        for x in 0..tx {
            let t = y * tx + x;
            for l0 in (0..ld).step_by(LANES) {
                for j in 0..T {
                    let mut v = [_mm512_setzero_ps(); T];
                    for (i, e) in v.iter_mut().enumerate() {
                        *e = _mm512_loadu_ps(m.add((i * T + j) * ps + t * ld + l0));
                    }
                    for (row, e) in cols.iter_mut().zip(at_rows::<M>(v)) {
                        row[j] = e;
                    }
                }
                for (a, row) in cols.iter().enumerate() {
                    let Some(r) = slots.rows[M * y + a] else { continue };
                    for (b, v) in at_rows::<M>(*row).into_iter().enumerate() {
                        if let Some(c) = slots.cols[M * x + b] {
                            _mm512_storeu_ps(out.add((r + c) * ld + l0), v);
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

/// Tiles per [`gemm_tile`] block: 8 x 2 vectors of accumulators (8 x 1
/// keeps both FMA pipes' latency covered too).
const QT: usize = 8;

/// Tiles in the register block that starts `rest` tiles before the end
/// (`ov` lane vectors): [`QT`], or all of them where they fit in one block
/// (up to 15 x 1 or 12 x 2 accumulators), so that the tiles past the last
/// multiple of 8 share a block instead of going one at a time. A lone
/// tile is a chain of `nc` dependent FMAs, and ResNet-20's 25-tile GEMMs
/// (28x28 images, 14x14 ones four to a mosaic) left one over at every
/// point: at 16 channels it took as long as eight tiles in a block. Every
/// tile sums its channels in the same order in any block.
fn block_tiles(rest: usize, ov: usize) -> usize {
    let most = if ov == 1 { 15 } else { 12 };
    if rest <= most {
        rest
    } else {
        QT
    }
}

/// For every point `p`: `m[p][t][..ldo] = v[p][t][..nc] * u[p][..nc][..ldo]`,
/// `nt` tiles (`v` row stride `ldv`, `u` `[TT][nc][ldo]`).
///
/// # Safety
/// `v` has `TT * point_len(nt, ldv)` floats with `nc <= ldv`, `u` `TT * nc *
/// ldo`, `m` `TT * point_len(nt, ldo)`, `ldo` a multiple of 16; AVX-512F.
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
    // One monomorphic block per tile count `block_tiles` hands out.
    macro_rules! block {
        ($ov:literal, $q:expr, $a:expr, $($n:literal)*) => {
            match $q {
                $($n => gemm_tile::<$n, $ov>($a.0, $a.1, $a.2, $a.3, $a.4, $a.5, $a.6),)*
                _ => unreachable!("block_tiles hands out at most 15 x 1 or 12 x 2 tiles"),
            }
        };
    }
    for p in 0..TT {
        let (vp, up, mp) =
            (v.add(p * point_len(nt, ldv)), u.add(p * nc * ldo), m.add(p * point_len(nt, ldo)));
        let mut o0 = 0;
        while o0 < ldo {
            let ov = if ldo - o0 >= 2 * LANES { 2 } else { 1 };
            let mut t0 = 0;
            while t0 < nt {
                let (vq, uq, mq) = (vp.add(t0 * ldv), up.add(o0), mp.add(t0 * ldo + o0));
                let q = block_tiles(nt - t0, ov);
                let args = (nc, vq, ldv, uq, ldo, mq, ldo);
                if ov == 2 {
                    block!(2, q, args, 1 2 3 4 5 6 7 8 9 10 11 12)
                } else {
                    block!(1, q, args, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
                }
                t0 += q;
            }
            o0 += ov * LANES;
        }
    }
}

/// `acc[c * lda + 16 v + l] += sum_{t < nt} v[t * ldv + c] * d[t * ldd + 16 v + l]`
/// for `QC` channels `c` and `OV` lane vectors: one point's weight-gradient
/// GEMM, the sum over tiles in the inner loop. `first`: `=` instead of
/// `+=` (`acc` may be uninitialized).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_tile<const QC: usize, const OV: usize>(
    nt: usize,
    vp: *const f32,
    ldv: usize,
    d: *const f32,
    ldd: usize,
    acc_mem: *mut f32,
    lda: usize,
    first: bool,
) {
    let mut acc: [[__m512; OV]; QC] = std::array::from_fn(|c| {
        std::array::from_fn(|v| {
            if first {
                _mm512_setzero_ps()
            } else {
                _mm512_loadu_ps(acc_mem.add(c * lda + v * LANES))
            }
        })
    });
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
/// for `c < ldc` (`v` and `acc` padded to `ldc`, a multiple of 16); `first`:
/// `=`, every element of `acc` written (it may come uninitialized: zeroing
/// a task's 1 MB of accumulators took 1-2% of a ResNet-20 step).
///
/// # Safety
/// `v` has `TT * point_len(nt, ldc)` floats, `d` `TT * point_len(nt, ldo)`, `acc` `TT * ldc *
/// ldo`, `ldc` and `ldo` multiples of 16; AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn point_dw(
    nt: usize,
    v: *const f32,
    ldc: usize,
    d: *const f32,
    ldo: usize,
    acc: *mut f32,
    first: bool,
) {
    for p in 0..TT {
        let (vp, dp, ap) =
            (v.add(p * point_len(nt, ldc)), d.add(p * point_len(nt, ldo)), acc.add(p * ldc * ldo));
        for c0 in (0..ldc).step_by(QC) {
            let mut o0 = 0;
            while o0 < ldo {
                let (vq, dq, aq) = (vp.add(c0), dp.add(o0), ap.add(c0 * ldo + o0));
                if ldo - o0 >= 2 * LANES {
                    dw_tile::<QC, 2>(nt, vq, ldc, dq, ldo, aq, ldo, first);
                    o0 += 2 * LANES;
                } else {
                    dw_tile::<QC, 1>(nt, vq, ldc, dq, ldo, aq, ldo, first);
                    o0 += LANES;
                }
            }
        }
    }
}
