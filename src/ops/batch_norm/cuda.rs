//! Launchers for `kernels/batch_norm.cu`: BatchNorm2d training forward,
//! eval forward and backward, and the SyncBatchNorm pieces, over NCHW device
//! buffers. Activations are `T` (f32 or f16); weight, bias, running
//! statistics, the saved mean/invstd and the reductions are f32 (apex O2's
//! keep_batchnorm_fp32). CPU twins: [`super::forward_train`],
//! [`super::forward_eval`], [`super::backward`] and [`super::sync`].
//!
//! SyncBatchNorm on the device: [`local_sums`] -> all-reduce the `1 + 2c`
//! floats -> [`sync_stats`] -> [`forward_apply`]; backward: [`backward_reduce`]
//! -> all-reduce the `2c` sums -> [`backward_dx`] with the global count.
//!
//! A ReLU fused behind BatchNorm ([`Epilogue::Relu`], the device plan's
//! `batchnorm2d+relu` group) is applied as the forward stores each output,
//! with the bits of the two layers one by one.
//!
//! The per-channel f32 buffers go in the structs the CPU twins take, named
//! as PyTorch names them ([`BnParams`], [`RunningStats`], [`BnHyper`],
//! [`SavedStats`], [`BnGrads`]), so none is passed by position.

use super::{BnGrads, BnHyper, BnParams, RunningStats, SavedStats};
use crate::cuda::{as_i64, check_len, DeviceFloat, KernelFn, TypedKernelFn};
use crate::cuda::{Gpu, BLOCK};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};

const FILE: &str = "batch_norm.cu";
static BN_BACKWARD_DX: TypedKernelFn = typed_kernel!(FILE, "bn_backward_dx");
static BN_BACKWARD_REDUCE: TypedKernelFn = typed_kernel!(FILE, "bn_backward_reduce");
static BN_FORWARD_APPLY: TypedKernelFn = typed_kernel!(FILE, "bn_forward_apply");
static BN_FORWARD_APPLY_RELU: TypedKernelFn = typed_kernel!(FILE, "bn_forward_apply_relu");
static BN_FORWARD_APPLY_ADD_RELU: TypedKernelFn = typed_kernel!(FILE, "bn_forward_apply_add_relu");
static BN_FORWARD_EVAL: TypedKernelFn = typed_kernel!(FILE, "bn_forward_eval");
static BN_FORWARD_EVAL_RELU: TypedKernelFn = typed_kernel!(FILE, "bn_forward_eval_relu");
static BN_FORWARD_EVAL_ADD_RELU: TypedKernelFn = typed_kernel!(FILE, "bn_forward_eval_add_relu");
static BN_FORWARD_STATS: TypedKernelFn = typed_kernel!(FILE, "bn_forward_stats");
static BN_LOCAL_SUMS: TypedKernelFn = typed_kernel!(FILE, "bn_local_sums");
static BN_SYNC_STATS: KernelFn = KernelFn::new(FILE, "bn_sync_stats");

/// What the forward applies to each output as it stores it (cuBLASLt's
/// word for the same thing on a GEMM).
#[derive(Clone, Copy)]
pub enum Epilogue<'a, 'b, T> {
    /// The normalized value itself.
    Default,
    /// ReLU (`kernels/relu.cu`'s forward) on it.
    Relu,
    /// The residual added (`kernels/add.cu`'s sum), then ReLU: a residual
    /// block's end.
    AddRelu(&'a CudaView<'b, T>),
}

impl<T> Epilogue<'_, '_, T> {
    fn pick<'k>(&self, [plain, relu, add_relu]: [&'k TypedKernelFn; 3]) -> &'k TypedKernelFn {
        match self {
            Epilogue::Default => plain,
            Epilogue::Relu => relu,
            Epilogue::AddRelu(_) => add_relu,
        }
    }

    fn check(&self, op: &str, numel: usize) -> Result<()> {
        match self {
            Epilogue::AddRelu(r) => check_len(op, "residual", r.len(), numel),
            _ => Ok(()),
        }
    }
}

