//! A dataset held on the device (MNIST is a few tens of MB) and the launcher
//! that assembles a batch from it: no host copy inside a training step.
//! CPU twin: the loader's `build` (row i of a batch is sample `indices[i]`,
//! augmented with the draws of its sample when the run augments). A text
//! split is its token stream; the host draws each pass's window offsets
//! (`Windows::offset`, as the loader does) and uploads them with the pass,
//! so the gather cuts the windows out of the stream on the device (CPU
//! twin: `Windows::push`).

use super::augment::{Augment, Draw};
use super::text::Windows;
use super::Dataset;
use crate::cuda::{as_i64, check_len, launch_1d, Gpu, KernelFn};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, CudaViewMut};

const FILE: &str = "data.cu";
static GATHER_BATCH: KernelFn = KernelFn::new(FILE, "gather_batch");
static GATHER_BATCH_AUGMENT: KernelFn = KernelFn::new(FILE, "gather_batch_augment");
static GATHER_TEXT: KernelFn = KernelFn::new(FILE, "gather_text");

/// Normalized images (f32) and labels of a whole split, on the device; or,
/// for text, the split's token stream in `labels`.
pub struct DeviceDataset {
    images: CudaSlice<f32>,
    labels: CudaSlice<u32>,
    sample_len: usize,
    shape: [usize; 3],
    len: usize,
    /// Text: the host's windows (each pass's offsets are drawn from them).
    text: Option<Windows>,
}

