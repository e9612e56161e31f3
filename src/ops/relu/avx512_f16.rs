//! f16 ReLU on AVX-512 without widening: each 16 lanes are compared with
//! zero on their bits ([`negative`], [`nonpositive`]), and the lanes that
//! ReLU zeroes are overwritten with +0. A kept lane is left as it
//! is, which is what the widen / f32 select / round sequence of the generic
//! path stores (an f16 widens exactly and rounds back to itself), so the bits
//! are the same, in one pass over memory. (Except a signalling NaN, which no
//! arithmetic produces: the conversions would quiet it, here it stays.)

use super::cpu::{PAR_CHUNK, PAR_MIN_ELEMS};
use crate::ops::half_emu::{lanes_from, Load16, Store16};
use half::f16;
use rayon::prelude::*;
use std::arch::x86_64::*;

const LANES: usize = 16;

/// The lanes of 16 f16 bit patterns that are `< 0` (ordered): a set sign,
/// not -0, not a NaN. Read off the bits, without widening.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) fn negative(h: __m256i) -> __mmask16 {
    let magnitude = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
    _mm256_cmplt_epi16_mask(h, _mm256_setzero_si256())
        & _mm256_cmpneq_epi16_mask(magnitude, _mm256_setzero_si256())
        & !nan(magnitude)
}

/// The lanes of 16 f16 bit patterns that are `<= 0` (ordered): a set sign
/// or a zero, unless a NaN.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn nonpositive(h: __m256i) -> __mmask16 {
    let magnitude = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
    _mm256_cmple_epi16_mask(h, _mm256_setzero_si256()) & !nan(magnitude)
}

/// The NaN lanes of 16 f16 magnitudes (sign bit clear).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn nan(magnitude: __m256i) -> __mmask16 {
    _mm256_cmpgt_epu16_mask(magnitude, _mm256_set1_epi16(0x7c00))
}

/// `v = relu(v)`: negative lanes become +0; -0 and NaN stay (`v < 0` is false).
pub fn forward_inplace(v: &mut [f16]) {
    // SAFETY: `relu_lanes` reads and writes the `v.len()` elements of `v`;
    // AVX-512F/BW/VL are checked by the caller (`half_emu::avx512_usable`).
    let run = |v: &mut [f16]| unsafe { relu_lanes(v.as_mut_ptr(), v.len()) };
    if v.len() >= PAR_MIN_ELEMS {
        v.par_chunks_mut(PAR_CHUNK).for_each(run);
    } else {
        run(v);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn relu_lanes(p: *mut f16, len: usize) {
    let mut i = 0;
    while i < len {
        let m = lanes_from(i, len);
        let neg = m & negative(_mm256_maskz_loadu_epi16(m, p.add(i).cast()));
        _mm256_mask_storeu_epi16(p.add(i).cast(), neg, _mm256_setzero_si256());
        i += LANES;
    }
}

/// `dy = y > 0 ? dy : 0` (PyTorch's `threshold_backward`: a NaN `y` passes
/// its gradient), `y` and `dy` of the same length.
pub fn backward_inplace(y: &[f16], dy: &mut [f16]) {
    assert_eq!(y.len(), dy.len(), "relu backward: y and dy lengths differ");
    // SAFETY: `grad_lanes` reads `dy.len()` elements of `y` (as long, per
    // the assert and the equal split) and writes those of `dy`; AVX-512F/BW/VL
    // are checked by the caller.
    let run = |(y, dy): (&[f16], &mut [f16])| unsafe { grad_lanes(y.as_ptr(), dy.as_mut_ptr(), dy.len()) };
    if dy.len() >= PAR_MIN_ELEMS {
        y.par_chunks(PAR_CHUNK).zip(dy.par_chunks_mut(PAR_CHUNK)).for_each(run);
    } else {
        run((y, dy));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn grad_lanes(y: *const f16, dy: *mut f16, len: usize) {
    let mut i = 0;
    while i < len {
        let m = lanes_from(i, len);
        let drop = m & nonpositive(_mm256_maskz_loadu_epi16(m, y.add(i).cast()));
        _mm256_mask_storeu_epi16(dy.add(i).cast(), drop, _mm256_setzero_si256());
        i += LANES;
    }
}

/// [`backward_inplace`] of `dy + other` (the sum rounded to f16 once, as
/// `ops::add::accumulate_` rounds it): the gradient of a value read twice,
/// summed in the same pass as ReLU's mask instead of one of its own.
pub fn add_backward_inplace(y: &[f16], dy: &mut [f16], other: &[f16]) {
    assert!(y.len() == dy.len() && other.len() == dy.len(), "relu backward: y, dy and other lengths differ");
    type Chunks<'a> = ((&'a [f16], &'a mut [f16]), &'a [f16]);
    // SAFETY: the three chunks have one length (asserted above);
    // AVX-512F/BW/VL: callers check `avx512_usable`.
    let run = |((y, dy), o): Chunks<'_>| unsafe {
        add_grad_lanes(y.as_ptr(), dy.as_mut_ptr(), o.as_ptr(), dy.len())
    };
    if dy.len() >= PAR_MIN_ELEMS {
        y.par_chunks(PAR_CHUNK)
            .zip(dy.par_chunks_mut(PAR_CHUNK))
            .zip(other.par_chunks(PAR_CHUNK))
            .for_each(run);
    } else {
        run(((y, dy), other));
    }
}

/// `dy = (y > 0) ? round(dy + other) : 0` over `len` elements, as
/// [`grad_lanes`] after the add's `sum_lanes`. Dropped lanes store the f32
/// +0 rounded, +0 as [`grad_lanes`] writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn add_grad_lanes(y: *const f16, dy: *mut f16, other: *const f16, len: usize) {
    let mut i = 0;
    while i < len {
        let m = lanes_from(i, len);
        let drop = nonpositive(_mm256_maskz_loadu_epi16(m, y.add(i).cast()));
        let sum = _mm512_add_ps(f16::load16(dy.add(i), m), f16::load16(other.add(i), m));
        f16::store16(dy.add(i), m, _mm512_maskz_mov_ps(!drop, sum));
        i += LANES;
    }
}
