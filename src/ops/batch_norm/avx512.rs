//! f32 AVX-512 versions of the BatchNorm kernels that dominate a CPU step:
//! the forward sums and the fused BN + ReLU + MaxPool2d(2, 2) forward and
//! backward. The generic kernels vectorize poorly (the 2x2 windows interleave
//! even and odd columns), so these split each pair of input rows into its four
//! window positions with two permutes per 16 windows and work on whole vectors.
//!
//! Every value is the same expression as in the generic kernels, evaluated in
//! the same order (multiply then add, never fused), so outputs, window codes
//! and `dx` are bitwise equal to theirs, as are [`plane_sums`]' f64 results.
//! Only [`pool_plane_sums`] adds in a different order (per lane over the plane
//! instead of per pooled row, two rows to a vector for rows of up to 8
//! windows), an f32 reassociation.

use super::fused_cpu::KILLED;
use std::arch::x86_64::*;

const LANES: usize = 16;

/// Whether the CPU runs these kernels (BW and VL for the byte-masked loads
/// of window codes).
pub fn usable() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// `(sum (x - shift), sum (x - shift)^2)` of one plane, as the generic
/// `cpu::plane_sums` computes it: 16 lanes over blocks of 1,024, the tail in
/// scalars, each block moved to f64 tail first, then the lanes as
/// `cpu::lanes_to_f64`'s tree.
pub fn plane_sums(p: &[f32], shift: f32) -> (f64, f64) {
    const BLOCK: usize = 1024;
    let (mut s_tot, mut q_tot) = (0.0f64, 0.0f64);
    for blk in p.chunks(BLOCK) {
        let chunks = blk.chunks_exact(LANES);
        let (mut rs, mut rq) = (0.0f32, 0.0f32);
        for &x in chunks.remainder() {
            let v = x - shift;
            rs += v;
            rq += v * v;
        }
        // SAFETY: reads `chunks.len()` whole vectors of `blk`; AVX-512F is
        // checked by the caller through `usable`.
        let (s, q) = unsafe { block_sums(blk.as_ptr(), blk.len() / LANES, shift) };
        s_tot += f64::from(rs);
        q_tot += f64::from(rq);
        s_tot += s;
        q_tot += q;
    }
    (s_tot, q_tot)
}

/// The lane sums of `nv` vectors at `p`, minus `shift`, and of their
/// squares, each reduced by [`lanes_to_f64`].
#[target_feature(enable = "avx512f")]
unsafe fn block_sums(p: *const f32, nv: usize, shift: f32) -> (f64, f64) {
    let k = _mm512_set1_ps(shift);
    let (mut sv, mut qv) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for v in 0..nv {
        let d = _mm512_sub_ps(_mm512_loadu_ps(p.add(v * LANES)), k);
        sv = _mm512_add_ps(sv, d);
        qv = _mm512_add_ps(qv, _mm512_mul_ps(d, d));
    }
    (lanes_to_f64(sv), lanes_to_f64(qv))
}

/// `cpu::lanes_to_f64` on a vector: widened to f64 and added as the same
/// tree (lane `i` with `i + 8`, `+ 4`, `+ 2`, `+ 1`), bit for bit.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn lanes_to_f64(v: __m512) -> f64 {
    let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
    let t = _mm512_add_pd(lo, hi);
    let u = _mm256_add_pd(_mm512_castpd512_pd256(t), _mm512_extractf64x4_pd::<1>(t));
    let w = _mm_add_pd(_mm256_castpd256_pd128(u), _mm256_extractf128_pd::<1>(u));
    _mm_cvtsd_f64(w) + _mm_cvtsd_f64(_mm_unpackhi_pd(w, w))
}

/// Lane masks for `n` (<= 16) windows: the pooled lanes, and the low and
/// high halves of the `2n` input columns.
#[inline(always)]
pub(super) fn masks(n: usize) -> (__mmask16, __mmask16, __mmask16) {
    let bits = |m: usize| ((1u32 << m) - 1) as __mmask16;
    let cols = 2 * n;
    (bits(n), bits(cols.min(LANES)), bits(cols.saturating_sub(LANES)))
}

