//! `nn.GELU(approximate="none")`, or `"tanh"` (GPT-2's form).
//!
//! Gradients: dx `=` dy * gelu'(x). On the CPU, training keeps gelu'(x)
//! (f32) from the forward instead of x: the forward computes Φ(x) anyway,
//! and the backward is then one multiply an element.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{config_err, mul, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// `{ type = "gelu", approximate = "none" }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub approximate: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gelu {
    pub approximate: String,
}

impl Gelu {
    fn tanh(&self) -> bool {
        self.approximate == "tanh"
    }
}

impl Layer for Gelu {
    type Config = Config;
    /// gelu'(x), f32 ([`ops::gelu::forward_train`]).
    type Saved = Tensor;

    const TYPE: &'static str = "gelu";
    const KEYS: &'static [&'static str] = &["type", "name", "approximate"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config { approximate: raw.approximate.clone().unwrap_or_else(|| "none".into()) })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        if !matches!(cfg.approximate.as_str(), "none" | "tanh") {
            return Err(config_err(
                format!("{key}.approximate"),
                format!("approximate argument must be either none or tanh, got {:?}", cfg.approximate),
            ));
        }
        Ok((Gelu { approximate: cfg.approximate.clone() }, shape.to_vec()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        // The device plan keeps the input; the CPU keeps the f32 slope.
        mul(&[super::numel128(m.in_shape)?, if m.on_gpu { m.act } else { 4 }])
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Tensor)> {
        ops::gelu::forward_train(&x, self.tanh())
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        ops::gelu::forward(&x, self.tanh())
    }

    fn backward(
        &self,
        _w: &mut Weights,
        slope: Tensor,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(Some(ops::gelu::backward_from_slope(&slope, &dy)?))
    }
}

/// PyTorch's repr: `GELU(approximate='none')`.
impl fmt::Display for Gelu {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GELU(approximate='{}')", self.approximate)
    }
}
