//! PyTorch's `Reducer` on device buckets. A bucket's gradients are one
//! allocation ([`DeviceParams`]); when backward has produced all of them, an
//! event recorded on the compute stream orders the communication stream after
//! that backward, and the communication stream scales, all-reduces and scales
//! the bucket while the compute stream goes on with the earlier layers. The
//! arithmetic is the CPU reducer's (src/dist/reducer.rs) step for step, so
//! both backends produce the same bits: apex's `1/predivide` before the sum
//! and `predivide/world` after it, f16 buckets reduced in f16 unless
//! `allreduce_fp32`, which reduces an f32 copy and rounds once on the way back.
//!
//! The last bucket's all-reduce also sums the ranks' votes (a stop, a timed
//! save), `VOTE_LEN` elements after its gradients (never scaled), and copies the sum into
//! [`DeviceReducer::vote`] for the step's loss-scaler snapshot: the host
//! learns it one step late without a collective of its own (src/train/stop.rs).
//!
//! Every NCCL collective of the reducer, those the trainer asks for on the
//! compute stream's behalf included, runs on the one communication stream:
//! NCCL kernels of one communicator on two streams can run at once and
//! deadlock when ranks start them in different orders (PyTorch's process
//! group likewise keeps one NCCL stream per device).

use super::{hidden_fraction, internal, scale, DeviceComm, ReadyTracker, ReduceElem, Staging};
use crate::cuda::Gpu;
use crate::dist::reducer::{assign_buckets, ReducerOptions};
use crate::dist::{Buffer, Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::nn::cuda::params::{DevBuf, DeviceParams};
use crate::tensor::DType;
use crate::train::stop::VOTE_LEN;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaViewMut, PinnedHostSlice};
use half::f16;
use std::sync::Arc;

struct BucketState {
    numel: usize,
    /// Elements after the gradients: the stop vote in the last bucket, else none.
    tail: usize,
    dtype: DType,
    /// allreduce_fp32 of an f16 bucket: the f32 copy it is reduced in.
    scratch: Option<CudaSlice<f32>>,
    /// The TCP path's host copy (exactly `numel + tail` long, as the copies need).
    staging: Option<Staging>,
}

/// Timing events of one step, on the communication stream (each bucket's
/// start and end) and the compute stream (the end of backward).
struct StepEvents {
    start: Vec<CudaEvent>,
    end: Vec<CudaEvent>,
    backward_done: CudaEvent,
}

pub struct DeviceReducer {
    comm: DeviceComm,
    world: usize,
    stream: Arc<CudaStream>,
    tracker: ReadyTracker,
    buckets: Vec<BucketState>,
    /// Scale before the all-reduce (1/predivide) and after (predivide/world).
    pre: f32,
    post: f32,
    inject_inf: bool,
    /// This rank's stop vote for the next step, and the last step's sum over ranks.
    vote_local: [f32; VOTE_LEN],
    vote: CudaSlice<f32>,
    /// Orders the communication stream after the compute stream, and back.
    to_comm: CudaEvent,
    to_compute: CudaEvent,
    /// Two sets, alternating by step, so the last finished step's events are
    /// still intact while the next step records into the other set.
    events: [StepEvents; 2],
    step: u64,
    /// The set holding the last finished step's timings.
    last_timed: Option<usize>,
    /// Test only: leave out the hand-off event between a bucket's last
    /// gradient kernel and its all-reduce, to show the emulated device's
    /// race checker finds the missing edge (tests_race.rs).
    #[cfg(test)]
    pub(super) omit_hand_off: bool,
}

fn cuda(op: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::cuda(op, e)
}