/// Threads of the per-channel reduction blocks (a multiple of 32; the
/// reduction order, hence the bits, depends on it).
const BN_THREADS: u32 = 256;
/// The most values per channel (N*H*W) the kernels' `unsigned` loops take.
const MAX_CHANNEL_COUNT: usize = (u32::MAX - (BN_THREADS - 1)) as usize;

/// `(n, c, h*w)` of a validated NCHW shape.
#[derive(Debug, Clone, Copy)]
struct Nchw {
    n: usize,
    c: usize,
    hw: usize,
}

impl Nchw {
    fn new(op: &str, shape: &[usize]) -> Result<Nchw> {
        let [n, c, h, w] = *shape else {
            return Err(Error::shape(format!(
                "{op}: expected a 4-D [N, C, H, W] input, got shape {shape:?}"
            )));
        };
        let d = Nchw { n, c, hw: h * w };
        // The kernels walk a channel's n*h*w values with a 32-bit unsigned
        // counter stepping by BN_THREADS: the last step past the end must not
        // wrap around to the start (the block would loop forever).
        if d.count() > MAX_CHANNEL_COUNT {
            return Err(Error::shape(format!(
                "{op}: {} values per channel is too many (at most {MAX_CHANNEL_COUNT})",
                d.count()
            )));
        }
        Ok(d)
    }

    fn count(&self) -> usize {
        self.n * self.hw
    }

    fn numel(&self) -> usize {
        self.n * self.c * self.hw
    }

    fn args(&self, op: &str) -> Result<(i64, i64, i64)> {
        Ok((as_i64(op, self.n)?, as_i64(op, self.c)?, as_i64(op, self.hw)?))
    }

