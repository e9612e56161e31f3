//! GELU's CPU kernels, elementwise.
//!
//! Training runs [`forward`] and [`backward`] in f32 on formulas with no
//! cancellation: the exact form through `Φ(x) = erfc(-x/√2) / 2` with erfc's
//! Chebyshev fit (fractional error under 1.2e-7, Numerical Recipes' `erfcc`),
//! the tanh form through `(1 + tanh u) / 2 = σ(2u)`, each exp from
//! `ops::exp`. Every operation is one IEEE f32 operation rounded to nearest
//! (the polynomials' steps fused multiply-adds, rounded once; no library
//! calls), so kernels/gelu.cu, doing the same operations in the same order
//! with `_rn` intrinsics, gives the same bits.
//! Against f64 evaluated exactly they differ by a few f32 ulp
//! (`f32_forms_track_the_exact_ones` in tests.rs measures it); libm's f64
//! erf per element took a fifth of a baby GPT's training step.
//!
//! [`forward_exact`] and [`backward_exact`], f64 with libm's erfc and exp
//! (not `1 + erf` or `1 + tanh`, which cancel to 0 far below 0 even in f64), are the
//! reference the finite-difference and accuracy tests hold them to.

use crate::ops::exp::exp;
use crate::ops::Elem;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Below this many elements one core beats rayon's fork/join.
const PAR_CHUNK: usize = 1 << 14;
/// √(2/π) and the cubic coefficient of the tanh form.
const K: f64 = 0.797_884_560_802_865_4;
const C: f64 = 0.044_715;

/// The same constants in f32, and 1/√2, 1/√(2π).
pub(super) const K32: f32 = 0.797_884_6;
pub(super) const C32: f32 = 0.044_715;
pub(super) const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
pub(super) const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
/// erfcc's coefficients, constant term first.
pub(super) const ERFC: [f32; 10] = [
    -1.265_512_2,
    1.000_023_7,
    0.374_091_96,
    0.096_784_18,
    -0.186_288_06,
    0.278_868_07,
    -1.135_204,
    1.488_515_9,
    -0.822_152_23,
    0.170_872_77,
];

/// x² / 2 as `h + d`, `h` exact in f32 (x with its low 12 significand bits
/// cleared, squared) and `d` small: `exp(-h) * exp(-d)` is then e^(-x²/2) to
/// about an ulp where `exp(-x * x / 2)` would carry the rounding of x²/2,
/// 1e-6 relative by x = 5.
#[inline(always)]
fn half_square(x: f32) -> (f32, f32) {
    let xh = f32::from_bits(x.to_bits() & 0xFFFF_F000);
    let d = 0.5 * ((x - xh) * (x + xh));
    // ±∞ (and NaN) leave ∞ - ∞ in d: h alone then says what exp(-h) is.
    (0.5 * (xh * xh), if d.is_nan() { 0.0 } else { d })
}

/// `Φ(x)`, the standard normal CDF, as `erfc(|x|/√2) / 2` mirrored, given
/// `half_square(x)` and `e^-h`.
#[inline(always)]
fn cdf(x: f32, d: f32, exp_h: f32) -> f32 {
    let z = x.abs() * FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = ERFC[9];
    for &c in ERFC[..9].iter().rev() {
        p = p.mul_add(t, c);
    }
    // erfcc's exp(-z² + p), z² = x²/2 = h + d.
    let half_erfc = 0.5 * (t * (exp_h * exp(p - d)));
    if x <= 0.0 {
        half_erfc
    } else {
        1.0 - half_erfc
    }
}

/// σ(2u) = (1 + tanh u) / 2 of the tanh form, `u = K (x + C x³)`, and
/// σ(-2u) = 1 - σ(2u) without the cancellation of that difference.
#[inline(always)]
fn tanh_sigmoid(x: f32) -> (f32, f32) {
    let u = K32 * (x + C32 * x * x * x);
    let e = exp(-2.0 * u);
    // Both as 1 / (1 + ·), so that e = 0 or ∞ gives 0 and 1, not ∞ · 0.
    (1.0 / (1.0 + e), 1.0 / (1.0 + 1.0 / e))
}

