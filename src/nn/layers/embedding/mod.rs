//! `nn.Embedding(num_embeddings, embedding_dim)` over `[T]` token ids
//! (nanoGPT's `wte`), or, with `positions = true`, indexed by the positions
//! `0..T` of its input instead of its values (nanoGPT's
//! `wpe(torch.arange(T))`): `{ residual = [wte], shortcut = [wpe] }` is
//! `tok_emb + pos_emb`.
//!
//! Gradients: `weight.grad[id] += dy` for each looked-up id, in order (no
//! dx: ids have no gradient).

pub mod cuda;

use std::fmt;

use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{config_err, positive, AmpClass, BufferValue, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::Result;
use crate::nn::init;
use crate::ops;
use crate::tensor::Tensor;

/// `{ type = "embedding", num_embeddings, embedding_dim, positions = false, init_std = 1.0 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub num_embeddings: usize,
    pub embedding_dim: usize,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub positions: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_std: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Embedding {
    pub num_embeddings: usize,
    pub embedding_dim: usize,
    /// Indexed by position `0..T`, not by the input's values.
    pub positions: bool,
    /// The weight's N(0, std) init (nn.Embedding's is N(0, 1)).
    pub init_std: f64,
}

impl Embedding {
    /// The ids looked up for a batch `x` of `[N, T]` ids.
    fn ids(&self, x: &Tensor) -> Result<Vec<usize>> {
        if self.positions {
            let t = x.shape().get(1).copied().unwrap_or(1).max(1);
            return Ok((0..x.shape().iter().take(2).product::<usize>()).map(|i| i % t).collect());
        }
        ops::embedding::ids(x, self.num_embeddings)
    }

    fn apply(&self, w: &Weights, x: &Tensor) -> Result<(Tensor, Vec<usize>)> {
        let ids = self.ids(x)?;
        let y = ops::embedding::forward(&ids, &w.param(0, Self::TYPE)?.value)?;
        let mut shape: Vec<usize> = x.shape().iter().take(2).copied().collect();
        shape.push(self.embedding_dim);
        Ok((y.reshape(&shape)?, ids))
    }
}

impl Layer for Embedding {
    type Config = Config;
    /// The ids looked up.
    type Saved = Vec<usize>;

    const TYPE: &'static str = "embedding";
    const KEYS: &'static [&'static str] =
        &["type", "name", "num_embeddings", "embedding_dim", "positions", "init_std"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {
            num_embeddings: raw.num_embeddings.ok_or_else(|| E::missing_field("num_embeddings"))?,
            embedding_dim: raw.embedding_dim.ok_or_else(|| E::missing_field("embedding_dim"))?,
            positions: raw.positions.unwrap_or(false),
            init_std: raw.init_std,
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        positive(cfg.num_embeddings, key, "num_embeddings")?;
        positive(cfg.embedding_dim, key, "embedding_dim")?;
        let init_std = cfg.init_std.unwrap_or(1.0);
        if !(init_std.is_finite() && init_std >= 0.0) {
            return Err(config_err(
                format!("{key}.init_std"),
                format!("must be a finite std >= 0, got {init_std}"),
            ));
        }
        let [t] = *shape else {
            return Err(config_err(
                key,
                format!("embedding takes [T] token ids, but its input is {shape:?}"),
            ));
        };
        if cfg.positions && t > cfg.num_embeddings {
            return Err(config_err(
                format!("{key}.num_embeddings"),
                format!("{} positions cannot index a sequence of {t} (model.input_shape): raise it to the block size", cfg.num_embeddings),
            ));
        }
        let layer = Embedding {
            num_embeddings: cfg.num_embeddings,
            embedding_dim: cfg.embedding_dim,
            positions: cfg.positions,
            init_std,
        };
        Ok((layer, vec![t, cfg.embedding_dim]))
    }

    fn params(&self) -> Vec<(&'static str, Vec<usize>)> {
        vec![("weight", vec![self.num_embeddings, self.embedding_dim])]
    }

    fn init(&self, rng: &mut ChaCha8Rng) -> Result<(Vec<Tensor>, Vec<BufferValue>)> {
        Ok((vec![init::normal(rng, &[self.num_embeddings, self.embedding_dim], self.init_std)?], Vec::new()))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Fp32
    }

    /// The ids (8 bytes each).
    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        super::numel128(m.in_shape)?.checked_mul(8)
    }

    fn forward_train(&self, w: &mut Weights, x: Tensor, _cx: Ctx<'_>) -> Result<(Tensor, Vec<usize>)> {
        self.apply(w, &x)
    }

    fn forward_eval(&self, w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(self.apply(w, &x)?.0)
    }

    fn backward(
        &self,
        w: &mut Weights,
        ids: Vec<usize>,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        let dy = dy.reshape(&[ids.len(), self.embedding_dim])?;
        let weight =
            w.params.first_mut().ok_or_else(|| crate::error::Error::internal("embedding has no weight"))?;
        ops::embedding::backward(&ids, &dy, &mut weight.grad)?;
        Ok(None)
    }
}

/// PyTorch's repr: `Embedding(65, 128)`.
impl fmt::Display for Embedding {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Embedding({}, {})", self.num_embeddings, self.embedding_dim)
    }
}