    /// One block per channel (grid-strided past 65,535 channels).
    fn per_channel(&self) -> LaunchConfig {
        let blocks = self.c.clamp(1, 65_535) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BN_THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    /// blockIdx.y over the (n, c) planes, blockIdx.x over a plane's positions.
    fn planes(&self) -> LaunchConfig {
        let x = self.hw.div_ceil(BLOCK as usize).clamp(1, 64) as u32;
        let y = (self.n * self.c).clamp(1, 65_535) as u32;
        LaunchConfig { grid_dim: (x, y, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    fn check_training(&self, op: &str, shape: &[usize]) -> Result<()> {
        if self.count() <= 1 {
            return Err(Error::shape(format!(
                "{op}: expected more than 1 value per channel when training, got input shape {shape:?}"
            )));
        }
        Ok(())
    }
}

fn launch(op: &str, b: &mut crate::cuda::launch::Launch<'_>, cfg: LaunchConfig) -> Result<()> {
    // SAFETY: each caller pushes the arguments of its kernel in order with
    // the types of its signature, after checking every buffer's length.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(op, e))?;
    Ok(())
}

/// Training forward: batch statistics (two-pass, f32), `y` normalized with
/// them, running statistics moved (unbiased variance), and the `mean` and
/// `invstd` backward needs written into `saved`.
#[allow(clippy::too_many_arguments)]
pub fn forward_train<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: &[usize],
    params: BnParams<&CudaView<'_, f32>>,
    running: RunningStats<&mut CudaViewMut<'_, f32>>,
    hyper: BnHyper,
    y: &mut CudaViewMut<'_, T>,
    saved: SavedStats<&mut CudaViewMut<'_, f32>>,
    epilogue: Epilogue<'_, '_, T>,
) -> Result<()> {
    const OP: &str = "batch_norm forward_train";
    let (BnParams { weight, bias }, BnHyper { momentum, eps }) = (params, hyper);
    let (RunningStats { running_mean, running_var }, SavedStats { mean, invstd }) = (running, saved);
    let d = Nchw::new(OP, shape)?;
    d.check_training(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "y", y.len(), d.numel())?;
    epilogue.check(OP, d.numel())?;
    for (what, len) in [("running_mean", running_mean.len()), ("running_var", running_var.len())] {
        check_len(OP, what, len, d.c)?;
    }
    for (what, len) in [("mean", mean.len()), ("invstd", invstd.len())] {
        check_len(OP, what, len, d.c)?;
    }
    // forward_apply checks these too, but only after the statistics kernel
    // has moved the running statistics.
    check_len(OP, "weight", weight.len(), d.c)?;
    check_len(OP, "bias", bias.len(), d.c)?;
    if d.c == 0 {
        return Ok(());
    }
    let (n, c, hw) = d.args(OP)?;
    let f = gpu.kernel(T::pick(&BN_FORWARD_STATS))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(&n).arg(&c).arg(&hw).arg(&eps).arg(&momentum);
    b.arg(&mut *mean).arg(&mut *invstd).arg(running_mean).arg(running_var);
    launch(OP, &mut b, d.per_channel())?;
    let saved = SavedStats { mean: &mean.as_view(), invstd: &invstd.as_view() };
    forward_apply(gpu, x, shape, saved, params, y, epilogue)
}

/// `y = (x - mean) * invstd * weight + bias` with given per-channel
/// statistics (the batch's, local or synced), then the `epilogue`.
pub fn forward_apply<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: &[usize],
    saved: SavedStats<&CudaView<'_, f32>>,
    params: BnParams<&CudaView<'_, f32>>,
    y: &mut CudaViewMut<'_, T>,
    epilogue: Epilogue<'_, '_, T>,
) -> Result<()> {
    const OP: &str = "batch_norm forward_apply";
    let (SavedStats { mean, invstd }, BnParams { weight, bias }) = (saved, params);
    let d = Nchw::new(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "y", y.len(), d.numel())?;
    epilogue.check(OP, d.numel())?;
    for (what, len) in
        [("mean", mean.len()), ("invstd", invstd.len()), ("weight", weight.len()), ("bias", bias.len())]
    {
        check_len(OP, what, len, d.c)?;
    }
    if d.numel() == 0 {
        return Ok(());
    }
    let (n, c, hw) = d.args(OP)?;
    let kernels = [&BN_FORWARD_APPLY, &BN_FORWARD_APPLY_RELU, &BN_FORWARD_APPLY_ADD_RELU];
    let f = gpu.kernel(T::pick(epilogue.pick(kernels)))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(mean).arg(invstd).arg(weight).arg(bias).arg(&n).arg(&c).arg(&hw);
    if let Epilogue::AddRelu(r) = epilogue {
        b.arg(r);
    }
    b.arg(y);
    launch(OP, &mut b, d.planes())
}

/// Evaluation forward with the running statistics, then the `epilogue`.
#[allow(clippy::too_many_arguments)]
pub fn forward_eval<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: &[usize],
    params: BnParams<&CudaView<'_, f32>>,
    running: RunningStats<&CudaView<'_, f32>>,
    eps: f32,
    y: &mut CudaViewMut<'_, T>,
    epilogue: Epilogue<'_, '_, T>,
) -> Result<()> {
    const OP: &str = "batch_norm forward_eval";
    let (BnParams { weight, bias }, RunningStats { running_mean, running_var }) = (params, running);
    let d = Nchw::new(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "y", y.len(), d.numel())?;
    epilogue.check(OP, d.numel())?;
    let params = [
        ("weight", weight.len()),
        ("bias", bias.len()),
        ("running_mean", running_mean.len()),
        ("running_var", running_var.len()),
    ];
    for (what, len) in params {
        check_len(OP, what, len, d.c)?;
    }
    if d.numel() == 0 {
        return Ok(());
    }
    let (n, c, hw) = d.args(OP)?;
    let kernels = [&BN_FORWARD_EVAL, &BN_FORWARD_EVAL_RELU, &BN_FORWARD_EVAL_ADD_RELU];
    let f = gpu.kernel(T::pick(epilogue.pick(kernels)))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(weight).arg(bias).arg(running_mean).arg(running_var).arg(&eps);
    b.arg(&n).arg(&c).arg(&hw);
    if let Epilogue::AddRelu(r) = epilogue {
        b.arg(r);
    }
    b.arg(y);
    launch(OP, &mut b, d.planes())
}

/// Training backward: `dx`, and the weight and bias gradients added into
/// `grads`. `sums` (2c floats) is scratch for the reductions.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    shape: &[usize],
    saved: SavedStats<&CudaView<'_, f32>>,
    weight: &CudaView<'_, f32>,
    sums: &mut CudaViewMut<'_, f32>,
    grads: BnGrads<&mut CudaViewMut<'_, f32>>,
    dx: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    const OP: &str = "batch_norm backward";
    let d = Nchw::new(OP, shape)?;
    // Checked here too so nothing is accumulated when dx's launch would fail.
    check_len(OP, "weight", weight.len(), d.c)?;
    check_len(OP, "dx", dx.len(), d.numel())?;
    backward_reduce(gpu, x, dy, shape, saved, sums, grads)?;
    let reduced = ReducedSums { sums: &sums.as_view(), count: d.count() };
    backward_dx(gpu, x, dy, shape, saved, weight, reduced, dx)
}

