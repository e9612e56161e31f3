//! AVX-512 twins of cpu.rs's GELU kernels, 16 elements at a time. Every
//! value is the same sequence of IEEE f32 operations as the scalar kernels
//! (fused multiply-adds exactly where they fuse, `mul_add`; the same
//! constants; division and floor exact as IEEE defines them), so each output is bit for bit the scalar one,
//! and kernels/gelu.cu's. The compiler's own vectorization of the scalar
//! loop (8 lanes, with the saturating float-to-int casts and selects spelled
//! out) ran at about 10 ns an element, a third of a baby GPT's CPU step.
//!
//! f16 values are widened in the loads and rounded to nearest-even in the
//! stores (`half_emu`'s `Load16` and `Store16`), as the whole-tensor
//! casts around an f32 kernel would, without those two extra passes.

use super::cpu::{Lane, C32, ERFC, FRAC_1_SQRT_2, FRAC_1_SQRT_2PI, K32};
use crate::ops::exp::x86::exp;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

const LANES: usize = 16;

/// Whether the CPU runs these kernels (F for the arithmetic, BW and VL for
/// the f16 loads and stores).
pub fn usable() -> bool {
    crate::ops::half_emu::avx512_usable()
}

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(v: f32) -> __m512 {
    _mm512_set1_ps(v)
}

/// `-v`, exactly (the sign bit flipped), as the scalar `-v`.
#[inline]
#[target_feature(enable = "avx512f")]
fn neg(v: __m512) -> __m512 {
    _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN)))
}

/// cpu.rs's `half_square`: `(h, d)`.
#[inline]
#[target_feature(enable = "avx512f")]
fn half_square(x: __m512) -> (__m512, __m512) {
    let xh = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(x),
        _mm512_set1_epi32(0xFFFF_F000u32 as i32),
    ));
    let d = _mm512_mul_ps(splat(0.5), _mm512_mul_ps(_mm512_sub_ps(x, xh), _mm512_add_ps(x, xh)));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(d, d);
    (_mm512_mul_ps(splat(0.5), _mm512_mul_ps(xh, xh)), _mm512_mask_blend_ps(nan, d, _mm512_setzero_ps()))
}

/// cpu.rs's `cdf`.
#[inline]
#[target_feature(enable = "avx512f")]
fn cdf(x: __m512, d: __m512, exp_h: __m512) -> __m512 {
    let abs = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MAX)));
    let z = _mm512_mul_ps(abs, splat(FRAC_1_SQRT_2));
    let t = _mm512_div_ps(splat(1.0), _mm512_add_ps(splat(1.0), _mm512_mul_ps(splat(0.5), z)));
    let mut p = splat(ERFC[9]);
    for &c in ERFC[..9].iter().rev() {
        p = _mm512_fmadd_ps(p, t, splat(c));
    }
    let half_erfc =
        _mm512_mul_ps(splat(0.5), _mm512_mul_ps(t, _mm512_mul_ps(exp_h, exp(_mm512_sub_ps(p, d)))));
    let nonpositive = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, _mm512_setzero_ps());
    _mm512_mask_blend_ps(nonpositive, _mm512_sub_ps(splat(1.0), half_erfc), half_erfc)
}

/// cpu.rs's `tanh_sigmoid`: `(σ(2u), σ(-2u))`.
#[inline]
#[target_feature(enable = "avx512f")]
fn tanh_sigmoid(x: __m512) -> (__m512, __m512) {
    let cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(splat(C32), x), x), x);
    let u = _mm512_mul_ps(splat(K32), _mm512_add_ps(x, cube));
    let e = exp(_mm512_mul_ps(splat(-2.0), u));
    let one = splat(1.0);
    (_mm512_div_ps(one, _mm512_add_ps(one, e)), _mm512_div_ps(one, _mm512_add_ps(one, _mm512_div_ps(one, e))))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn value<const TANH: bool>(x: __m512) -> __m512 {
    if TANH {
        _mm512_mul_ps(x, tanh_sigmoid(x).0)
    } else {
        let (h, d) = half_square(x);
        _mm512_mul_ps(x, cdf(x, d, exp(neg(h))))
    }
}

/// The tanh form's slope from `σ(2u)` and `σ(-2u)`.
#[inline]
#[target_feature(enable = "avx512f")]
fn tanh_slope(x: __m512, s: __m512, rest: __m512) -> __m512 {
    let a = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(splat(2.0), x), s), rest), splat(K32));
    let b = _mm512_add_ps(splat(1.0), _mm512_mul_ps(_mm512_mul_ps(splat(3.0 * C32), x), x));
    _mm512_add_ps(s, _mm512_mul_ps(a, b))
}

