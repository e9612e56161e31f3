//! `torch.optim.Adam` / `AdamW`, single-tensor path (`_single_tensor_adam`,
//! amsgrad off), at step t (1-based):
//!
//! ```text
//! AdamW: p = p * (1 - lr * wd)                      (param.mul_(1 - lr*wd))
//! Adam:  g = g + wd * p                             (grad.add(param, alpha=wd))
//! m = lerp(m, g, 1 - beta1)                         (exp_avg.lerp_(grad, 1-beta1))
//! v = v * beta2 + ((1 - beta2) * g) * g             (exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2))
//! denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//! p = p + (-(lr / (1 - beta1^t)) * m) / denom      (param.addcdiv_(m, denom, value=-step_size))
//! ```
//!
//! `add(.., alpha=)` and `lerp` are fused multiply-adds, as in PyTorch's
//! vectorized CPU kernels; `addcmul`/`addcdiv` round op by op, left to right.

/// The Python-side scalars of one Adam step, computed in f64 and rounded to
/// f32 as PyTorch hands them to its kernels.
pub(super) struct AdamScalars {
    /// AdamW's `1 - lr * weight_decay`; `None` for Adam.
    decoupled_factor: Option<f32>,
    /// Adam's L2 term added to the gradient; 0 for AdamW.
    weight_decay: f32,
    lerp_weight: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    neg_step_size: f32,
}

impl AdamScalars {
    /// `step` is the 1-based index of the step being taken.
    pub(super) fn new(
        lr: f64,
        (beta1, beta2): (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
        step: u64,
    ) -> Self {
        // PyTorch's step count is a float tensor read back with `.item()`.
        let t = step as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2 = 1.0 - beta2.powf(t);
        let step_size = lr / bias_correction1;
        AdamScalars {
            decoupled_factor: decoupled.then_some((1.0 - lr * weight_decay) as f32),
            weight_decay: if decoupled { 0.0 } else { weight_decay as f32 },
            lerp_weight: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            // Python's `bias_correction2 ** 0.5`, i.e. pow, not sqrt.
            bias_correction2_sqrt: bias_correction2.powf(0.5) as f32,
            eps: eps as f32,
            neg_step_size: (-step_size) as f32,
        }
    }
}

/// `torch.lerp(start, end, weight)` as PyTorch's vectorized CPU kernel computes
/// it: from the nearer end, to keep the result exact at weight 0 and 1.
#[inline(always)]
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        weight.mul_add(end - start, start)
    } else {
        (weight - 1.0).mul_add(end - start, end)
    }
}

/// One Adam/AdamW update of one parameter tensor. Lengths are checked by the
/// caller.
pub(super) fn update(
    param: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    hp: &AdamScalars,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: `update_fma` only needs the FMA instructions, checked just above.
        unsafe { update_fma(param, grad, exp_avg, exp_avg_sq, hp) };
        return;
    }
    update_portable(param, grad, exp_avg, exp_avg_sq, hp);
}

/// [`update_portable`] compiled with hardware FMA: `mul_add` becomes one
/// instruction (and the loop can vectorize) instead of a call into libm.
/// Fused multiply-adds are exactly rounded either way, so the results are
/// the same bits.
///
/// # Safety
/// The CPU must support FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
pub(super) unsafe fn update_fma(
    param: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    hp: &AdamScalars,
) {
    update_portable(param, grad, exp_avg, exp_avg_sq, hp);
}

#[inline(always)]
pub(super) fn update_portable(
    param: &mut [f32],
    grad: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    hp: &AdamScalars,
) {
    let moments = exp_avg.iter_mut().zip(exp_avg_sq.iter_mut());
    for ((p, &g), (m, v)) in param.iter_mut().zip(grad).zip(moments) {
        let mut g = g;
        if let Some(factor) = hp.decoupled_factor {
            *p *= factor;
        } else if hp.weight_decay != 0.0 {
            g = p.mul_add(hp.weight_decay, g);
        }
        *m = lerp(*m, g, hp.lerp_weight);
        *v = *v * hp.beta2 + hp.one_minus_beta2 * g * g;
        let denom = v.sqrt() / hp.bias_correction2_sqrt + hp.eps;
        *p += hp.neg_step_size * *m / denom;
    }
}