/// SyncBatchNorm forward, step 1: `out = [count, sum[c], sumsq[c]]` of this
/// rank's batch, the buffer to all-reduce.
pub fn local_sums<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    shape: &[usize],
    out: &mut CudaViewMut<'_, f32>,
) -> Result<()> {
    const OP: &str = "batch_norm local_sums";
    let d = Nchw::new(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "out", out.len(), 1 + 2 * d.c)?;
    // A rank with an empty batch would count for nothing; PyTorch refuses it.
    if d.count() == 0 {
        return Err(Error::shape(format!("{OP}: input shape {shape:?} has no values per channel")));
    }
    let (n, c, hw) = d.args(OP)?;
    let f = gpu.kernel(T::pick(&BN_LOCAL_SUMS))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(&n).arg(&c).arg(&hw).arg(out);
    launch(OP, &mut b, d.per_channel())
}

/// SyncBatchNorm forward, step 2: the all-reduced `totals` (as written by
/// [`local_sums`] and summed over ranks) to the `saved` mean and invstd and
/// the running statistics. A global count <= 1 gives NaN statistics (see the
/// kernel).
pub fn sync_stats(
    gpu: &Gpu,
    totals: &CudaView<'_, f32>,
    channels: usize,
    hyper: BnHyper,
    saved: SavedStats<&mut CudaViewMut<'_, f32>>,
    running: RunningStats<&mut CudaViewMut<'_, f32>>,
) -> Result<()> {
    const OP: &str = "batch_norm sync_stats";
    let (BnHyper { momentum, eps }, SavedStats { mean, invstd }) = (hyper, saved);
    let RunningStats { running_mean, running_var } = running;
    check_len(OP, "totals", totals.len(), 1 + 2 * channels)?;
    let outs = [
        ("mean", mean.len()),
        ("invstd", invstd.len()),
        ("running_mean", running_mean.len()),
        ("running_var", running_var.len()),
    ];
    for (what, len) in outs {
        check_len(OP, what, len, channels)?;
    }
    if channels == 0 {
        return Ok(());
    }
    let c = as_i64(OP, channels)?;
    let f = gpu.kernel(&BN_SYNC_STATS)?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(totals).arg(&c).arg(&eps).arg(&momentum).arg(mean).arg(invstd).arg(running_mean).arg(running_var);
    launch(OP, &mut b, crate::cuda::launch_1d(channels))
}