/// One pass of the pooling kernels: up to 16 windows, of one pooled row
/// (lanes `0..n`) or, for rows of at most 8 windows, of two (lanes `0..ow`
/// and `8..8 + ow`), so MNIST's 7-window rows fill 14 lanes, not 7.
#[derive(Clone, Copy)]
struct Strip {
    /// Plane offsets of the top input row's columns for the first and the
    /// second 16 of [`split`]'s 32 (the bottom row is `w` further on).
    cols: [usize; 2],
    lo: __mmask16,
    hi: __mmask16,
    /// Pooled outputs: lane `l` of mask `m[i]` at offset `at[i] + l`.
    at: [isize; 2],
    m: [__mmask16; 2],
}

/// The strips covering an `oh x ow` pooled plane over input rows of `w`:
/// pairs of rows first (when `ow <= 8`), then single rows in 16-window
/// pieces. (A `chain` of two iterators here was not inlined: 2% of a step.)
fn strips(oh: usize, ow: usize, w: usize) -> Strips {
    let paired = if ow <= LANES / 2 { oh / 2 * 2 } else { 0 };
    Strips { oh, ow, w, paired, oy: 0, ox: 0 }
}

struct Strips {
    oh: usize,
    ow: usize,
    w: usize,
    /// Rows `0..paired` go two at a time.
    paired: usize,
    oy: usize,
    ox: usize,
}

impl Iterator for Strips {
    type Item = Strip;

    #[inline(always)]
    fn next(&mut self) -> Option<Strip> {
        let (oy, ow, w) = (self.oy, self.ow, self.w);
        if oy < self.paired {
            self.oy += 2;
            let (m, lo, _) = masks(ow);
            let at = (oy * ow) as isize;
            return Some(Strip {
                cols: [2 * oy * w, (2 * oy + 2) * w],
                lo,
                hi: lo,
                at: [at, at + ow as isize - 8],
                m: [m, m << 8],
            });
        }
        if oy >= self.oh {
            return None;
        }
        let ox = self.ox;
        self.ox += LANES;
        if self.ox >= ow {
            (self.ox, self.oy) = (0, oy + 1);
        }
        let (m, lo, hi) = masks((ow - ox).min(LANES));
        let c = 2 * oy * w + 2 * ox;
        Some(Strip { cols: [c, c + LANES], lo, hi, at: [(oy * ow + ox) as isize, 0], m: [m, 0] })
    }
}

/// The pooled values of strip `s` from `p` (other lanes 0).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_pooled(p: *const f32, s: &Strip) -> __m512 {
    let v = _mm512_maskz_loadu_ps(s.m[0], p.wrapping_offset(s.at[0]));
    _mm512_mask_loadu_ps(v, s.m[1], p.wrapping_offset(s.at[1]))
}

/// Stores the pooled lanes of strip `s` at `p`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_pooled(p: *mut f32, s: &Strip, v: __m512) {
    _mm512_mask_storeu_ps(p.wrapping_offset(s.at[0]), s.m[0], v);
    _mm512_mask_storeu_ps(p.wrapping_offset(s.at[1]), s.m[1], v);
}

/// The even and odd columns of up to 16 floats at `p` and 16 at `q` (lanes
/// past the masks read as 0): window positions (0, 1) of a top row, (2, 3)
/// of a bottom one.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn split(p: *const f32, q: *const f32, lo: __mmask16, hi: __mmask16) -> (__m512, __m512) {
    let a = _mm512_maskz_loadu_ps(lo, p);
    let b = _mm512_maskz_loadu_ps(hi, q);
    let ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    (_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b))
}

/// The inverse of [`split`]: stores even `e` and odd `o` columns interleaved.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn merge(p: *mut f32, q: *mut f32, lo: __mmask16, hi: __mmask16, e: __m512, o: __m512) {
    let il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_mask_storeu_ps(p, lo, _mm512_permutex2var_ps(e, il, o));
    _mm512_mask_storeu_ps(q, hi, _mm512_permutex2var_ps(e, ih, o));
}

/// The window codes of the `m` lanes at `c` as 32-bit lanes; lanes past
/// `m` read [`KILLED`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn load_codes(c: *const u8, m: __mmask16) -> __m512i {
    let v = _mm_mask_loadu_epi8(_mm_set1_epi8(KILLED as i8), m, c.cast());
    _mm512_cvtepu8_epi32(v)
}

/// The window codes of strip `s` at `c` as 32-bit lanes; other lanes read
/// [`KILLED`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn strip_codes(c: *const u8, s: &Strip) -> __m512i {
    let v = _mm_mask_loadu_epi8(_mm_set1_epi8(KILLED as i8), s.m[0], c.wrapping_offset(s.at[0]).cast());
    let v = _mm_mask_loadu_epi8(v, s.m[1], c.wrapping_offset(s.at[1]).cast());
    _mm512_cvtepu8_epi32(v)
}

