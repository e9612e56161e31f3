//! Dropout's CPU kernel. Each element's bit depends only on its index, so
//! the tensor is cut into chunks for rayon freely: any chunking and thread
//! count give the same mask.

use super::Mask;
use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many elements a single core beats rayon's fork/join.
const PAR_MIN_ELEMS: usize = 1 << 15;
/// Work unit per rayon task (a multiple of 4: whole Philox groups).
pub(super) const PAR_CHUNK: usize = 1 << 14;

/// `v[i] = v[i] * mask[offset + i] * scale`, computed as `(v * m) * scale`
/// with m in {0, 1}, in `T`.
pub fn apply<T: Elem>(m: &Mask, v: &mut [T], offset: u64) {
    let scale = <T as Elem>::from_f32(m.scale);
    let mut group = u64::MAX;
    let mut words = [0u32; 4];
    for (i, x) in v.iter_mut().enumerate() {
        let e = offset + i as u64;
        if e >> 2 != group {
            group = e >> 2;
            words = m.draws.words(group);
        }
        let bit = if m.kept(&words, e) { T::one() } else { T::zero() };
        *x = *x * bit * scale;
    }
}

/// [`apply`] over a whole tensor, parallel when it is large.
pub fn apply_par<T: Elem>(m: &Mask, v: &mut [T]) {
    if v.len() < PAR_MIN_ELEMS {
        apply(m, v, 0);
        return;
    }
    v.par_chunks_mut(PAR_CHUNK).enumerate().for_each(|(i, c)| apply(m, c, (i * PAR_CHUNK) as u64));
}
