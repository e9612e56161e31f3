//! Evaluation on the device: each rank scores its shard of the test set
//! (samples rank, rank + world, ...) with BatchNorm in eval mode, and the
//! (loss sum, correct, total) triple is summed over ranks on the GPU backend.

use crate::cuda::Gpu;
use crate::data::cuda::{gather_batch, DeviceDataset, DeviceIndices};
use crate::dist::cuda::DeviceReducer;
use crate::error::{Error, Result};
use crate::nn::cuda::GpuModel;
use crate::ops::cross_entropy::cuda::CrossEntropyTotals;
use crate::train::{Ddp, EvalResult};
use cudarc::driver::CudaSlice;

#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    gpu: &Gpu,
    dev: &mut GpuModel,
    ds: &DeviceDataset,
    x: &mut CudaSlice<f32>,
    y: &mut CudaSlice<u32>,
    batch_size: usize,
    ddp: &Ddp,
    reducer: Option<&mut DeviceReducer>,
) -> Result<EvalResult> {
    let indices: Vec<usize> = (ddp.rank()..ds.len()).step_by(ddp.world_size().max(1)).collect();
    let order = DeviceIndices::upload(gpu, ds, &indices, 0)?;
    let (per, labels) = (ds.sample_len(), ds.labels_per_sample());
    let mut totals = CrossEntropyTotals::new(gpu, batch_size * labels)?;
    for start in (0..indices.len()).step_by(batch_size.max(1)) {
        let n = (indices.len() - start).min(batch_size);
        let (xs, ys) = (&mut x.slice_mut(0..n * per), &mut y.slice_mut(0..n * labels));
        gather_batch(gpu, ds, &order, start, n, xs, ys)?;
        dev.eval_batch(&x.slice(0..n * per), &y.slice(0..n * labels), n, &mut totals)?;
    }
    let (loss_sum, correct) = totals.read(gpu)?;
    // A language model's loss is per token, as the CPU's evaluation counts it.
    let (mut loss_sum, mut correct, mut total) = (loss_sum, correct as usize, indices.len() * labels);
    if let Some(r) = reducer {
        // f32 counts are exact below 2^24 samples; the loss sum keeps 7 digits.
        let host = [loss_sum as f32, correct as f32, total as f32];
        let mut buf = gpu.stream().clone_htod(&host).map_err(|e| Error::cuda("evaluation totals", e))?;
        r.all_reduce_sum_f32(gpu, &mut buf.as_view_mut(), "evaluation totals")?;
        let sums = gpu.stream().clone_dtoh(&buf).map_err(|e| Error::cuda("evaluation totals", e))?;
        (loss_sum, correct, total) = (f64::from(sums[0]), sums[1].round() as usize, sums[2].round() as usize);
    }
    let denom = total.max(1) as f64;
    Ok(EvalResult { accuracy: correct as f64 / denom, loss: loss_sum / denom, correct, total })
}
