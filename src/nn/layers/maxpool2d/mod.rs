//! `nn.MaxPool2d` with square windows and no padding.
//!
//! Gradients: dx `=` dy scattered to each window's maximum (first on ties).

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{chw, config_err, mul, positive, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

/// `{ type = "maxpool2d", kernel_size (or kernel), stride = kernel_size }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub kernel_size: usize,
    /// Defaults to `kernel_size`, as in PyTorch.
    pub stride: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaxPool2d {
    pub kernel_size: usize,
    pub stride: usize,
}

/// The argmax of every output within its plane, and the input's shape.
pub struct Saved {
    pub indices: Vec<u32>,
    pub x_shape: Vec<usize>,
}

impl Layer for MaxPool2d {
    type Config = Config;
    type Saved = Saved;

    const TYPE: &'static str = "maxpool2d";
    const KEYS: &'static [&'static str] = &["type", "name", "kernel_size", "kernel", "stride"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        let kernel_size = raw.kernel_size.ok_or_else(|| E::missing_field("kernel_size"))?;
        Ok(Config { kernel_size, stride: raw.stride.unwrap_or(kernel_size) })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let &Config { kernel_size: k, stride: s } = cfg;
        let (c, h, w) = chw(shape, Self::TYPE, key)?;
        positive(k, key, "kernel_size")?;
        positive(s, key, "stride")?;
        if h < k || w < k {
            return Err(config_err(
                format!("{key}.kernel_size"),
                format!("kernel_size {k} is larger than the input {h}x{w}"),
            ));
        }
        Ok((MaxPool2d { kernel_size: k, stride: s }, vec![c, (h - k) / s + 1, (w - k) / s + 1]))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    /// The argmax indices, u32.
    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[super::numel128(m.out_shape)?, 4])
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Saved)> {
        let (y, indices) = ops::max_pool2d::forward(&x, self.kernel_size, self.stride)?;
        Ok((y, Saved { indices, x_shape: x.shape().to_vec() }))
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(ops::max_pool2d::forward(&x, self.kernel_size, self.stride)?.0)
    }

    fn backward(
        &self,
        _w: &mut Weights,
        s: Saved,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(Some(ops::max_pool2d::backward(&dy, &s.indices, &s.x_shape)?))
    }
}

impl fmt::Display for MaxPool2d {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "MaxPool2d(kernel_size={}, stride={})", self.kernel_size, self.stride)
    }
}