impl DeviceReducer {
    pub fn new(
        gpu: &Arc<Gpu>,
        comm: DeviceComm,
        params: &DeviceParams,
        opts: &ReducerOptions,
    ) -> Result<Self> {
        let spec: Vec<(usize, DType)> = params.slots.iter().map(|s| (s.numel, s.dtype)).collect();
        let (first, cap) = super::bucket_bytes(opts);
        let want = assign_buckets(&spec, first, cap);
        if want.len() != params.buckets.len() || want.iter().zip(&params.buckets).any(|(w, b)| *w != b.layout)
        {
            return Err(internal(format!(
                "the device gradient buckets are not those of first_bucket_mb = {} and bucket_cap_mb = {}: \
                 build DeviceParams with dist::cuda::bucket_bytes of the reducer's options",
                opts.first_bucket_mb, opts.bucket_cap_mb
            )));
        }
        let names = params.slots.iter().map(|s| s.name.clone()).collect();
        let members: Vec<Vec<usize>> = params.buckets.iter().map(|b| b.layout.params.clone()).collect();
        let tracker = ReadyTracker::new(names, &members)?;
        let stream = gpu.ctx().new_stream().map_err(cuda("creating the DDP communication stream"))?;
        let tcp = matches!(comm, DeviceComm::Tcp(_));
        let last = params.buckets.len().saturating_sub(1);
        let buckets = params
            .buckets
            .iter()
            .enumerate()
            .map(|(k, b)| {
                let (numel, dtype) = (b.layout.numel, b.layout.dtype);
                let tail = if k == last { VOTE_LEN } else { 0 };
                let widen = dtype == DType::F16 && opts.allreduce_fp32;
                let scratch = if widen {
                    Some(
                        stream
                            .alloc_zeros::<f32>((numel + tail).max(1))
                            .map_err(cuda("allocating DDP f32 scratch"))?,
                    )
                } else {
                    None
                };
                let staging = match (tcp, widen || dtype == DType::F32) {
                    (false, _) => None,
                    (true, true) => Some(Staging::F32(pinned(gpu, numel + tail)?)),
                    (true, false) => Some(Staging::F16(pinned(gpu, numel + tail)?)),
                };
                Ok(BucketState { numel, tail, dtype, scratch, staging })
            })
            .collect::<Result<Vec<_>>>()?;
        let n = buckets.len();
        let vote = stream.alloc_zeros::<f32>(VOTE_LEN).map_err(cuda("allocating the DDP stop vote"))?;
        let events = [step_events(gpu, n)?, step_events(gpu, n)?];
        // Compile kernels/ddp.cu now rather than inside the first backward.
        gpu.kernel(&scale::DDP_SCALE.f32)?;
        let world = comm.world_size();
        let f = opts.gradient_predivide_factor;
        Ok(DeviceReducer {
            comm,
            world,
            stream,
            tracker,
            buckets,
            pre: (1.0 / f) as f32,
            post: (f / world as f64) as f32,
            inject_inf: false,
            vote_local: [0.0; VOTE_LEN],
            vote,
            to_comm: event(gpu, false)?,
            to_compute: event(gpu, false)?,
            events,
            step: 0,
            last_timed: None,
            #[cfg(test)]
            omit_hand_off: false,
        })
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Testing hook (`DDPTRAIN_INJECT_GRAD_INF`): the next bucket launched
    /// gets an inf in its first element before its all-reduce, as if this
    /// rank's backward had overflowed, so every rank sees the overflow.
    pub fn inject_inf_next(&mut self) {
        self.inject_inf = true;
    }

    /// This rank's vote (`stop::Vote::elements`), sent with the next step's last bucket.
    pub fn set_vote(&mut self, vote: [f32; VOTE_LEN]) {
        self.vote_local = vote;
    }

    /// The last reduced step's votes summed over the ranks (`VOTE_LEN` f32),
    /// written on the communication stream: read it on the compute stream
    /// after [`DeviceReducer::finish`].
    pub fn vote(&self) -> &CudaSlice<f32> {
        &self.vote
    }

    /// Params whose gradients backward has just launched (registration
    /// indices). Buckets they complete start their all-reduce on the
    /// communication stream, in bucket order; the host does not wait for NCCL.
    pub fn mark_ready(&mut self, gpu: &Gpu, params: &mut DeviceParams, ready: &[usize]) -> Result<()> {
        self.check_params(params)?;
        let launch = self.tracker.mark(ready)?;
        if launch.is_empty() {
            return Ok(());
        }
        #[cfg(test)]
        let hand_off = !self.omit_hand_off;
        #[cfg(not(test))]
        let hand_off = true;
        if hand_off {
            self.comm_after_compute(gpu)?;
        }
        for b in launch {
            self.launch_bucket(gpu, params, b)?;
        }
        Ok(())
    }

    /// End of the synchronizing backward: every bucket must have been
    /// launched (else PyTorch's "Expected to have finished reduction" error,
    /// naming the parameters never marked ready). The compute stream waits
    /// for the communication stream; the host does not. Resets for the next step.
    pub fn finish(&mut self, gpu: &Gpu, params: &mut DeviceParams) -> Result<()> {
        self.check_params(params)?;
        let set = self.set();
        self.events[set].backward_done.record(gpu.stream()).map_err(cuda("recording the end of backward"))?;
        // The compute stream waits even when a bucket is missing: the launched
        // ones are still in flight on gradients the caller owns.
        self.compute_after_comm(gpu)?;
        self.last_timed = None;
        self.step += 1;
        self.tracker.finish()?;
        self.last_timed = Some(set);
        Ok(())
    }

    /// Sum `buf` over ranks in place, in compute-stream order (SyncBatchNorm
    /// statistics, evaluation totals).
    pub fn all_reduce_sum_f32(
        &mut self,
        gpu: &Gpu,
        buf: &mut CudaViewMut<'_, f32>,
        what: &str,
    ) -> Result<()> {
        match &self.comm {
            DeviceComm::Nccl(c) => {
                self.comm_after_compute(gpu)?;
                c.all_reduce_sum(buf, &self.stream)?;
                self.compute_after_comm(gpu)
            }
            DeviceComm::Tcp(c) => through_host(gpu, buf, |b| c.all_reduce(b, ReduceOp::Sum, what)),
        }
    }

    /// Rank 0's parameter values (every group) to every rank (the DDP constructor).
    pub fn broadcast_from_rank0(&mut self, gpu: &Gpu, params: &mut DeviceParams) -> Result<()> {
        self.check_params(params)?;
        match &self.comm {
            DeviceComm::Nccl(c) => {
                self.comm_after_compute(gpu)?;
                let stream = &self.stream;
                c.group(|c| {
                    for g in params.groups.iter_mut().filter(|g| g.numel > 0) {
                        match &mut g.values {
                            DevBuf::F32(v) => c.broadcast(&mut v.slice_mut(0..g.numel), 0, stream)?,
                            DevBuf::F16(v) => c.broadcast(&mut v.slice_mut(0..g.numel), 0, stream)?,
                        }
                    }
                    Ok(())
                })?;
                self.compute_after_comm(gpu)
            }
            DeviceComm::Tcp(c) => {
                for (k, g) in params.groups.iter_mut().enumerate().filter(|(_, g)| g.numel > 0) {
                    let what = format!("initial parameter broadcast ({:?} group {k})", g.dtype);
                    match &mut g.values {
                        DevBuf::F32(v) => {
                            through_host(gpu, &mut v.slice_mut(0..g.numel), |b| c.broadcast(b, 0, &what))?
                        }
                        DevBuf::F16(v) => {
                            through_host(gpu, &mut v.slice_mut(0..g.numel), |b| c.broadcast(b, 0, &what))?
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Rank 0's `buf` to every rank (BatchNorm running statistics).
    pub fn broadcast_f32(&mut self, gpu: &Gpu, buf: &mut CudaViewMut<'_, f32>, what: &str) -> Result<()> {
        self.broadcast(gpu, buf, what)
    }

    pub fn broadcast_f16(&mut self, gpu: &Gpu, buf: &mut CudaViewMut<'_, f16>, what: &str) -> Result<()> {
        self.broadcast(gpu, buf, what)
    }

    fn broadcast<T: ReduceElem>(
        &mut self,
        gpu: &Gpu,
        buf: &mut CudaViewMut<'_, T>,
        what: &str,
    ) -> Result<()> {
        match &self.comm {
            DeviceComm::Nccl(c) => {
                self.comm_after_compute(gpu)?;
                c.broadcast(buf, 0, &self.stream)?;
                self.compute_after_comm(gpu)
            }
            DeviceComm::Tcp(c) => through_host(gpu, buf, |b| c.broadcast(b, 0, what)),
        }
    }

    /// Share of all-reduce time hidden behind backward in the last finished
    /// step, from its CUDA events. Waits for those events, so call it only
    /// when the figure is wanted (logging steps); `None` before the first step.
    pub fn last_hidden_fraction(&self) -> Result<Option<f64>> {
        let Some(set) = self.last_timed else { return Ok(None) };
        let ev = &self.events[set];
        let mut spans = Vec::with_capacity(ev.start.len());
        for (s, e) in ev.start.iter().zip(&ev.end) {
            let rel = |x: &CudaEvent| {
                ev.backward_done.elapsed_ms(x).map(f64::from).map_err(cuda("reading DDP timing events"))
            };
            spans.push((rel(s)?, rel(e)?));
        }
        Ok(Some(hidden_fraction(&spans)))
    }

    fn set(&self) -> usize {
        (self.step % 2) as usize
    }

    fn comm_after_compute(&self, gpu: &Gpu) -> Result<()> {
        self.to_comm.record(gpu.stream()).map_err(cuda("recording the DDP hand-off event"))?;
        self.stream.wait(&self.to_comm).map_err(cuda("ordering the DDP stream after backward"))
    }

    fn compute_after_comm(&self, gpu: &Gpu) -> Result<()> {
        self.to_compute.record(&self.stream).map_err(cuda("recording the DDP completion event"))?;
        gpu.stream().wait(&self.to_compute).map_err(cuda("ordering the compute stream after DDP"))
    }

    /// The gradients must be laid out as the reducer was built for.
    fn check_params(&self, params: &DeviceParams) -> Result<()> {
        let ok = params.buckets.len() == self.buckets.len()
            && params.buckets.iter().zip(&self.buckets).all(|(p, s)| {
                let len = match &p.grads {
                    DevBuf::F32(g) => g.len(),
                    DevBuf::F16(g) => g.len(),
                };
                p.layout.numel == s.numel && p.grads.dtype() == s.dtype && len >= s.numel + s.tail
            });
        if ok {
            Ok(())
        } else {
            Err(internal("the device parameters are not the ones the reducer was built for"))
        }
    }

    /// Scale, all-reduce and scale bucket `b` on the communication stream
    /// (already ordered after the compute stream).
    fn launch_bucket(&mut self, gpu: &Gpu, params: &mut DeviceParams, b: usize) -> Result<()> {
        let set = self.set();
        let stream = &self.stream;
        self.events[set].start[b].record(stream).map_err(cuda("recording a DDP timing event"))?;
        let poison = std::mem::take(&mut self.inject_inf);
        let label = format!("gradient bucket {b} of step {}", self.step + 1);
        let st = &mut self.buckets[b];
        let (n, tail) = (st.numel, st.tail);
        let vote = (tail > 0).then_some(self.vote_local);
        let r = Reduce {
            gpu,
            comm: &self.comm,
            stream,
            pre: self.pre,
            post: self.post,
            poison,
            vote,
            label: &label,
        };
        let out = &mut self.vote;
        match (&mut params.buckets[b].grads, st.scratch.as_mut()) {
            (DevBuf::F32(g), _) => {
                r.run(&mut g.slice_mut(0..n + tail), n, st.staging.as_mut())?;
                if tail > 0 {
                    stream.memcpy_dtod(&g.slice(n..n + tail), out).map_err(cuda("copying the stop vote"))?;
                }
            }
            (DevBuf::F16(g), None) => {
                r.run(&mut g.slice_mut(0..n + tail), n, st.staging.as_mut())?;
                if tail > 0 {
                    scale::widen_scale(gpu, stream, &g.slice(n..n + tail), out, 1.0)?;
                }
            }
            (DevBuf::F16(g), Some(scratch)) => {
                let mut g = g.slice_mut(0..n);
                scale::widen_scale(gpu, stream, &g, &mut scratch.slice_mut(0..n), r.pre)?;
                let mut w = scratch.slice_mut(0..n + tail);
                Reduce { pre: 1.0, post: 1.0, ..r }.run(&mut w, n, st.staging.as_mut())?;
                scale::narrow_scale(gpu, stream, &w.slice(0..n), &mut g, r.post)?;
                if tail > 0 {
                    stream.memcpy_dtod(&w.slice(n..n + tail), out).map_err(cuda("copying the stop vote"))?;
                }
            }
        }
        self.events[set].end[b].record(stream).map_err(cuda("recording a DDP timing event"))?;
        Ok(())
    }
}

/// One bucket's trip through the all-reduce, on the communication stream.
#[derive(Clone, Copy)]
struct Reduce<'a> {
    gpu: &'a Gpu,
    comm: &'a DeviceComm,
    stream: &'a Arc<CudaStream>,
    pre: f32,
    post: f32,
    poison: bool,
    /// This rank's stop vote, written after the `grads` gradients of the buffer.
    vote: Option<[f32; VOTE_LEN]>,
    label: &'a str,
}

impl Reduce<'_> {
    /// Sums `x` over the ranks: its first `grads` elements are gradients
    /// (scaled before and after), the rest the stop vote (summed as it is).
    fn run<T: ReduceElem>(
        &self,
        x: &mut CudaViewMut<'_, T>,
        grads: usize,
        staging: Option<&mut Staging>,
    ) -> Result<()> {
        if x.is_empty() {
            return Ok(());
        }
        // A scale of 1 is skipped, as the CPU reducer's plain copy.
        if self.pre != 1.0 {
            scale::scale(self.gpu, self.stream, &mut x.slice_mut(0..grads), self.pre)?;
        }
        if self.poison {
            scale::fill(self.gpu, self.stream, &mut x.slice_mut(0..1), f32::INFINITY)?;
        }
        if let Some(vote) = self.vote {
            for (i, v) in vote.into_iter().enumerate() {
                let at = grads + i;
                scale::fill(self.gpu, self.stream, &mut x.slice_mut(at..at + 1), v)?;
            }
        }
        match self.comm {
            DeviceComm::Nccl(c) => c.all_reduce_sum(x, self.stream)?,
            DeviceComm::Tcp(c) => {
                let pinned = staging
                    .and_then(T::staging)
                    .ok_or_else(|| internal(format!("{} has no host staging buffer", self.label)))?;
                self.staged_all_reduce(&**c, x, pinned)?;
            }
        }
        if self.post != 1.0 {
            scale::scale(self.gpu, self.stream, &mut x.slice_mut(0..grads), self.post)?;
        }
        Ok(())
    }

    /// Device -> pinned host -> TCP all-reduce -> pinned host -> device. The
    /// host waits for the copy out (this bucket's backward and the scaling
    /// before it); the copy back is left queued on the communication stream.
    fn staged_all_reduce<T: ReduceElem>(
        &self,
        comm: &dyn Communicator,
        x: &mut CudaViewMut<'_, T>,
        pinned: &mut PinnedHostSlice<T>,
    ) -> Result<()> {
        let n = x.len();
        if pinned.len() != n {
            return Err(internal(format!("{}: staging holds {} of {n} elements", self.label, pinned.len())));
        }
        let s = self.stream;
        s.memcpy_dtoh(&*x, pinned).map_err(cuda("copying a gradient bucket to the host"))?;
        s.synchronize().map_err(cuda("waiting for a gradient bucket's copy to the host"))?;
        let host = pinned.as_slice().map_err(cuda("reading the DDP staging buffer"))?.to_vec();
        let out = T::from_buffer(comm.all_reduce(T::into_buffer(host), ReduceOp::Sum, self.label)?)?;
        if out.len() != n {
            return Err(internal(format!(
                "{}: the all-reduce returned {} of {n} elements",
                self.label,
                out.len()
            )));
        }
        pinned.as_mut_slice().map_err(cuda("writing the DDP staging buffer"))?.copy_from_slice(&out);
        s.memcpy_htod(&*pinned, x).map_err(cuda("copying a reduced gradient bucket to the device"))
    }
}

/// A host-synchronous collective on `buf` in compute-stream order: download,
/// `op`, upload (the TCP backend).
fn through_host<T: ReduceElem>(
    gpu: &Gpu,
    buf: &mut CudaViewMut<'_, T>,
    op: impl FnOnce(Buffer) -> Result<Buffer>,
) -> Result<()> {
    let n = buf.len();
    if n == 0 {
        return Ok(());
    }
    let s = gpu.stream();
    let host = s.clone_dtoh(&*buf).map_err(cuda("copying a buffer to the host for a collective"))?;
    s.synchronize().map_err(cuda("waiting for a buffer's copy to the host"))?;
    let out = T::from_buffer(op(T::into_buffer(host))?)?;
    if out.len() != n {
        return Err(internal(format!("a collective returned {} of {n} elements", out.len())));
    }
    s.memcpy_htod(&out, buf).map_err(cuda("copying a collective's result to the device"))
}

fn event(gpu: &Gpu, timing: bool) -> Result<CudaEvent> {
    // Timing off where it is not needed: such events are cheaper to record and wait on.
    let flags = if timing { CUevent_flags::CU_EVENT_DEFAULT } else { CUevent_flags::CU_EVENT_DISABLE_TIMING };
    gpu.ctx().new_event(Some(flags)).map_err(cuda("creating a CUDA event"))
}

fn step_events(gpu: &Gpu, buckets: usize) -> Result<StepEvents> {
    Ok(StepEvents {
        start: (0..buckets).map(|_| event(gpu, true)).collect::<Result<_>>()?,
        end: (0..buckets).map(|_| event(gpu, true)).collect::<Result<_>>()?,
        backward_done: event(gpu, true)?,
    })
}

/// Page-locked host memory for `n` elements (at least one). Not
/// write-combined (cudarc's `alloc_pinned` default): the host reads it back.
fn pinned<T: cudarc::driver::DeviceRepr>(gpu: &Gpu, n: usize) -> Result<PinnedHostSlice<T>> {
    // SAFETY: the contents are uninitialised; every read follows a copy into it.
    unsafe { gpu.ctx().alloc_pinned_with_flags::<T>(n.max(1), 0) }
        .map_err(cuda("allocating pinned host memory"))
}
