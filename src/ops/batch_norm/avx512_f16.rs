//! AVX-512 versions of the f16 BatchNorm + ReLU + MaxPool2d(2, 2) kernels
//! ([`super::f16_pool`]) and of the f16 forward sums. f16 values are widened
//! as they are loaded and f32 results rounded as they are stored, by the
//! 512-bit forms of the F16C conversions the whole-tensor casts use (exact
//! widening, round-to-nearest-even), so every value and every sum is the one
//! the generic kernels compute on widened copies, bit for bit.

use super::avx512::{lanes_to_f64, load_codes, masks};
use super::fused_cpu::KILLED;
use crate::ops::half_emu::{Load16, Store16};
use crate::ops::relu::avx512_f16::negative;
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

const LANES: usize = 16;
/// The f32 block of `cpu::plane_sums` and `cpu::plane_backward_sums`.
const BLOCK: usize = 1024;

/// `v` rounded to f16 and widened back: the f32 view of an f16 store.
#[inline]
#[target_feature(enable = "avx512f")]
fn round_trip(v: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
}

/// `(sum (x - shift), sum (x - shift)^2)` of one f16 plane, bit for bit
/// `cpu::plane_sums` of its widened copy (see `avx512::plane_sums`).
pub fn plane_sums(p: &[f16], shift: f32) -> (f64, f64) {
    let (mut s_tot, mut q_tot) = (0.0f64, 0.0f64);
    for blk in p.chunks(BLOCK) {
        let nv = blk.len() / LANES;
        let (mut rs, mut rq) = (0.0f32, 0.0f32);
        for &x in &widen_tail(&blk[nv * LANES..])[..blk.len() - nv * LANES] {
            let v = x - shift;
            rs += v;
            rq += v * v;
        }
        // SAFETY: reads `blk.len() / LANES` whole vectors of `blk`; AVX-512
        // F/BW/VL are checked by the caller through `avx512::usable`.
        let (s, q) = unsafe { block_sums(blk.as_ptr(), nv, shift) };
        s_tot += f64::from(rs);
        q_tot += f64::from(rq);
        s_tot += s;
        q_tot += q;
    }
    (s_tot, q_tot)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn block_sums(p: *const f16, nv: usize, shift: f32) -> (f64, f64) {
    let k = _mm512_set1_ps(shift);
    let (mut sv, mut qv) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for v in 0..nv {
        let d = _mm512_sub_ps(f16::load16(p.add(v * LANES), 0xffff), k);
        sv = _mm512_add_ps(sv, d);
        qv = _mm512_add_ps(qv, _mm512_mul_ps(d, d));
    }
    (lanes_to_f64(sv), lanes_to_f64(qv))
}

/// The (fewer than 16) f16 (or f32) of a block's tail widened in one
/// conversion, for the scalar adds that sum them in order; lanes past the
/// tail are 0.
fn widen_tail<T: Load16>(t: &[T]) -> [f32; LANES] {
    assert!(t.len() < LANES);
    let mut out = [0.0f32; LANES];
    // SAFETY: loads the `t.len()` elements of `t` (masked) and stores one
    // vector into `out`; AVX-512F/BW/VL are checked by the caller.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), T::load16(t.as_ptr(), masks(t.len()).0)) };
    out
}

/// The even and odd lanes of the 32 values `a:b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn deinterleave(a: __m512, b: __m512) -> (__m512, __m512) {
    let ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    (_mm512_permutex2var_ps(a, ev, b), _mm512_permutex2var_ps(a, od, b))
}

