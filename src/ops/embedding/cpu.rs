//! Embedding's CPU kernels, generic over f32/f64.

use crate::ops::Elem;

/// `y[i] = w[ids[i]]` (ids in range: the caller checked).
pub fn forward<T: Elem>(c: usize, ids: &[usize], w: &[T], y: &mut [T]) {
    for (row, &id) in y.chunks_mut(c).zip(ids) {
        row.copy_from_slice(&w[id * c..(id + 1) * c]);
    }
}

/// `dw[ids[i]] += dy[i]`, in order of i: repeated ids add up in the same
/// order on every run (a GPU's atomics would not).
pub fn backward<T: Elem>(c: usize, ids: &[usize], dy: &[T], dw: &mut [T]) {
    for (row, &id) in dy.chunks(c).zip(ids) {
        for (d, &g) in dw[id * c..(id + 1) * c].iter_mut().zip(row) {
            *d = *d + g;
        }
    }
}
