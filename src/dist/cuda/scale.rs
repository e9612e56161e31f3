//! Launchers for kernels/ddp.cu: the bucket scaling around the all-reduce.
//! Unlike the model's launchers they take the stream to run on, because they
//! run on the reducer's communication stream, not the compute stream.

use crate::cuda::{as_i64, check_len, launch_1d, DeviceFloat, Gpu, KernelFn, TypedKernelFn};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::f16;

const FILE: &str = "ddp.cu";
pub(crate) static DDP_SCALE: TypedKernelFn = typed_kernel!(FILE, "ddp_scale");
static DDP_FILL: TypedKernelFn = typed_kernel!(FILE, "ddp_fill");
static DDP_WIDEN_SCALE_F16: KernelFn = KernelFn::new(FILE, "ddp_widen_scale_f16");
static DDP_NARROW_SCALE_F16: KernelFn = KernelFn::new(FILE, "ddp_narrow_scale_f16");

/// `x = x * s` in place, the product in f32, rounded once into `T`.
pub fn scale<T: DeviceFloat>(
    gpu: &Gpu,
    stream: &CudaStream,
    x: &mut impl DevicePtrMut<T>,
    s: f32,
) -> Result<()> {
    let k = T::pick(&DDP_SCALE);
    let n = as_i64(k.name(), x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(k)?;
    let cfg = launch_1d(x.len());
    let (xp, _x) = x.device_ptr_mut(stream);
    // SAFETY: x holds n elements of T; each thread reads and writes only its own.
    unsafe { f.launch_on(stream).arg(&xp).arg(&s).arg(&n).launch(cfg) }
        .map_err(|e| Error::cuda(k.name(), e))?;
    Ok(())
}

/// `x[i] = T(v)` for every element.
pub fn fill<T: DeviceFloat>(
    gpu: &Gpu,
    stream: &CudaStream,
    x: &mut impl DevicePtrMut<T>,
    v: f32,
) -> Result<()> {
    let k = T::pick(&DDP_FILL);
    let n = as_i64(k.name(), x.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(k)?;
    let cfg = launch_1d(x.len());
    let (xp, _x) = x.device_ptr_mut(stream);
    // SAFETY: x holds n elements of T.
    unsafe { f.launch_on(stream).arg(&xp).arg(&v).arg(&n).launch(cfg) }
        .map_err(|e| Error::cuda(k.name(), e))?;
    Ok(())
}

/// `dst = f32(src) * s` (an f16 bucket into its f32 all-reduce copy).
pub fn widen_scale(
    gpu: &Gpu,
    stream: &CudaStream,
    src: &impl DevicePtr<f16>,
    dst: &mut impl DevicePtrMut<f32>,
    s: f32,
) -> Result<()> {
    convert(gpu, stream, &DDP_WIDEN_SCALE_F16, src, dst, s)
}

/// `dst = f16(src * s)` (the f32 all-reduce copy back into its f16 bucket).
pub fn narrow_scale(
    gpu: &Gpu,
    stream: &CudaStream,
    src: &impl DevicePtr<f32>,
    dst: &mut impl DevicePtrMut<f16>,
    s: f32,
) -> Result<()> {
    convert(gpu, stream, &DDP_NARROW_SCALE_F16, src, dst, s)
}

fn convert<A, B>(
    gpu: &Gpu,
    stream: &CudaStream,
    k: &'static KernelFn,
    src: &impl DevicePtr<A>,
    dst: &mut impl DevicePtrMut<B>,
    s: f32,
) -> Result<()> {
    let name = k.name();
    check_len(name, "dst", dst.len(), src.len())?;
    let n = as_i64(name, src.len())?;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.kernel(k)?;
    let (sp, _s) = src.device_ptr(stream);
    let (dp, _d) = dst.device_ptr_mut(stream);
    // SAFETY: src and dst hold n elements of the kernel's types (checked above).
    unsafe { f.launch_on(stream).arg(&sp).arg(&dp).arg(&s).arg(&n).launch(launch_1d(src.len())) }
        .map_err(|e| Error::cuda(name, e))?;
    Ok(())
}
