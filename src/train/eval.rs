//! Evaluation on the test split: BatchNorm in eval mode, loss summed in f64.

use crate::data::{Dataset, Loader};
use crate::error::Result;
use crate::nn::Model;
use crate::ops;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct EvalResult {
    pub accuracy: f64,
    pub loss: f64,
    pub correct: usize,
    pub total: usize,
}

pub fn evaluate(model: &Model, ds: &Arc<Dataset>, batch_size: usize, prefetch: usize) -> Result<EvalResult> {
    evaluate_shard(model, ds, 0, 1, batch_size, prefetch)
}

/// Scores rank `rank`'s shard of the test set (samples rank, rank + world, ...):
/// the shards cover every sample exactly once, so the summed counts are exact.
pub fn evaluate_shard(
    model: &Model,
    ds: &Arc<Dataset>,
    rank: usize,
    world: usize,
    batch_size: usize,
    prefetch: usize,
) -> Result<EvalResult> {
    let indices: Vec<usize> = (rank..ds.len()).step_by(world.max(1)).collect();
    let loader = Loader::new(ds.clone(), indices, batch_size, false, prefetch);
    let (mut loss_sum, mut correct, mut total) = (0.0f64, 0usize, 0usize);
    for batch in loader {
        let logits = ops::cross_entropy::as_rows(model.forward_eval(batch.images)?)?;
        let (l, c) = ops::cross_entropy::forward(&logits, &batch.labels)?;
        loss_sum += l;
        correct += c;
        total += batch.labels.len();
    }
    let denom = total.max(1) as f64;
    Ok(EvalResult { accuracy: correct as f64 / denom, loss: loss_sum / denom, correct, total })
}
