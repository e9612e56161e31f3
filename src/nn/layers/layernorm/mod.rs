//! `nn.LayerNorm(normalized_shape=C, eps=1e-5, bias=True)` over the last
//! dimension (nanoGPT's `LayerNorm(ndim, bias)`), statistics in f32.
//!
//! Gradients: `weight.grad += sum(dy * xhat)`, `bias.grad += sum(dy)`, dx `=`.

pub mod cuda;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{config_err, mul, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::{Error, Result};
use crate::ops;
use crate::ops::layer_norm::Stats;
use crate::tensor::Tensor;

/// `{ type = "layernorm", eps = 1e-5, bias = true }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub eps: f32,
    pub bias: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerNorm {
    pub normalized_shape: usize,
    pub eps: f32,
    pub bias: bool,
}

impl LayerNorm {
    fn apply(&self, w: &Weights, x: &Tensor) -> Result<(Tensor, Stats)> {
        let weight = &w.param(0, Self::TYPE)?.value;
        ops::layer_norm::forward(x, weight, w.params.get(1).map(|b| &b.value), self.eps)
    }
}

impl Layer for LayerNorm {
    type Config = Config;
    /// The input and each row's statistics.
    type Saved = (Tensor, Stats);

    const TYPE: &'static str = "layernorm";
    const KEYS: &'static [&'static str] = &["type", "name", "eps", "bias"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config { eps: raw.eps.unwrap_or(1e-5), bias: raw.bias.unwrap_or(true) })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let Some(&c) = shape.last() else {
            return Err(config_err(key, "layernorm needs an input with at least one dimension"));
        };
        if !(cfg.eps.is_finite() && cfg.eps > 0.0) {
            return Err(config_err(
                format!("{key}.eps"),
                format!("must be a positive number, got {}", cfg.eps),
            ));
        }
        Ok((LayerNorm { normalized_shape: c, eps: cfg.eps, bias: cfg.bias }, shape.to_vec()))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut p = vec![("weight", vec![self.normalized_shape])];
        if self.bias {
            p.push(("bias", vec![self.normalized_shape]));
        }
        p
    }

    /// PyTorch's: ones and zeros.
    fn init(&self, _rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        let mut values = vec![Tensor::full(&[self.normalized_shape], 1.0)];
        if self.bias {
            values.push(Tensor::zeros(&[self.normalized_shape]));
        }
        Ok((values, Vec::new()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Fp32
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        let rows = super::numel128(m.in_shape)? / (self.normalized_shape.max(1) as u128);
        mul(&[super::numel128(m.in_shape)?, m.act])?.checked_add(rows.checked_mul(8)?)
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, (Tensor, Stats))> {
        let (y, stats) = self.apply(w, &x)?;
        Ok((y, (x, stats)))
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(self.apply(w, &x)?.0)
    }

    fn backward(
        &self,
        w: &mut Weights,
        (x, stats): (Tensor, Stats),
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let (weight, bias) = match w.params.as_mut_slice() {
            [weight] => (weight, None),
            [weight, bias] => (weight, Some(bias)),
            other => return Err(Error::internal(format!("layernorm holds {} parameters", other.len()))),
        };
        let dx = ops::layer_norm::backward(
            &x,
            &weight.value,
            &stats,
            &dy,
            &mut weight.grad,
            bias.map(|b| &mut b.grad),
        )?;
        Ok(Some(dx))
    }
}

/// PyTorch's repr: `LayerNorm((128,), eps=1e-05, elementwise_affine=True)` (and `bias=False`).
impl fmt::Display for LayerNorm {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let eps = format!("{:e}", self.eps).replace("e-", "e-0");
        write!(f, "LayerNorm(({},), eps={eps}, elementwise_affine=True", self.normalized_shape)?;
        if !self.bias {
            f.write_str(", bias=False")?;
        }
        f.write_str(")")
    }
}