/// The exact form's slope `Φ(x) + x φ(x)` from `Φ(x)`, `e^-h` and `d`.
#[inline]
#[target_feature(enable = "avx512f")]
fn erf_slope(x: __m512, cdf: __m512, exp_h: __m512, d: __m512) -> __m512 {
    let pdf = _mm512_mul_ps(splat(FRAC_1_SQRT_2PI), _mm512_mul_ps(exp_h, exp(neg(d))));
    _mm512_add_ps(cdf, _mm512_mul_ps(x, pdf))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn slope<const TANH: bool>(x: __m512) -> __m512 {
    if TANH {
        let (s, rest) = tanh_sigmoid(x);
        tanh_slope(x, s, rest)
    } else {
        let (h, d) = half_square(x);
        let exp_h = exp(neg(h));
        erf_slope(x, cdf(x, d, exp_h), exp_h, d)
    }
}

/// `(value, slope)`, sharing `Φ(x)` (or `σ(2u)`) between the two.
#[inline]
#[target_feature(enable = "avx512f")]
fn value_slope<const TANH: bool>(x: __m512) -> (__m512, __m512) {
    if TANH {
        let (s, rest) = tanh_sigmoid(x);
        (_mm512_mul_ps(x, s), tanh_slope(x, s, rest))
    } else {
        let (h, d) = half_square(x);
        let exp_h = exp(neg(h));
        let phi = cdf(x, d, exp_h);
        (_mm512_mul_ps(x, phi), erf_slope(x, phi, exp_h, d))
    }
}

/// The lanes of a vector starting at `i` of `len`: all 16, or the tail's.
fn lanes(len: usize, i: usize) -> __mmask16 {
    let n = (len - i).min(LANES);
    ((1u32 << n) - 1) as __mmask16
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn forward_with<S: Lane, D: Lane, const TANH: bool>(x: &[S], y: &mut [D]) {
    let len = x.len().min(y.len());
    for i in (0..len).step_by(LANES) {
        let m = lanes(len, i);
        // SAFETY: the lanes in m lie inside both slices.
        unsafe { D::store16(y.as_mut_ptr().add(i), m, value::<TANH>(S::load16(x.as_ptr().add(i), m))) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn backward_with<S: Lane, D: Lane, const TANH: bool>(x: &[S], dy: &[S], dx: &mut [D]) {
    let len = x.len().min(dy.len()).min(dx.len());
    for i in (0..len).step_by(LANES) {
        let m = lanes(len, i);
        // SAFETY: the lanes in m lie inside the three slices.
        unsafe {
            let g = _mm512_mul_ps(
                S::load16(dy.as_ptr().add(i), m),
                slope::<TANH>(S::load16(x.as_ptr().add(i), m)),
            );
            D::store16(dx.as_mut_ptr().add(i), m, g);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn forward_train_with<S: Lane, D: Lane, const TANH: bool>(
    x: &[S],
    y: &mut [MaybeUninit<D>],
    slope: &mut [MaybeUninit<f32>],
) {
    let len = x.len().min(y.len()).min(slope.len());
    for i in (0..len).step_by(LANES) {
        let m = lanes(len, i);
        // SAFETY: the lanes in m lie inside the three slices.
        unsafe {
            let (v, g) = value_slope::<TANH>(S::load16(x.as_ptr().add(i), m));
            D::store16(y.as_mut_ptr().add(i).cast(), m, v);
            _mm512_mask_storeu_ps(slope.as_mut_ptr().add(i).cast(), m, g);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn backward_from_slope_with<S: Lane, D: Lane>(slope: &[f32], dy: &[S], dx: &mut [MaybeUninit<D>]) {
    let len = slope.len().min(dy.len()).min(dx.len());
    for i in (0..len).step_by(LANES) {
        let m = lanes(len, i);
        // SAFETY: the lanes in m lie inside the three slices.
        unsafe {
            let g = _mm512_maskz_loadu_ps(m, slope.as_ptr().add(i));
            D::store16(dx.as_mut_ptr().add(i).cast(), m, _mm512_mul_ps(S::load16(dy.as_ptr().add(i), m), g));
        }
    }
}

/// `y = gelu(x)` over the shorter of the two.
///
/// # Safety
/// AVX-512 F, BW and VL ([`usable`]).
pub unsafe fn forward<S: Lane, D: Lane>(x: &[S], y: &mut [D], tanh: bool) {
    // SAFETY: the caller checked the features.
    unsafe {
        if tanh {
            forward_with::<S, D, true>(x, y)
        } else {
            forward_with::<S, D, false>(x, y)
        }
    }
}

/// `dx = dy * gelu'(x)` over the shortest of the three.
///
/// # Safety
/// AVX-512 F, BW and VL ([`usable`]).
pub unsafe fn backward<S: Lane, D: Lane>(x: &[S], dy: &[S], dx: &mut [D], tanh: bool) {
    // SAFETY: the caller checked the features.
    unsafe {
        if tanh {
            backward_with::<S, D, true>(x, dy, dx)
        } else {
            backward_with::<S, D, false>(x, dy, dx)
        }
    }
}

/// `y = gelu(x)` and `slope = gelu'(x)` (f32) over the shortest of the three.
///
/// # Safety
/// AVX-512 F, BW and VL ([`usable`]).
pub unsafe fn forward_train<S: Lane, D: Lane>(
    x: &[S],
    y: &mut [MaybeUninit<D>],
    slope: &mut [MaybeUninit<f32>],
    tanh: bool,
) {
    // SAFETY: the caller checked the features.
    unsafe {
        if tanh {
            forward_train_with::<S, D, true>(x, y, slope)
        } else {
            forward_train_with::<S, D, false>(x, y, slope)
        }
    }
}

/// `dx = dy * slope` over the shortest of the three.
///
/// # Safety
/// AVX-512 F, BW and VL ([`usable`]).
pub unsafe fn backward_from_slope<S: Lane, D: Lane>(slope: &[f32], dy: &[S], dx: &mut [MaybeUninit<D>]) {
    // SAFETY: the caller checked the features.
    unsafe { backward_from_slope_with(slope, dy, dx) }
}
