//! GELU's CPU kernels, elementwise, generic over f32/f64 (f64 in the
//! gradient tests). erf is libm's, evaluated in f64 and rounded once.

use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many elements one core beats rayon's fork/join.
const PAR_CHUNK: usize = 1 << 14;
/// √(2/π) and the cubic coefficient of the tanh form.
const K: f64 = 0.797_884_560_802_865_4;
const C: f64 = 0.044_715;

#[inline]
fn value(x: f64, tanh: bool) -> f64 {
    if tanh {
        0.5 * x * (1.0 + (K * (x + C * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
    }
}

/// d gelu / dx.
#[inline]
fn slope(x: f64, tanh: bool) -> f64 {
    if tanh {
        let t = (K * (x + C * x * x * x)).tanh();
        0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K * (1.0 + 3.0 * C * x * x)
    } else {
        // Φ(x) + x φ(x).
        let cdf = 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
        let pdf =
            (-0.5 * x * x).exp() * 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
        cdf + x * pdf
    }
}

pub fn forward<T: Elem>(x: &[T], y: &mut [T], tanh: bool) {
    y.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(y, x)| {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = T::from_f64(value(x.to_f64(), tanh)).unwrap_or_else(T::nan);
        }
    });
}

pub fn backward<T: Elem>(x: &[T], dy: &[T], dx: &mut [T], tanh: bool) {
    dx.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK).zip(dy.par_chunks(PAR_CHUNK))).for_each(
        |(dx, (x, dy))| {
            for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
                *dx = dy * T::from_f64(slope(x.to_f64(), tanh)).unwrap_or_else(T::nan);
            }
        },
    );
}