/// `fused_cpu::forward_plane` for f32: one `h x w` plane into its pooled
/// plane `y` and window codes.
pub fn forward_plane(x: &[f32], w: usize, scale: f32, shift: f32, y: &mut [f32], codes: &mut [u8]) {
    let ow = w / 2;
    assert!(w.is_multiple_of(2) && ow > 0 && y.len() == codes.len() && x.len() >= 4 * y.len());
    // SAFETY: every access is to window (oy, ox < ow) of pooled row oy <
    // y.len() / ow, at x[(2 oy + r) w + 2 ox + j] and y/codes[oy ow + ox],
    // inside the slices by the assert; masked lanes are not accessed.
    // AVX-512F/BW/VL are checked by the caller through `usable`.
    unsafe {
        forward_plane_avx512(x.as_ptr(), w, y.len() / ow, scale, shift, y.as_mut_ptr(), codes.as_mut_ptr())
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn forward_plane_avx512(
    x: *const f32,
    w: usize,
    oh: usize,
    scale: f32,
    shift: f32,
    y: *mut f32,
    codes: *mut u8,
) {
    let ow = w / 2;
    let (sc, sh) = (_mm512_set1_ps(scale), _mm512_set1_ps(shift));
    let (zero, nan) = (_mm512_setzero_ps(), _mm512_set1_ps(f32::NAN));
    for s in strips(oh, ow, w) {
        let (t, b) = (s.cols.map(|c| x.wrapping_add(c)), s.cols.map(|c| x.wrapping_add(c + w)));
        let (a0, a1) = split(t[0], t[1], s.lo, s.hi);
        let (a2, a3) = split(b[0], b[1], s.lo, s.hi);
        let (z0, z1) = (affine(a0, sc, sh), affine(a1, sc, sh));
        let (z2, z3) = (affine(a2, sc, sh), affine(a3, sc, sh));
        // max_ps(a, b) is `a > b ? a : b`, the generic max2.
        let mx = _mm512_max_ps(_mm512_max_ps(z0, z1), _mm512_max_ps(z2, z3));
        let mut c = _mm512_set1_epi32(3);
        c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(z2, mx), _mm512_set1_epi32(2));
        c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(z1, mx), _mm512_set1_epi32(1));
        c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(z0, mx), _mm512_setzero_si512());
        let alive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, zero);
        let has_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(z0, z1) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(z2, z3);
        let live = alive & !has_nan;
        let code = _mm512_mask_mov_epi32(_mm512_set1_epi32(i32::from(KILLED)), live, c);
        let out = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(alive, mx), has_nan, nan);
        store_pooled(y, &s, out);
        for (at, m) in s.at.into_iter().zip(s.m) {
            _mm512_mask_cvtepi32_storeu_epi8(codes.wrapping_offset(at).cast(), m, code);
        }
    }
}

/// `v * scale + shift`, rounded after each operation like the generic kernel.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn affine(v: __m512, scale: __m512, shift: __m512) -> __m512 {
    _mm512_add_ps(_mm512_mul_ps(v, scale), shift)
}

/// The input value at each live window's source, selected by `code`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pick(code: __m512i, a: [__m512; 4]) -> __m512 {
    let mut v = a[3];
    for d in [2, 1, 0] {
        v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(d)), a[d as usize]);
    }
    v
}

