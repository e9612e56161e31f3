//! The element type the CPU kernels are generic over: f32 in training, f64 in
//! the finite-difference tests (so the reference gradient is computed in f64).

use num_traits::Float;
use std::any::TypeId;

pub trait Elem:
    Float + num_traits::FromPrimitive + Default + Send + Sync + Copy + std::fmt::Debug + std::iter::Sum + 'static
{
    fn from_f32(v: f32) -> Self;
    fn to_f64(self) -> f64;
}

impl Elem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Elem for f64 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

/// `s` as f32 when `T` is f32 (the f64 test instantiations take the generic path).
pub fn f32s<T: Elem>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32, so the slice is reinterpreted as itself.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// [`f32s`] for a mutable slice.
pub fn f32s_mut<T: Elem>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `f32s`; the borrow of `s` moves into the result.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}
