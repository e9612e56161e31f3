//! `nn.Conv2d` with square kernels, stride and zero padding.
//!
//! Gradients: `weight.grad += conv(x, dy)`, `bias.grad += sum(dy)`, dx `=`.

pub mod cuda;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{chw, config_err, mul, positive, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::config::model::numel;
use crate::error::Result;
use crate::nn::init;
use crate::ops::{self, conv2d::Conv2dArgs};
use crate::tensor::Tensor;

/// `{ type = "conv2d", out_channels, kernel_size (or kernel), stride = 1, padding = 0, bias = true }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub out_channels: usize,
    pub kernel_size: usize,
    pub stride: usize,
    pub padding: usize,
    pub bias: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conv2d {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_size: usize,
    pub stride: usize,
    pub padding: usize,
    pub bias: bool,
}

impl Conv2d {
    pub fn args(&self) -> Conv2dArgs {
        Conv2dArgs { stride: self.stride, padding: self.padding }
    }

    fn apply(&self, w: &Weights, x: &Tensor) -> Result<Tensor> {
        let weight = &w.param(0, Self::TYPE)?.value;
        let bias = w.params.get(1).map(|b| &b.value);
        ops::conv2d::forward(x, weight, bias, self.args())
    }
}

impl Layer for Conv2d {
    type Config = Config;
    /// The input.
    type Saved = Tensor;

    const TYPE: &'static str = "conv2d";
    const KEYS: &'static [&'static str] =
        &["type", "name", "out_channels", "kernel_size", "kernel", "stride", "padding", "bias"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {
            out_channels: raw.out_channels.ok_or_else(|| E::missing_field("out_channels"))?,
            kernel_size: raw.kernel_size.ok_or_else(|| E::missing_field("kernel_size"))?,
            stride: raw.stride.unwrap_or(1),
            padding: raw.padding.unwrap_or(0),
            bias: raw.bias.unwrap_or(true),
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let &Config { out_channels, kernel_size: k, stride: s, padding: p, bias } = cfg;
        let (c, h, w) = chw(shape, Self::TYPE, key)?;
        positive(out_channels, key, "out_channels")?;
        positive(k, key, "kernel_size")?;
        positive(s, key, "stride")?;
        let padded = |side: usize| p.checked_mul(2).and_then(|pp| side.checked_add(pp));
        let (Some(hp), Some(wp)) = (padded(h), padded(w)) else {
            return Err(config_err(
                format!("{key}.padding"),
                format!(
                    "padding {p} is too large: the padded input {h}x{w} (+2*padding) does not fit in 64 bits"
                ),
            ));
        };
        if hp < k || wp < k {
            return Err(config_err(
                format!("{key}.kernel_size"),
                format!("kernel_size {k} is larger than the input {h}x{w} (+2*padding {p})"),
            ));
        }
        let (ho, wo) = ((hp - k) / s + 1, (wp - k) / s + 1);
        let out_shape = vec![out_channels, ho, wo];
        if numel(&out_shape).is_none() {
            // Name what made it large: the channels, or the padding that grew the image.
            let field = if out_channels > ho.max(wo) || p == 0 { "out_channels" } else { "padding" };
            return Err(config_err(
                format!("{key}.{field}"),
                format!("the output {out_shape:?} has more elements than fit in 64 bits"),
            ));
        }
        if numel(&[out_channels, c, k, k]).is_none() {
            let field = if out_channels >= k.saturating_mul(k) { "out_channels" } else { "kernel_size" };
            return Err(config_err(
                format!("{key}.{field}"),
                format!("the weight [{out_channels}, {c}, {k}, {k}] has more elements than fit in 64 bits"),
            ));
        }
        let layer = Conv2d { in_channels: c, out_channels, kernel_size: k, stride: s, padding: p, bias };
        Ok((layer, out_shape))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        let k = self.kernel_size;
        let mut p = vec![("weight", vec![self.out_channels, self.in_channels, k, k])];
        if self.bias {
            p.push(("bias", vec![self.out_channels]));
        }
        p
    }

    fn init(&self, rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        let fan_in = self.in_channels * self.kernel_size * self.kernel_size;
        let k = self.kernel_size;
        let mut values =
            vec![init::kaiming_uniform(rng, &[self.out_channels, self.in_channels, k, k], fan_in)?];
        if self.bias {
            values.push(init::fan_in_uniform(rng, &[self.out_channels], fan_in)?);
        }
        Ok((values, Vec::new()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Fp16
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[super::numel128(m.in_shape)?, m.act])
    }

    /// The im2col scratch: on the CPU each of `threads` tasks holds its
    /// columns, output and (backward) column gradient and weight gradient
    /// (see ops/conv2d/cpu.rs); on the GPU the columns of the whole batch.
    fn scratch_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        let (c, o, k, p) = (
            self.in_channels as u128,
            self.out_channels as u128,
            self.kernel_size as u128,
            self.padding as u128,
        );
        let (h, w) = (*m.in_shape.get(1)? as u128, *m.in_shape.get(2)? as u128);
        let (ho, wo) = (*m.out_shape.get(1)? as u128, *m.out_shape.get(2)? as u128);
        let ckk = mul(&[c, k, k])?;
        if m.on_gpu {
            return mul(&[m.batch, ckk, ho, wo, 4]);
        }
        // Columns span the padded row pitch (the "wide" layout), at most W + 2P per output row.
        let cols = mul(&[ho, w.checked_add(p.checked_mul(2)?)?])?.max(wo);
        let padded = mul(&[c, h.checked_add(p.checked_mul(2)?)?, w.checked_add(p.checked_mul(2)?)?])?;
        let per_task = [mul(&[ckk, cols, 2])?, mul(&[o, cols, 2])?, mul(&[ckk, o])?, mul(&[padded, 2])?]
            .iter()
            .try_fold(0u128, |a, &b| a.checked_add(b))?;
        mul(&[per_task, m.threads, 4])
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Tensor)> {
        Ok((self.apply(w, &x)?, x))
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        self.apply(w, &x)
    }

    fn backward(
        &self,
        w: &mut Weights,
        x: Tensor,
        dy: Tensor,
        need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let (weight, bias) = super::linear::weight_and_bias(w, Self::TYPE)?;
        let db = bias.map(|b| &mut b.grad);
        ops::conv2d::backward(&x, &weight.value, &dy, self.args(), &mut weight.grad, db, need_dx)
    }
}

/// PyTorch's repr, e.g. `Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))`.
impl fmt::Display for Conv2d {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let Conv2d { in_channels, out_channels, kernel_size: k, stride: s, padding: p, bias } = *self;
        write!(f, "Conv2d({in_channels}, {out_channels}, kernel_size=({k}, {k}), stride=({s}, {s})")?;
        if p != 0 {
            write!(f, ", padding=({p}, {p})")?;
        }
        if !bias {
            write!(f, ", bias=False")?;
        }
        write!(f, ")")
    }
}
