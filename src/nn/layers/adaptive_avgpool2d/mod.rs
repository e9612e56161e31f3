//! `nn.AdaptiveAvgPool2d(1)`: global average pooling, `[C, H, W]` to
//! `[C, 1, 1]`, the mean of each plane (a ResNet's head before `fc`). Other
//! output sizes are refused: their windows overlap unevenly, and nothing
//! here needs them yet.
//!
//! Gradients: dx `=` dy / (H * W) everywhere in the plane.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{chw, config_err, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::ops::avg_pool2d::{self as pool, AvgPool2dArgs};
use crate::tensor::Tensor;

/// `{ type = "adaptive_avgpool2d", output_size = 1 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub output_size: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdaptiveAvgPool2d {
    pub output_size: usize,
    /// The input's H and W (the window).
    #[serde(skip)]
    pub in_hw: [usize; 2],
}

impl AdaptiveAvgPool2d {
    pub fn args(&self) -> AvgPool2dArgs {
        AvgPool2dArgs::global(self.in_hw[0], self.in_hw[1])
    }
}

impl Layer for AdaptiveAvgPool2d {
    type Config = Config;
    /// The input's shape.
    type Saved = Vec<usize>;

    const TYPE: &'static str = "adaptive_avgpool2d";
    const KEYS: &'static [&'static str] = &["type", "name", "output_size"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config { output_size: raw.output_size.ok_or_else(|| E::missing_field("output_size"))? })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let (c, h, w) = chw(shape, Self::TYPE, key)?;
        if cfg.output_size != 1 {
            return Err(config_err(
                format!("{key}.output_size"),
                format!(
                    "only output_size = 1 (global average pooling) is supported, got {}; \
                     for other sizes use avgpool2d with a kernel_size and stride",
                    cfg.output_size
                ),
            ));
        }
        Ok((AdaptiveAvgPool2d { output_size: 1, in_hw: [h, w] }, vec![c, 1, 1]))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    fn saved_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        Some(0)
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Vec<usize>)> {
        super::avgpool2d::forward(x, self.args())
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        pool::forward(&x, self.args())
    }

    fn backward(
        &self,
        _w: &mut Weights,
        x_shape: Vec<usize>,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        super::avgpool2d::backward(dy, &x_shape, self.args())
    }
}

impl fmt::Display for AdaptiveAvgPool2d {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "AdaptiveAvgPool2d(output_size={})", self.output_size)
    }
}
