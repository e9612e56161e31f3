//! f16 + f16 on AVX-512 in one pass: 16 lanes of each operand widened in
//! registers, added in f32 and rounded to nearest-even as they are stored,
//! by the F16C instructions the generic path's block widening and rounding
//! use, so the bits are that path's (widen both, add in f32, round once).

use super::cpu::{PAR_CHUNK, PAR_MIN_ELEMS};
use crate::ops::half_emu::{lanes_from, Load16, Store16};
use half::f16;
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

const LANES: usize = 16;

/// `out[i] = round(a[i] + b[i])` for `i < len`; `out` may be `a`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn sum_lanes(a: *const f16, b: *const f16, out: *mut f16, len: usize) {
    let mut i = 0;
    while i < len {
        let m = lanes_from(i, len);
        f16::store16(out.add(i), m, _mm512_add_ps(f16::load16(a.add(i), m), f16::load16(b.add(i), m)));
        i += LANES;
    }
}

/// `a + b` (same length) into a new vector, on both cores when large.
/// AVX-512F/BW/VL: checked by the caller (`half_emu::avx512_usable`).
pub fn forward(a: &[f16], b: &[f16]) -> Vec<f16> {
    assert_eq!(a.len(), b.len(), "add: operand lengths differ");
    let mut y = Vec::with_capacity(a.len());
    type Chunks<'a> = ((&'a [f16], &'a [f16]), &'a mut [MaybeUninit<f16>]);
    let run = |((a, b), y): Chunks<'_>| {
        // SAFETY: the three chunks are equally long (equal lengths, equal
        // splits); only `y`'s chunk is written.
        unsafe { sum_lanes(a.as_ptr(), b.as_ptr(), y.as_mut_ptr().cast(), y.len()) }
    };
    let out = &mut y.spare_capacity_mut()[..a.len()];
    if a.len() >= PAR_MIN_ELEMS {
        a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)).zip(out.par_chunks_mut(PAR_CHUNK)).for_each(run);
    } else {
        run(((a, b), out));
    }
    // SAFETY: `sum_lanes` wrote all `a.len()` elements.
    unsafe { y.set_len(a.len()) };
    y
}

/// `dst += src` (same length), rounded once per element.
/// AVX-512F/BW/VL: checked by the caller.
pub fn accumulate(dst: &mut [f16], src: &[f16]) {
    assert_eq!(dst.len(), src.len(), "add: operand lengths differ");
    let run = |(d, s): (&mut [f16], &[f16])| {
        // SAFETY: equal lengths; `d` is read and written in place, lane by lane.
        unsafe { sum_lanes(d.as_ptr(), s.as_ptr(), d.as_mut_ptr(), d.len()) }
    };
    if dst.len() >= PAR_MIN_ELEMS {
        dst.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(run);
    } else {
        run((dst, src));
    }
}
