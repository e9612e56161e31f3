//! Causal self-attention on the device (`ops/attention/cuda.rs`): `[T, 3C]`
//! to `[T, C]`, its softmax `[H, T, T]` kept for the backward. Attention
//! dropout draws its mask from the node's Philox counters in both passes.
//! `=` into dx (dqkv).

use super::CausalSelfAttention;
use crate::error::Result;
use crate::nn::cuda::layer::{
    read, Backward, DeviceLayer, Elem, Forward, Needs, PlanArgs, Scratch, StateArgs,
};
use crate::nn::cuda::params::DevBuf;
use crate::ops::attention::cpu::Dims;
use crate::ops::attention::cuda as attk;
use crate::ops::dropout::Mask;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionPlan {
    pub t: usize,
    pub c: usize,
    pub n_head: usize,
    pub dropout_p: f64,
}

impl AttentionPlan {
    /// Attention matrix values for `n` samples.
    fn att_len(&self, n: usize) -> usize {
        n * self.n_head * self.t * self.t
    }
}

impl DeviceLayer for CausalSelfAttention {
    type Plan = AttentionPlan;
    /// The softmax, in the activations' dtype.
    type State = DevBuf;

    fn plan(&self, a: &PlanArgs<'_>) -> Result<(AttentionPlan, Needs)> {
        let (c, n_head) = (self.n_embd, self.n_head);
        let t = a.in_shape.first().copied().unwrap_or(0);
        if a.in_shape != [t, 3 * c] || a.out_shape != [t, c] || n_head == 0 || c % n_head != 0 {
            return Err(a.bad(format!("is not attention of width {c} over {n_head} heads")));
        }
        let p = AttentionPlan { t, c, n_head, dropout_p: self.dropout_p };
        // The backward's scores; the forward's dropped softmax meanwhile.
        let mut s = Scratch::default();
        s.push(a.compute, p.att_len(a.max_batch));
        Ok((p, Needs::new().reads_input().scratch(s)))
    }

    fn state(p: &AttentionPlan, a: &StateArgs<'_>) -> Result<DevBuf> {
        DevBuf::zeros(a.gpu, a.act, p.att_len(a.max_batch))
    }

    fn forward<A: Elem>(p: &AttentionPlan, att: &mut DevBuf, f: Forward<'_, A>) -> Result<()> {
        let Forward { gpu, blas, n, train, draws, x, mut y, mut ws, .. } = f;
        let len = p.att_len(n);
        let mut att = crate::nn::cuda::model::view_mut::<A>(att, len)?;
        let mask = Mask::new(p.dropout_p, draws);
        let [mut dropped] = ws.take::<A, 1>([len])?;
        let dropout =
            (train && p.dropout_p > 0.0).then_some(attk::Dropout { mask: &mask, workspace: &mut dropped });
        attk::forward(gpu, blas, &x, Dims { n, t: p.t, c: p.c, h: p.n_head }, &mut y, &mut att, dropout)
    }

    fn backward<A: Elem>(p: &AttentionPlan, att: &DevBuf, b: Backward<'_, A>) -> Result<()> {
        let Backward { gpu, blas, n, draws, x, dy, dx, mut ws, .. } = b;
        let (qkv, mut dqkv) = (read(x, "input")?, read(dx, "dx")?);
        let len = p.att_len(n);
        let att = crate::nn::cuda::model::view::<A>(att, len)?;
        let [mut scores] = ws.take::<A, 1>([len])?;
        let mask = (p.dropout_p > 0.0).then(|| Mask::new(p.dropout_p, draws));
        let d = Dims { n, t: p.t, c: p.c, h: p.n_head };
        attk::backward(gpu, blas, &qkv, &att, d, &dy, &mut dqkv, &mut scores, mask.as_ref())
    }
}