/// `f16_pool::forward_plane` of one `h x w` f16 plane (`h`, `w` even) into
/// its pooled plane and window codes. Returns whether a pooled row held a
/// NaN: the caller then redoes the plane with the generic kernel, as the
/// max-pool redoes such rows with its exact scan.
pub fn forward_plane(x: &[f16], w: usize, scale: f32, shift: f32, y: &mut [f16], codes: &mut [u8]) -> bool {
    let ow = w / 2;
    assert!(w.is_multiple_of(2) && ow > 0 && y.len() == codes.len() && x.len() >= 4 * y.len());
    // SAFETY: every access is to window (oy, ox < ow) of pooled row oy <
    // y.len() / ow, at x[(2 oy + r) w + 2 ox + j] and y/codes[oy ow + ox],
    // inside the slices by the assert; masked lanes are not accessed.
    // AVX-512F/BW/VL are checked by the caller through `avx512::usable`.
    unsafe {
        forward_plane_avx512(x.as_ptr(), w, y.len() / ow, scale, shift, y.as_mut_ptr(), codes.as_mut_ptr())
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn forward_plane_avx512(
    x: *const f16,
    w: usize,
    oh: usize,
    scale: f32,
    shift: f32,
    y: *mut f16,
    codes: *mut u8,
) -> bool {
    let ow = w / 2;
    let (sc, sh, zero) = (_mm512_set1_ps(scale), _mm512_set1_ps(shift), _mm512_setzero_ps());
    // BatchNorm's output as its f16 store holds it, then ReLU: max_ps(0, v)
    // is `0 > v ? 0 : v`, which keeps NaN and -0 as `v < 0 ? 0 : v` does.
    let bn_relu = |v: __m512| _mm512_max_ps(zero, round_trip(_mm512_add_ps(_mm512_mul_ps(v, sc), sh)));
    let row = |p: *const f16, lo: __mmask16, hi: __mmask16| {
        let a = bn_relu(f16::load16(p, lo));
        // Rows of up to 16 values (MNIST's 14x14 planes) fit in `a`.
        let b = if hi == 0 { zero } else { bn_relu(f16::load16(p.wrapping_add(LANES), hi)) };
        deinterleave(a, b)
    };
    let mut nan: __mmask16 = 0;
    for oy in 0..oh {
        let (r0, r1) = (x.add(2 * oy * w), x.add((2 * oy + 1) * w));
        for ox in (0..ow).step_by(LANES) {
            let n = (ow - ox).min(LANES);
            let (m, lo, hi) = masks(n);
            let (a0, a1) = row(r0.add(2 * ox), lo, hi);
            let (a2, a3) = row(r1.add(2 * ox), lo, hi);
            nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, a0, a1)
                | _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, a2, a3);
            // max_ps(a, b) is `a > b ? a : b`, the max-pool's max2.
            let mx = _mm512_max_ps(_mm512_max_ps(a0, a1), _mm512_max_ps(a2, a3));
            let mut c = _mm512_set1_epi32(3);
            c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a2, mx), _mm512_set1_epi32(2));
            c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a1, mx), _mm512_set1_epi32(1));
            c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a0, mx), _mm512_setzero_si512());
            // ReLU passes gradient where its output is > 0: at the window's max.
            let live = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, zero);
            let code = _mm512_mask_mov_epi32(_mm512_set1_epi32(i32::from(KILLED)), live, c);
            let at = oy * ow + ox;
            f16::store16(y.add(at), m, mx);
            _mm512_mask_cvtepi32_storeu_epi8(codes.add(at).cast(), m, code);
        }
    }
    nan != 0
}

/// `f16_pool::dz_plane_generic` of the f16 pooled gradient `g`: the
/// gradient at BatchNorm's output of one `h x w` plane, `0 + g` at each live
/// window's source and `+0` elsewhere.
pub fn dz_plane(g: &[f16], codes: &[u8], w: usize, dz: &mut [f32]) {
    let ow = w / 2;
    assert!(w.is_multiple_of(2) && ow > 0 && g.len() == codes.len() && dz.len() == 4 * g.len());
    // SAFETY: as in `forward_plane`, reading g and codes at [oy ow + ox]
    // and writing dz at [(2 oy + r) w + 2 ox + j].
    unsafe { dz_plane_avx512(g.as_ptr(), codes, w, dz.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dz_plane_avx512(g: *const f16, codes: &[u8], w: usize, dz: *mut f32) {
    let ow = w / 2;
    let il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for oy in 0..codes.len() / ow {
        for ox in (0..ow).step_by(LANES) {
            let n = (ow - ox).min(LANES);
            let (m, lo, hi) = masks(n);
            let at = oy * ow + ox;
            let code = load_codes(codes.as_ptr().add(at), m);
            // The max-pool's backward adds g into a zeroed gradient.
            let zg = _mm512_add_ps(_mm512_setzero_ps(), f16::load16(g.add(at), m));
            for r in 0..2 {
                let pos = 2 * r as i32;
                let e = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(pos)), zg);
                let o = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(code, _mm512_set1_epi32(pos + 1)), zg);
                let p = dz.add((2 * oy + r) * w + 2 * ox);
                _mm512_mask_storeu_ps(p, lo, _mm512_permutex2var_ps(e, il, o));
                _mm512_mask_storeu_ps(p.wrapping_add(LANES), hi, _mm512_permutex2var_ps(e, ih, o));
            }
        }
    }
}

