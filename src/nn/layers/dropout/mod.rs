//! `nn.Dropout(p)`: in training, `y = x * mask / (1 - p)` with mask ~
//! Bernoulli(1 - p) per element; in evaluation the identity. PyTorch's
//! default p = 0.5; p may be 1 (all zeros), as PyTorch allows.
//!
//! The mask is drawn from Philox4x32-10 keyed by (run seed, node index,
//! rank) with (micro-batch, element) in the counter ([`crate::rng::Draws`]),
//! so the CPU and the device draw the same one, a resumed run draws what an
//! unbroken one would, and each DDP rank draws its own. Nothing is kept for
//! backward but the key: backward draws the mask again. Its bits differ
//! from PyTorch's (another generator and key), so comparisons with PyTorch
//! run with p = 0 or in evaluation.
//!
//! Gradients: dx `=` dy * mask / (1 - p).

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{config_err, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::{Error, Result};
use crate::ops::dropout::{self, Mask};
use crate::tensor::Tensor;

/// `{ type = "dropout", p = 0.5 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub p: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dropout {
    pub p: f64,
}

impl Layer for Dropout {
    type Config = Config;
    /// The mask's key, threshold and scale (the mask is drawn again).
    type Saved = Mask;

    const TYPE: &'static str = "dropout";
    const KEYS: &'static [&'static str] = &["type", "name", "p"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config { p: raw.p.unwrap_or(0.5) })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        let p = cfg.p;
        if !(0.0..=1.0).contains(&p) {
            return Err(config_err(
                format!("{key}.p"),
                format!("dropout probability has to be between 0 and 1, but got {p}"),
            ));
        }
        Ok((Dropout { p }, shape.to_vec()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    /// Nothing: backward draws the mask again from its counters.
    fn saved_bytes(&self, _m: &MemoryArgs<'_>) -> Option<u128> {
        Some(0)
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, cx: Ctx<'_>) -> Result<(Tensor, Mask)> {
        let draws =
            cx.draws.ok_or_else(|| Error::internal("dropout's training forward was given no draws"))?;
        let mask = Mask::new(self.p, draws);
        let mut y = x;
        dropout::apply_(&mut y, &mask)?;
        Ok((y, mask))
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(x)
    }

    fn backward(
        &self,
        _w: &mut Weights,
        mask: Mask,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let mut dx = dy;
        dropout::apply_(&mut dx, &mask)?;
        Ok(Some(dx))
    }
}

/// PyTorch's repr: `Dropout(p=0.5, inplace=False)` (p as Python prints a float).
impl fmt::Display for Dropout {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Dropout(p={:?}, inplace=False)", self.p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::cuda::plan::tests_plan::dropout_layers;
    use crate::nn::Model;
    use crate::ops::testing::rand_vec_f32;
    use crate::rng::{Draws, MicroBatch};
    use crate::tensor::DType;

    fn ctx(at: u64) -> Ctx<'static> {
        let d = Draws { seed: 3, rank: 0, at: MicroBatch { epoch: 0, index: at } };
        Ctx { sync: None, draws: Some(d.node(1)), defer: None }
    }

    #[test]
    fn training_scales_the_kept_and_backward_uses_the_same_mask() {
        let layer = Dropout { p: 0.25 };
        let x = Tensor::from_vec(&[4, 3, 5], rand_vec_f32(60, 1)).unwrap();
        let mut w = Weights::default();
        let (y, mask) = layer.forward_train(&mut w, x.clone(), ctx(0)).unwrap();
        let bits = mask.bits(60);
        let kept = bits.iter().filter(|&&b| b).count();
        assert!(kept > 30 && kept < 60, "{kept} of 60 kept at p = 0.25");
        for ((&y, &x), &b) in y.to_f32_vec().iter().zip(&x.to_f32_vec()).zip(&bits) {
            assert_eq!(y, if b { x * (1.0f64 / 0.75) as f32 } else { 0.0 });
        }
        let dy = Tensor::from_vec(&[4, 3, 5], rand_vec_f32(60, 2)).unwrap();
        let dx = layer.backward(&mut w, mask, dy.clone(), true, Ctx::default()).unwrap().unwrap();
        for ((&g, &d), &b) in dx.to_f32_vec().iter().zip(&dy.to_f32_vec()).zip(&bits) {
            assert_eq!(g, if b { d * (1.0f64 / 0.75) as f32 } else { 0.0 });
        }
        // Another micro-batch, another mask; the same one, the same mask.
        assert_ne!(layer.forward_train(&mut w, x.clone(), ctx(1)).unwrap().0.to_f32_vec(), y.to_f32_vec());
        assert_eq!(layer.forward_train(&mut w, x.clone(), ctx(0)).unwrap().0.to_f32_vec(), y.to_f32_vec());
        let e = layer.forward_train(&mut w, x, Ctx::default()).unwrap_err().to_string();
        assert!(e.contains("no draws"), "{e}");
    }

    #[test]
    fn evaluation_is_the_identity_in_both_dtypes() {
        let layer = Dropout { p: 0.9 };
        for dt in [DType::F32, DType::F16] {
            let x = Tensor::from_vec(&[2, 7], rand_vec_f32(14, 3)).unwrap().into_dtype(dt);
            let y = layer.forward_eval(&Weights::default(), x.clone()).unwrap();
            assert_eq!(y.dtype(), dt);
            assert_eq!(y.to_f32_vec(), x.to_f32_vec());
        }
    }

    #[test]
    fn f16_activations_stay_f16() {
        let layer = Dropout { p: 0.5 };
        let x = Tensor::from_vec(&[3, 8], rand_vec_f32(24, 4)).unwrap().into_dtype(DType::F16);
        let (y, mask) = layer.forward_train(&mut Weights::default(), x.clone(), ctx(0)).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        let dx = layer.backward(&mut Weights::default(), mask, x, true, Ctx::default()).unwrap().unwrap();
        assert_eq!(dx.dtype(), DType::F16);
        // dy = x: dx is y.
        assert_eq!(dx.to_f32_vec(), y.to_f32_vec());
    }

    #[test]
    fn a_model_draws_by_micro_batch_and_rank_and_nothing_else() {
        let layers = dropout_layers();
        let x = || Tensor::from_vec(&[3, 1, 6, 6], rand_vec_f32(108, 5)).unwrap();
        let mut m = Model::new(&layers, 9).unwrap();
        let run = |m: &mut Model| m.forward_train(x()).unwrap().0.to_f32_vec();
        let first = run(&mut m);
        // The same micro-batch again (a resumed run): the same masks.
        assert_eq!(run(&mut m), first);
        // A rayon pool of another size: the same masks.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        assert_eq!(pool.install(|| run(&mut m)), first);
        m.draws.at = MicroBatch { epoch: 0, index: 1 };
        assert_ne!(run(&mut m), first);
        m.draws.at = MicroBatch::default();
        m.draws.rank = 1;
        assert_ne!(run(&mut m), first);
        // Evaluation draws nothing: dropout is the identity there.
        let mut plain = layers.clone();
        plain.retain(|l| !matches!(l.kind, super::super::LayerKind::Dropout(_)));
        for (i, l) in plain.iter_mut().enumerate() {
            l.inputs = vec![i];
        }
        let mut without = Model::new(&plain, 9).unwrap();
        for (a, b) in without.params_mut().into_iter().zip(m.params()) {
            a.value = b.value.clone();
        }
        assert_eq!(
            m.forward_eval(x()).unwrap().to_f32_vec(),
            without.forward_eval(x()).unwrap().to_f32_vec()
        );
    }
}
