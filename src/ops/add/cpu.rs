//! Elementwise add CPU kernels: one f32 (or f64) addition per element, so
//! the only concern is one pass and both cores on large activations.

use crate::ops::Elem;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Below this many elements a single core beats rayon's fork/join.
pub(super) const PAR_MIN_ELEMS: usize = 1 << 15;
/// Work unit per rayon task: big enough to amortize scheduling.
pub(super) const PAR_CHUNK: usize = 1 << 14;

/// `y = a + b`, every element of `y` written (it may start uninitialized).
pub fn forward<T: Elem>(a: &[T], b: &[T], y: &mut [MaybeUninit<T>]) {
    debug_assert_eq!(a.len(), b.len());
    debug_assert_eq!(a.len(), y.len());
    let run = |xa: &[T], xb: &[T], ys: &mut [MaybeUninit<T>]| {
        for ((o, &u), &v) in ys.iter_mut().zip(xa).zip(xb) {
            o.write(u + v);
        }
    };
    if a.len() >= PAR_MIN_ELEMS {
        let chunks = a.par_chunks(PAR_CHUNK).zip(b.par_chunks(PAR_CHUNK)).zip(y.par_chunks_mut(PAR_CHUNK));
        chunks.for_each(|((a, b), y)| run(a, b, y));
    } else {
        run(a, b, y);
    }
}

/// `dst += src`.
pub fn accumulate<T: Elem>(dst: &mut [T], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    let run = |(ds, ss): (&mut [T], &[T])| {
        for (d, &s) in ds.iter_mut().zip(ss) {
            *d = *d + s;
        }
    };
    if dst.len() >= PAR_MIN_ELEMS {
        dst.par_chunks_mut(PAR_CHUNK).zip(src.par_chunks(PAR_CHUNK)).for_each(run);
    } else {
        run((dst, src));
    }
}