/// Backward, step 1: `sums = [sum dy[c], sum dy*xhat[c]]` of this batch (to
/// all-reduce under SyncBatchNorm), also added into `grads` (`dbias` and
/// `dweight`).
pub fn backward_reduce<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    shape: &[usize],
    saved: SavedStats<&CudaView<'_, f32>>,
    sums: &mut CudaViewMut<'_, f32>,
    grads: BnGrads<&mut CudaViewMut<'_, f32>>,
) -> Result<()> {
    const OP: &str = "batch_norm backward_reduce";
    let (SavedStats { mean, invstd }, BnGrads { dweight, dbias }) = (saved, grads);
    let d = Nchw::new(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "dy", dy.len(), d.numel())?;
    check_len(OP, "sums", sums.len(), 2 * d.c)?;
    let per_c =
        [("mean", mean.len()), ("invstd", invstd.len()), ("dweight", dweight.len()), ("dbias", dbias.len())];
    for (what, len) in per_c {
        check_len(OP, what, len, d.c)?;
    }
    if d.c == 0 {
        return Ok(());
    }
    let (n, c, hw) = d.args(OP)?;
    let f = gpu.kernel(T::pick(&BN_BACKWARD_REDUCE))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(dy).arg(mean).arg(invstd).arg(&n).arg(&c).arg(&hw).arg(sums).arg(dweight).arg(dbias);
    launch(OP, &mut b, d.per_channel())
}

/// The `sums` [`backward_reduce`] wrote (all-reduced under SyncBatchNorm)
/// and `count`, the number of values per channel they cover (all ranks'
/// under SyncBatchNorm).
#[derive(Debug, Clone, Copy)]
pub struct ReducedSums<'a> {
    pub sums: &'a CudaView<'a, f32>,
    pub count: usize,
}

/// Backward, step 2: `dx` from the (possibly all-reduced) sums and count.
#[allow(clippy::too_many_arguments)]
pub fn backward_dx<T: DeviceFloat>(
    gpu: &Gpu,
    x: &CudaView<'_, T>,
    dy: &CudaView<'_, T>,
    shape: &[usize],
    saved: SavedStats<&CudaView<'_, f32>>,
    weight: &CudaView<'_, f32>,
    reduced: ReducedSums<'_>,
    dx: &mut CudaViewMut<'_, T>,
) -> Result<()> {
    const OP: &str = "batch_norm backward_dx";
    let (SavedStats { mean, invstd }, ReducedSums { sums, count }) = (saved, reduced);
    let d = Nchw::new(OP, shape)?;
    check_len(OP, "x", x.len(), d.numel())?;
    check_len(OP, "dy", dy.len(), d.numel())?;
    check_len(OP, "dx", dx.len(), d.numel())?;
    check_len(OP, "sums", sums.len(), 2 * d.c)?;
    for (what, len) in [("mean", mean.len()), ("invstd", invstd.len()), ("weight", weight.len())] {
        check_len(OP, what, len, d.c)?;
    }
    if d.numel() == 0 {
        return Ok(());
    }
    if count == 0 {
        return Err(Error::shape(format!("{OP}: count must be at least 1")));
    }
    let (n, c, hw) = d.args(OP)?;
    let count = as_i64(OP, count)?;
    let f = gpu.kernel(T::pick(&BN_BACKWARD_DX))?;
    let mut b = f.launch_on(gpu.stream());
    b.arg(x).arg(dy).arg(mean).arg(invstd).arg(weight).arg(sums).arg(&count);
    b.arg(&n).arg(&c).arg(&hw).arg(dx);
    launch(OP, &mut b, d.planes())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;

#[cfg(test)]
mod bounds {
    use super::{Nchw, BN_THREADS};

    /// The largest N*H*W whose last loop step (k += BN_THREADS from k =
    /// count - 1) still fits in 32 bits is accepted; one more is refused
    /// before a kernel could spin on a wrapped counter.
    #[test]
    fn a_channel_the_unsigned_loop_would_wrap_on_is_refused() {
        let max = (u32::MAX - (BN_THREADS - 1)) as usize;
        assert!(Nchw::new("bn", &[1, 2, 1, max]).is_ok());
        let e = Nchw::new("bn", &[1, 2, 1, max + 1]).err().unwrap().to_string();
        assert!(e.contains(&format!("{} values per channel is too many", max + 1)), "{e}");
        let e = Nchw::new("bn", &[1 << 16, 1, 1 << 16, 1]).err().unwrap().to_string();
        assert!(e.contains("4294967296 values per channel is too many"), "{e}");
    }
}
