//! Softmax cross-entropy launchers for kernels/cross_entropy.cu, the device
//! twins of `cpu.rs`. Nothing comes back to the host during a step: the
//! per-batch loss sum and hit count are added to device totals
//! ([`CrossEntropyTotals`]) that the trainer reads on logging steps and
//! after evaluation.

use crate::cuda::{check_len, DeviceFloat, KernelFn, TypedKernelFn};
use crate::cuda::{launch_rows, Gpu};
use crate::error::{Error, Result};
use crate::typed_kernel;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

const FILE: &str = "cross_entropy.cu";
static CROSS_ENTROPY_ACCUMULATE: KernelFn = KernelFn::new(FILE, "cross_entropy_accumulate");
static CROSS_ENTROPY_ROWS: TypedKernelFn = typed_kernel!(FILE, "cross_entropy_rows");
/// Threads of the single block `cross_entropy_accumulate` runs as (its
/// shared arrays are sized for it).
const ACC_THREADS: u32 = 256;

/// Per-row scratch (allocated once for the largest batch) and the running
/// totals the launchers add to.
pub struct CrossEntropyTotals {
    row_loss: CudaSlice<f32>,
    row_hit: CudaSlice<u32>,
    /// Sum of the per-row losses since the last [`reset`](Self::reset) (f64,
    /// as the CPU sums them).
    pub loss_sum: CudaSlice<f64>,
    /// Rows whose argmax (first maximum) equals the label since the last reset.
    pub correct: CudaSlice<u64>,
}

impl CrossEntropyTotals {
    /// Room for batches of up to `max_rows` rows; totals start at zero.
    pub fn new(gpu: &Gpu, max_rows: usize) -> Result<Self> {
        let s = gpu.stream();
        let alloc = |e| Error::cuda("cross_entropy buffers", e);
        Ok(CrossEntropyTotals {
            row_loss: s.alloc_zeros(max_rows.max(1)).map_err(alloc)?,
            row_hit: s.alloc_zeros(max_rows.max(1)).map_err(alloc)?,
            loss_sum: s.alloc_zeros(1).map_err(alloc)?,
            correct: s.alloc_zeros(1).map_err(alloc)?,
        })
    }

    pub fn max_rows(&self) -> usize {
        self.row_loss.len()
    }

    /// Zeroes the totals (asynchronously, on the compute stream).
    pub fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        let s = gpu.stream();
        s.memset_zeros(&mut self.loss_sum).map_err(|e| Error::cuda("cross_entropy reset", e))?;
        s.memset_zeros(&mut self.correct).map_err(|e| Error::cuda("cross_entropy reset", e))?;
        Ok(())
    }

    /// `(loss_sum, correct)`: copies back, so it waits for the stream.
    pub fn read(&self, gpu: &Gpu) -> Result<(f64, u64)> {
        let s = gpu.stream();
        let l = s.clone_dtoh(&self.loss_sum).map_err(|e| Error::cuda("cross_entropy read loss", e))?;
        let c = s.clone_dtoh(&self.correct).map_err(|e| Error::cuda("cross_entropy read hits", e))?;
        Ok((l[0], c[0]))
    }
}

/// Training: `dlogits = grad_scale * (softmax - onehot) / N` (in T), and the
/// batch's loss sum and hit count added to `totals` (the mean loss is
/// `loss_sum / N` after a reset). `shape` is `[N, C]`; `grad_scale` is one
/// f32 on the device (the loss scale, 1 without mixed precision).
pub fn forward_backward<T: DeviceFloat>(
    gpu: &Gpu,
    logits: &impl DevicePtr<T>,
    labels: &impl DevicePtr<u32>,
    shape: [usize; 2],
    grad_scale: &impl DevicePtr<f32>,
    dlogits: &mut impl DevicePtrMut<T>,
    totals: &mut CrossEntropyTotals,
) -> Result<()> {
    const OP: &str = "cross_entropy forward_backward";
    check(OP, logits, labels, shape, totals)?;
    check_len(OP, "grad_scale", grad_scale.len(), 1)?;
    check_len(OP, "dlogits", dlogits.len(), shape[0] * shape[1])?;
    let stream = gpu.stream();
    let (sp, _s) = grad_scale.device_ptr(stream);
    let (dp, _d) = dlogits.device_ptr_mut(stream);
    rows::<T>(gpu, OP, logits, labels, shape, (sp, dp), totals)
}

