//! `nn.RMSNorm(normalized_shape=C, eps=None, elementwise_affine=True)` over
//! the last dimension: `y = x / sqrt(mean(x^2) + eps) * weight`, statistics
//! in f32 whatever the activations' dtype (apex's class for norms, as
//! LayerNorm's). Its CPU kernels are `cpu.rs`, its device side `cuda.rs`
//! and kernels/rmsnorm.cu, and `mnist_mlp.toml` is the model the PyTorch
//! oracle trains it in (tests/torch_parity.rs).
//!
//! Gradients: `weight.grad += sum(dy * xhat)`, dx `=`.

pub mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{config_err, mul, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::{Error, Result};
use crate::ops::cpu_f32;
use crate::ops::half_emu::{any_f16, f32_of, grads_in_f32};
use crate::tensor::{written_by, Tensor};

const OP: &str = "rmsnorm";

/// `{ type = "rmsnorm", eps = 1.1920929e-7, elementwise_affine = true }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub eps: f32,
    pub elementwise_affine: bool,
}

/// Serialized as `nn.RMSNorm`'s arguments.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RmsNorm {
    pub normalized_shape: usize,
    pub eps: f32,
    pub elementwise_affine: bool,
}

/// `x` as `[rows, c]` rows.
fn rows(x: &Tensor, c: usize) -> Result<usize> {
    match x.shape().last() {
        Some(&last) if last == c && c > 0 => Ok(x.numel() / c),
        _ => Err(Error::shape(format!("{OP}: an input of shape {:?} has no last dimension of {c}", x.shape()))),
    }
}

impl RmsNorm {
    fn weight<'w>(&self, w: &'w Weights) -> Result<Option<&'w Tensor>> {
        if !self.elementwise_affine {
            return Ok(None);
        }
        Ok(Some(&w.param(0, Self::TYPE)?.value))
    }

    /// `y` and each row's 1/rms, f16 inputs widened and the output rounded once.
    fn apply(&self, x: &Tensor, weight: Option<&Tensor>) -> Result<(Tensor, Vec<f32>)> {
        if any_f16([Some(x), weight]) {
            let w = weight.map(f32_of);
            let (y, rstd) = self.apply(&f32_of(x), w.as_deref())?;
            return Ok((y.into_dtype(x.dtype()), rstd));
        }
        let n = rows(x, self.normalized_shape)?;
        let xs = cpu_f32(OP, "input", x)?;
        let w = weight.map(|w| cpu_f32(OP, "weight", w)).transpose()?;
        let mut rstd = vec![0.0; n];
        // SAFETY: cpu::forward writes every element of every row.
        let y = unsafe {
            written_by(xs.len(), |y| cpu::forward(self.normalized_shape, xs, w, self.eps, y, &mut rstd))
        };
        Ok((Tensor::from_vec(x.shape(), y)?, rstd))
    }

    /// dx where `need_dx`, and the weight's gradient accumulated into `dw`.
    fn grads(
        &self,
        x: &Tensor,
        weight: Option<&Tensor>,
        rstd: &[f32],
        dy: &Tensor,
        dw: Option<&mut Tensor>,
        need_dx: bool,
    ) -> Result<Option<Tensor>> {
        dy.check_shape("rmsnorm backward: dy (must match x)", x.shape())?;
        if any_f16([Some(x), weight, Some(dy), dw.as_deref()]) {
            let (x32, dy32, w32) = (f32_of(x), f32_of(dy), weight.map(f32_of));
            let grads = |dw: Option<&mut Tensor>| self.grads(&x32, w32.as_deref(), rstd, &dy32, dw, need_dx);
            let dx = match dw {
                Some(dw) => grads_in_f32(dw, None, |dw, _| grads(Some(dw)))?,
                None => grads(None)?,
            };
            return Ok(dx.map(|dx| dx.into_dtype(dy.dtype())));
        }
        let (c, n) = (self.normalized_shape, rows(x, self.normalized_shape)?);
        if rstd.len() != n {
            return Err(Error::internal(format!("rmsnorm backward: statistics of {} rows for {n}", rstd.len())));
        }
        let xs = cpu_f32(OP, "input", x)?;
        let dys = cpu_f32(OP, "dy", dy)?;
        let w = weight.map(|w| cpu_f32(OP, "weight", w)).transpose()?;
        let dw = dw.map(|dw| dw.as_f32_mut()).transpose()?;
        if !need_dx {
            cpu::backward(c, xs, w, rstd, dys, None, dw);
            return Ok(None);
        }
        // SAFETY: cpu::backward writes every element of every row of dx.
        let dx = unsafe { written_by(xs.len(), |dx| cpu::backward(c, xs, w, rstd, dys, Some(dx), dw)) };
        Ok(Some(Tensor::from_vec(x.shape(), dx)?))
    }
}

