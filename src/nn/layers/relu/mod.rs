//! `nn.ReLU`.
//!
//! Gradients: dx `=` dy where the output is positive, else 0.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{mul, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// `{ type = "relu" }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Relu {}

impl Layer for Relu {
    type Config = Config;
    /// The output (its sign is the mask).
    type Saved = Tensor;

    const TYPE: &'static str = "relu";
    const KEYS: &'static [&'static str] = &["type", "name"];

    fn config<E: serde::de::Error>(_raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {})
    }

    fn resolve(_cfg: &Config, shape: &[usize], _key: &str) -> Result<(Self, Vec<usize>)> {
        Ok((Relu {}, shape.to_vec()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[super::numel128(m.out_shape)?, m.act])
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Tensor)> {
        let y = self.forward_eval(w, x)?;
        Ok((y.clone(), y))
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        let mut y = x;
        ops::relu::forward_(&mut y)?;
        Ok(y)
    }

    fn backward(
        &self,
        _w: &mut Weights,
        y: Tensor,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let mut dx = dy;
        ops::relu::backward_(&y, &mut dx)?;
        Ok(Some(dx))
    }
}

impl fmt::Display for Relu {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ReLU()")
    }
}