/// Evaluation: adds the batch's loss sum and hit count to `totals`.
pub fn forward<T: DeviceFloat>(
    gpu: &Gpu,
    logits: &impl DevicePtr<T>,
    labels: &impl DevicePtr<u32>,
    shape: [usize; 2],
    totals: &mut CrossEntropyTotals,
) -> Result<()> {
    const OP: &str = "cross_entropy forward";
    check(OP, logits, labels, shape, totals)?;
    // Null grad_scale and dlogits: the kernel skips the gradient.
    rows::<T>(gpu, OP, logits, labels, shape, (0, 0), totals)
}

/// The kernel's lanes walk the columns with an `int` stepping by 32, so the
/// step past the last column must still fit an `int` (signed overflow is
/// undefined behaviour in CUDA C++).
const MAX_CLASSES: usize = (i32::MAX - 31) as usize;

fn check_classes(op: &str, c: usize) -> Result<()> {
    if c > MAX_CLASSES {
        return Err(Error::shape(format!(
            "{op}: {c} classes is more than the kernel's int column index allows ({MAX_CLASSES})"
        )));
    }
    Ok(())
}

fn check<T>(
    op: &str,
    logits: &impl DevicePtr<T>,
    labels: &impl DevicePtr<u32>,
    [n, c]: [usize; 2],
    totals: &CrossEntropyTotals,
) -> Result<()> {
    if n == 0 || c == 0 {
        return Err(Error::shape(format!(
            "{op}: empty logits [{n}, {c}] (need at least one row and one class)"
        )));
    }
    check_classes(op, c)?;
    if n > totals.max_rows() {
        return Err(Error::shape(format!(
            "{op}: {n} rows but the buffers were allocated for at most {}",
            totals.max_rows()
        )));
    }
    check_len(op, "logits", logits.len(), n * c)?;
    check_len(op, "labels", labels.len(), n)
}

/// Launches the row kernel (with `(grad_scale, dlogits)` device pointers,
/// or nulls) and the fixed-order accumulation into the totals.
fn rows<T: DeviceFloat>(
    gpu: &Gpu,
    op: &str,
    logits: &impl DevicePtr<T>,
    labels: &impl DevicePtr<u32>,
    [n, c]: [usize; 2],
    (scale_ptr, dlogits_ptr): (u64, u64),
    totals: &mut CrossEntropyTotals,
) -> Result<()> {
    let rows_f = gpu.kernel(T::pick(&CROSS_ENTROPY_ROWS))?;
    let acc_f = gpu.kernel(&CROSS_ENTROPY_ACCUMULATE)?;
    let stream = gpu.stream();
    let (n64, c64) = (n as i64, c as i64);
    let (lp, _l) = logits.device_ptr(stream);
    let (yp, _y) = labels.device_ptr(stream);
    {
        let (rl, _rl) = totals.row_loss.device_ptr_mut(stream);
        let (rh, _rh) = totals.row_hit.device_ptr_mut(stream);
        let cfg = launch_rows(n);
        let mut b = rows_f.launch_on(stream);
        b.arg(&lp).arg(&yp).arg(&n64).arg(&c64).arg(&scale_ptr).arg(&dlogits_ptr).arg(&rl).arg(&rh);
        // SAFETY: logits, labels and dlogits were checked against [n, c]; the
        // row buffers hold at least n (checked against max_rows); null
        // grad_scale/dlogits are the kernel's forward-only mode.
        unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(format!("{op} (rows)"), e))?;
    }
    let (rl, _rl) = totals.row_loss.device_ptr(stream);
    let (rh, _rh) = totals.row_hit.device_ptr(stream);
    let (ls, _ls) = totals.loss_sum.device_ptr_mut(stream);
    let (cs, _cs) = totals.correct.device_ptr_mut(stream);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ACC_THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut b = acc_f.launch_on(stream);
    b.arg(&rl).arg(&rh).arg(&n64).arg(&ls).arg(&cs);
    // SAFETY: the row buffers hold n entries written above; the totals are
    // one element each; the kernel's shared arrays match ACC_THREADS.
    unsafe { b.launch(cfg) }.map_err(|e| Error::cuda(format!("{op} (accumulate)"), e))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests_cuda.rs"]
mod tests_cuda;

#[cfg(test)]
mod bounds {
    use super::check_classes;

    /// A class count whose last lane step (j += 32) would overflow the
    /// kernel's `int` is refused; the largest safe one is accepted.
    #[test]
    fn a_class_count_the_int_loop_would_overflow_on_is_refused() {
        let max = (i32::MAX - 31) as usize;
        assert!(check_classes("ce", max).is_ok());
        let e = check_classes("ce", max + 1).unwrap_err().to_string();
        assert!(e.contains(&format!("{} classes is more than", max + 1)), "{e}");
    }
}
