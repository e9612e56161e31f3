//! `torch.utils.data.DistributedSampler`, except that the epoch's permutation
//! comes from `rng::stream(seed, Sampler, epoch)` instead of torch's generator.

use crate::rng::{stream, Purpose};
use rand::Rng;

/// Which dataset indices rank `rank` of `num_replicas` visits in an epoch.
///
/// Without `drop_last` the (shuffled) index list is padded, by repeating it
/// from the start, to a multiple of `num_replicas`; with `drop_last` its tail
/// is cut instead. Rank `r` then takes every `num_replicas`-th index from `r`.
/// Every rank gets the same count, so no rank waits on a collective that the
/// others never reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    /// Dataset length.
    pub len: usize,
    pub num_replicas: usize,
    pub rank: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
}

impl DistributedSampler {
    /// Samples this rank visits per epoch (torch's `num_samples`).
    pub fn num_samples(&self) -> usize {
        let w = self.num_replicas;
        if w == 0 {
            return 0;
        }
        if self.drop_last && !self.len.is_multiple_of(w) {
            // torch: ceil((len - W) / W), which is floor(len / W) here.
            self.len / w
        } else {
            self.len.div_ceil(w)
        }
    }

    /// Samples all ranks together visit per epoch (torch's `total_size`).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// This rank's dataset indices for `epoch`, in visiting order. Empty when
    /// `rank >= num_replicas`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let all = self.permutation(epoch);
        self.deal(all, self.total_size())
    }

    /// This rank's share of what is left of `epoch` once its first
    /// `consumed` positions are visited (a job of another size visited them:
    /// a resume that changed the world size or the batch). The rest is
    /// padded or cut to a multiple of `num_replicas` as a whole epoch is.
    pub fn indices_after(&self, epoch: u64, consumed: usize) -> Vec<usize> {
        let mut all = self.permutation(epoch);
        let rest = all.split_off(consumed.min(all.len()));
        let w = self.num_replicas.max(1);
        let total = if self.drop_last { rest.len() / w * w } else { rest.len().div_ceil(w) * w };
        self.deal(rest, total)
    }

    /// The epoch's order of the whole dataset.
    fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = stream(self.seed, Purpose::Sampler, epoch);
            // Fisher-Yates, from the back.
            for i in (1..all.len()).rev() {
                let j = rng.random_range(0..=i);
                all.swap(i, j);
            }
        }
        all
    }

    /// `all` cut or padded to `total`, then every `num_replicas`-th from `rank`.
    fn deal(&self, mut all: Vec<usize>, total: usize) -> Vec<usize> {
        if total <= all.len() {
            all.truncate(total);
        } else if !all.is_empty() {
            // Repeat from the start (more than once when len < W - len).
            let mut k = 0;
            while all.len() < total {
                all.push(all[k]);
                k += 1;
            }
        }
        if self.rank >= self.num_replicas {
            return Vec::new();
        }
        all.into_iter().skip(self.rank).step_by(self.num_replicas).collect()
    }
}
