//! Training data: MNIST and Fashion-MNIST from IDX files (raw or .gz),
//! CIFAR-10/100 binary files, users' own `.npz` arrays, a seeded synthetic
//! set for benchmarks, PyTorch's `DistributedSampler`, torchvision's
//! RandomCrop/RandomHorizontalFlip, and a prefetching batch loader.
//!
//! A dataset is decoded and normalized once into memory (MNIST is 47 MB as
//! f32); the loader thread gathers samples into batches and augments them.

pub mod augment;
pub mod cifar;
pub mod cuda;
pub mod idx;
mod loader;
pub mod npz;
mod sampler;
mod synthetic;
pub mod text;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_augment;
#[cfg(test)]
mod tests_formats;
#[cfg(test)]
mod tests_text;

pub use augment::{Augment, Crop, EpochAugment};
pub use loader::{Batch, Loader};
pub use sampler::DistributedSampler;
pub use synthetic::synthetic;

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// MNIST's digit classes.
pub const MNIST_CLASSES: usize = 10;
const MNIST_SIDE: usize = 28;

/// Samples in memory: `images` is `[n, C, H, W]` row-major, already
/// normalized; or, for text, windows of a token stream (`text`, with
/// `images` and `labels` empty).
#[derive(Debug, Clone)]
pub struct Dataset {
    pub images: Vec<f32>,
    pub labels: Vec<u32>,
    /// `[C, H, W]` for images, `[block_size]` for text.
    pub sample_shape: Vec<usize>,
    /// Classes, or the vocabulary's size.
    pub num_classes: usize,
    /// Set for `dataset = "text"`: each sample is a window of the stream.
    pub text: Option<text::Windows>,
}

impl Dataset {
    /// Images with their labels.
    pub fn images(images: Vec<f32>, labels: Vec<u32>, sample_shape: [usize; 3], num_classes: usize) -> Self {
        Dataset { images, labels, sample_shape: sample_shape.to_vec(), num_classes, text: None }
    }

    /// Samples per epoch (text: windows).
    pub fn len(&self) -> usize {
        match &self.text {
            Some(t) => t.count,
            None => self.labels.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `[C, H, W]` of an image dataset; `None` for text.
    pub fn chw(&self) -> Option<[usize; 3]> {
        match (&self.text, &self.sample_shape[..]) {
            (None, &[c, h, w]) => Some([c, h, w]),
            _ => None,
        }
    }

    /// Values per sample, `C * H * W`.
    pub fn sample_numel(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// The `i`-th sample's normalized pixels.
    pub fn sample(&self, i: usize) -> &[f32] {
        let n = self.sample_numel();
        &self.images[i * n..(i + 1) * n]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Split {
    Train,
    Test,
}

impl Split {
    /// Stable index, used as the synthetic data's stream index.
    pub fn index(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Test => 1,
        }
    }

    /// File-name prefix of the split in the MNIST distribution.
    pub fn mnist_prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Per-channel normalization as torchvision's `ToTensor` + `Normalize`:
/// `v = pixel / 255`, then `(v - mean[c]) / std[c]`, all in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Normalize {
    /// The usual MNIST statistics (`transforms.Normalize((0.1307,), (0.3081,))`).
    pub fn mnist() -> Self {
        Normalize { mean: vec![0.1307], std: vec![0.3081] }
    }

    /// `data.mean` and `data.std` for images of `channels` channels: a
    /// single value is every channel's (torchvision's `Normalize` broadcasts
    /// a one-element mean and std).
    pub fn broadcast(mean: &[f32], std: &[f32], channels: usize) -> Self {
        let widen = |v: &[f32]| if v.len() == 1 { vec![v[0]; channels] } else { v.to_vec() };
        Normalize { mean: widen(mean), std: widen(std) }
    }

    /// `pixel / 255` only.
    pub fn identity(channels: usize) -> Self {
        Normalize { mean: vec![0.0; channels], std: vec![1.0; channels] }
    }

    /// Checks that there is one finite mean and one finite positive std per
    /// channel; `path` is the data the normalization is applied to.
    pub fn check(&self, path: &Path, channels: usize) -> Result<()> {
        if self.mean.len() != channels || self.std.len() != channels {
            return Err(Error::data(
                path,
                format!(
                    "normalization has {} mean and {} std values but the images have {channels} channel(s); \
                     set `data.mean` and `data.std` to one value per channel",
                    self.mean.len(),
                    self.std.len()
                ),
            ));
        }
        if let Some(m) = self.mean.iter().find(|m| !m.is_finite()) {
            return Err(Error::data(path, format!("normalization mean {m} is not finite")));
        }
        if let Some(s) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(Error::data(path, format!("normalization std {s} must be finite and > 0")));
        }
        Ok(())
    }

    /// Lookup table of the normalized value of every byte, for channel `c`.
    fn table(&self, c: usize) -> [f32; 256] {
        let mut t = [0.0f32; 256];
        for (p, v) in t.iter_mut().enumerate() {
            *v = (p as f32 / 255.0 - self.mean[c]) / self.std[c];
        }
        t
    }

    /// Normalizes `[n, C, H*W]` bytes into f32 (C = `self.mean.len()`; call
    /// `check` first, or a short `std` silently drops channels).
    pub fn apply(&self, pixels: &[u8], plane: usize) -> Vec<f32> {
        let channels = self.mean.len().min(self.std.len());
        let tables: Vec<[f32; 256]> = (0..channels).map(|c| self.table(c)).collect();
        let mut out = Vec::with_capacity(pixels.len());
        if plane == 0 || tables.is_empty() {
            return out;
        }
        for (k, chunk) in pixels.chunks(plane).enumerate() {
            let t = &tables[k % tables.len()];
            out.extend(chunk.iter().map(|&p| t[p as usize]));
        }
        out
    }
}

/// The datasets that ship as MNIST-style IDX files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdxSet {
    Mnist,
    FashionMnist,
}

impl IdxSet {
    fn name(self) -> &'static str {
        match self {
            IdxSet::Mnist => "MNIST",
            IdxSet::FashionMnist => "Fashion-MNIST",
        }
    }

    fn fetch(self) -> &'static str {
        match self {
            IdxSet::Mnist => "run scripts/fetch-mnist.sh to download MNIST there",
            IdxSet::FashionMnist => "run scripts/fetch-fashion-mnist.sh to download Fashion-MNIST there",
        }
    }
}

