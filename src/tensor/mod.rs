//! `Tensor {shape, storage}` with storage an enum dispatched by `match` (CPU now,
//! CUDA later). Layout is always contiguous row-major (PyTorch's NCHW for images).

mod buf;

pub use buf::Buf;

use crate::error::{Error, Result};
use half::f16;
use std::mem::MaybeUninit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
}

/// A host tensor's elements, shared by its clones (see [`Buf`]).
#[derive(Debug, Clone)]
pub enum CpuStorage {
    F32(Buf<f32>),
    F16(Buf<f16>),
}

/// Elements below which [`par_copy`] and [`par_map`] run on the calling
/// thread (a rayon split costs a few microseconds).
const PAR_COPY_MIN: usize = 1 << 16;

/// `src.to_vec()`, in parallel chunks when `src` is large.
pub(crate) fn par_copy<T: Copy + Send + Sync>(src: &[T]) -> Vec<T> {
    let copy = |s: &[T], d: &mut [MaybeUninit<T>]| {
        for (d, s) in d.iter_mut().zip(s) {
            d.write(*s);
        }
    };
    // SAFETY: `copy` writes every element of its chunk.
    unsafe { par_map(src, copy) }
}

/// A vector of `src.len()` elements that `kernel` writes from `src`, chunk
/// by chunk (each output chunk from the input chunk at the same place), in
/// parallel when `src` is large: the whole-tensor dtype conversions of
/// apex's O2 ran serially with the second core idle.
///
/// # Safety
/// `kernel` writes every element of the output chunk it is given.
pub(crate) unsafe fn par_map<S: Sync, D: Send>(
    src: &[S],
    kernel: impl Fn(&[S], &mut [MaybeUninit<D>]) + Sync,
) -> Vec<D> {
    use rayon::prelude::*;
    let fill = |dst: &mut [MaybeUninit<D>]| {
        if src.len() < PAR_COPY_MIN {
            return kernel(src, dst);
        }
        dst.par_chunks_mut(PAR_COPY_MIN).zip(src.par_chunks(PAR_COPY_MIN)).for_each(|(d, s)| kernel(s, d));
    };
    // SAFETY: the chunks of `dst` cover it, and the caller's kernel writes
    // each element of each.
    unsafe { written_by(src.len(), fill) }
}

/// A vector of `len` elements that `fill` writes, without zero-filling it
/// first: a serial `memset` of a whole activation, ahead of kernels that
/// write every element anyway, kept the second core idle.
///
/// # Safety
/// `fill` writes every element of the slice it is given.
pub(crate) unsafe fn written_by<T>(len: usize, fill: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v.spare_capacity_mut()[..len]);
    // SAFETY: the caller's contract: `fill` wrote all `len` elements.
    unsafe { v.set_len(len) };
    v
}

/// `s` as possibly uninitialized values, for a kernel that only stores.
pub(crate) fn as_uninit<T>(s: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: MaybeUninit<T> has T's layout, and only initialized values
    // are ever written through the result.
    unsafe { &mut *(s as *mut [T] as *mut [MaybeUninit<T>]) }
}