#[inline(always)]
fn value(x: f32, tanh: bool) -> f32 {
    if tanh {
        x * tanh_sigmoid(x).0
    } else {
        let (h, d) = half_square(x);
        x * cdf(x, d, exp(-h))
    }
}

/// d gelu / dx: `Φ(x) + x φ(x)`, or for the tanh form `s + 2 x s (1 - s) K
/// (1 + 3 C x²)` with `s = σ(2u)` (`(1 - tanh² u) / 2 = 2 s (1 - s)`) and
/// `1 - s` as σ(-2u).
#[inline(always)]
fn slope(x: f32, tanh: bool) -> f32 {
    value_slope(x, tanh).1
}

/// `(value, slope)`, sharing `Φ(x)` (or `σ(2u)`) between the two.
#[inline(always)]
fn value_slope(x: f32, tanh: bool) -> (f32, f32) {
    if tanh {
        let (s, rest) = tanh_sigmoid(x);
        (x * s, s + 2.0 * x * s * rest * K32 * (1.0 + 3.0 * C32 * x * x))
    } else {
        let (h, d) = half_square(x);
        let exp_h = exp(-h);
        let phi = cdf(x, d, exp_h);
        (x * phi, phi + x * (FRAC_1_SQRT_2PI * (exp_h * exp(-d))))
    }
}

/// `y = gelu(x)`: f32 or f16 (widened, computed in f32, rounded once).
pub(crate) fn forward<S: Lane, D: Lane>(x: &[S], y: &mut [D], tanh: bool) {
    y.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(y, x)| {
        #[cfg(target_arch = "x86_64")]
        if super::avx512::usable() {
            // SAFETY: AVX-512 F/BW/VL checked just above.
            return unsafe { super::avx512::forward(x, y, tanh) };
        }
        forward_scalar(x, y, tanh);
    });
}

/// `dx = dy * gelu'(x)`, in f32 for f32 or f16 values.
pub(crate) fn backward<S: Lane, D: Lane>(x: &[S], dy: &[S], dx: &mut [D], tanh: bool) {
    dx.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK).zip(dy.par_chunks(PAR_CHUNK))).for_each(
        |(dx, (x, dy))| {
            #[cfg(target_arch = "x86_64")]
            if super::avx512::usable() {
                // SAFETY: AVX-512 F/BW/VL checked just above.
                return unsafe { super::avx512::backward(x, dy, dx, tanh) };
            }
            backward_scalar(x, dy, dx, tanh);
        },
    );
}

/// [`forward`] for training: `y`, and `slope = gelu'(x)` in f32 for
/// [`backward_from_slope`]. Φ(x) (or σ(2u)) is computed once for both, and
/// the backward is then one multiply an element instead of the whole
/// formula again (it was two thirds of GELU's time in a baby GPT's step).
/// The slope is the one [`backward`] computes, so dx has the same bits.
/// Every element of both outputs is written (they may start uninitialized).
pub(crate) fn forward_train<S: Lane, D: Lane>(
    x: &[S],
    y: &mut [MaybeUninit<D>],
    slope: &mut [MaybeUninit<f32>],
    tanh: bool,
) {
    let parts = y.par_chunks_mut(PAR_CHUNK).zip(slope.par_chunks_mut(PAR_CHUNK));
    parts.zip(x.par_chunks(PAR_CHUNK)).for_each(|((y, slope), x)| {
        #[cfg(target_arch = "x86_64")]
        if super::avx512::usable() {
            // SAFETY: AVX-512 F/BW/VL checked just above.
            return unsafe { super::avx512::forward_train(x, y, slope, tanh) };
        }
        forward_train_scalar(x, y, slope, tanh);
    });
}

