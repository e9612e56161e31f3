//! PyTorch's default initialization for Conv2d and Linear (`reset_parameters`):
//! weight ~ kaiming_uniform_(a=sqrt(5)), which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
//! and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

use crate::error::{Error, Result};
use crate::tensor::{numel, Tensor};
use rand::Rng;

fn uniform(rng: &mut impl Rng, shape: &[usize], bound: f64) -> Result<Tensor> {
    let data = (0..numel(shape)).map(|_| rng.random_range(-bound..bound) as f32).collect();
    Tensor::from_vec(shape, data)
}

pub fn kaiming_uniform(rng: &mut impl Rng, shape: &[usize], fan_in: usize) -> Result<Tensor> {
    if fan_in == 0 {
        return Err(Error::shape(format!("cannot initialize {shape:?}: fan_in is 0")));
    }
    // gain = sqrt(2 / (1 + a^2)) with a = sqrt(5); bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
    let gain = (2.0f64 / (1.0 + 5.0)).sqrt();
    uniform(rng, shape, gain * (3.0 / fan_in as f64).sqrt())
}

pub fn fan_in_uniform(rng: &mut impl Rng, shape: &[usize], fan_in: usize) -> Result<Tensor> {
    if fan_in == 0 {
        return Err(Error::shape(format!("cannot initialize {shape:?}: fan_in is 0")));
    }
    uniform(rng, shape, 1.0 / (fan_in as f64).sqrt())
}

/// `nn.init.normal_(t, mean=0.0, std=std)` (nn.Embedding's default with
/// std 1; nanoGPT's `_init_weights` with std 0.02).
pub fn normal(rng: &mut impl Rng, shape: &[usize], std: f64) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|_| (rng.sample::<f64, _>(rand_distr::StandardNormal) * std) as f32).collect();
    Tensor::from_vec(shape, v)
}
