//! Layer normalization over the last dimension, PyTorch's
//! `F.layer_norm(x, (C,), weight, bias, eps)`: per row of `C` values,
//! `y = (x - mean) / sqrt(var + eps) * weight + bias`, the biased variance,
//! statistics in f32 whatever the input's dtype (apex keeps layer_norm in
//! f32; f16 inputs are widened and the output rounded once).

pub mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;

use super::cpu_f32;
use super::half_emu::{any_f16, f32_of, grads_in_f32};
use crate::error::{Error, Result};
use crate::tensor::{written_by, Tensor};

const OP: &str = "layer_norm";

/// Each row's mean and 1/sqrt(var + eps), kept for backward.
#[derive(Debug, Clone)]
pub struct Stats {
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

fn rows(x: &Tensor, weight: &Tensor) -> Result<(usize, usize)> {
    let c = *x.shape().last().ok_or_else(|| Error::shape("layer_norm: a 0-D input has no last dimension"))?;
    weight.check_shape("layer_norm weight", &[c])?;
    Ok((x.numel() / c.max(1), c))
}

pub fn forward(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, eps: f32) -> Result<(Tensor, Stats)> {
    if any_f16([Some(x), Some(weight), bias]) {
        let b = bias.map(f32_of);
        let (y, s) = forward(&f32_of(x), &f32_of(weight), b.as_deref(), eps)?;
        return Ok((y.into_dtype(x.dtype()), s));
    }
    let (n, c) = rows(x, weight)?;
    if let Some(b) = bias {
        b.check_shape("layer_norm bias", &[c])?;
    }
    let xs = cpu_f32(OP, "input", x)?;
    let w = cpu_f32(OP, "weight", weight)?;
    let b = bias.map(|b| cpu_f32(OP, "bias", b)).transpose()?;
    let mut stats = Stats { mean: vec![0.0; n], rstd: vec![0.0; n] };
    let (mean, rstd) = (&mut stats.mean, &mut stats.rstd);
    // SAFETY: cpu::forward writes every element of every row (n rows of c).
    let y = unsafe { written_by(xs.len(), |y| cpu::forward(c, xs, w, b, eps, y, mean, rstd)) };
    Ok((Tensor::from_vec(x.shape(), y)?, stats))
}

/// dx (`=`), and `weight.grad`/`bias.grad` accumulated (`+=`).
pub fn backward(
    x: &Tensor,
    weight: &Tensor,
    stats: &Stats,
    dy: &Tensor,
    dweight: &mut Tensor,
    dbias: Option<&mut Tensor>,
) -> Result<Tensor> {
    dy.check_shape("layer_norm backward: dy (must match x)", x.shape())?;
    if any_f16([Some(x), Some(weight), Some(dy), Some(&*dweight), dbias.as_deref()]) {
        let (x32, w32, dy32) = (f32_of(x), f32_of(weight), f32_of(dy));
        let dx = grads_in_f32(dweight, dbias, |dw, db| backward(&x32, &w32, stats, &dy32, dw, db))?;
        return Ok(dx.into_dtype(dy.dtype()));
    }
    let (n, c) = rows(x, weight)?;
    if stats.mean.len() != n || stats.rstd.len() != n {
        return Err(Error::internal(format!(
            "layer_norm backward: statistics of {} rows for {n}",
            stats.mean.len()
        )));
    }
    let xs = cpu_f32(OP, "input", x)?;
    let w = cpu_f32(OP, "weight", weight)?;
    let dys = cpu_f32(OP, "dy", dy)?;
    let dw = dweight.as_f32_mut()?;
    let db = match dbias {
        Some(b) => Some(b.as_f32_mut()?),
        None => None,
    };
    // SAFETY: cpu::backward writes every element of every row.
    let dx = unsafe {
        written_by(xs.len(), |dx| cpu::backward(c, xs, w, &stats.mean, &stats.rstd, dys, dx, dw, db))
    };
    Tensor::from_vec(x.shape(), dx)
}
