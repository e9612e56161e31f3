//! Causal multi-head self-attention's core, as nanoGPT's
//! `CausalSelfAttention.forward` between `c_attn` and `c_proj`: `qkv[N, T, 3C]`
//! split into q, k, v of `n_head` heads of `C / n_head`, then
//! `softmax(q k^T / sqrt(hd) + causal mask) v` (PyTorch's
//! `F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p)`),
//! heads merged back to `[N, T, C]`. The softmax is in f32 with each row's
//! max subtracted; attention dropout draws its mask from the node's Philox
//! draws (`rng::NodeDraws`) at element `((n * H + h) * T + i) * T + j`.
//!
//! f16 inputs are widened, computed in f32, the output rounded once.

pub mod cpu;
pub mod cuda;
mod softmax;
#[cfg(test)]
mod tests;

use super::cpu_f32;
use super::dropout::Mask;
use super::half_emu::{any_f16, f32_of};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const OP: &str = "attention";

/// What backward needs: the input and the softmax (before dropout).
pub struct Saved {
    pub qkv: Tensor,
    pub att: Vec<f32>,
}

/// `(N, T, C)` of a `[N, T, 3C]` input with `C` divisible by `n_head`.
fn dims(qkv: &Tensor, n_head: usize) -> Result<(usize, usize, usize)> {
    let &[n, t, c3] = qkv.shape() else {
        return Err(Error::shape(format!("attention: input must be [N, T, 3C], got {:?}", qkv.shape())));
    };
    if n_head == 0 || c3 % 3 != 0 || (c3 / 3) % n_head != 0 {
        return Err(Error::shape(format!(
            "attention: [N, T, 3C] = {:?} does not split into {n_head} heads",
            qkv.shape()
        )));
    }
    Ok((n, t, c3 / 3))
}

/// `[N, T, C]`, and the softmax kept for backward when `keep`.
pub fn forward(qkv: &Tensor, n_head: usize, mask: Option<&Mask>) -> Result<(Tensor, Vec<f32>)> {
    if any_f16([Some(qkv)]) {
        let (y, att) = forward(&f32_of(qkv), n_head, mask)?;
        return Ok((y.into_dtype(qkv.dtype()), att));
    }
    let (n, t, c) = dims(qkv, n_head)?;
    let x = cpu_f32(OP, "input", qkv)?;
    let mut y = vec![0f32; n * t * c];
    let mut att = vec![0f32; n * n_head * t * t];
    cpu::forward(cpu::Dims { n, t, c, h: n_head }, x, mask, &mut y, &mut att);
    Ok((Tensor::from_vec(&[n, t, c], y)?, att))
}

/// d qkv (`=`) from `dy[N, T, C]`.
pub fn backward(saved: &Saved, dy: &Tensor, n_head: usize, mask: Option<&Mask>) -> Result<Tensor> {
    if any_f16([Some(&saved.qkv), Some(dy)]) {
        let dx = backward_of(&f32_of(&saved.qkv), &saved.att, &f32_of(dy), n_head, mask)?;
        return Ok(dx.into_dtype(dy.dtype()));
    }
    backward_of(&saved.qkv, &saved.att, dy, n_head, mask)
}

/// [`backward`] from the input and the softmax (borrowed: f16's widened
/// input needs no copy of the softmax beside it).
fn backward_of(qkv: &Tensor, att: &[f32], dy: &Tensor, n_head: usize, mask: Option<&Mask>) -> Result<Tensor> {
    let (n, t, c) = dims(qkv, n_head)?;
    dy.check_shape("attention backward: dy", &[n, t, c])?;
    if att.len() != n * n_head * t * t {
        return Err(Error::internal("attention backward: the saved softmax has the wrong size"));
    }
    let x = cpu_f32(OP, "input", qkv)?;
    let dys = cpu_f32(OP, "dy", dy)?;
    let mut dx = vec![0f32; n * t * 3 * c];
    cpu::backward(cpu::Dims { n, t, c, h: n_head }, x, att, dys, mask, &mut dx);
    Tensor::from_vec(qkv.shape(), dx)
}
