//! `nn.Flatten`: `[N, ...]` to `[N, prod(...)]`, no copy.
//!
//! Gradients: dx `=` dy reshaped.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{config_err, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::config::model::numel;
use crate::error::Result;
use crate::tensor::Tensor;

/// `{ type = "flatten" }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flatten {}

impl Layer for Flatten {
    type Config = Config;
    /// The input's shape.
    type Saved = Vec<usize>;

    const TYPE: &'static str = "flatten";
    const KEYS: &'static [&'static str] = &["type", "name"];

    fn config<E: serde::de::Error>(_raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {})
    }

    fn resolve(_cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        // Every shape reaching here was checked to fit by the layer that made it.
        let n = numel(shape)
            .ok_or_else(|| config_err(key, format!("its input {shape:?} does not fit in 64 bits")))?;
        Ok((Flatten {}, vec![n]))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    fn saved_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        Some(0)
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Vec<usize>)> {
        let shape = x.shape().to_vec();
        Ok((self.forward_eval(w, x)?, shape))
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        let n = x.shape().first().copied().unwrap_or(0);
        let rest = x.shape().iter().skip(1).product::<usize>();
        x.reshape(&[n, rest])
    }

    fn backward(
        &self,
        _w: &mut Weights,
        shape: Vec<usize>,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(Some(dy.reshape(&shape)?))
    }
}

impl fmt::Display for Flatten {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Flatten()")
    }
}
