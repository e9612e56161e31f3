//! A dataset held on the device (MNIST is a few tens of MB) and the launcher
//! that assembles a batch from it: no host copy inside a training step.
//! CPU twin: the loader's `build` (row i of a batch is sample `indices[i]`).

use super::Dataset;
use crate::cuda::{as_i64, check_len, launch_1d, Gpu, KernelFn};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaViewMut};

const FILE: &str = "data.cu";
static GATHER_BATCH: KernelFn = KernelFn::new(FILE, "gather_batch");

/// Normalized images (f32) and labels of a whole split, on the device.
pub struct DeviceDataset {
    images: CudaSlice<f32>,
    labels: CudaSlice<u32>,
    sample_len: usize,
    len: usize,
}

impl DeviceDataset {
    /// Copies `ds` to the device (once, before training).
    pub fn upload(gpu: &Gpu, ds: &Dataset) -> Result<Self> {
        let s = gpu.stream();
        let bytes = ds.images.len() * 4 + ds.labels.len() * 4;
        let err = |e| Error::cuda(format!("copying the dataset to the device ({bytes} bytes)"), e);
        // A zero-length allocation is refused; an empty split never gathers.
        let images = if ds.images.is_empty() { s.alloc_zeros(1) } else { s.clone_htod(&ds.images) };
        let labels = if ds.labels.is_empty() { s.alloc_zeros(1) } else { s.clone_htod(&ds.labels) };
        Ok(DeviceDataset {
            images: images.map_err(err)?,
            labels: labels.map_err(err)?,
            sample_len: ds.sample_numel(),
            len: ds.len(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values per sample (C*H*W).
    pub fn sample_len(&self) -> usize {
        self.sample_len
    }
}

/// One pass's sample order on the device (uploaded once per epoch).
pub struct DeviceIndices {
    indices: CudaSlice<u32>,
    len: usize,
}

impl DeviceIndices {
    /// `indices` must be valid sample indices of `ds` (the sampler's).
    pub fn upload(gpu: &Gpu, ds: &DeviceDataset, indices: &[usize]) -> Result<Self> {
        const OP: &str = "uploading the epoch's sample order";
        let mut host = Vec::with_capacity(indices.len().max(1));
        for &i in indices {
            if i >= ds.len {
                return Err(Error::shape(format!("{OP}: index {i} is out of range for {} samples", ds.len)));
            }
            host.push(u32::try_from(i).map_err(|_| Error::shape(format!("{OP}: index {i} exceeds u32")))?);
        }
        if host.is_empty() {
            host.push(0);
        }
        let indices_dev = gpu.stream().clone_htod(&host).map_err(|e| Error::cuda(OP, e))?;
        Ok(DeviceIndices { indices: indices_dev, len: indices.len() })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Batch rows `offset..offset + n` of `order`: images into `x` (`n *
/// sample_len` f32) and labels into `y` (`n` u32), on the compute stream.
pub fn gather_batch(
    gpu: &Gpu,
    ds: &DeviceDataset,
    order: &DeviceIndices,
    offset: usize,
    n: usize,
    x: &mut CudaViewMut<'_, f32>,
    y: &mut CudaViewMut<'_, u32>,
) -> Result<()> {
    const OP: &str = "gather_batch";
    if offset + n > order.len {
        return Err(Error::shape(format!(
            "{OP}: rows {offset}..{} past the {} indices of this pass",
            offset + n,
            order.len
        )));
    }
    check_len(OP, "x", x.len(), n * ds.sample_len)?;
    check_len(OP, "labels", y.len(), n)?;
    if n == 0 || ds.sample_len == 0 {
        return Ok(());
    }
    let (off, rows, per) = (as_i64(OP, offset)?, as_i64(OP, n)?, as_i64(OP, ds.sample_len)?);
    let f = gpu.kernel(&GATHER_BATCH)?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(&ds.images).arg(&ds.labels).arg(&order.indices).arg(&off).arg(&rows).arg(&per);
    b.arg(x).arg(y);
    // SAFETY: argument types and order match gather_batch; x and y are sized
    // for n rows (checked), every index was range-checked at upload, and
    // offset + n is within the uploaded indices.
    unsafe { b.launch(launch_1d(n * ds.sample_len)) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
