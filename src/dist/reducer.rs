//! The DDP gradient reducer (PyTorch's `Reducer`): parameters are assigned to
//! flat buckets in reverse registration order (the order backward produces
//! their gradients), the first bucket capped at `first_bucket_mb` so
//! communication starts early, the rest at `bucket_cap_mb`. As backward
//! finishes a layer, its gradients are marked ready; a bucket whose gradients
//! are all ready starts its all-reduce at once on the communication thread
//! while backward goes on with the earlier layers. [`Reducer::finish`] waits
//! for every bucket, in order, and writes the averaged gradients back.
//!
//! Buffers are handed to the communicator by value, so each bucket is a flat
//! f32 buffer the gradients are copied into (a few hundred KB for the seed
//! ConvNet) rather than memory the parameters' `.grad` points into.

use super::{Buffer, Communicator, ReduceOp, Work, WorkTiming};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketLayout {
    /// Parameter indices (registration order) in this bucket, in the order they
    /// are laid out in the flat buffer.
    pub params: Vec<usize>,
    pub numel: usize,
}

/// PyTorch's `compute_bucket_assignment_by_size`, for one dtype: walk the
/// parameters in reverse registration order, closing a bucket once it holds at
/// least its cap (the first cap `first_bucket_bytes`, then `bucket_cap_bytes`).
pub fn assign_buckets(
    param_sizes: &[usize],
    elem_bytes: usize,
    first_bucket_bytes: usize,
    bucket_cap_bytes: usize,
) -> Vec<BucketLayout> {
    let mut buckets = Vec::new();
    let mut cur = BucketLayout { params: Vec::new(), numel: 0 };
    for i in (0..param_sizes.len()).rev() {
        cur.params.push(i);
        cur.numel += param_sizes[i];
        let cap = if buckets.is_empty() { first_bucket_bytes } else { bucket_cap_bytes };
        if cur.numel * elem_bytes >= cap {
            buckets.push(std::mem::replace(&mut cur, BucketLayout { params: Vec::new(), numel: 0 }));
        }
    }
    if !cur.params.is_empty() {
        buckets.push(cur);
    }
    buckets
}

struct Bucket {
    layout: BucketLayout,
    /// Offset of each of `layout.params` in the flat buffer.
    offsets: Vec<usize>,
    data: Vec<f32>,
    ready: usize,
    work: Option<Work>,
}

/// When a step's bucket all-reduces ran relative to the end of backward
/// (the moment [`Reducer::finish`] was called).
#[derive(Debug, Clone, Default)]
pub struct StepOverlap {
    pub backward_done: Option<Instant>,
    /// One per bucket, in launch order.
    pub buckets: Vec<WorkTiming>,
}

impl StepOverlap {
    /// Buckets whose all-reduce had started before backward finished.
    pub fn started_during_backward(&self) -> usize {
        let Some(done) = self.backward_done else { return 0 };
        self.buckets.iter().filter(|t| t.started.is_some_and(|s| s < done)).count()
    }

    /// The share of all-reduce time that ran while backward was still going.
    pub fn hidden_fraction(&self) -> f64 {
        let Some(done) = self.backward_done else { return 0.0 };
        let (mut hidden, mut total) = (0.0, 0.0);
        for t in &self.buckets {
            if let (Some(s), Some(f)) = (t.started, t.finished) {
                total += f.saturating_duration_since(s).as_secs_f64();
                hidden += done.min(f).saturating_duration_since(s).as_secs_f64();
            }
        }
        if total > 0.0 {
            hidden / total
        } else {
            0.0
        }
    }
}

pub struct Reducer {
    comm: Arc<dyn Communicator>,
    buckets: Vec<Bucket>,
    /// For each parameter: (bucket, slot in the bucket).
    locate: Vec<(usize, usize)>,
    marked: Vec<bool>,
    /// Scale before the all-reduce (1/predivide) and after (predivide/world).
    pre: f32,
    post: f32,
    step: u64,
    last: StepOverlap,
}

