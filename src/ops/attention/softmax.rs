//! One row of the causal softmax, in place: `row[..=i]` scaled, its max
//! subtracted, exponentiated and divided by the sum (in the warp's order,
//! `ops::warp_order`), `row[i + 1..]` zeroed.
//!
//! f32 rows take the CPU's own exp (`ops::exp`), 16 lanes at a time under
//! AVX-512 and one at a time otherwise, the same bits either way; libm's
//! scalar `expf` and the row's scalar loops were a twentieth of a baby GPT's
//! step. Other element types (the f64 of the gradient checks) take `exp`.

use crate::ops::elem::f32s_mut;
use crate::ops::warp_order::{butterfly, lane_sums_of};
use crate::ops::Elem;

pub fn row<T: Elem>(row: &mut [T], i: usize, scale: T) {
    if let (Some(r), Some(s)) = (f32s_mut(row), scale.to_f32()) {
        #[cfg(target_arch = "x86_64")]
        if crate::ops::half_emu::avx512_usable() {
            // SAFETY: AVX-512 F checked just above.
            return unsafe { x86::exp_shifted(r, i, s) };
        }
        return finish(r, i, crate::ops::exp::exp, s);
    }
    finish(row, i, T::exp, scale);
}

/// The scalar row with `exp`.
fn finish<T: Elem>(row: &mut [T], i: usize, exp: impl Fn(T) -> T, scale: T) {
    let mut max = T::neg_infinity();
    for s in row.iter_mut().take(i + 1) {
        *s = *s * scale;
        max = max.max(*s);
    }
    for s in row.iter_mut().take(i + 1) {
        *s = exp(*s - max);
    }
    normalize(row, i);
}

/// `row[..=i]` divided by its sum, the rest zeroed.
fn normalize<T: Elem>(row: &mut [T], i: usize) {
    let (head, tail) = row.split_at_mut((i + 1).min(row.len()));
    let sum = butterfly(lane_sums_of(T::zero(), head, |v| v));
    head.iter_mut().for_each(|s| *s = *s / sum);
    tail.iter_mut().for_each(|s| *s = T::zero());
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::ops::exp::x86::exp;
    use std::arch::x86_64::*;

    /// The lanes of a vector starting at `j` of `len`.
    fn lanes(len: usize, j: usize) -> __mmask16 {
        ((1u32 << (len - j).min(16)) - 1) as __mmask16
    }

    /// [`super::finish`] with the scaling, the max and the exps 16 lanes at
    /// a time. The max is exact in any order; `max(v, m)` keeps m where v is
    /// NaN, as `f32::max` does.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_shifted(row: &mut [f32], i: usize, scale: f32) {
        let len = (i + 1).min(row.len());
        let p = row.as_mut_ptr();
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for j in (0..len).step_by(16) {
            let k = lanes(len, j);
            // SAFETY: the lanes in k lie inside row[..len].
            unsafe {
                let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p.add(j)), _mm512_set1_ps(scale));
                _mm512_mask_storeu_ps(p.add(j), k, v);
                m = _mm512_mask_max_ps(m, k, v, m);
            }
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        for j in (0..len).step_by(16) {
            let k = lanes(len, j);
            // SAFETY: as above.
            unsafe {
                let v = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(j)), max));
                _mm512_mask_storeu_ps(p.add(j), k, v);
            }
        }
        super::normalize(row, i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 rows are the scalar rows bit for bit, at every length
    /// around the vector edges, with the special values a score can take.
    #[test]
    fn avx512_rows_are_the_scalar_rows() {
        let t = 70;
        let mut base: Vec<f32> = crate::ops::testing::rand_vec_f32(t, 5).iter().map(|v| v * 30.0).collect();
        for i in 0..t {
            let (mut got, mut want) = (base.clone(), base.clone());
            row(&mut got, i, 0.125);
            finish(&mut want, i, crate::ops::exp::exp, 0.125f32);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "row {i}");
            assert!(got[i + 1..].iter().all(|&v| v == 0.0));
            let sum: f32 = got[..=i].iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {i} sums to {sum}");
        }
        base[3] = f32::NAN;
        base[5] = f32::NEG_INFINITY;
        base[6] = -0.0;
        for i in [4, 5, 6, 20] {
            let (mut got, mut want) = (base.clone(), base.clone());
            row(&mut got, i, 0.5);
            finish(&mut want, i, crate::ops::exp::exp, 0.5f32);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "row {i}: {got:?} vs {want:?}"
                );
            }
        }
    }
}
