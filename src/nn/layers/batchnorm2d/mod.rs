//! `nn.BatchNorm2d` (and `nn.SyncBatchNorm` after
//! `convert_sync_batchnorm`): statistics in f32 whatever the activations'
//! dtype; running statistics moved with PyTorch's unbiased variance.
//!
//! Gradients: `weight.grad += sum(dy * xhat)`, `bias.grad += sum(dy)`, dx `=`.

pub mod cuda;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{chw, config_err, mul, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::config::schema::short_f32;
use crate::dist::{Buffer as CommBuffer, Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::nn::{Param, SyncGroup};
use crate::ops;
use crate::ops::batch_norm::{BatchNormSaved, BnGrads, BnHyper, BnParams, RunningStats};
use crate::tensor::Tensor;

/// `{ type = "batchnorm2d", eps = 1e-5, momentum = 0.1 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    #[serde(serialize_with = "short_f32::one")]
    pub eps: f32,
    #[serde(serialize_with = "short_f32::one")]
    pub momentum: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchNorm2d {
    pub num_features: usize,
    #[serde(serialize_with = "short_f32::one")]
    pub eps: f32,
    #[serde(serialize_with = "short_f32::one")]
    pub momentum: f32,
}

/// The input and the batch statistics; `global_count` is set for
/// SyncBatchNorm: the element count per channel over all ranks.
pub struct Saved {
    pub x: Tensor,
    pub stats: BatchNormSaved,
    pub global_count: Option<usize>,
}

/// A BatchNorm's parameters and buffers, borrowed out of its [`Weights`].
pub struct Parts<'a> {
    pub weight: &'a mut Param,
    pub bias: &'a mut Param,
    pub running_mean: &'a mut Tensor,
    pub running_var: &'a mut Tensor,
    pub num_batches_tracked: &'a mut i64,
}

fn not_batchnorm() -> Error {
    Error::internal("a BatchNorm2d's weights are not weight, bias, running_mean, running_var, num_batches_tracked")
}

/// The parts of `w`, which must hold what [`BatchNorm2d::init`] made.
pub fn parts(w: &mut Weights) -> Result<Parts<'_>> {
    let bad = not_batchnorm;
    let [weight, bias] = w.params.as_mut_slice() else { return Err(bad()) };
    let [rm, rv, nbt] = w.buffers.as_mut_slice() else { return Err(bad()) };
    match (&mut rm.value, &mut rv.value, &mut nbt.value) {
        (
            BufferValue::Tensor(running_mean),
            BufferValue::Tensor(running_var),
            BufferValue::Count(num_batches_tracked),
        ) => Ok(Parts { weight, bias, running_mean, running_var, num_batches_tracked }),
        _ => Err(bad()),
    }
}

/// running_mean, running_var and num_batches_tracked of `w`, read only.
pub fn running_stats(w: &Weights) -> Result<(&Tensor, &Tensor, i64)> {
    match w.buffers.as_slice() {
        [rm, rv, nbt] => match (&rm.value, &rv.value, &nbt.value) {
            (BufferValue::Tensor(rm), BufferValue::Tensor(rv), BufferValue::Count(n)) => Ok((rm, rv, *n)),
            _ => Err(not_batchnorm()),
        },
        _ => Err(not_batchnorm()),
    }
}

fn sum_over_ranks(group: &dyn Communicator, buf: Vec<f32>, what: &str) -> Result<Vec<f32>> {
    group.all_reduce(CommBuffer::F32(buf), ReduceOp::Sum, what)?.into_f32()
}

impl Layer for BatchNorm2d {
    type Config = Config;
    type Saved = Saved;

    const TYPE: &'static str = "batchnorm2d";
    const KEYS: &'static [&'static str] = &["type", "name", "eps", "momentum"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config { eps: raw.eps.unwrap_or(1e-5), momentum: raw.momentum.unwrap_or(0.1) })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let &Config { eps, momentum } = cfg;
        let (c, _, _) = chw(shape, Self::TYPE, key)?;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(config_err(format!("{key}.eps"), format!("must be a positive number, got {eps}")));
        }
        if !(0.0..=1.0).contains(&momentum) {
            return Err(config_err(format!("{key}.momentum"), format!("must be in [0, 1], got {momentum}")));
        }
        Ok((BatchNorm2d { num_features: c, eps, momentum }, shape.to_vec()))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        vec![("weight", vec![self.num_features]), ("bias", vec![self.num_features])]
    }

    fn buffers(&self) -> Vec<(&'static str, Vec<usize>)> {
        let c = self.num_features;
        vec![("running_mean", vec![c]), ("running_var", vec![c]), ("num_batches_tracked", vec![])]
    }

    fn init(&self, _rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        let c = [self.num_features];
        Ok((
            vec![Tensor::full(&c, 1.0), Tensor::zeros(&c)],
            vec![
                BufferValue::Tensor(Tensor::zeros(&c)),
                BufferValue::Tensor(Tensor::full(&c, 1.0)),
                BufferValue::Count(0),
            ],
        ))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::BatchNorm
    }

    fn syncs_statistics(&self) -> bool {
        true
    }

    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        mul(&[super::numel128(m.in_shape)?, m.act])
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, cx: Ctx<'_>) -> Result<(Tensor, Saved)> {
        let p = parts(w)?;
        let params = BnParams { weight: &p.weight.value, bias: &p.bias.value };
        let running = RunningStats { running_mean: &mut *p.running_mean, running_var: &mut *p.running_var };
        let hyper = BnHyper { momentum: self.momentum, eps: self.eps };
        let (y, stats, global_count) = match cx.sync {
            Some(SyncGroup(group)) => {
                let (y, stats, count) =
                    ops::batch_norm::sync::forward_train(&x, params, running, hyper, &mut |buf| {
                        sum_over_ranks(group.as_ref(), buf, "SyncBatchNorm forward")
                    })?;
                (y, stats, Some(count))
            }
            None => {
                let (y, stats) = ops::batch_norm::forward_train(&x, params, running, hyper)?;
                (y, stats, None)
            }
        };
        *p.num_batches_tracked += 1;
        Ok((y, Saved { x, stats, global_count }))
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        let params =
            BnParams { weight: &w.param(0, Self::TYPE)?.value, bias: &w.param(1, Self::TYPE)?.value };
        let running =
            RunningStats { running_mean: w.tensor(0, Self::TYPE)?, running_var: w.tensor(1, Self::TYPE)? };
        ops::batch_norm::forward_eval(&x, params, running, self.eps)
    }

    fn backward(
        &self,
        w: &mut Weights,
        s: Saved,
        dy: Tensor,
        _need_dx: bool,
        cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let Parts { weight, bias, .. } = parts(w)?;
        let grads = BnGrads { dweight: &mut weight.grad, dbias: &mut bias.grad };
        let dx = match (cx.sync, s.global_count) {
            (Some(SyncGroup(group)), Some(count)) => ops::batch_norm::sync::backward(
                &s.x,
                &weight.value,
                &s.stats,
                count,
                &dy,
                grads,
                &mut |buf| sum_over_ranks(group.as_ref(), buf, "SyncBatchNorm backward"),
            )?,
            _ => ops::batch_norm::backward(&s.x, &weight.value, &s.stats, &dy, grads)?,
        };
        Ok(Some(dx))
    }
}

impl fmt::Display for BatchNorm2d {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "BatchNorm2d({}, eps={:?}, momentum={:?})", self.num_features, self.eps, self.momentum)
    }
}