/// Loads one MNIST split from `dir`: `train-{images-idx3,labels-idx1}-ubyte` or
/// `t10k-...` (each raw or `.gz`). Accepts any count (the 8k/2k files from
/// `scripts/fetch-mnist.sh`, the standard 60k/10k ones) but requires 28x28
/// images, as many labels as images, and labels in 0..10.
pub fn load_mnist(dir: &Path, split: Split, norm: &Normalize) -> Result<Dataset> {
    load_idx(IdxSet::Mnist, dir, split, norm)
}

/// [`load_mnist`] for either IDX dataset (Fashion-MNIST has the same files,
/// shapes and 10 classes).
pub fn load_idx(set: IdxSet, dir: &Path, split: Split, norm: &Normalize) -> Result<Dataset> {
    let (images_path, labels_path) = idx_files(set, dir, split, norm)?;
    let images = idx::read_images(&images_path)?;
    let labels = idx::read_labels(&labels_path)?;
    check_idx(set, (&images_path, images.count, images.rows, images.cols), &labels_path, &labels.labels)?;
    Ok(Dataset::images(
        norm.apply(&images.pixels, images.rows * images.cols),
        labels.labels.iter().map(|&l| l as u32).collect(),
        [1, images.rows, images.cols],
        MNIST_CLASSES,
    ))
}

/// What a split holds, as `ddptrain check` reads it without the pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspected {
    pub sample_shape: Vec<usize>,
    /// The largest label, when the labels were read.
    pub max_label: Option<u32>,
}

/// [`load_idx`]'s checks, reading the images' header only (the labels are
/// small and read whole).
pub fn inspect_idx(set: IdxSet, dir: &Path, split: Split, norm: &Normalize) -> Result<Inspected> {
    let (images_path, labels_path) = idx_files(set, dir, split, norm)?;
    let (count, rows, cols) = idx::read_images_header(&images_path)?;
    let labels = idx::read_labels(&labels_path)?;
    check_idx(set, (&images_path, count, rows, cols), &labels_path, &labels.labels)?;
    Ok(Inspected {
        sample_shape: vec![1, rows, cols],
        max_label: labels.labels.iter().max().map(|&l| u32::from(l)),
    })
}

/// A split's images and labels files, and the normalization checked against them.
fn idx_files(set: IdxSet, dir: &Path, split: Split, norm: &Normalize) -> Result<(PathBuf, PathBuf)> {
    let prefix = split.mnist_prefix();
    let images_path = idx::find_with(dir, &format!("{prefix}-images-idx3-ubyte"), set.fetch())?;
    let labels_path = idx::find_with(dir, &format!("{prefix}-labels-idx1-ubyte"), set.fetch())?;
    norm.check(&images_path, 1)?;
    Ok((images_path, labels_path))
}

/// Images of `set`'s size, as many labels as images, labels in range.
fn check_idx(
    set: IdxSet,
    (images_path, count, rows, cols): (&Path, usize, usize, usize),
    labels_path: &Path,
    labels: &[u8],
) -> Result<()> {
    if (rows, cols) != (MNIST_SIDE, MNIST_SIDE) {
        return Err(Error::data(
            images_path,
            format!("images are {rows}x{cols}, but {} images are {MNIST_SIDE}x{MNIST_SIDE}", set.name()),
        ));
    }
    if labels.len() != count {
        let name = images_path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        return Err(Error::data(
            labels_path,
            format!("count mismatch: {} labels but {name} has {count} images", labels.len()),
        ));
    }
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= MNIST_CLASSES) {
        return Err(Error::data(
            labels_path,
            format!(
                "label {l} at index {i} is out of range: {} labels are 0..={}",
                set.name(),
                MNIST_CLASSES - 1
            ),
        ));
    }
    Ok(())
}
