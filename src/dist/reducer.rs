//! The DDP gradient reducer (PyTorch's `Reducer`): parameters are assigned to
//! flat buckets in reverse registration order (the order backward produces
//! their gradients), one dtype per bucket as PyTorch does (under apex O2 the
//! f16 conv/linear gradients and the f32 BatchNorm gradients go to separate
//! buckets), the first bucket of each dtype capped at `first_bucket_mb` so
//! communication starts early, the rest at `bucket_cap_mb`, sizes counted in
//! bytes of the gradient's dtype. As backward finishes a layer, its gradients
//! are marked ready; a bucket whose gradients are all ready starts its
//! all-reduce at once on the communication thread while backward goes on with
//! the earlier layers. [`Reducer::finish`] waits for every bucket and writes
//! the averaged gradients back.
//!
//! Averaging is apex's: gradients are multiplied by 1/`gradient_predivide_factor`
//! on the way into the bucket and by factor/world after the sum, so that f16
//! sums over many ranks stay below f16's maximum. f16 buckets are reduced in
//! f16 unless `allreduce_fp32`, which widens them to f32 for the all-reduce and
//! rounds once on the way back (apex's `allreduce_always_fp32`).
//!
//! The last bucket carries [`VOTE_LEN`] more elements after its gradients:
//! each rank's stop request and rank 0's call for a timed checkpoint
//! (src/train/stop.rs), summed unscaled with the gradients, so the ranks
//! agree on the step to stop or save after without a collective of its own.
//!
//! Buffers are handed to the communicator by value, so each bucket is a flat
//! buffer the gradients are copied into (a few hundred KB for the seed
//! ConvNet) rather than memory the parameters' `.grad` points into.

use super::{Buffer, Communicator, ReduceOp, Work, WorkTiming};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use crate::train::stop::VOTE_LEN;
use half::f16;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketLayout {
    /// Parameter indices (registration order) in this bucket, in the order they
    /// are laid out in the flat buffer.
    pub params: Vec<usize>,
    pub numel: usize,
    /// The gradients' dtype (every parameter of a bucket has it).
    pub dtype: DType,
}

fn elem_bytes(d: DType) -> usize {
    match d {
        DType::F32 => 4,
        DType::F16 => 2,
    }
}

/// PyTorch's `compute_bucket_assignment_by_size`: walk the parameters
/// (`(numel, dtype)` in registration order) in reverse, keeping one open
/// bucket per dtype and closing it once it holds at least its cap in bytes
/// (each dtype's first cap `first_bucket_bytes`, then `bucket_cap_bytes`).
/// Buckets come out in the order their first gradient becomes ready.
pub fn assign_buckets(
    params: &[(usize, DType)],
    first_bucket_bytes: usize,
    bucket_cap_bytes: usize,
) -> Vec<BucketLayout> {
    // (open bucket, buckets of this dtype closed so far), per dtype.
    let mut open: Vec<(BucketLayout, usize)> = Vec::new();
    let mut buckets = Vec::new();
    for i in (0..params.len()).rev() {
        let (numel, dtype) = params[i];
        let k = match open.iter().position(|(b, _)| b.dtype == dtype) {
            Some(k) => k,
            None => {
                open.push((BucketLayout { params: Vec::new(), numel: 0, dtype }, 0));
                open.len() - 1
            }
        };
        let (cur, closed) = &mut open[k];
        cur.params.push(i);
        cur.numel += numel;
        let cap = if *closed == 0 { first_bucket_bytes } else { bucket_cap_bytes };
        if cur.numel * elem_bytes(dtype) >= cap {
            buckets.push(std::mem::replace(cur, BucketLayout { params: Vec::new(), numel: 0, dtype }));
            *closed += 1;
        }
    }
    buckets.extend(open.into_iter().map(|(b, _)| b).filter(|b| !b.params.is_empty()));
    // The first parameter of a bucket is the first of its gradients backward produces.
    buckets.sort_by_key(|b| std::cmp::Reverse(b.params[0]));
    buckets
}

/// How [`Reducer`] averages and in which dtype it communicates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReducerOptions {
    pub first_bucket_mb: f64,
    pub bucket_cap_mb: f64,
    pub gradient_predivide_factor: f64,
    /// Reduce f16 buckets in f32 (apex's `allreduce_always_fp32`).
    pub allreduce_fp32: bool,
}

impl ReducerOptions {
    pub fn from_config(p: &crate::config::ParallelConfig) -> Self {
        ReducerOptions {
            first_bucket_mb: p.first_bucket_mb,
            bucket_cap_mb: p.bucket_cap_mb,
            gradient_predivide_factor: p.gradient_predivide_factor,
            allreduce_fp32: p.allreduce_fp32,
        }
    }
}

