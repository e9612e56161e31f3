//! ReLU CPU kernels: elementwise, so the only concern is staying one pass and
//! letting both cores stream memory on large activations.

use crate::ops::Elem;
use rayon::prelude::*;

/// Below this many elements a single core beats rayon's fork/join.
pub(super) const PAR_MIN_ELEMS: usize = 1 << 15;
/// Work unit per rayon task: big enough to amortize scheduling.
pub(super) const PAR_CHUNK: usize = 1 << 14;

/// `max(x, 0)` with NaN kept as NaN, like `torch.relu`.
#[inline(always)]
fn relu<T: Elem>(v: T) -> T {
    // `v < 0` is false for NaN, so NaN passes through; the select vectorizes.
    if v < T::zero() {
        T::zero()
    } else {
        v
    }
}

/// PyTorch's `threshold_backward`: the gradient is dropped where `y <= 0`
/// (so a NaN output passes its gradient, as in PyTorch).
#[inline(always)]
fn relu_grad<T: Elem>(y: T, g: T) -> T {
    if y <= T::zero() {
        T::zero()
    } else {
        g
    }
}

pub fn forward<T: Elem>(x: &[T], y: &mut [T]) {
    debug_assert_eq!(x.len(), y.len());
    let run = |(xs, ys): (&[T], &mut [T])| {
        for (o, &v) in ys.iter_mut().zip(xs) {
            *o = relu(v);
        }
    };
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks(PAR_CHUNK).zip(y.par_chunks_mut(PAR_CHUNK)).for_each(run);
    } else {
        run((x, y));
    }
}

pub fn forward_inplace<T: Elem>(x: &mut [T]) {
    let run = |xs: &mut [T]| {
        for v in xs {
            *v = relu(*v);
        }
    };
    if x.len() >= PAR_MIN_ELEMS {
        x.par_chunks_mut(PAR_CHUNK).for_each(run);
    } else {
        run(x);
    }
}

pub fn backward<T: Elem>(y: &[T], dy: &[T], dx: &mut [T]) {
    debug_assert_eq!(y.len(), dy.len());
    debug_assert_eq!(y.len(), dx.len());
    let run = |((ys, gs), os): ((&[T], &[T]), &mut [T])| {
        for ((o, &v), &g) in os.iter_mut().zip(ys).zip(gs) {
            *o = relu_grad(v, g);
        }
    };
    if y.len() >= PAR_MIN_ELEMS {
        y.par_chunks(PAR_CHUNK).zip(dy.par_chunks(PAR_CHUNK)).zip(dx.par_chunks_mut(PAR_CHUNK)).for_each(run);
    } else {
        run(((y, dy), dx));
    }
}

pub fn backward_inplace<T: Elem>(y: &[T], dy: &mut [T]) {
    debug_assert_eq!(y.len(), dy.len());
    let run = |(ys, gs): (&[T], &mut [T])| {
        for (g, &v) in gs.iter_mut().zip(ys) {
            *g = relu_grad(v, *g);
        }
    };
    if y.len() >= PAR_MIN_ELEMS {
        y.par_chunks(PAR_CHUNK).zip(dy.par_chunks_mut(PAR_CHUNK)).for_each(run);
    } else {
        run((y, dy));
    }
}
