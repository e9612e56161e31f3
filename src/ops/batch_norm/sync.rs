//! SyncBatchNorm: BatchNorm2d whose batch statistics cover every rank's batch.
//! The forward reduces the per-channel (count, sum, sum of squares), the
//! backward (sum dy, sum dy*xhat), through a caller-supplied sum over ranks,
//! so uneven per-rank batches stay correct. As in PyTorch, the weight and bias
//! gradients are the local ones (DDP averages them like any other gradient).

use super::{cpu, dims, BatchNormSaved};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Element-wise sum of a buffer over all ranks (an all-reduce).
pub type SumOverRanks<'a> = dyn FnMut(Vec<f32>) -> Result<Vec<f32>> + 'a;

fn reduced(sum: &mut SumOverRanks, buf: Vec<f32>) -> Result<Vec<f32>> {
    let len = buf.len();
    let out = sum(buf)?;
    if out.len() != len {
        return Err(Error::Training(format!(
            "sync_batch_norm: reduction returned {} values for {len}",
            out.len()
        )));
    }
    Ok(out)
}

/// Training forward with global statistics; updates the running statistics
/// (identically on every rank) and returns what [`backward`] needs.
#[allow(clippy::too_many_arguments)]
pub fn forward_train(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    running_mean: &mut Tensor,
    running_var: &mut Tensor,
    momentum: f32,
    eps: f32,
    sum: &mut SumOverRanks,
) -> Result<(Tensor, BatchNormSaved, usize)> {
    let (n, c, hw) = dims("sync forward_train", x)?;
    let xs = x.as_f32()?;
    let local = cpu::local_sums(xs, n, c, hw);
    // One buffer: [count, sum[c], sumsq[c]], reduced in f32 as the numerics contract says.
    let mut buf = Vec::with_capacity(1 + 2 * c);
    buf.push(local.count as f32);
    buf.extend(local.sum.iter().map(|&v| v as f32));
    buf.extend(local.sumsq.iter().map(|&v| v as f32));
    let g = reduced(sum, buf)?;
    let count = g[0].round() as usize;
    if count <= 1 {
        return Err(Error::shape(format!(
            "sync_batch_norm: expected more than 1 value per channel over all ranks, got {count}"
        )));
    }
    let gsum: Vec<f64> = g[1..=c].iter().map(|&v| f64::from(v)).collect();
    let gsumsq: Vec<f64> = g[1 + c..].iter().map(|&v| f64::from(v)).collect();
    let stats = cpu::batch_stats::<f32>(&gsum, &gsumsq, count, f64::from(eps));
    let mut out = vec![0.0f32; xs.len()];
    cpu::normalize_affine(xs, c, hw, &stats.mean, &stats.invstd, weight.as_f32()?, bias.as_f32()?, &mut out);
    cpu::update_running(running_mean.as_f32_mut()?, running_var.as_f32_mut()?, &stats, momentum);
    let saved = BatchNormSaved { mean: stats.mean, invstd: stats.invstd };
    Ok((Tensor::from_vec(x.shape(), out)?, saved, count))
}

/// Backward with global (sum dy, sum dy*xhat); `count` is the global count the
/// forward returned. Weight/bias gradients accumulate the local sums.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    saved: &BatchNormSaved,
    count: usize,
    dy: &Tensor,
    dweight: &mut Tensor,
    dbias: &mut Tensor,
    sum: &mut SumOverRanks,
) -> Result<Tensor> {
    let (n, c, hw) = dims("sync backward", x)?;
    dy.check_shape("sync_batch_norm backward: dy (must match x)", x.shape())?;
    let (xs, dys) = (x.as_f32()?, dy.as_f32()?);
    let local = cpu::backward_sums(xs, dys, n, c, hw, &saved.mean, &saved.invstd);
    for (g, &s) in dweight.as_f32_mut()?.iter_mut().zip(&local.sum_dy_xhat) {
        *g += s as f32;
    }
    for (g, &s) in dbias.as_f32_mut()?.iter_mut().zip(&local.sum_dy) {
        *g += s as f32;
    }
    let buf: Vec<f32> = local.sum_dy.iter().chain(&local.sum_dy_xhat).map(|&v| v as f32).collect();
    let g = reduced(sum, buf)?;
    let global = cpu::BackwardSums {
        sum_dy: g[..c].iter().map(|&v| f64::from(v)).collect(),
        sum_dy_xhat: g[c..].iter().map(|&v| f64::from(v)).collect(),
    };
    let mut dx = vec![0.0f32; xs.len()];
    cpu::backward_dx(xs, dys, c, hw, &saved.mean, &saved.invstd, weight.as_f32()?, &global, count, &mut dx);
    Tensor::from_vec(x.shape(), dx)
}