/// The gradient at BatchNorm's output as the backward kernels load it, 16
/// lanes at a time.
pub trait Dz: Copy {
    /// Lanes `m` of elements `i..i + 16`, the others `+0`; `xv` is BatchNorm's
    /// input at those elements, which the callers load anyway.
    ///
    /// # Safety
    /// The lanes in `m` lie inside the plane; AVX-512F/BW/VL.
    unsafe fn dz16(self, i: usize, m: __mmask16, xv: __m512) -> __m512;
}

/// A plane of `dz` itself, f32 or f16 (widened).
#[derive(Clone, Copy)]
struct Plain<D>(*const D);

impl<D: Load16> Dz for Plain<D> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn dz16(self, i: usize, m: __mmask16, _xv: __m512) -> __m512 {
        D::load16(self.0.add(i), m)
    }
}

/// `dy` at the output of the ReLU that follows BatchNorm, taken back
/// through it without its output: that is `max(0, round(x * scale +
/// shift))` (`affine_lanes`), recomputed from `x`, and ReLU's backward
/// zeroes `dy` where it is `<= 0` (ordered: NaN passes), which is where the
/// rounded affine value is. Lanes it zeroes load as `+0`, the value ReLU's
/// backward stores there.
#[derive(Clone, Copy)]
struct ReluDz {
    dy: *const f16,
    scale: f32,
    shift: f32,
}

/// The largest f32 that rounds to an f16 zero: half the smallest subnormal
/// (2^-24), which ties to the even zero. So `round(v) <= 0` exactly where
/// `v <= RELU_ZERO` (ordered both: NaN rounds to NaN), without the two
/// conversions of the rounding.
const RELU_ZERO: f32 = 1.0 / 33_554_432.0;

impl Dz for ReluDz {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn dz16(self, i: usize, m: __mmask16, xv: __m512) -> __m512 {
        let (a, b) = (_mm512_set1_ps(self.scale), _mm512_set1_ps(self.shift));
        let v = _mm512_add_ps(_mm512_mul_ps(xv, a), b);
        let drop = _mm512_mask_cmp_ps_mask::<_CMP_LE_OQ>(m, v, _mm512_set1_ps(RELU_ZERO));
        f16::load16(self.dy.add(i), m & !drop)
    }
}

/// `(sum dz, sum dz * (x - mean))` of one plane of f16 `x` and f32 or f16
/// `dz`, bit for bit `cpu::plane_backward_sums` of their widened copies (an
/// f16 `dz` widened in its loads: widening both planes into scratch first
/// took as long as the sums).
pub fn plane_backward_sums<D: Load16>(x: &[f16], dz: &[D], mean: f32) -> (f64, f64) {
    assert_eq!(x.len(), dz.len());
    // SAFETY: the plane of `x` and `dz`, the same length; AVX-512F/BW/VL are
    // checked by the caller through `avx512::usable`.
    unsafe { backward_sums_lanes(x.as_ptr(), Plain(dz.as_ptr()), x.len(), mean) }
}

/// [`plane_backward_sums`] of the gradient `dy` at the output of the ReLU
/// after BatchNorm (`ReluDz`), without that output or ReLU's backward: the
/// sums of ReLU's backward followed by [`plane_backward_sums`], bit for bit.
pub fn plane_backward_sums_relu(x: &[f16], dy: &[f16], (scale, shift): (f32, f32), mean: f32) -> (f64, f64) {
    assert_eq!(x.len(), dy.len());
    let dz = ReluDz { dy: dy.as_ptr(), scale, shift };
    // SAFETY: as in `plane_backward_sums`.
    unsafe { backward_sums_lanes(x.as_ptr(), dz, x.len(), mean) }
}

