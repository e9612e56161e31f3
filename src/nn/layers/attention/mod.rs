//! The core of nanoGPT's `CausalSelfAttention` between its `c_attn` and
//! `c_proj` linears: `F.scaled_dot_product_attention(q, k, v,
//! is_causal=True, dropout_p)` over `n_head` heads of `[T, 3C]` → `[T, C]`
//! (`ops::attention`). A block writes `attn = [c_attn, this, c_proj]`, so the
//! state_dict keys are nanoGPT's (`attn.c_attn.weight`, `attn.c_proj.weight`).
//!
//! Gradients: d qkv `=`; no parameters.

pub mod cuda;

use std::fmt;

use serde::Serialize;

use super::{config_err, mul, positive, AmpClass, Ctx, Layer, MemoryArgs, Weights};
use crate::config::layers::RawLayer;
use crate::error::{Error, Result};
use crate::ops;
use crate::ops::dropout::Mask;
use crate::tensor::Tensor;

/// `{ type = "causal_self_attention", n_head, dropout_p = 0.0 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub n_head: usize,
    pub dropout_p: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CausalSelfAttention {
    pub n_head: usize,
    pub n_embd: usize,
    pub dropout_p: f64,
}

impl Layer for CausalSelfAttention {
    type Config = Config;
    /// The input, the softmax, and the dropout mask's key.
    type Saved = (ops::attention::Saved, Option<Mask>);

    const TYPE: &'static str = "causal_self_attention";
    const KEYS: &'static [&'static str] = &["type", "name", "n_head", "dropout_p"];

    fn config<E: serde::de::Error>(raw: &RawLayer) -> Result<Config, E> {
        Ok(Config {
            n_head: raw.n_head.ok_or_else(|| E::missing_field("n_head"))?,
            dropout_p: raw.dropout_p.unwrap_or(0.0),
        })
    }

    fn resolve(cfg: &Config, shape: &[usize], key: &str) -> Result<(Self, Vec<usize>)> {
        positive(cfg.n_head, key, "n_head")?;
        if !(0.0..=1.0).contains(&cfg.dropout_p) {
            return Err(config_err(
                format!("{key}.dropout_p"),
                format!("dropout probability has to be between 0 and 1, but got {}", cfg.dropout_p),
            ));
        }
        let [t, c3] = *shape else {
            return Err(config_err(key, format!("causal_self_attention takes [T, 3 * n_embd] (c_attn's q, k, v), but its input is {shape:?}")));
        };
        if c3 % 3 != 0 || (c3 / 3) % cfg.n_head != 0 {
            return Err(config_err(
                format!("{key}.n_head"),
                format!("the input's {c3} features are not q, k and v of n_head = {} equal heads (3 * n_embd with n_embd % n_head == 0)", cfg.n_head),
            ));
        }
        let n_embd = c3 / 3;
        Ok((CausalSelfAttention { n_head: cfg.n_head, n_embd, dropout_p: cfg.dropout_p }, vec![t, n_embd]))
    }

    fn amp_class(&self) -> AmpClass {
        AmpClass::Passthrough
    }

    /// The input and the `[H, T, T]` softmax (f32).
    fn saved_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        let t = *m.in_shape.first()? as u128;
        mul(&[super::numel128(m.in_shape)?, m.act])?.checked_add(mul(&[self.n_head as u128, t, t, 4])?)
    }

    /// On the GPU, the `[N, H, T, T]` workspace the attention layers share
    /// (backward's scores, forward's dropped softmax); on the CPU, each
    /// task's f32 blocks of one head: the dropped softmax, its gradient and
    /// the scores' (`T x T` each), and seven `[T, hd]` blocks.
    fn scratch_bytes(&self, m: &MemoryArgs<'_>) -> Option<u128> {
        let (t, h) = (*m.in_shape.first()? as u128, self.n_head as u128);
        if m.on_gpu {
            return mul(&[m.batch, h, t, t, m.act]);
        }
        let hd = (self.n_embd as u128).checked_div(h)?;
        let per_task = mul(&[3, t, t])?.checked_add(mul(&[7, t, hd])?)?;
        mul(&[per_task, m.threads, 4])
    }

    fn forward_train(&self, _w: &mut Weights, x: Tensor, cx: Ctx<'_>) -> Result<(Tensor, Self::Saved)> {
        let mask = if self.dropout_p > 0.0 {
            let draws = cx.draws.ok_or_else(|| Error::internal("attention dropout was given no draws"))?;
            Some(Mask::new(self.dropout_p, draws))
        } else {
            None
        };
        let (y, att) = ops::attention::forward(&x, self.n_head, mask.as_ref())?;
        Ok((y, (ops::attention::Saved { qkv: x, att }, mask)))
    }

    fn forward_eval(&self, _w: &Weights, x: Tensor) -> Result<Tensor> {
        Ok(ops::attention::forward(&x, self.n_head, None)?.0)
    }

    fn backward(
        &self,
        _w: &mut Weights,
        (saved, mask): Self::Saved,
        dy: Tensor,
        _need_dx: bool,
        _cx: Ctx<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(Some(ops::attention::backward(&saved, &dy, self.n_head, mask.as_ref())?))
    }
}

/// Not a PyTorch module (nanoGPT calls the function in its forward): named as the call.
impl fmt::Display for CausalSelfAttention {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "scaled_dot_product_attention(n_head={}, is_causal=True, dropout_p={:?})",
            self.n_head, self.dropout_p
        )
    }
}
