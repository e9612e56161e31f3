//! A seeded random dataset for benchmarks and tests: N(0, 1) pixels (already
//! "normalized") and uniform labels, identical on every rank and every run.

use super::{Dataset, Split};
use crate::rng::{stream, Purpose};
use rand::Rng;
use rand_distr::StandardNormal;

/// `n` samples of `sample_shape` (`[C, H, W]`) with labels in `0..num_classes`.
/// Sample by sample (image, then label) from the stream of `(seed, split)`, so
/// the first `k` samples do not depend on `n`.
///
/// `num_classes` must be at least 1 (config validation refuses 0).
pub fn synthetic(seed: u64, split: Split, n: usize, sample_shape: [usize; 3], num_classes: usize) -> Dataset {
    assert!(num_classes > 0, "synthetic: num_classes must be at least 1");
    let mut rng = stream(seed, Purpose::Synthetic, split.index());
    let per: usize = sample_shape.iter().product();
    let mut images = Vec::with_capacity(n * per);
    let mut labels = Vec::with_capacity(n);
    for _ in 0..n {
        images.extend((0..per).map(|_| rng.sample::<f32, _>(StandardNormal)));
        labels.push(rng.random_range(0..num_classes) as u32);
    }
    Dataset::images(images, labels, sample_shape, num_classes)
}