/// The sums of `plane_backward_sums` over `len` elements, per block of
/// [`BLOCK`]: whole vectors in lanes, the tail in order (as the f32 kernel).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn backward_sums_lanes<G: Dz>(x: *const f16, dz: G, len: usize, mean: f32) -> (f64, f64) {
    let (mut s_tot, mut q_tot) = (0.0f64, 0.0f64);
    for b0 in (0..len).step_by(BLOCK) {
        let n = (len - b0).min(BLOCK);
        let nv = n / LANES;
        let (s, q) = backward_block_sums(x, dz, b0, nv, mean);
        let (mut rs, mut rq) = (0.0f32, 0.0f32);
        let (t0, tail) = (b0 + nv * LANES, n - nv * LANES);
        let (mut xt, mut gt) = ([0.0f32; LANES], [0.0f32; LANES]);
        let m = masks(tail).0;
        let xv = f16::load16(x.add(t0), m);
        _mm512_storeu_ps(xt.as_mut_ptr(), xv);
        _mm512_storeu_ps(gt.as_mut_ptr(), dz.dz16(t0, m, xv));
        for (&xv, &g) in xt.iter().zip(&gt).take(tail) {
            rs += g;
            rq += g * (xv - mean);
        }
        s_tot += s + f64::from(rs);
        q_tot += q + f64::from(rq);
    }
    (s_tot, q_tot)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn backward_block_sums<G: Dz>(x: *const f16, dz: G, b0: usize, nv: usize, mean: f32) -> (f64, f64) {
    let mv = _mm512_set1_ps(mean);
    let (mut sv, mut qv) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for v in 0..nv {
        let i = b0 + v * LANES;
        let xv = f16::load16(x.add(i), 0xffff);
        let g = dz.dz16(i, 0xffff, xv);
        sv = _mm512_add_ps(sv, g);
        qv = _mm512_add_ps(qv, _mm512_mul_ps(g, _mm512_sub_ps(xv, mv)));
    }
    (lanes_to_f64(sv), lanes_to_f64(qv))
}

/// `f16_pool::dx_plane`: `x` becomes `round(k * dz + p * x + q)` in place.
pub fn dx_plane(xdx: &mut [f16], dz: &[f32], (k, p, q): (f32, f32, f32)) {
    assert_eq!(xdx.len(), dz.len());
    // SAFETY: reads dz and reads then writes xdx at [i, i + 16) masked to
    // the slices' common length; AVX-512F/BW/VL are checked by the caller.
    unsafe { dx_lanes(xdx.as_ptr(), Plain(dz.as_ptr()), xdx.as_mut_ptr(), dz.len(), (k, p, q)) }
}

/// One plane of `f16::backward_dx`: `dx = round(k * dy + p * x + q)`,
/// every element of `dx` written.
pub fn dx_plane_f16(x: &[f16], dy: &[f16], coef: (f32, f32, f32), dx: &mut [MaybeUninit<f16>]) {
    assert!(x.len() == dx.len() && dy.len() == dx.len());
    // SAFETY: reads x and dy and writes dx at [i, i + 16) masked to their
    // common length; AVX-512F/BW/VL are checked by the caller.
    unsafe { dx_lanes(x.as_ptr(), Plain(dy.as_ptr()), dx.as_mut_ptr().cast(), dx.len(), coef) }
}

/// [`dx_plane_f16`] of the gradient `dy` at the output of the ReLU after
/// BatchNorm (`ReluDz`): ReLU's backward and then [`dx_plane_f16`], bit for bit.
pub fn dx_plane_relu(
    x: &[f16],
    dy: &[f16],
    (scale, shift): (f32, f32),
    coef: (f32, f32, f32),
    dx: &mut [MaybeUninit<f16>],
) {
    assert!(x.len() == dx.len() && dy.len() == dx.len());
    let dz = ReluDz { dy: dy.as_ptr(), scale, shift };
    // SAFETY: as in `dx_plane_f16`.
    unsafe { dx_lanes(x.as_ptr(), dz, dx.as_mut_ptr().cast(), dx.len(), coef) }
}

/// `out = round(k * dz + p * x + q)` over `len` lanes (`out` may be `x`),
/// the products and sums in the generic kernels' order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dx_lanes<G: Dz>(x: *const f16, dz: G, out: *mut f16, len: usize, (k, p, q): (f32, f32, f32)) {
    let (kv, pv, qv) = (_mm512_set1_ps(k), _mm512_set1_ps(p), _mm512_set1_ps(q));
    for i in (0..len).step_by(LANES) {
        let m = masks((len - i).min(LANES)).0;
        let xv = f16::load16(x.add(i), m);
        let g = dz.dz16(i, m, xv);
        let d = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(kv, g), _mm512_mul_ps(pv, xv)), qv);
        f16::store16(out.add(i), m, d);
    }
}

/// One plane of `f16::normalize_affine`: `y = round(x * a + b)`; with
/// `relu` (`normalize_affine_relu`), ReLU of that rounded value.
pub fn affine_plane(x: &[f16], (a, b): (f32, f32), relu: bool, y: &mut [MaybeUninit<f16>]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: reads x and writes every element of y at [i, i + 16) masked
    // to their length; AVX-512F/BW/VL are checked by the caller.
    unsafe { affine_lanes(x.as_ptr(), y.as_mut_ptr().cast(), y.len(), a, b, relu) }
}

