//! `torch.optim.SGD`, single-tensor path (`_single_tensor_sgd`):
//!
//! ```text
//! d = g + weight_decay * p                          (grad.add(param, alpha=wd))
//! buf = d                                           (first step: clone, no dampening)
//! buf = momentum * buf + (1 - dampening) * d        (buf.mul_(m).add_(d, alpha=1-dampening))
//! d = nesterov ? d + momentum * buf : buf           (d.add(buf, alpha=m))
//! p = p - lr * d                                    (param.add_(d, alpha=-lr))
//! ```
//!
//! Each `add(.., alpha=)` is a fused multiply-add, as in PyTorch's vectorized
//! CPU kernel (`vec::fmadd(other, alpha, self)`).

/// The Python-side scalars of one SGD step, rounded to f32 as PyTorch hands
/// them to its kernels.
pub(super) struct SgdScalars {
    neg_lr: f32,
    momentum: f32,
    one_minus_dampening: f32,
    nesterov: bool,
    weight_decay: f32,
}

impl SgdScalars {
    pub(super) fn new(lr: f64, momentum: f64, dampening: f64, nesterov: bool, weight_decay: f64) -> Self {
        SgdScalars {
            neg_lr: (-lr) as f32,
            momentum: momentum as f32,
            one_minus_dampening: (1.0 - dampening) as f32,
            nesterov,
            weight_decay: weight_decay as f32,
        }
    }
}

/// One SGD update of one parameter tensor. Lengths are checked by the caller.
pub(super) fn update(
    param: &mut [f32],
    grad: &[f32],
    momentum_buffer: &mut Option<Vec<f32>>,
    hp: &SgdScalars,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: `update_fma` only needs the FMA instructions, checked just above.
        unsafe { update_fma(param, grad, momentum_buffer, hp) };
        return;
    }
    update_portable(param, grad, momentum_buffer, hp);
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
    momentum_buffer: &mut Option<Vec<f32>>,
    hp: &SgdScalars,
) {
    update_portable(param, grad, momentum_buffer, hp);
}

#[inline(always)]
pub(super) fn update_portable(
    param: &mut [f32],
    grad: &[f32],
    momentum_buffer: &mut Option<Vec<f32>>,
    hp: &SgdScalars,
) {
    let with_decay = |p: f32, g: f32| {
        if hp.weight_decay != 0.0 {
            p.mul_add(hp.weight_decay, g)
        } else {
            g
        }
    };
    if hp.momentum == 0.0 {
        for (p, &g) in param.iter_mut().zip(grad) {
            let d = with_decay(*p, g);
            *p = d.mul_add(hp.neg_lr, *p);
        }
        return;
    }
    let first_step = momentum_buffer.is_none();
    let buf = momentum_buffer.get_or_insert_with(|| vec![0.0; param.len()]);
    for ((p, &g), b) in param.iter_mut().zip(grad).zip(buf.iter_mut()) {
        let d = with_decay(*p, g);
        *b = if first_step { d } else { d.mul_add(hp.one_minus_dampening, *b * hp.momentum) };
        let d = if hp.nesterov { b.mul_add(hp.momentum, d) } else { *b };
        *p = d.mul_add(hp.neg_lr, *p);
    }
}