struct Bucket {
    layout: BucketLayout,
    /// Offset of each of `layout.params` in the flat buffer.
    offsets: Vec<usize>,
    /// The flat buffer in the dtype it is reduced in; empty while its
    /// all-reduce is in flight.
    data: Buffer,
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
    /// Buckets whose all-reduce was submitted before backward finished: the
    /// reducer's own ordering, whatever the scheduler did with the
    /// communication thread.
    pub fn submitted_during_backward(&self) -> usize {
        let Some(done) = self.backward_done else { return 0 };
        self.buckets.iter().filter(|t| t.submitted.is_some_and(|s| s < done)).count()
    }

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
    poison: bool,
    /// What it was built for: `(numel, dtype)` per parameter.
    params: Vec<(usize, DType)>,
    /// This rank's stop request for the step, and the last step's sum over ranks.
    vote: [f32; VOTE_LEN],
    agreed: [f32; VOTE_LEN],
}

impl Reducer {
    /// Buckets for parameters of `(numel, dtype)` in registration order; the
    /// gradients marked ready later must have these dtypes.
    pub fn new(comm: Arc<dyn Communicator>, params: &[(usize, DType)], opts: &ReducerOptions) -> Self {
        let mb = |m: f64| (m * 1024.0 * 1024.0) as usize;
        let layouts = assign_buckets(params, mb(opts.first_bucket_mb), mb(opts.bucket_cap_mb));
        let mut locate = vec![(0, 0); params.len()];
        let last = layouts.len().saturating_sub(1);
        let buckets = layouts
            .into_iter()
            .enumerate()
            .map(|(b, layout)| {
                let mut offsets = Vec::with_capacity(layout.params.len());
                let mut off = 0;
                for (slot, &p) in layout.params.iter().enumerate() {
                    locate[p] = (b, slot);
                    offsets.push(off);
                    off += params[p].0;
                }
                let len = layout.numel + if b == last { VOTE_LEN } else { 0 };
                let data = match (layout.dtype, opts.allreduce_fp32) {
                    (DType::F16, false) => Buffer::F16(vec![f16::ZERO; len]),
                    _ => Buffer::F32(vec![0.0; len]),
                };
                Bucket { data, layout, offsets, ready: 0, work: None }
            })
            .collect();
        let world = comm.world_size() as f64;
        let f = opts.gradient_predivide_factor;
        Reducer {
            comm,
            buckets,
            locate,
            marked: vec![false; params.len()],
            pre: (1.0 / f) as f32,
            post: (f / world) as f32,
            step: 0,
            last: StepOverlap::default(),
            poison: false,
            params: params.to_vec(),
            vote: [0.0; VOTE_LEN],
            agreed: [0.0; VOTE_LEN],
        }
    }

    /// The `(numel, dtype)` of each parameter it was built for.
    pub fn params(&self) -> &[(usize, DType)] {
        &self.params
    }

    /// How the last reduced step's communication overlapped its backward.
    pub fn last_overlap(&self) -> &StepOverlap {
        &self.last
    }

    pub fn layouts(&self) -> Vec<&BucketLayout> {
        self.buckets.iter().map(|b| &b.layout).collect()
    }

    /// The dtype each bucket is all-reduced in.
    pub fn reduce_dtypes(&self) -> Vec<super::DType> {
        self.buckets.iter().map(|b| b.data.dtype()).collect()
    }

    /// This rank's vote (`stop::Vote::elements`), sent with the next step's last bucket.
    pub fn set_vote(&mut self, vote: [f32; VOTE_LEN]) {
        self.vote = vote;
    }

    /// The votes of the last finished step, summed over the ranks.
    pub fn agreed_vote(&self) -> [f32; VOTE_LEN] {
        self.agreed
    }

    /// Testing hook: the next gradient marked ready enters its bucket with an
    /// inf in its first element, as if this rank's backward had overflowed.
    pub fn inject_inf_next(&mut self) {
        self.poison = true;
    }

    /// Marks parameter `index`'s gradient as final for this step. When its
    /// bucket is complete, the bucket's all-reduce starts.
    pub fn mark_ready(&mut self, index: usize, grad: &Tensor) -> Result<()> {
        let &(b, slot) = self.locate.get(index).ok_or_else(|| {
            Error::Training(format!("DDP: parameter {index} is not one the reducer was built for"))
        })?;
        if self.marked[index] {
            return Err(Error::Training(format!(
                "DDP: parameter {index} was marked ready twice in one step"
            )));
        }
        let bucket = &mut self.buckets[b];
        if grad.dtype() != bucket.layout.dtype {
            return Err(Error::Training(format!(
                "DDP: parameter {index} has a {:?} gradient but its bucket holds {:?} gradients; \
                 the model's dtypes changed after the reducer was built",
                grad.dtype(),
                bucket.layout.dtype
            )));
        }
        self.marked[index] = true;
        let off = bucket.offsets[slot];
        let pre = self.pre;
        match (&mut bucket.data, grad.dtype()) {
            (Buffer::F32(d), DType::F32) => {
                scale_into(&mut d[off..off + grad.numel()], grad.as_f32()?, pre, |v| v)
            }
            (Buffer::F32(d), DType::F16) => {
                scale_into(&mut d[off..off + grad.numel()], grad.as_f16()?, pre, |v| v)
            }
            // In f16 the predivision rounds, as apex's in-place `mul_` on the f16 bucket does.
            (Buffer::F16(d), DType::F16) => {
                scale_into(&mut d[off..off + grad.numel()], grad.as_f16()?, pre, f16::from_f32)
            }
            (Buffer::F16(_), DType::F32) => {
                return Err(Error::Training("DDP: an f32 gradient in an f16 bucket".into()))
            }
        }
        if std::mem::take(&mut self.poison) {
            match &mut bucket.data {
                Buffer::F32(d) => d[off] = f32::INFINITY,
                Buffer::F16(d) => d[off] = f16::INFINITY,
            }
        }
        bucket.ready += 1;
        if bucket.ready == bucket.layout.params.len() {
            if b + 1 == self.buckets.len() {
                write_vote(&mut self.buckets[b], self.vote);
            }
            let bucket = &mut self.buckets[b];
            let data = std::mem::replace(&mut bucket.data, Buffer::F32(Vec::new()));
            let label = format!("gradient bucket {b} of step {}", self.step + 1);
            bucket.work = Some(self.comm.all_reduce_async(data, ReduceOp::Sum, &label));
        }
        Ok(())
    }

