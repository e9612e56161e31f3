//! The scratch every layer of the device model shares: typed regions, each
//! its own allocation sized before step 1 as the largest any layer asks for
//! (the plan's [`Scratch`]). A layer takes its regions in the order its
//! plan declared them and hands what is left to a layer it wraps (O1).
//! Regions are separate allocations, not cuts of one, so the emulated
//! device's bounds checks still catch a kernel overrunning its scratch
//! into another region.

use super::layer::{internal, Scratch};
use crate::cuda::Gpu;
use crate::error::Result;
use cudarc::driver::{CudaSlice, CudaViewMut};
use half::f16;

/// The model's scratch, allocated once.
pub struct Scratchpad {
    f32: Vec<CudaSlice<f32>>,
    f16: Vec<CudaSlice<f16>>,
}

impl Scratchpad {
    pub fn new(gpu: &Gpu, s: &Scratch) -> Result<Scratchpad> {
        let s32 = s.f32.iter().map(|&n| super::model::alloc(gpu, n)).collect::<Result<_>>()?;
        let s16 = s.f16.iter().map(|&n| super::model::alloc(gpu, n)).collect::<Result<_>>()?;
        Ok(Scratchpad { f32: s32, f16: s16 })
    }

    /// All of it, for one layer's launches.
    pub fn all(&mut self) -> Workspace<'_> {
        Workspace { f32: &mut self.f32, f16: &mut self.f16 }
    }
}

/// The regions a layer has not taken yet.
pub struct Workspace<'a> {
    f32: &'a mut [CudaSlice<f32>],
    f16: &'a mut [CudaSlice<f16>],
}

/// The element types a region holds.
pub trait Region: Sized {
    fn regions<'w, 'a>(ws: &'w mut Workspace<'a>) -> &'w mut &'a mut [CudaSlice<Self>];
}

impl Region for f32 {
    fn regions<'w, 'a>(ws: &'w mut Workspace<'a>) -> &'w mut &'a mut [CudaSlice<f32>] {
        &mut ws.f32
    }
}

impl Region for f16 {
    fn regions<'w, 'a>(ws: &'w mut Workspace<'a>) -> &'w mut &'a mut [CudaSlice<f16>] {
        &mut ws.f16
    }
}

impl<'a> Workspace<'a> {
    /// The next `K` regions of `T`, whole (launchers that take a larger one).
    pub fn whole<T: Region, const K: usize>(&mut self) -> Result<[CudaViewMut<'a, T>; K]> {
        self.next([None; K])
    }

    /// The next `K` regions of `T`, the first `lens[i]` values of each.
    pub fn take<T: Region, const K: usize>(&mut self, lens: [usize; K]) -> Result<[CudaViewMut<'a, T>; K]> {
        self.next(lens.map(Some))
    }

    fn next<T: Region, const K: usize>(
        &mut self,
        lens: [Option<usize>; K],
    ) -> Result<[CudaViewMut<'a, T>; K]> {
        let regions = std::mem::take(T::regions(self));
        let sizes: Vec<usize> = regions.iter().map(|r| r.len()).collect();
        // The plan sized each region for every layer that takes it.
        let fits = |(head, _): &(&mut [CudaSlice<T>; K], &mut [CudaSlice<T>])| {
            head.iter().zip(lens).all(|(r, len)| len.is_none_or(|len| len <= r.len()))
        };
        let Some((head, tail)) = regions.split_first_chunk_mut::<K>().filter(fits) else {
            return Err(internal(format!("scratch regions {lens:?} asked of a workspace of {sizes:?}")));
        };
        *T::regions(self) = tail;
        let mut lens = lens.into_iter();
        Ok(head.each_mut().map(|r| {
            let len = lens.next().flatten().unwrap_or(r.len());
            r.slice_mut(0..len)
        }))
    }
}