/// One plane's `(sum dz, sum dz * (x - mean))` for `fused_cpu::backward_sums`
/// (before the `invstd` factor), `dz` being `dy` at live windows' sources.
pub fn pool_plane_sums(x: &[f32], dy: &[f32], codes: &[u8], w: usize, mean: f32) -> (f64, f64) {
    let ow = w / 2;
    assert!(w.is_multiple_of(2) && ow > 0 && dy.len() == codes.len() && x.len() >= 4 * dy.len());
    // SAFETY: as in `forward_plane`, reading x, dy and codes only.
    unsafe { pool_sums_avx512(x.as_ptr(), dy.as_ptr(), codes, w, mean) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pool_sums_avx512(x: *const f32, dy: *const f32, codes: &[u8], w: usize, mean: f32) -> (f64, f64) {
    let ow = w / 2;
    let mv = _mm512_set1_ps(mean);
    let (mut sv, mut qv) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for s in strips(codes.len() / ow, ow, w) {
        let code = strip_codes(codes.as_ptr(), &s);
        let live = _mm512_cmplt_epi32_mask(code, _mm512_set1_epi32(i32::from(KILLED)));
        let (t, b) = (s.cols.map(|c| x.wrapping_add(c)), s.cols.map(|c| x.wrapping_add(c + w)));
        let (a0, a1) = split(t[0], t[1], s.lo, s.hi);
        let (a2, a3) = split(b[0], b[1], s.lo, s.hi);
        let xv = pick(code, [a0, a1, a2, a3]);
        let g = load_pooled(dy, &s);
        sv = _mm512_mask_add_ps(sv, live, sv, g);
        qv = _mm512_mask_add_ps(qv, live, qv, _mm512_mul_ps(g, _mm512_sub_ps(xv, mv)));
    }
    (lanes_to_f64(sv), lanes_to_f64(qv))
}

/// One plane of `fused_cpu::backward_dx`, in place: `x` becomes `dx = p * x
/// + q`, and `k * dy + p * x + q` at each live window's source.
pub fn pool_plane_dx(xdx: &mut [f32], dy: &[f32], codes: &[u8], w: usize, kpq: (f32, f32, f32)) {
    let ow = w / 2;
    assert!(w.is_multiple_of(2) && ow > 0 && dy.len() == codes.len() && xdx.len() >= 4 * dy.len());
    // SAFETY: as in `forward_plane`, reading then writing the same x/dx
    // elements: each store follows the loads of the values it replaces.
    unsafe { pool_dx_avx512(xdx.as_mut_ptr(), dy.as_ptr(), codes, w, kpq) }
}

/// `p * x + q`, or `k * dy + p * x + q` (`kg` = `k * dy`) where `code` is `pos`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dx_at(x: __m512, code: __m512i, pos: i32, kg: __m512, p: __m512, q: __m512) -> __m512 {
    let px = _mm512_mul_ps(p, x);
    let dead = _mm512_add_ps(px, q);
    let live = _mm512_add_ps(_mm512_add_ps(kg, px), q);
    _mm512_mask_mov_ps(dead, _mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(pos)), live)
}

/// One strip's inputs to [`pool_dx_avx512`]: its codes, `k * dy`, and the
/// even and odd columns of its top and bottom rows.
struct DxStrip {
    s: Strip,
    code: __m512i,
    kg: __m512,
    rows: [(__m512, __m512); 2],
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_dx_strip(
    xdx: *const f32,
    dy: *const f32,
    codes: &[u8],
    w: usize,
    kv: __m512,
    s: Strip,
) -> DxStrip {
    let code = strip_codes(codes.as_ptr(), &s);
    let kg = _mm512_mul_ps(kv, load_pooled(dy, &s));
    // Written out, not as a closure over [0, w]: a closure here is LLVM's
    // to inline or not, and a build that kept it out of line ran the seed
    // ConvNet 2-4% slower.
    let [c0, c1] = s.cols;
    let rows = [
        split(xdx.wrapping_add(c0), xdx.wrapping_add(c1), s.lo, s.hi),
        split(xdx.wrapping_add(c0 + w), xdx.wrapping_add(c1 + w), s.lo, s.hi),
    ];
    DxStrip { s, code, kg, rows }
}

/// Every load of a strip comes before its stores, and the next strip's
/// loads before this one's stores: a masked store covers its whole vector,
/// and a load that overlaps it (the rows' tails share vectors) waited for
/// the store to retire, which took 80% of this kernel's time.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pool_dx_avx512(xdx: *mut f32, dy: *const f32, codes: &[u8], w: usize, (k, p, q): (f32, f32, f32)) {
    let ow = w / 2;
    let (kv, pv, qv) = (_mm512_set1_ps(k), _mm512_set1_ps(p), _mm512_set1_ps(q));
    let mut strips = strips(codes.len() / ow, ow, w);
    let mut next = strips.next().map(|s| load_dx_strip(xdx, dy, codes, w, kv, s));
    while let Some(cur) = next {
        next = strips.next().map(|s| load_dx_strip(xdx, dy, codes, w, kv, s));
        let s = &cur.s;
        for (r, (row, (e, o))) in [0, w].into_iter().zip(cur.rows).enumerate() {
            let [p, q] = s.cols.map(|c| xdx.wrapping_add(c + row));
            let pos = 2 * r as i32;
            let (de, dod) =
                (dx_at(e, cur.code, pos, cur.kg, pv, qv), dx_at(o, cur.code, pos + 1, cur.kg, pv, qv));
            merge(p, q, s.lo, s.hi, de, dod);
        }
    }
}
