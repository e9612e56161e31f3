//! Where a model's parameters and gradients live on the device.
//!
//! Values: one flat buffer per dtype ([`ParamGroup`]), the parameters of that
//! dtype in reverse registration order, so that the fused optimizer steps a
//! whole group in one launch (`optim::cuda::DeviceOptimizer`).
//!
//! Gradients: one allocation per DDP bucket ([`GradBucket`], the layout of
//! `dist::reducer::assign_buckets`), and a parameter's `.grad` is a view into
//! its bucket, as in PyTorch's reducer. A bucket is its own allocation so
//! that the communication stream reading one bucket never orders the compute
//! stream's writes into another (cudarc tracks reads and writes per
//! allocation). Buckets of one dtype, in order, tile that dtype's group:
//! bucket `b` holds the gradients of the values at
//! `group_offset..group_offset + numel` of its group. The last bucket has
//! `VOTE_LEN` more elements after its gradients: the ranks' stop and save vote,
//! all-reduced with them (src/train/stop.rs).

use super::layer::internal;
use crate::cuda::{DeviceFloat, Gpu};
use crate::dist::reducer::{assign_buckets, BucketLayout};
use crate::error::{Error, Result};
use crate::nn::Model;
use crate::tensor::DType;
use crate::train::stop::VOTE_LEN;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use half::f16;

/// A device buffer of either element type.
pub enum DevBuf {
    F32(CudaSlice<f32>),
    F16(CudaSlice<f16>),
}

impl DevBuf {
    /// `n` zeros (at least one element, so an empty group still allocates).
    pub fn zeros(gpu: &Gpu, dtype: DType, n: usize) -> Result<DevBuf> {
        let s = gpu.stream();
        let alloc = |e| Error::cuda(format!("allocating {n} {dtype:?} values"), e);
        Ok(match dtype {
            DType::F32 => DevBuf::F32(s.alloc_zeros(n.max(1)).map_err(alloc)?),
            DType::F16 => DevBuf::F16(s.alloc_zeros(n.max(1)).map_err(alloc)?),
        })
    }