/// `dx = dy * slope`, `slope` from [`forward_train`]; every element of dx
/// is written.
pub(crate) fn backward_from_slope<S: Lane, D: Lane>(slope: &[f32], dy: &[S], dx: &mut [MaybeUninit<D>]) {
    let parts = dx.par_chunks_mut(PAR_CHUNK).zip(slope.par_chunks(PAR_CHUNK));
    parts.zip(dy.par_chunks(PAR_CHUNK)).for_each(|((dx, slope), dy)| {
        #[cfg(target_arch = "x86_64")]
        if super::avx512::usable() {
            // SAFETY: AVX-512 F/BW/VL checked just above.
            return unsafe { super::avx512::backward_from_slope(slope, dy, dx) };
        }
        backward_from_slope_scalar(slope, dy, dx);
    });
}

/// [`forward_train`] one element at a time.
pub(crate) fn forward_train_scalar<S: Lane, D: Lane>(
    x: &[S],
    y: &mut [MaybeUninit<D>],
    slope: &mut [MaybeUninit<f32>],
    tanh: bool,
) {
    for ((y, g), &x) in y.iter_mut().zip(slope.iter_mut()).zip(x) {
        let (v, s) = value_slope(x.f32(), tanh);
        y.write(D::of(v));
        g.write(s);
    }
}

/// [`backward_from_slope`] one element at a time.
pub(crate) fn backward_from_slope_scalar<S: Lane, D: Lane>(
    slope: &[f32],
    dy: &[S],
    dx: &mut [MaybeUninit<D>],
) {
    for ((dx, &g), &dy) in dx.iter_mut().zip(slope).zip(dy) {
        dx.write(D::of(dy.f32() * g));
    }
}

/// [`forward`] one element at a time: without AVX-512, and the AVX-512
/// kernels' twin in the tests.
pub(crate) fn forward_scalar<S: Lane, D: Lane>(x: &[S], y: &mut [D], tanh: bool) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = D::of(value(x.f32(), tanh));
    }
}

/// [`backward`] one element at a time.
pub(crate) fn backward_scalar<S: Lane, D: Lane>(x: &[S], dy: &[S], dx: &mut [D], tanh: bool) {
    for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
        *dx = D::of(dy.f32() * slope(x.f32(), tanh));
    }
}

/// An element the kernels read and write: f32, or f16 widened exactly and
/// rounded to nearest-even (as `half` and the AVX-512 conversions do).
#[cfg(target_arch = "x86_64")]
pub(crate) trait Lane:
    Copy + Send + Sync + crate::ops::half_emu::Load16 + crate::ops::half_emu::Store16
{
    fn f32(self) -> f32;
    fn of(v: f32) -> Self;
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) trait Lane: Copy + Send + Sync {
    fn f32(self) -> f32;
    fn of(v: f32) -> Self;
}

impl Lane for f32 {
    fn f32(self) -> f32 {
        self
    }
    fn of(v: f32) -> Self {
        v
    }
}

impl Lane for half::f16 {
    fn f32(self) -> f32 {
        self.to_f32()
    }
    fn of(v: f32) -> Self {
        half::f16::from_f32(v)
    }
}

#[inline]
fn value_exact(x: f64, tanh: bool) -> f64 {
    if tanh {
        // 0.5 x (1 + tanh u), as x σ(2u): no cancellation for x << 0.
        x / (1.0 + (-2.0 * K * (x + C * x * x * x)).exp())
    } else {
        0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }
}

#[inline]
fn slope_exact(x: f64, tanh: bool) -> f64 {
    if tanh {
        let s = 1.0 / (1.0 + (-2.0 * K * (x + C * x * x * x)).exp());
        s + 2.0 * x * s * (1.0 - s) * K * (1.0 + 3.0 * C * x * x)
    } else {
        let cdf = 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
        let pdf =
            (-0.5 * x * x).exp() * 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
        cdf + x * pdf
    }
}

/// The reference forward, in T's precision from f64 (the tests' f64).
pub fn forward_exact<T: Elem>(x: &[T], y: &mut [T], tanh: bool) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = T::from_f64(value_exact(x.to_f64(), tanh)).unwrap_or_else(T::nan);
    }
}

/// The reference backward.
pub fn backward_exact<T: Elem>(x: &[T], dy: &[T], dx: &mut [T], tanh: bool) {
    for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
        *dx = dy * T::from_f64(slope_exact(x.to_f64(), tanh)).unwrap_or_else(T::nan);
    }
}