impl DeviceDataset {
    /// Copies `ds` to the device (once, before training).
    pub fn upload(gpu: &Gpu, ds: &Dataset) -> Result<Self> {
        if let Some(t) = &ds.text {
            return Self::upload_text(gpu, ds, t);
        }
        let shape =
            ds.chw().ok_or_else(|| Error::internal("the device dataset holds [C, H, W] images or text"))?;
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
            shape,
            len: ds.len(),
            text: None,
        })
    }

    fn upload_text(gpu: &Gpu, ds: &Dataset, t: &Windows) -> Result<Self> {
        if t.tokens.len() <= t.block_size {
            return Err(Error::shape(format!(
                "a text split of {} tokens holds no window of {} + 1",
                t.tokens.len(),
                t.block_size
            )));
        }
        let s = gpu.stream();
        let err = |e| Error::cuda(format!("copying the {} tokens to the device", t.tokens.len()), e);
        Ok(DeviceDataset {
            images: s.alloc_zeros(1).map_err(err)?,
            labels: s.clone_htod(t.tokens.as_slice()).map_err(err)?,
            sample_len: t.block_size,
            shape: [0; 3],
            len: ds.len(),
            text: Some(t.clone()),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values per sample (C*H*W, or a text window's block_size ids).
    pub fn sample_len(&self) -> usize {
        self.sample_len
    }

    /// Labels per sample: one per image, a target per position of a window.
    pub fn labels_per_sample(&self) -> usize {
        if self.text.is_some() {
            self.sample_len
        } else {
            1
        }
    }
}

/// One pass's sample order on the device (uploaded once per epoch), with
/// each row's augmentation draws when the pass augments.
pub struct DeviceIndices {
    indices: CudaSlice<u32>,
    /// top, left, flip per row.
    draws: Option<CudaSlice<i32>>,
    len: usize,
}

/// The run's RandomCrop padding on the device: its width and the normalized
/// fill of each channel.
pub struct DeviceAugment {
    fill: CudaSlice<f32>,
    pad: usize,
}

impl DeviceAugment {
    pub fn upload(gpu: &Gpu, a: &Augment, channels: usize) -> Result<Self> {
        let (pad, mut fill) = match &a.crop {
            Some(c) => (c.padding, c.fill.clone()),
            None => (0, Vec::new()),
        };
        fill.resize(channels.max(1), 0.0);
        let fill = gpu.stream().clone_htod(&fill).map_err(|e| Error::cuda("uploading the crop's fill", e))?;
        Ok(DeviceAugment { fill, pad })
    }
}

impl DeviceIndices {
    /// `indices` must be valid sample indices of `ds` (the sampler's);
    /// `epoch` keys a text split's windows (the validation split's are
    /// epoch 0's).
    pub fn upload(gpu: &Gpu, ds: &DeviceDataset, indices: &[usize], epoch: u64) -> Result<Self> {
        const OP: &str = "uploading the epoch's sample order";
        let mut host = Vec::with_capacity(indices.len().max(1));
        for &i in indices {
            if i >= ds.len {
                return Err(Error::shape(format!("{OP}: index {i} is out of range for {} samples", ds.len)));
            }
            // Text: the window's first token in the stream (below its length).
            let v = ds.text.as_ref().map_or(i, |t| t.offset(epoch, i));
            host.push(u32::try_from(v).map_err(|_| Error::shape(format!("{OP}: index {v} exceeds u32")))?);
        }
        if host.is_empty() {
            host.push(0);
        }
        let indices_dev = gpu.stream().clone_htod(&host).map_err(|e| Error::cuda(OP, e))?;
        Ok(DeviceIndices { indices: indices_dev, draws: None, len: indices.len() })
    }

    /// `upload`, with epoch `epoch`'s draws of `a` for every row, drawn on
    /// the host as the CPU loader draws them.
    pub fn upload_augmented(
        gpu: &Gpu,
        ds: &DeviceDataset,
        indices: &[usize],
        a: &Augment,
        epoch: u64,
    ) -> Result<Self> {
        const OP: &str = "uploading the epoch's augmentation draws";
        let mut order = Self::upload(gpu, ds, indices, epoch)?;
        let mut host = Vec::with_capacity(3 * indices.len().max(1));
        for &i in indices {
            let Draw { top, left, flip } = a.draw(epoch, ds.len, i, ds.shape);
            for v in [top, left, usize::from(flip)] {
                host.push(
                    i32::try_from(v).map_err(|_| Error::shape(format!("{OP}: offset {v} exceeds i32")))?,
                );
            }
        }
        if host.is_empty() {
            host.extend([0, 0, 0]);
        }
        order.draws = Some(gpu.stream().clone_htod(&host).map_err(|e| Error::cuda(OP, e))?);
        Ok(order)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The checks both gathers make: rows `offset..offset + n` exist in this
/// pass's indices, and `x` and `y` (of lengths `x_len`, `y_len`) hold them.
fn check_rows(
    op: &str,
    ds: &DeviceDataset,
    order: &DeviceIndices,
    offset: usize,
    n: usize,
    x_len: usize,
    y_len: usize,
) -> Result<()> {
    if offset.checked_add(n).is_none_or(|end| end > order.len) {
        return Err(Error::shape(format!(
            "{op}: rows {offset}..{} past the {} indices of this pass",
            offset.saturating_add(n),
            order.len
        )));
    }
    check_len(op, "x", x_len, n * ds.sample_len)?;
    check_len(op, "labels", y_len, n * ds.labels_per_sample())
}

/// Batch rows `offset..offset + n` of `order`: images into `x` (`n *
/// sample_len` f32) and labels into `y` (`n` u32), on the compute stream;
/// for text, each row's input ids (as f32) and its `sample_len` targets.
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
    check_rows(OP, ds, order, offset, n, x.len(), y.len())?;
    if n == 0 || ds.sample_len == 0 {
        return Ok(());
    }
    let (off, rows, per) = (as_i64(OP, offset)?, as_i64(OP, n)?, as_i64(OP, ds.sample_len)?);
    let f = gpu.kernel(if ds.text.is_some() { &GATHER_TEXT } else { &GATHER_BATCH })?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(&ds.images).arg(&ds.labels).arg(&order.indices).arg(&off).arg(&rows).arg(&per);
    b.arg(x).arg(y);
    // SAFETY: argument types and order match gather_batch and gather_text;
    // x and y are sized for n rows (checked), every index was range-checked
    // at upload (a text offset leaves room for its window in the stream),
    // and offset + n is within the uploaded indices.
    unsafe { b.launch(launch_1d(n * ds.sample_len)) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

/// `gather_batch` with each row cropped and flipped by its draws (`order`
/// from [`DeviceIndices::upload_augmented`]).
#[allow(clippy::too_many_arguments)]
pub fn gather_batch_augmented(
    gpu: &Gpu,
    ds: &DeviceDataset,
    order: &DeviceIndices,
    aug: &DeviceAugment,
    offset: usize,
    n: usize,
    x: &mut CudaViewMut<'_, f32>,
    y: &mut CudaViewMut<'_, u32>,
) -> Result<()> {
    const OP: &str = "gather_batch_augment";
    let Some(draws) = &order.draws else {
        return Err(Error::shape(format!("{OP}: the pass was uploaded without augmentation draws")));
    };
    check_rows(OP, ds, order, offset, n, x.len(), y.len())?;
    check_len(OP, "fill", aug.fill.len(), ds.shape[0].max(1))?;
    if n == 0 || ds.sample_len == 0 {
        return Ok(());
    }
    let [c, h, w] = ds.shape;
    let (off, rows) = (as_i64(OP, offset)?, as_i64(OP, n)?);
    let (c, h, w, pad) = (as_i64(OP, c)?, as_i64(OP, h)?, as_i64(OP, w)?, as_i64(OP, aug.pad)?);
    let f = gpu.kernel(&GATHER_BATCH_AUGMENT)?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(&ds.images).arg(&ds.labels).arg(&order.indices).arg(draws).arg(&aug.fill);
    b.arg(&off).arg(&rows).arg(&c).arg(&h).arg(&w).arg(&pad).arg(x).arg(y);
    // SAFETY: argument types and order match gather_batch_augment; x and y
    // are sized for n rows and fill for every channel (checked); indices were
    // range-checked at upload and draws hold 3 values per uploaded row;
    // offset + n is within them; out-of-image reads are replaced by fill.
    unsafe { b.launch(launch_1d(n * ds.sample_len)) }.map_err(|e| Error::cuda(OP, e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;