impl Reducer {
    pub fn new(
        comm: Arc<dyn Communicator>,
        param_sizes: &[usize],
        first_bucket_mb: f64,
        bucket_cap_mb: f64,
        gradient_predivide_factor: f64,
    ) -> Self {
        let mb = |m: f64| (m * 1024.0 * 1024.0) as usize;
        let layouts = assign_buckets(param_sizes, 4, mb(first_bucket_mb), mb(bucket_cap_mb));
        let mut locate = vec![(0, 0); param_sizes.len()];
        let buckets = layouts
            .into_iter()
            .enumerate()
            .map(|(b, layout)| {
                let mut offsets = Vec::with_capacity(layout.params.len());
                let mut off = 0;
                for (slot, &p) in layout.params.iter().enumerate() {
                    locate[p] = (b, slot);
                    offsets.push(off);
                    off += param_sizes[p];
                }
                Bucket { data: vec![0.0; layout.numel], layout, offsets, ready: 0, work: None }
            })
            .collect();
        let world = comm.world_size() as f64;
        let f = gradient_predivide_factor;
        Reducer {
            comm,
            buckets,
            locate,
            marked: vec![false; param_sizes.len()],
            pre: (1.0 / f) as f32,
            post: (f / world) as f32,
            step: 0,
            last: StepOverlap::default(),
        }
    }

    /// How the last reduced step's communication overlapped its backward.
    pub fn last_overlap(&self) -> &StepOverlap {
        &self.last
    }

    pub fn layouts(&self) -> Vec<&BucketLayout> {
        self.buckets.iter().map(|b| &b.layout).collect()
    }

    /// Marks parameter `index`'s gradient as final for this step. When its
    /// bucket is complete, the bucket's all-reduce starts.
    pub fn mark_ready(&mut self, index: usize, grad: &[f32]) -> Result<()> {
        let (b, slot) = self.locate[index];
        if self.marked[index] {
            return Err(Error::Training(format!(
                "DDP: parameter {index} was marked ready twice in one step"
            )));
        }
        self.marked[index] = true;
        let bucket = &mut self.buckets[b];
        let off = bucket.offsets[slot];
        let dst = &mut bucket.data[off..off + grad.len()];
        if self.pre == 1.0 {
            dst.copy_from_slice(grad);
        } else {
            dst.iter_mut().zip(grad).for_each(|(d, g)| *d = g * self.pre);
        }
        bucket.ready += 1;
        if bucket.ready == bucket.layout.params.len() {
            let data = std::mem::take(&mut bucket.data);
            let label = format!("gradient bucket {b} of step {}", self.step + 1);
            bucket.work = Some(self.comm.all_reduce_async(Buffer::F32(data), ReduceOp::Sum, &label));
        }
        Ok(())
    }

    /// Waits for every bucket (in launch order) and writes the averaged
    /// gradients into `grads` (indexed like the parameters).
    pub fn finish(&mut self, grads: &mut [&mut [f32]]) -> Result<()> {
        self.last = StepOverlap { backward_done: Some(Instant::now()), buckets: Vec::new() };
        if let Some(i) = self.marked.iter().position(|m| !m) {
            return Err(Error::Training(format!(
                "DDP: parameter {i} received no gradient this step; every parameter must take part in the loss"
            )));
        }
        for bucket in &mut self.buckets {
            let work = bucket
                .work
                .take()
                .ok_or_else(|| Error::Training("DDP: a bucket was never launched".into()))?;
            let (result, timing) = work.wait_timed();
            self.last.buckets.push(timing);
            let mut data = result?.into_f32()?;
            if self.post != 1.0 {
                data.iter_mut().for_each(|v| *v *= self.post);
            }
            for (slot, &p) in bucket.layout.params.iter().enumerate() {
                let off = bucket.offsets[slot];
                grads[p].copy_from_slice(&data[off..off + grads[p].len()]);
            }
            bucket.data = data;
            bucket.ready = 0;
        }
        self.marked.iter_mut().for_each(|m| *m = false);
        self.step += 1;
        Ok(())
    }
}
