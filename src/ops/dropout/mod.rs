//! Dropout's one op: `v = v * mask * scale` over a tensor in place, with
//! mask ~ Bernoulli(1 - p) drawn element by element from Philox4x32-10
//! ([`crate::rng::NodeDraws`]) and scale = 1 / (1 - p). The training forward
//! applies it to x, and backward to dy (`dx = dy * mask / (1 - p)`), drawing
//! the same mask again from the same counters instead of keeping it.
//!
//! As PyTorch's kernels (`src * mask * scale`), a dropped element is `x * 0`
//! (NaN and inf become NaN, so amp still sees an overflow). p = 1 drops
//! everything with scale 0, as PyTorch's `input * 0`.

pub mod cpu;
pub mod cuda;

use half::f16;
use rayon::prelude::*;

use super::half_emu::{round_into, scratch, widen_into};
use crate::error::Result;
use crate::rng::NodeDraws;
use crate::tensor::{DType, Tensor};

/// One mask: where its bits come from, the drop threshold and the scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mask {
    pub draws: NodeDraws,
    /// Element `e` is dropped when its 32-bit word is below this:
    /// round(p * 2^32), so 0 keeps all and 2^32 drops all.
    pub threshold: u64,
    /// What a kept element is multiplied by: 1 / (1 - p) rounded once to
    /// f32 (0 for p = 1).
    pub scale: f32,
}

impl Mask {
    /// The mask dropping with probability `p` (in [0, 1], checked by the
    /// layer) drawn from `draws`.
    pub fn new(p: f64, draws: NodeDraws) -> Mask {
        let p = p.clamp(0.0, 1.0);
        let threshold = (p * 4_294_967_296.0).round() as u64;
        let scale = if p >= 1.0 { 0.0 } else { (1.0 / (1.0 - p)) as f32 };
        Mask { draws, threshold, scale }
    }

    /// Whether every element is kept unscaled (p = 0): applying the mask is
    /// then the identity, bit for bit, and needs no draws.
    pub fn keeps_all(&self) -> bool {
        self.threshold == 0 && self.scale == 1.0
    }

    /// Whether element `e` is kept, given its group's words.
    #[inline(always)]
    pub fn kept(&self, words: &[u32; 4], e: u64) -> bool {
        u64::from(words[(e & 3) as usize]) >= self.threshold
    }

    /// The first `n` bits of the mask (tests and statistics).
    pub fn bits(&self, n: usize) -> Vec<bool> {
        (0..n as u64).map(|e| self.kept(&self.draws.words(e >> 2), e)).collect()
    }
}

/// `t = t * mask * scale` in place: f32 as is, f16 widened, computed in
/// f32 and rounded once.
pub fn apply_(t: &mut Tensor, m: &Mask) -> Result<()> {
    if m.keeps_all() {
        return Ok(());
    }
    match t.dtype() {
        DType::F32 => {
            cpu::apply_par(m, t.as_f32_mut()?);
            Ok(())
        }
        DType::F16 => {
            apply_f16(m, t.as_f16_mut()?);
            Ok(())
        }
    }
}

/// [`apply_`] over f16 storage, a block at a time.
fn apply_f16(m: &Mask, v: &mut [f16]) {
    v.par_chunks_mut(cpu::PAR_CHUNK).enumerate().for_each_init(Vec::new, |buf, (i, c)| {
        let s = scratch(buf, c.len());
        widen_into(c, s);
        cpu::apply(m, s, (i * cpu::PAR_CHUNK) as u64);
        round_into(s, c);
    });
}

#[cfg(test)]
mod tests;