#[derive(Debug, Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    storage: CpuStorage,
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Tensor {
    pub fn from_vec(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        if numel(shape) != data.len() {
            return Err(Error::shape(format!(
                "shape {shape:?} needs {} elements, got {}",
                numel(shape),
                data.len()
            )));
        }
        Ok(Tensor { shape: shape.to_vec(), storage: CpuStorage::F32(data.into()) })
    }

    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), storage: CpuStorage::F32(vec![0.0; numel(shape)].into()) }
    }

    pub fn full(shape: &[usize], v: f32) -> Self {
        Tensor { shape: shape.to_vec(), storage: CpuStorage::F32(vec![v; numel(shape)].into()) }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn dtype(&self) -> DType {
        match &self.storage {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
        }
    }

    pub fn storage(&self) -> &CpuStorage {
        &self.storage
    }

    /// The f32 host data. Errors for other dtypes/devices rather than converting
    /// silently, so a caller never pays for a hidden copy.
    pub fn as_f32(&self) -> Result<&[f32]> {
        match &self.storage {
            CpuStorage::F32(v) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f32 tensor, got {:?}", self.dtype()))),
        }
    }

    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        let dt = self.dtype();
        match &mut self.storage {
            CpuStorage::F32(v) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f32 tensor, got {dt:?}"))),
        }
    }

    pub fn into_f32_vec(self) -> Result<Vec<f32>> {
        match self.storage {
            CpuStorage::F32(v) => Ok(v.into_vec()),
            CpuStorage::F16(v) => Ok(f16_to_f32(&v)),
        }
    }

    /// The f16 values, rounded to nearest-even from f32 storage.
    pub fn into_f16_vec(self) -> Result<Vec<f16>> {
        match self.storage {
            CpuStorage::F16(v) => Ok(v.into_vec()),
            CpuStorage::F32(v) => Ok(f32_to_f16(&v)),
        }
    }

    /// An f16 tensor from IEEE binary16 values.
    pub fn from_f16_vec(shape: &[usize], data: Vec<f16>) -> Result<Self> {
        if numel(shape) != data.len() {
            return Err(Error::shape(format!(
                "shape {shape:?} needs {} elements, got {}",
                numel(shape),
                data.len()
            )));
        }
        Ok(Tensor { shape: shape.to_vec(), storage: CpuStorage::F16(data.into()) })
    }

    /// f32 values stored as `dtype`: rounded to nearest-even for f16, so values
    /// beyond f16's range become +-inf and tiny ones subnormal or zero, as on a GPU.
    pub fn from_f32_as(shape: &[usize], data: Vec<f32>, dtype: DType) -> Result<Self> {
        match dtype {
            DType::F32 => Self::from_vec(shape, data),
            DType::F16 => Self::from_f16_vec(shape, f32_to_f16(&data)),
        }
    }

    pub fn zeros_dtype(shape: &[usize], dtype: DType) -> Self {
        match dtype {
            DType::F32 => Self::zeros(shape),
            DType::F16 => Tensor {
                shape: shape.to_vec(),
                storage: CpuStorage::F16(vec![f16::ZERO; numel(shape)].into()),
            },
        }
    }

    /// The values in `dtype` (PyTorch's `.to(dtype)`): the same elements,
    /// shared (see [`Buf`]), when already `dtype`; f32 -> f16 rounds to
    /// nearest-even.
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        let storage = match (&self.storage, dtype) {
            (s @ CpuStorage::F32(_), DType::F32) | (s @ CpuStorage::F16(_), DType::F16) => s.clone(),
            (CpuStorage::F32(v), DType::F16) => CpuStorage::F16(f32_to_f16(v).into()),
            (CpuStorage::F16(v), DType::F32) => CpuStorage::F32(f16_to_f32(v).into()),
        };
        Tensor { shape: self.shape.clone(), storage }
    }

    /// Converts in place (no copy when already `dtype`).
    pub fn into_dtype(self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            self
        } else {
            self.to_dtype(dtype)
        }
    }

    pub fn as_f16(&self) -> Result<&[f16]> {
        match &self.storage {
            CpuStorage::F16(v) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f16 tensor, got {:?}", self.dtype()))),
        }
    }

    pub fn as_f16_mut(&mut self) -> Result<&mut [f16]> {
        let dt = self.dtype();
        match &mut self.storage {
            CpuStorage::F16(v) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f16 tensor, got {dt:?}"))),
        }
    }

    /// The values widened to f32 (a copy, whatever the dtype).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.storage {
            CpuStorage::F32(v) => par_copy(v),
            CpuStorage::F16(v) => f16_to_f32(v),
        }
    }

    /// Overwrites every element with `src[i]` stored in this tensor's dtype
    /// (rounded to nearest-even for f16).
    pub fn copy_from_f32(&mut self, src: &[f32]) -> Result<()> {
        if src.len() != self.numel() {
            return Err(Error::shape(format!(
                "copy_from_f32: {} values for a tensor of shape {:?}",
                src.len(),
                self.shape
            )));
        }
        match &mut self.storage {
            CpuStorage::F32(v) => v.copy_from_slice(src),
            CpuStorage::F16(v) => crate::ops::half_emu::round_into(src, v),
        }
        Ok(())
    }

    /// Sets every element to `value` (rounded for f16), whatever the dtype.
    pub fn fill_(&mut self, value: f32) {
        match &mut self.storage {
            CpuStorage::F32(v) => v.fill(value),
            CpuStorage::F16(v) => v.fill(f16::from_f32(value)),
        }
    }

    /// Same data, new shape (PyTorch's `view` on a contiguous tensor).
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        if numel(shape) != self.numel() {
            return Err(Error::shape(format!("cannot reshape {:?} to {shape:?}", self.shape)));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    pub fn check_shape(&self, what: &str, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(Error::shape(format!("{what}: expected shape {expected:?}, got {:?}", self.shape)));
        }
        Ok(())
    }
}

/// f32 -> f16 with IEEE round-to-nearest-even (overflow to +-inf, gradual underflow).
pub fn f32_to_f16(v: &[f32]) -> Vec<f16> {
    crate::ops::half_emu::round_to_vec(v)
}

/// f16 -> f32, exact.
pub fn f16_to_f32(v: &[f16]) -> Vec<f32> {
    crate::ops::half_emu::widen_to_vec(v)
}

#[cfg(test)]
mod tests_f16;