    /// Waits for every bucket (in launch order) and writes the averaged
    /// gradients into `grads` (indexed like the parameters, in their dtypes).
    pub fn finish(&mut self, grads: &mut [&mut Tensor]) -> Result<()> {
        let last = self.buckets.len().saturating_sub(1);
        self.last = StepOverlap { backward_done: Some(Instant::now()), buckets: Vec::new() };
        if let Some(i) = self.marked.iter().position(|m| !m) {
            return Err(Error::Training(format!(
                "DDP: parameter {i} received no gradient this step; every parameter must take part in the loss"
            )));
        }
        let post = self.post;
        for (b, bucket) in self.buckets.iter_mut().enumerate() {
            let work = bucket
                .work
                .take()
                .ok_or_else(|| Error::Training("DDP: a bucket was never launched".into()))?;
            let (result, timing) = work.wait_timed();
            self.last.buckets.push(timing);
            let data = result?;
            for (slot, &p) in bucket.layout.params.iter().enumerate() {
                let off = bucket.offsets[slot];
                let g = &mut *grads[p];
                let n = g.numel();
                // Post-scale in f32 and round once into the gradient's dtype.
                match (&data, g.dtype()) {
                    (Buffer::F32(d), DType::F32) => {
                        scale_into(g.as_f32_mut()?, &d[off..off + n], post, |v| v)
                    }
                    (Buffer::F32(d), DType::F16) => {
                        scale_into(g.as_f16_mut()?, &d[off..off + n], post, f16::from_f32)
                    }
                    (Buffer::F16(d), DType::F16) => {
                        scale_into(g.as_f16_mut()?, &d[off..off + n], post, f16::from_f32)
                    }
                    (Buffer::F16(_), DType::F32) => {
                        return Err(Error::Training("DDP: an f32 gradient in an f16 bucket".into()))
                    }
                }
            }
            if b == last {
                self.agreed = read_vote(&data, bucket.layout.numel)?;
            }
            bucket.data = data;
            bucket.ready = 0;
        }
        self.marked.iter_mut().for_each(|m| *m = false);
        self.step += 1;
        Ok(())
    }
}

/// The vote's elements after the last bucket's gradients.
fn write_vote(bucket: &mut Bucket, vote: [f32; VOTE_LEN]) {
    let n = bucket.layout.numel;
    match &mut bucket.data {
        Buffer::F32(d) => d[n..n + VOTE_LEN].copy_from_slice(&vote),
        Buffer::F16(d) => d[n..n + VOTE_LEN].iter_mut().zip(vote).for_each(|(d, v)| *d = f16::from_f32(v)),
    }
}

fn read_vote(data: &Buffer, numel: usize) -> Result<[f32; VOTE_LEN]> {
    let mut vote = [0.0; VOTE_LEN];
    let got = match data {
        Buffer::F32(d) => d.get(numel..numel + VOTE_LEN).map(|s| vote.copy_from_slice(s)),
        Buffer::F16(d) => {
            d.get(numel..numel + VOTE_LEN).map(|s| vote.iter_mut().zip(s).for_each(|(v, x)| *v = x.to_f32()))
        }
    };
    got.ok_or_else(|| {
        Error::Training(format!(
            "DDP: the last gradient bucket came back with {} elements, not its {numel} and the stop vote",
            data.len()
        ))
    })?;
    Ok(vote)
}

/// `dst = to(src * scale)` with the product in f32; a plain copy when `scale` is 1.
fn scale_into<S: Copy + Into<f32>, D>(dst: &mut [D], src: &[S], scale: f32, to: impl Fn(f32) -> D) {
    if scale == 1.0 {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = to(s.into()));
    } else {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d = to(s.into() * scale));
    }
}
