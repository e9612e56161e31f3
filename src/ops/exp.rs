//! The CPU kernels' own f32 `e^x`, one IEEE operation at a time (each
//! rounded once: the polynomial's steps are fused multiply-adds, no library
//! calls), so kernels/common.cuh's `ddp::exp_rn`, doing the same operations
//! with `_rn` intrinsics (`__fmaf_rn` for the fused ones), gives the same
//! bits, and the AVX-512 form ([`x86::exp`]) gives the scalar one's in every
//! lane. Within 1.5 ulp of the exact value
//! (`exp_is_within_an_ulp_and_a_half_over_its_range`).

/// log2(e), and ln 2 split so that `k * LN2_HI` is exact for every exponent
/// `k` [`exp`] uses.
pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;
pub(crate) const LN2_HI: f32 = 0.693_145_75;
pub(crate) const LN2_LO: f32 = 1.428_606_8e-6;
/// e^r's Taylor coefficients, highest degree first (Horner's order).
pub(crate) const EXP_TAYLOR: [f32; 8] =
    [1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

/// e^x: `2^k e^r`, k = ⌊x log2 e + 1/2⌋, `r = x - k ln 2` in two exact
/// steps, e^r by its Taylor polynomial of degree 7 (truncation under 6e-9
/// on |r| ≤ ln 2 / 2); 0 below -87 and infinity above 88, where 2^k would
/// leave the normal range.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(-87.0, 88.0);
    let k = (xc * LOG2_E + 0.5).floor();
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    let mut p = EXP_TAYLOR[0];
    for &c in &EXP_TAYLOR[1..] {
        // Fused: half the operations of a multiply and an add (e^x is most
        // of GELU's and the softmax's time), one rounding instead of two.
        p = p.mul_add(r, c);
    }
    // k is in [-126, 127]: 2^k is a normal f32, built from its exponent bits.
    let v = p * f32::from_bits(((k as i32 + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        v
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{EXP_TAYLOR, LN2_HI, LN2_LO, LOG2_E};
    use std::arch::x86_64::*;

    /// [`super::exp`], 16 lanes at a time. maxps and minps return their second operand when either
    /// is NaN, so `min(88, max(-87, x))` keeps a NaN as `f32::clamp` does.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp(x: __m512) -> __m512 {
        let xc = _mm512_min_ps(_mm512_set1_ps(88.0), _mm512_max_ps(_mm512_set1_ps(-87.0), x));
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
            _mm512_mul_ps(xc, _mm512_set1_ps(LOG2_E)),
            _mm512_set1_ps(0.5),
        ));
        let r = _mm512_sub_ps(
            _mm512_sub_ps(xc, _mm512_mul_ps(k, _mm512_set1_ps(LN2_HI))),
            _mm512_mul_ps(k, _mm512_set1_ps(LN2_LO)),
        );
        let mut p = _mm512_set1_ps(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        // k is integral; a NaN k gives a garbage 2^k, but then p is NaN too.
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)));
        let v = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(88.0));
        _mm512_mask_blend_ps(
            high,
            _mm512_mask_blend_ps(low, v, _mm512_setzero_ps()),
            _mm512_set1_ps(f32::INFINITY),
        )
    }
}
