//! The element type the CPU kernels are generic over: f32 in training, f64 in
//! the finite-difference tests (so the reference gradient is computed in f64).

use num_traits::Float;

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
