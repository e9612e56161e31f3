//! Softmax cross-entropy with mean reduction (`nn.CrossEntropyLoss()`), fused
//! with its gradient for training and with the top-1 hit count for metrics.

pub mod cpu;
pub mod cuda;

use super::half_emu::{any_f16, f32_of};
use crate::error::{Error, Result};
use crate::tensor::{CpuStorage, Tensor};

/// Result of the training loss: the mean loss, how many rows were classified
/// correctly, and the (scaled) gradient w.r.t. the logits.
#[derive(Debug, Clone)]
pub struct CrossEntropyOut {
    pub loss: f32,
    pub correct: usize,
    pub dlogits: Tensor,
}

/// `(n, c)` after checking the logits are `[N, C]`, N > 0, and every label is
/// a class index for its row.
fn check(op: &str, logits: &Tensor, labels: &[u32]) -> Result<(usize, usize)> {
    let (n, c) = match *logits.shape() {
        [n, c] => (n, c),
        _ => {
            return Err(Error::shape(format!(
                "cross_entropy {op}: expected [N, C] logits, got shape {:?}",
                logits.shape()
            )))
        }
    };
    if labels.len() != n {
        return Err(Error::shape(format!(
            "cross_entropy {op}: {} labels for {n} rows of logits (shape {:?})",
            labels.len(),
            logits.shape()
        )));
    }
    if n == 0 {
        return Err(Error::shape(format!(
            "cross_entropy {op}: empty batch (logits shape {:?})",
            logits.shape()
        )));
    }
    if let Some((row, &label)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= c) {
        return Err(Error::shape(format!(
            "cross_entropy {op}: label {label} in row {row} is out of range for {c} classes \
             (labels must be 0..{c})"
        )));
    }
    Ok((n, c))
}

fn unsupported(op: &str, t: &Tensor) -> Error {
    Error::Unsupported(format!(
        "cross_entropy {op} on {:?} tensors: this path takes host f32 (f16 is widened before it)",
        t.dtype()
    ))
}

/// A language model's `[N, T, V]` logits as `[N * T, V]` rows, as
/// nanoGPT's `F.cross_entropy(logits.view(-1, V), targets.view(-1))`
/// (targets are already `N * T` labels); other logits as they are.
pub fn as_rows(logits: Tensor) -> Result<Tensor> {
    match *logits.shape() {
        [n, t, v] => logits.reshape(&[n * t, v]),
        _ => Ok(logits),
    }
}

/// Mean loss, hit count, and `dlogits = grad_scale * (softmax - onehot) / N`.
/// `grad_scale` is the loss scale under mixed precision (1 otherwise).
/// f16 logits: softmax and loss in f32; `dlogits` is rounded to f16 (so a
/// loss scale that is too large overflows here, as on the GPU).
pub fn forward_backward(logits: &Tensor, labels: &[u32], grad_scale: f32) -> Result<CrossEntropyOut> {
    if any_f16([Some(logits)]) {
        let mut out = forward_backward(&f32_of(logits), labels, grad_scale)?;
        out.dlogits = out.dlogits.into_dtype(logits.dtype());
        return Ok(out);
    }
    let (n, c) = check("forward_backward", logits, labels)?;
    match logits.storage() {
        CpuStorage::F32(xs) => {
            let mut d = vec![0.0f32; n * c];
            let (sum, correct) = cpu::forward_backward(xs, labels, c, grad_scale, &mut d);
            Ok(CrossEntropyOut {
                loss: (sum / n as f64) as f32,
                correct,
                dlogits: Tensor::from_vec(&[n, c], d)?,
            })
        }
        _ => Err(unsupported("forward_backward", logits)),
    }
}

/// Evaluation: the loss SUM over the batch (f64, so an epoch's total can be
/// accumulated across batches before dividing) and the hit count.
pub fn forward(logits: &Tensor, labels: &[u32]) -> Result<(f64, usize)> {
    if any_f16([Some(logits)]) {
        return forward(&f32_of(logits), labels);
    }
    let (_, c) = check("forward", logits, labels)?;
    match logits.storage() {
        CpuStorage::F32(xs) => Ok(cpu::forward(xs, labels, c)),
        _ => Err(unsupported("forward", logits)),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_f16;
