//! SyncBatchNorm: BatchNorm2d whose batch statistics cover every rank's batch.
//! The forward reduces the per-channel (count, sum, sum of squares), the
//! backward (sum dy, sum dy*xhat), through a caller-supplied sum over ranks,
//! so uneven per-rank batches stay correct. As in PyTorch, the weight and bias
//! gradients are the local ones (DDP averages them like any other gradient).

use super::RunningStats;
use super::{backward_widened, cpu, dims, forward_widened, BatchNormSaved, BnGrads, BnHyper, BnParams};
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
pub fn forward_train(
    x: &Tensor,
    params: BnParams<&Tensor>,
    running: RunningStats<&mut Tensor>,
    hyper: BnHyper,
    sum: &mut SumOverRanks,
) -> Result<(Tensor, BatchNormSaved, usize)> {
    let mut running = running;
    // f16 (O2's f16 activations, O3's f16 BatchNorm): as plain batch_norm does,
    // statistics and their all-reduce in f32, output in x's dtype.
    if let Some(r) = forward_widened(x, params, running.reborrow(), |x, p, r| {
        let (y, saved, count) = forward_train(x, p, r, hyper, &mut *sum)?;
        Ok((y, (saved, count)))
    }) {
        return r.map(|(y, (saved, count))| (y, saved, count));
    }
    let (BnParams { weight, bias }, BnHyper { momentum, eps }) = (params, hyper);
    let RunningStats { running_mean, running_var } = running;
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
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    saved: &BatchNormSaved,
    count: usize,
    dy: &Tensor,
    grads: BnGrads<&mut Tensor>,
    sum: &mut SumOverRanks,
) -> Result<Tensor> {
    let mut grads = grads;
    if let Some(r) = backward_widened(x, weight, dy, grads.reborrow(), |x, w, dy, g| {
        backward(x, w, saved, count, dy, g, &mut *sum)
    }) {
        return r;
    }
    let BnGrads { dweight, dbias } = grads;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::rand_vec_f32;
    use crate::tensor::DType;

    /// One rank (the sum over ranks is the identity) must reproduce plain
    /// BatchNorm bit for bit, with f16 activations and f32 parameters (apex
    /// O2) and with everything f16 (O3), and with loss-scaled gradients.
    #[test]
    fn one_rank_equals_plain_batch_norm_with_f16_activations() {
        let (n, c, h) = (4, 3, 5);
        let shape = [n, c, h, h];
        let len = n * c * h * h;
        for param_dtype in [DType::F32, DType::F16] {
            let x = Tensor::from_f32_as(&shape, rand_vec_f32(len, 1), DType::F16).unwrap();
            let dy: Vec<f32> = rand_vec_f32(len, 2).iter().map(|v| v * 32768.0).collect();
            let dy = Tensor::from_f32_as(&shape, dy, DType::F16).unwrap();
            let w = Tensor::from_f32_as(&[c], rand_vec_f32(c, 3), param_dtype).unwrap();
            let b = Tensor::from_f32_as(&[c], rand_vec_f32(c, 4), param_dtype).unwrap();
            let stats = || {
                (
                    Tensor::zeros_dtype(&[c], param_dtype),
                    Tensor::from_f32_as(&[c], vec![1.0; c], param_dtype).unwrap(),
                )
            };
            let (mut rm1, mut rv1) = stats();
            let (mut rm2, mut rv2) = stats();
            let params = BnParams { weight: &w, bias: &b };
            let hyper = BnHyper::default();
            let running1 = RunningStats { running_mean: &mut rm1, running_var: &mut rv1 };
            let (y1, s1) = super::super::forward_train(&x, params, running1, hyper).unwrap();
            let mut id = |v: Vec<f32>| Ok(v);
            let running2 = RunningStats { running_mean: &mut rm2, running_var: &mut rv2 };
            let (y2, s2, count) = forward_train(&x, params, running2, hyper, &mut id).unwrap();
            assert_eq!(count, n * h * h);
            assert_eq!((y1.dtype(), y2.dtype()), (DType::F16, DType::F16));
            assert_eq!(y1.to_f32_vec(), y2.to_f32_vec(), "{param_dtype:?} forward");
            assert_eq!(rm1.to_f32_vec(), rm2.to_f32_vec());
            assert_eq!(rv1.to_f32_vec(), rv2.to_f32_vec());
            let grads = || (Tensor::zeros_dtype(&[c], param_dtype), Tensor::zeros_dtype(&[c], param_dtype));
            let (mut dw1, mut db1) = grads();
            let (mut dw2, mut db2) = grads();
            let grads1 = BnGrads { dweight: &mut dw1, dbias: &mut db1 };
            let dx1 = super::super::backward(&x, &w, &s1, &dy, grads1).unwrap();
            let grads2 = BnGrads { dweight: &mut dw2, dbias: &mut db2 };
            let dx2 = backward(&x, &w, &s2, count, &dy, grads2, &mut id).unwrap();
            assert_eq!(dx1.to_f32_vec(), dx2.to_f32_vec(), "{param_dtype:?} dx");
            // The parameter gradients are per-channel sums: equal up to f32 summation order.
            for (g1, g2) in [(dw1, dw2), (db1, db2)] {
                for (p, q) in g1.to_f32_vec().iter().zip(g2.to_f32_vec()) {
                    assert!(
                        *p == q || (p - q).abs() <= 1e-6 * p.abs().max(1.0),
                        "{param_dtype:?}: {p} vs {q}"
                    );
                }
            }
        }
    }
}