    pub fn dtype(&self) -> DType {
        match self {
            DevBuf::F32(_) => DType::F32,
            DevBuf::F16(_) => DType::F16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            DevBuf::F32(b) => b.len(),
            DevBuf::F16(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as `T`.
    pub fn typed<T: DevElem>(&self, what: &str) -> Result<&CudaSlice<T>> {
        let have = self.dtype();
        T::of(self).ok_or_else(|| wrong_dtype::<T>(what, have))
    }

    pub fn typed_mut<T: DevElem>(&mut self, what: &str) -> Result<&mut CudaSlice<T>> {
        let have = self.dtype();
        T::of_mut(self).ok_or_else(|| wrong_dtype::<T>(what, have))
    }

    pub fn zero(&mut self, gpu: &Gpu) -> Result<()> {
        let s = gpu.stream();
        match self {
            DevBuf::F32(b) => s.memset_zeros(b),
            DevBuf::F16(b) => s.memset_zeros(b),
        }
        .map_err(|e| Error::cuda("zeroing a device buffer", e))
    }

    /// Writes `host` (rounded to this buffer's dtype) at `offset`.
    pub fn write_f32(&mut self, gpu: &Gpu, offset: usize, host: &[f32]) -> Result<()> {
        let s = gpu.stream();
        let range = offset..offset + host.len();
        let err = |e| Error::cuda("copying parameters to the device", e);
        match self {
            DevBuf::F32(b) => s.memcpy_htod(host, &mut b.slice_mut(range)).map_err(err),
            DevBuf::F16(b) => {
                let h = crate::tensor::f32_to_f16(host);
                s.memcpy_htod(&h, &mut b.slice_mut(range)).map_err(err)
            }
        }
    }

    /// `len` values from `offset`, widened to f32 (waits for the stream).
    pub fn read_f32(&self, gpu: &Gpu, offset: usize, len: usize) -> Result<Vec<f32>> {
        let s = gpu.stream();
        let range = offset..offset + len;
        let err = |e| Error::cuda("copying parameters from the device", e);
        Ok(match self {
            DevBuf::F32(b) => s.clone_dtoh(&b.slice(range)).map_err(err)?,
            DevBuf::F16(b) => crate::tensor::f16_to_f32(&s.clone_dtoh(&b.slice(range)).map_err(err)?),
        })
    }
}

/// A buffer of `have` values read as `T`: the one fact about a device
/// buffer its type does not carry (a [`DevBuf`] is either dtype).
pub fn wrong_dtype<T: DevElem>(what: &str, have: DType) -> Error {
    internal(format!("{what} is {have:?} on the device, not {:?}", T::DTYPE))
}

/// A weight's gradient and its bias's, as a backward adds into them.
pub type Grads<'s, 'v, G> = (&'s mut CudaViewMut<'v, G>, Option<&'s mut CudaViewMut<'v, G>>);

/// The element types a [`DevBuf`] holds, for code generic over them.
pub trait DevElem: DeviceFloat + cudarc::driver::DeviceRepr {
    const DTYPE: DType;
    fn of(buf: &DevBuf) -> Option<&CudaSlice<Self>>;
    fn of_mut(buf: &mut DevBuf) -> Option<&mut CudaSlice<Self>>;
    /// f16 views as views of `Self`: themselves for f16, none for f32 (O1's
    /// f16 copies handed to code generic over the element type).
    fn from_f16<'v, 'a>(v: &'v CudaView<'a, f16>) -> Option<&'v CudaView<'a, Self>>;
    fn from_f16_mut<'v, 'a>(v: &'v mut CudaViewMut<'a, f16>) -> Option<&'v mut CudaViewMut<'a, Self>>;
}

impl DevElem for f32 {
    const DTYPE: DType = DType::F32;
    fn of(buf: &DevBuf) -> Option<&CudaSlice<f32>> {
        match buf {
            DevBuf::F32(b) => Some(b),
            DevBuf::F16(_) => None,
        }
    }
    fn of_mut(buf: &mut DevBuf) -> Option<&mut CudaSlice<f32>> {
        match buf {
            DevBuf::F32(b) => Some(b),
            DevBuf::F16(_) => None,
        }
    }
    fn from_f16<'v, 'a>(_: &'v CudaView<'a, f16>) -> Option<&'v CudaView<'a, f32>> {
        None
    }
    fn from_f16_mut<'v, 'a>(_: &'v mut CudaViewMut<'a, f16>) -> Option<&'v mut CudaViewMut<'a, f32>> {
        None
    }
}

impl DevElem for f16 {
    const DTYPE: DType = DType::F16;
    fn of(buf: &DevBuf) -> Option<&CudaSlice<f16>> {
        match buf {
            DevBuf::F16(b) => Some(b),
            DevBuf::F32(_) => None,
        }
    }
    fn of_mut(buf: &mut DevBuf) -> Option<&mut CudaSlice<f16>> {
        match buf {
            DevBuf::F16(b) => Some(b),
            DevBuf::F32(_) => None,
        }
    }
    fn from_f16<'v, 'a>(v: &'v CudaView<'a, f16>) -> Option<&'v CudaView<'a, f16>> {
        Some(v)
    }
    fn from_f16_mut<'v, 'a>(v: &'v mut CudaViewMut<'a, f16>) -> Option<&'v mut CudaViewMut<'a, f16>> {
        Some(v)
    }
}

/// Where parameter `i` (registration order) lives.
#[derive(Debug, Clone)]
pub struct ParamSlot {
    pub name: String,
    pub shape: Vec<usize>,
    pub numel: usize,
    pub dtype: DType,
    /// Index into [`DeviceParams::groups`] and offset in its values.
    pub group: usize,
    pub offset: usize,
    /// Index into [`DeviceParams::buckets`] and offset in its gradients.
    pub bucket: usize,
    pub bucket_offset: usize,
}

/// The values of every parameter of one dtype, flat.
pub struct ParamGroup {
    pub dtype: DType,
    pub values: DevBuf,
    /// Parameter indices in layout order (reverse registration order).
    pub params: Vec<usize>,
    pub numel: usize,
}

/// One DDP bucket's gradients, flat, in the dtype of its parameters.
pub struct GradBucket {
    pub layout: BucketLayout,
    pub grads: DevBuf,
    /// The group whose values these are the gradients of, and where they start in it.
    pub group: usize,
    pub group_offset: usize,
}

pub struct DeviceParams {
    pub slots: Vec<ParamSlot>,
    pub groups: Vec<ParamGroup>,
    pub buckets: Vec<GradBucket>,
}

impl DeviceParams {
    /// Buffers for `host`'s parameters in their current dtypes (after the amp
    /// cast), with buckets capped as DDP's (`first_bucket_bytes` for each
    /// dtype's first, then `bucket_cap_bytes`). Values are uploaded; gradients
    /// start at zero.
    pub fn new(gpu: &Gpu, host: &Model, first_bucket_bytes: usize, bucket_cap_bytes: usize) -> Result<Self> {
        let params = host.params();
        let spec: Vec<(usize, DType)> = params.iter().map(|p| (p.value.numel(), p.value.dtype())).collect();
        let layouts = assign_buckets(&spec, first_bucket_bytes, bucket_cap_bytes);
        // Groups in the order their dtype's first bucket appears; each group's
        // layout is its buckets' parameters, bucket after bucket.
        let mut groups: Vec<(DType, Vec<usize>, usize)> = Vec::new();
        let mut bucket_meta = Vec::with_capacity(layouts.len());
        let mut placed: Vec<(usize, ParamSlot)> = Vec::with_capacity(params.len());
        for (b, layout) in layouts.iter().enumerate() {
            let g = match groups.iter().position(|(d, _, _)| *d == layout.dtype) {
                Some(g) => g,
                None => {
                    groups.push((layout.dtype, Vec::new(), 0));
                    groups.len() - 1
                }
            };
            let (_, members, numel) = &mut groups[g];
            let group_offset = *numel;
            let mut boff = 0;
            for &i in &layout.params {
                let p = &params[i].value;
                let slot = ParamSlot {
                    name: params[i].name.clone(),
                    shape: p.shape().to_vec(),
                    numel: p.numel(),
                    dtype: p.dtype(),
                    group: g,
                    offset: *numel,
                    bucket: b,
                    bucket_offset: boff,
                };
                (*numel, boff) = (*numel + slot.numel, boff + slot.numel);
                members.push(i);
                placed.push((i, slot));
            }
            bucket_meta.push((g, group_offset));
        }
        // In registration order; `upload` below holds them to the model's
        // parameters one by one, so none is missing or placed twice.
        placed.sort_by_key(|&(i, _)| i);
        let slots = placed.into_iter().map(|(_, s)| s).collect();
        let groups = groups
            .into_iter()
            .map(|(dtype, params, numel)| {
                Ok(ParamGroup { dtype, values: DevBuf::zeros(gpu, dtype, numel)?, params, numel })
            })
            .collect::<Result<Vec<_>>>()?;
        let last = layouts.len().saturating_sub(1);
        let buckets = layouts
            .into_iter()
            .zip(bucket_meta)
            .enumerate()
            .map(|(b, (layout, (group, group_offset)))| {
                // The last bucket's tail carries the ranks' stop vote with its all-reduce.
                let tail = if b == last { VOTE_LEN } else { 0 };
                let grads = DevBuf::zeros(gpu, layout.dtype, layout.numel + tail)?;
                Ok(GradBucket { layout, grads, group, group_offset })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut me = DeviceParams { slots, groups, buckets };
        me.upload(gpu, host)?;
        Ok(me)
    }

    fn check_host(&self, host: &Model) -> Result<()> {
        let params = host.params();
        let of_host = params.iter().map(|p| (p.name.as_str(), p.value.shape(), p.value.dtype()));
        let of_device = self.slots.iter().map(|s| (s.name.as_str(), s.shape.as_slice(), s.dtype));
        if !of_host.clone().eq(of_device.clone()) {
            return Err(internal(format!(
                "the model's parameters {:?} are not its device copy's {:?}",
                of_host.collect::<Vec<_>>(),
                of_device.collect::<Vec<_>>()
            )));
        }
        Ok(())
    }

    /// Copies every parameter's value from `host`.
    pub fn upload(&mut self, gpu: &Gpu, host: &Model) -> Result<()> {
        self.check_host(host)?;
        for (p, s) in host.params().iter().zip(&self.slots) {
            self.groups[s.group].values.write_f32(gpu, s.offset, &p.value.to_f32_vec())?;
        }
        Ok(())
    }

    /// Copies every parameter's value into `host` (waits for the stream).
    pub fn download(&self, gpu: &Gpu, host: &mut Model) -> Result<()> {
        self.check_host(host)?;
        for (p, s) in host.params_mut().into_iter().zip(&self.slots) {
            let v = self.groups[s.group].values.read_f32(gpu, s.offset, s.numel)?;
            p.value.copy_from_f32(&v)?;
        }
        Ok(())
    }

    /// Copies every parameter's `.grad` into `host` (tests; checkpoints with
    /// pending accumulation).
    pub fn download_grads(&self, gpu: &Gpu, host: &mut Model) -> Result<()> {
        self.check_host(host)?;
        for (p, s) in host.params_mut().into_iter().zip(&self.slots) {
            let v = self.buckets[s.bucket].grads.read_f32(gpu, s.bucket_offset, s.numel)?;
            p.grad.copy_from_f32(&v)?;
        }
        Ok(())
    }

    /// Copies every parameter's `.grad` from `host` (resume with pending accumulation).
    pub fn upload_grads(&mut self, gpu: &Gpu, host: &Model) -> Result<()> {
        self.check_host(host)?;
        for (p, s) in host.params().iter().zip(&self.slots) {
            self.buckets[s.bucket].grads.write_f32(gpu, s.bucket_offset, &p.grad.to_f32_vec())?;
        }
        Ok(())
    }

    /// Sets every element of the last registered parameter's gradient to
    /// `v` (the `DDPTRAIN_INJECT_GRAD_INF` testing hook at world size 1).
    pub fn fill_last_grad(&mut self, gpu: &Gpu, v: f32) -> Result<()> {
        let Some(s) = self.slots.last() else { return Ok(()) };
        self.buckets[s.bucket].grads.write_f32(gpu, s.bucket_offset, &vec![v; s.numel])
    }

    /// `optimizer.zero_grad()`: every bucket to zero.
    pub fn zero_grad(&mut self, gpu: &Gpu) -> Result<()> {
        self.buckets.iter_mut().try_for_each(|b| b.grads.zero(gpu))
    }

    /// Parameter `i`'s value (`i` a registration index of the plan's).
    pub fn value<T: DevElem>(&self, i: usize) -> Result<CudaView<'_, T>> {
        let s = &self.slots[i];
        Ok(self.groups[s.group].values.typed::<T>(&s.name)?.slice(s.offset..s.offset + s.numel))
    }

    /// Runs `f` with the value of parameter `v` and the writable `.grad`s of
    /// a layer's weight `w` and bias `b`. Values and gradients live apart,
    /// so both can be borrowed.
    pub fn with_value_and_grads<T: DevElem, G: DevElem, R>(
        &mut self,
        v: usize,
        (w, b): (usize, Option<usize>),
        f: impl FnOnce(&CudaView<'_, T>, Grads<'_, '_, G>) -> Result<R>,
    ) -> Result<R> {
        let DeviceParams { slots, groups, buckets } = self;
        let s = &slots[v];
        let value = groups[s.group].values.typed::<T>(&s.name)?.slice(s.offset..s.offset + s.numel);
        with_grads::<G, R>(slots, buckets, (w, b), |g| f(&value, g))
    }

    /// Runs `f` with the writable `.grad`s of a layer's weight `w` and bias `b`.
    pub fn with_grads<G: DevElem, R>(
        &mut self,
        wb: (usize, Option<usize>),
        f: impl FnOnce(Grads<'_, '_, G>) -> Result<R>,
    ) -> Result<R> {
        with_grads::<G, R>(&self.slots, &mut self.buckets, wb, f)
    }
}

fn grad_view<'b, G: DevElem>(b: &'b mut GradBucket, s: &ParamSlot) -> Result<CudaViewMut<'b, G>> {
    Ok(b.grads.typed_mut::<G>(&s.name)?.slice_mut(s.bucket_offset..s.bucket_offset + s.numel))
}

/// `f` over disjoint mutable views of a weight's gradient and its bias's.
/// Two in one bucket are cut from one view of the range they span.
fn with_grads<G: DevElem, R>(
    slots: &[ParamSlot],
    buckets: &mut [GradBucket],
    (w, b): (usize, Option<usize>),
    f: impl FnOnce(Grads<'_, '_, G>) -> Result<R>,
) -> Result<R> {
    let sw = &slots[w];
    let Some(b) = b else { return f((&mut grad_view(&mut buckets[sw.bucket], sw)?, None)) };
    let sb = &slots[b];
    if sw.bucket != sb.bucket {
        let (lo, hi) = buckets.split_at_mut(sw.bucket.max(sb.bucket));
        let (bw, bb) = if sw.bucket < sb.bucket {
            (&mut lo[sw.bucket], &mut hi[0])
        } else {
            (&mut hi[0], &mut lo[sb.bucket])
        };
        return f((&mut grad_view(bw, sw)?, Some(&mut grad_view(bb, sb)?)));
    }
    let (first, second) = if sw.bucket_offset < sb.bucket_offset { (sw, sb) } else { (sb, sw) };
    if first.bucket_offset + first.numel > second.bucket_offset {
        return Err(internal(format!("the gradients of {} and {} overlap", sw.name, sb.name)));
    }
    let buf = buckets[sw.bucket].grads.typed_mut::<G>(&sw.name)?;
    let mut span = buf.slice_mut(first.bucket_offset..second.bucket_offset + second.numel);
    let (mut a, mut rest) = span.split_at_mut(second.bucket_offset - first.bucket_offset);
    let mut a = a.slice_mut(0..first.numel);
    if std::ptr::eq(first, sw) {
        f((&mut a, Some(&mut rest)))
    } else {
        f((&mut rest, Some(&mut a)))
    }
}
