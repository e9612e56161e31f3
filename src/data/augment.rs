//! torchvision's `RandomCrop(size, padding, fill)` followed by
//! `RandomHorizontalFlip(p)`, applied to training samples as the loader
//! gathers them.
//!
//! Images are normalized once at load time, so padding uses the normalized
//! value of `fill`, `(fill / 255 - mean[c]) / std[c]`: the pixel torchvision
//! would pad a uint8 image with, then `ToTensor` and `Normalize` it.
//!
//! Each sample's draws come from `rng::stream(seed, Augment, epoch * len +
//! sample)`: they depend on the sample and the epoch only, not on the batch
//! it lands in, the rank that visits it, the prefetch depth or a resume.

use super::Normalize;
use crate::rng::{stream, Purpose};
use rand::Rng;

/// `RandomCrop`'s settings with `fill` already normalized per channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Crop {
    pub size: usize,
    pub padding: usize,
    /// The padded value of each channel, normalized.
    pub fill: Vec<f32>,
}

/// The transforms of one run's training samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Augment {
    pub seed: u64,
    pub crop: Option<Crop>,
    /// `RandomHorizontalFlip`'s p; `None`: no flip (and no draw for it).
    pub flip: Option<f64>,
}

/// What was drawn for one sample: the crop's top-left corner in the padded
/// image, and whether the crop is mirrored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    pub top: usize,
    pub left: usize,
    pub flip: bool,
}

impl Crop {
    /// `fill` is a raw pixel value 0..=255 as torchvision takes it for uint8 images.
    pub fn new(size: usize, padding: usize, fill: u8, norm: &Normalize) -> Crop {
        let channels = norm.mean.len().min(norm.std.len());
        let fill = (0..channels).map(|c| (f32::from(fill) / 255.0 - norm.mean[c]) / norm.std[c]).collect();
        Crop { size, padding, fill }
    }
}

impl Augment {
    /// The shape of an augmented sample of `shape` (`[C, H, W]`).
    pub fn out_shape(&self, shape: [usize; 3]) -> [usize; 3] {
        match &self.crop {
            Some(c) => [shape[0], c.size, c.size],
            None => shape,
        }
    }

    /// The draws for sample `index` of a dataset of `len` samples in `epoch`:
    /// the crop's top then left (torchvision's `get_params` order), then the
    /// flip's uniform draw against p. A crop larger than the padded image
    /// (refused by config validation) is taken at the corner.
    pub fn draw(&self, epoch: u64, len: usize, index: usize, shape: [usize; 3]) -> Draw {
        let key = epoch.wrapping_mul(len as u64).wrapping_add(index as u64);
        let mut rng = stream(self.seed, Purpose::Augment, key);
        let [_, h, w] = shape;
        let (mut top, mut left) = (0, 0);
        if let Some(c) = &self.crop {
            let span = |side: usize| side.saturating_add(2 * c.padding).saturating_sub(c.size);
            top = rng.random_range(0..=span(h));
            left = rng.random_range(0..=span(w));
        }
        let flip = self.flip.is_some_and(|p| rng.random::<f64>() < p);
        Draw { top, left, flip }
    }

    /// Appends the augmented `sample` (`[C, H, W]` of `shape`) to `out`.
    pub fn apply(&self, sample: &[f32], shape: [usize; 3], d: Draw, out: &mut Vec<f32>) {
        let [ch, h, w] = shape;
        let (size_h, size_w, pad, fill) = match &self.crop {
            Some(c) => (c.size, c.size, c.padding, c.fill.as_slice()),
            None => (h, w, 0, &[][..]),
        };
        for c in 0..ch {
            let plane = &sample[c * h * w..(c + 1) * h * w];
            let fill_c = fill.get(c).copied().unwrap_or(0.0);
            for y in 0..size_h {
                // Row and column in the unpadded image; outside it is padding.
                let sy = (d.top + y).checked_sub(pad).filter(|&sy| sy < h);
                for x in 0..size_w {
                    let x = if d.flip { size_w - 1 - x } else { x };
                    let sx = (d.left + x).checked_sub(pad).filter(|&sx| sx < w);
                    out.push(match (sy, sx) {
                        (Some(sy), Some(sx)) => plane[sy * w + sx],
                        _ => fill_c,
                    });
                }
            }
        }
    }
}

/// One epoch's augmentation, as the loader thread applies it.
#[derive(Debug, Clone)]
pub struct EpochAugment {
    pub augment: std::sync::Arc<Augment>,
    pub epoch: u64,
}