/// One plane of `f16::normalize_affine_then` with an add:
/// `y = relu(round(round(x * a + b) + s))`, BatchNorm's rounded output, the
/// add's rounded sum and ReLU of it, as the three ops in turn store them.
pub fn affine_add_relu_plane(x: &[f16], s: &[f16], (a, b): (f32, f32), y: &mut [MaybeUninit<f16>]) {
    assert!(x.len() == y.len() && s.len() == y.len());
    // SAFETY: reads x and s and writes every element of y at [i, i + 16)
    // masked to their length; AVX-512F/BW/VL are checked by the caller.
    unsafe { affine_add_relu_lanes(x.as_ptr(), s.as_ptr(), y.as_mut_ptr().cast(), y.len(), a, b) }
}

/// ReLU of 16 f16 values on their bits: a negative value becomes +0, -0
/// and NaN stay, as `max_ps(0, v)` of the widened value leaves them (the
/// second operand, for two zeros or a NaN).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn relu_bits(h: __m256i) -> __m256i {
    _mm256_mask_mov_epi16(h, negative(h), _mm256_setzero_si256())
}

/// `v` rounded to f16 (nearest-even), as `f16::store16` stores it.
#[inline]
#[target_feature(enable = "avx512f")]
fn to_f16_bits(v: __m512) -> __m256i {
    _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn affine_add_relu_lanes(x: *const f16, s: *const f16, y: *mut f16, len: usize, a: f32, b: f32) {
    let (av, bv) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
    for i in (0..len).step_by(LANES) {
        let m = masks((len - i).min(LANES)).0;
        let z = round_trip(_mm512_add_ps(_mm512_mul_ps(f16::load16(x.add(i), m), av), bv));
        let u = to_f16_bits(_mm512_add_ps(z, f16::load16(s.add(i), m)));
        // As ReLU's own kernel: negatives to zero, NaN and -0 kept.
        _mm256_mask_storeu_epi16(y.add(i).cast(), m, relu_bits(u));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn affine_lanes(x: *const f16, y: *mut f16, len: usize, a: f32, b: f32, relu: bool) {
    let (av, bv) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
    for i in (0..len).step_by(LANES) {
        let m = masks((len - i).min(LANES)).0;
        let mut h = to_f16_bits(_mm512_add_ps(_mm512_mul_ps(f16::load16(x.add(i), m), av), bv));
        if relu {
            // As in `forward_plane_avx512`: max_ps(0, v) of the rounded v.
            h = relu_bits(h);
        }
        _mm256_mask_storeu_epi16(y.add(i).cast(), m, h);
    }
}

#[cfg(test)]
mod tests {
    use super::{relu_bits, RELU_ZERO};
    use half::f16;
    use std::arch::x86_64::*;

    /// `relu_bits` is `max_ps(0, v)` of every f16 `v` widened and rounded
    /// back (the signalling NaNs kept: the conversions would quiet them,
    /// and no arithmetic makes one), 16 at a time.
    #[test]
    fn relu_bits_is_max_with_zero_of_every_f16() {
        if !crate::ops::half_emu::avx512_usable() {
            eprintln!("no AVX-512 on this CPU: kernel not checked");
            return;
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for chunk in all.chunks(16) {
            let mut got = [0u16; 16];
            // SAFETY: 16 u16 in and out; AVX-512F/BW/VL checked above.
            unsafe {
                let h = _mm256_loadu_si256(chunk.as_ptr().cast());
                _mm256_storeu_si256(got.as_mut_ptr().cast(), relu_bits(h));
            }
            for (&b, &g) in chunk.iter().zip(&got) {
                let v = f16::from_bits(b);
                let want = if v.is_nan() || v.to_f32() >= 0.0 { b } else { 0 };
                assert_eq!(g, want, "{v} ({b:#06x})");
            }
        }
    }

    /// `v <= RELU_ZERO` is `round(v) <= 0` for every f32 whose low 16 bits
    /// sit at an f16 rounding edge (all 65,536 high halves: every exponent,
    /// both signs, infinities and NaNs), and for the 4,000 floats around
    /// the threshold itself.
    #[test]
    fn relu_zero_is_where_rounding_gives_zero() {
        let edges = [0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xefff, 0xffff];
        let around = (0..4000u32).map(|d| RELU_ZERO.to_bits() - 2000 + d);
        let all = (0..1u32 << 16).flat_map(|hi| edges.iter().map(move |lo| hi << 16 | lo)).chain(around);
        for bits in all {
            let v = f32::from_bits(bits);
            assert_eq!(v <= RELU_ZERO, f16::from_f32(v).to_f32() <= 0.0, "{v:e} ({bits:#010x})");
        }
    }
}