impl Layer for RmsNorm {
    type Config = Config;
    /// The input and each row's 1/rms.
    type Saved = (Tensor, Vec<f32>);

    const TYPE: &'static str = "rmsnorm";
    const KEYS: &'static [&'static str] = &["type", "name", "eps", "elementwise_affine"];
    const DOCS: &'static [(&'static str, &'static str)] = &[
        ("eps", "Added to the mean square before its square root; unset: f32's machine epsilon, as `nn.RMSNorm(eps=None)` computes in f32."),
        ("elementwise_affine", "Learn a per-feature `weight` (`nn.RMSNorm` has no bias)."),
    ];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {
            eps: raw.eps.unwrap_or(f32::EPSILON),
            elementwise_affine: raw.get("elementwise_affine")?.unwrap_or(true),
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let Some(&c) = shape.last() else {
            return Err(config_err(key, "rmsnorm needs an input with at least one dimension"));
        };
        if !(cfg.eps.is_finite() && cfg.eps > 0.0) {
            return Err(config_err(format!("{key}.eps"), format!("must be a positive number, got {}", cfg.eps)));
        }
        let layer = RmsNorm { normalized_shape: c, eps: cfg.eps, elementwise_affine: cfg.elementwise_affine };
        Ok((layer, shape.to_vec()))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        match self.elementwise_affine {
            true => vec![("weight", vec![self.normalized_shape])],
            false => Vec::new(),
        }
    }

    /// PyTorch's: ones.
    fn init(&self, _rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        let w = self.elementwise_affine.then(|| Tensor::full(&[self.normalized_shape], 1.0));
        Ok((w.into_iter().collect(), Vec::new()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Fp32
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        let numel = super::numel128(m.in_shape)?;
        let rows = numel / (self.normalized_shape.max(1) as u128);
        mul(&[numel, m.act])?.checked_add(rows.checked_mul(4)?)
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, (Tensor, Vec<f32>))> {
        let (y, rstd) = self.apply(&x, self.weight(w)?)?;
        Ok((y, (x, rstd)))
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(self.apply(&x, self.weight(w)?)?.0)
    }

    fn backward(
        &self,
        w: &mut Weights,
        (x, rstd): (Tensor, Vec<f32>),
        dy: Tensor,
        need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        match w.params.as_mut_slice() {
            [] if !self.elementwise_affine => self.grads(&x, None, &rstd, &dy, None, need_dx),
            [weight] if self.elementwise_affine => {
                let (value, grad) = (&weight.value, &mut weight.grad);
                self.grads(&x, Some(value), &rstd, &dy, Some(grad), need_dx)
            }
            other => Err(Error::internal(format!("rmsnorm holds {} parameters", other.len()))),
        }
    }
}

/// PyTorch's repr: `RMSNorm((128,), eps=1.1920929e-07, elementwise_affine=True)`.
impl fmt::Display for RmsNorm {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let eps = format!("{:e}", self.eps).replace("e-", "e-0");
        let affine = if self.elementwise_affine { "True" } else { "False" };
        write!(f, "RMSNorm(({},), eps={eps}, elementwise_affine={affine})", self.normalized_shape)
    }
}
