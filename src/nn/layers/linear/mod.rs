//! `nn.Linear` over `[N, in_features]`, or `[N, T, in_features]` (a
//! transformer's, each position alike).
//!
//! Gradients: `weight.grad += dy^T x`, `bias.grad += sum(dy)`, dx `=`; in a
//! backward that defers ([`Ctx::defer`]) the first two run later.

pub mod cuda;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{config_err, mul, positive, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::config::model::numel;
use crate::error::{Error, Result};
use crate::nn::{init, Param};
use crate::ops;
use crate::tensor::Tensor;

/// `{ type = "linear", out_features, bias = true }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub out_features: usize,
    pub bias: bool,
    /// nanoGPT's `_init_weights`: weight ~ N(0, init_std), bias 0
    /// (PyTorch's kaiming-uniform default when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_std: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Linear {
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    /// Positions per sample: `Some(T)` for a `[T, in_features]` input.
    #[serde(skip)]
    pub positions: Option<usize>,
    #[serde(skip)]
    pub init_std: Option<f64>,
}

/// The weight and the optional bias of a conv or linear layer, both mutable.
pub(super) fn weight_and_bias<'w>(
    w: &'w mut Weights,
    ty: &str,
) -> Result<(&'w mut Param, Option<&'w mut Param>)> {
    match w.params.as_mut_slice() {
        [weight] => Ok((weight, None)),
        [weight, bias] => Ok((weight, Some(bias))),
        other => {
            Err(Error::internal(format!("{ty} holds {} parameters, not a weight and a bias", other.len())))
        }
    }
}

impl Linear {
    /// `(y, x)`: x is taken and given back so that its rows are the same
    /// buffer, not a copy made to reshape it.
    fn apply(&self, w: &Weights, x: Tensor) -> Result<(Tensor, Tensor)> {
        let weight = &w.param(0, Self::TYPE)?.value;
        let shape = x.shape().to_vec();
        let n = shape.first().copied().unwrap_or(0);
        let rows = self.rows(x, self.in_features)?;
        let y = ops::linear::forward(&rows, weight, w.params.get(1).map(|b| &b.value))?;
        Ok((self.unrows(y, n, self.out_features)?, rows.reshape(&shape)?))
    }

    /// `[N, T, width]` as `[N * T, width]` (row-major, the same data): the op
    /// runs on the rows, each position alike. `[N, width]` as it is.
    fn rows(&self, x: Tensor, width: usize) -> Result<Tensor> {
        match self.positions {
            Some(t) => {
                let n = x.shape().first().copied().unwrap_or(0);
                // The tensor holds n * t * width elements already: the product fits.
                x.reshape(&[n * t, width])
            }
            None => Ok(x),
        }
    }

    /// The inverse of [`Self::rows`] for a batch of `n` samples.
    fn unrows(&self, y: Tensor, n: usize, width: usize) -> Result<Tensor> {
        match self.positions {
            Some(t) => y.reshape(&[n, t, width]),
            None => Ok(y),
        }
    }
}

impl Layer for Linear {
    type Config = Config;
    /// The input.
    type Saved = Tensor;

    const TYPE: &'static str = "linear";
    const KEYS: &'static [&'static str] = &["type", "name", "out_features", "bias", "init_std"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {
            out_features: raw.out_features.ok_or_else(|| E::missing_field("out_features"))?,
            bias: raw.bias.unwrap_or(true),
            init_std: raw.init_std,
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let &Config { out_features, bias, init_std } = cfg;
        let (positions, in_features) = match *shape {
            [i] => (None, i),
            [t, i] => (Some(t), i),
            _ => (None, 0),
        };
        if !(1..=2).contains(&shape.len()) {
            return Err(config_err(
                key,
                format!(
                    "linear needs a 1-D input (or [T, in_features]), but its input is {shape:?}: add a flatten layer before it"
                ),
            ));
        }
        positive(out_features, key, "out_features")?;
        if numel(&[out_features, in_features]).is_none() {
            return Err(config_err(
                format!("{key}.out_features"),
                format!("the weight [{out_features}, {in_features}] has more elements than fit in 64 bits"),
            ));
        }
        if let Some(std) = init_std.filter(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(config_err(
                format!("{key}.init_std"),
                format!("must be a finite std >= 0, got {std}"),
            ));
        }
        let out = match positions {
            Some(t) => vec![t, out_features],
            None => vec![out_features],
        };
        Ok((Linear { in_features, out_features, bias, positions, init_std }, out))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        let mut p = vec![("weight", vec![self.out_features, self.in_features])];
        if self.bias {
            p.push(("bias", vec![self.out_features]));
        }
        p
    }

    fn init(&self, rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        let fan_in = self.in_features;
        if let Some(std) = self.init_std {
            let mut values = vec![init::normal(rng, &[self.out_features, fan_in], std)?];
            if self.bias {
                values.push(Tensor::zeros(&[self.out_features]));
            }
            return Ok((values, Vec::new()));
        }
        let mut values = vec![init::kaiming_uniform(rng, &[self.out_features, fan_in], fan_in)?];
        if self.bias {
            values.push(init::fan_in_uniform(rng, &[self.out_features], fan_in)?);
        }
        Ok((values, Vec::new()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Fp16
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[super::numel128(m.in_shape)?, m.act])
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Tensor)> {
        self.apply(w, x)
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(self.apply(w, x)?.0)
    }

    fn backward(
        &self,
        w: &mut Weights,
        x: Tensor,
        dy: Tensor,
        need_dx: bool,
        cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let n = x.shape().first().copied().unwrap_or(0);
        let (x, dy) = (self.rows(x, self.in_features)?, self.rows(dy, self.out_features)?);
        if let Some(defer) = cx.defer {
            let (shape, dtype) = (x.shape().to_vec(), x.dtype());
            let grads = ops::linear::ParamGrads::new(x, &w.param(0, Self::TYPE)?.value, dy)?;
            let dy = grads.dy();
            defer.spawn(
                w,
                Box::new(move |g: &mut [Tensor]| match g {
                    [dw] => grads.accumulate(dw, None),
                    [dw, db] => grads.accumulate(dw, Some(db)),
                    _ => Err(Error::internal(format!("linear handed {} gradients", g.len()))),
                }),
            );
            let weight = &w.param(0, Self::TYPE)?.value;
            let dx = need_dx.then(|| ops::linear::backward_input(&dy, weight, &shape, dtype)).transpose()?;
            return dx.map(|d| self.unrows(d, n, self.in_features)).transpose();
        }
        let (weight, bias) = weight_and_bias(w, Self::TYPE)?;
        let dx = ops::linear::backward(
            &x,
            &weight.value,
            &dy,
            &mut weight.grad,
            bias.map(|b| &mut b.grad),
            need_dx,
        )?;
        dx.map(|d| self.unrows(d, n, self.in_features)).transpose()
    }
}

/// PyTorch's repr, e.g. `Linear(in_features=1568, out_features=10, bias=True)`.
impl fmt::Display for Linear {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let b = if self.bias { "True" } else { "False" };
        write!(f, "Linear(in_features={}, out_features={}, bias={b})", self.in_features, self.out_features)
    }
}
