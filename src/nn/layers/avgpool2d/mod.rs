//! `nn.AvgPool2d(kernel_size, stride, padding)` with PyTorch's defaults
//! `ceil_mode=False`, `count_include_pad=True`: square windows, every one
//! divided by `kernel_size^2`, padded zeros included.
//!
//! Gradients: dx `=` the sum of dy / kernel_size^2 over the windows holding it.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{chw, config_err, positive, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::ops::avg_pool2d::{self as pool, AvgPool2dArgs};
use crate::tensor::Tensor;

/// `{ type = "avgpool2d", kernel_size (or kernel), stride = kernel_size, padding = 0 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub kernel_size: usize,
    /// Defaults to `kernel_size`, as in PyTorch.
    pub stride: usize,
    pub padding: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AvgPool2d {
    pub kernel_size: usize,
    pub stride: usize,
    pub padding: usize,
}

impl AvgPool2d {
    pub fn args(&self) -> AvgPool2dArgs {
        let (k, s, p) = (self.kernel_size, self.stride, self.padding);
        AvgPool2dArgs { kernel: [k, k], stride: [s, s], padding: [p, p] }
    }
}

/// The CPU forward and backward of an average pooling over `args`; the
/// saved state is the input's shape.
pub(super) fn forward(x: Tensor, args: AvgPool2dArgs) -> Result<(Tensor, Vec<usize>)> {
    let shape = x.shape().to_vec();
    Ok((pool::forward(&x, args)?, shape))
}

pub(super) fn backward(dy: Tensor, x_shape: &[usize], args: AvgPool2dArgs) -> Result<Option<Tensor>> {
    Ok(Some(pool::backward(&dy, x_shape, args)?))
}

impl Layer for AvgPool2d {
    type Config = Config;
    /// The input's shape.
    type Saved = Vec<usize>;

    const TYPE: &'static str = "avgpool2d";
    const KEYS: &'static [&'static str] = &["type", "name", "kernel_size", "kernel", "stride", "padding"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        let kernel_size = raw.kernel_size.ok_or_else(|| E::missing_field("kernel_size"))?;
        Ok(Config {
            kernel_size,
            stride: raw.stride.unwrap_or(kernel_size),
            padding: raw.padding.unwrap_or(0),
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let &Config { kernel_size: k, stride: s, padding: p } = cfg;
        let (c, h, w) = chw(shape, Self::TYPE, key)?;
        positive(k, key, "kernel_size")?;
        positive(s, key, "stride")?;
        if p > k / 2 {
            return Err(config_err(
                format!("{key}.padding"),
                format!("padding {p} must be at most half of kernel_size {k}, as in PyTorch"),
            ));
        }
        let layer = AvgPool2d { kernel_size: k, stride: s, padding: p };
        let (oh, ow) = layer.args().out_hw(h, w).map_err(|_| {
            config_err(
                format!("{key}.kernel_size"),
                format!("kernel_size {k} is larger than the input {h}x{w} (+2*padding {p})"),
            )
        })?;
        Ok((layer, vec![c, oh, ow]))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    fn saved_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        Some(0)
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Vec<usize>)> {
        forward(x, self.args())
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
        backward(dy, &x_shape, self.args())
    }
}

impl fmt::Display for AvgPool2d {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "AvgPool2d(kernel_size={}, stride={}, padding={})",
            self.kernel_size, self.stride, self.padding
        )
    }
}
