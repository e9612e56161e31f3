//! `Tensor {shape, storage}` with storage an enum dispatched by `match` (CPU now,
//! CUDA later). Layout is always contiguous row-major (PyTorch's NCHW for images).

use crate::error::{Error, Result};
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
}

#[derive(Debug, Clone)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

#[derive(Debug, Clone)]
pub enum Storage {
    Cpu(CpuStorage),
}

#[derive(Debug, Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
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
        Ok(Tensor { shape: shape.to_vec(), storage: Storage::Cpu(CpuStorage::F32(data)) })
    }

    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), storage: Storage::Cpu(CpuStorage::F32(vec![0.0; numel(shape)])) }
    }

    pub fn full(shape: &[usize], v: f32) -> Self {
        Tensor { shape: shape.to_vec(), storage: Storage::Cpu(CpuStorage::F32(vec![v; numel(shape)])) }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn dtype(&self) -> DType {
        match &self.storage {
            Storage::Cpu(CpuStorage::F32(_)) => DType::F32,
            Storage::Cpu(CpuStorage::F16(_)) => DType::F16,
        }
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The f32 host data. Errors for other dtypes/devices rather than converting
    /// silently, so a caller never pays for a hidden copy.
    pub fn as_f32(&self) -> Result<&[f32]> {
        match &self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f32 tensor, got {:?}", self.dtype()))),
        }
    }

    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        let dt = self.dtype();
        match &mut self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
            _ => Err(Error::shape(format!("expected a CPU f32 tensor, got {dt:?}"))),
        }
    }

    pub fn into_f32_vec(self) -> Result<Vec<f32>> {
        match self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
            Storage::Cpu(CpuStorage::F16(v)) => Ok(v.into_iter().map(f32::from).collect()),
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
