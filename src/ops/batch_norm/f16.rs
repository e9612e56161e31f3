//! BatchNorm2d over f16 activations with f32 parameters and running
//! statistics (apex O2's `keep_batchnorm_fp32`), without whole-tensor widen
//! and round passes: each (sample, channel) plane is widened into a
//! per-thread f32 buffer, the f32 kernels of [`super::cpu`] run on it, and
//! outputs are rounded to f16 as they are stored. Every plane sees the values
//! and every sum the order of the f32 path on a widened copy, so the results
//! are bit for bit those of widening, running the f32 op and rounding.

use super::cpu::{self, BackwardSums, LocalSums, PAR_MIN_ELEMS};
use crate::ops::half_emu::{round_into, round_trip, scratch, widen_into, with_widened};
use half::f16;
use rayon::prelude::*;
#[cfg(target_arch = "x86_64")]
use {crate::tensor::written_by, std::mem::MaybeUninit};

/// [`cpu::local_sums`] of f16 `x[N, C, HW]`.
pub fn local_sums(x: &[f16], n: usize, c: usize, hw: usize) -> LocalSums {
    let shift = |ch: usize| if n * hw > 0 { x[ch * hw].to_f32() } else { 0.0 };
    cpu::local_sums_with(n, c, hw, shift, |i, ch, k| {
        let p = &x[(i * c + ch) * hw..][..hw];
        #[cfg(target_arch = "x86_64")]
        if super::avx512::usable() {
            return super::avx512_f16::plane_sums(p, k);
        }
        with_widened(p, &[], |p, _| cpu::plane_sums(p, k))
    })
}

/// ReLU after BatchNorm, as the fused backward sees it: its output is
/// `max(0, round(x * scale + shift))` per channel, recomputed from `x`
/// instead of kept (see `avx512_f16::plane_backward_sums_relu`).
#[derive(Clone, Copy)]
pub struct ReluAfter<'a> {
    pub scale: &'a [f32],
    pub shift: &'a [f32],
}

/// [`cpu::backward_sums`] of f16 `x` and `dy`; with `relu`, of the gradient
/// that ReLU's backward makes of `dy` (AVX-512 only: the caller checks
/// `avx512::usable`).
#[allow(clippy::too_many_arguments)]
pub fn backward_sums(
    x: &[f16],
    dy: &[f16],
    n: usize,
    c: usize,
    hw: usize,
    mean: &[f32],
    invstd: &[f32],
    relu: Option<ReluAfter<'_>>,
) -> BackwardSums {
    cpu::backward_sums_with(n, c, hw, invstd, |i, ch| {
        let off = (i * c + ch) * hw;
        let (xp, dp) = (&x[off..][..hw], &dy[off..][..hw]);
        #[cfg(target_arch = "x86_64")]
        if super::avx512::usable() {
            return match relu {
                Some(r) => {
                    super::avx512_f16::plane_backward_sums_relu(xp, dp, (r.scale[ch], r.shift[ch]), mean[ch])
                }
                None => super::avx512_f16::plane_backward_sums(xp, dp, mean[ch]),
            };
        }
        assert!(relu.is_none(), "batch_norm: the fused ReLU backward needs AVX-512");
        with_widened(xp, dp, |xp, dp| cpu::plane_backward_sums(xp, dp, mean[ch]))
    })
}

/// `f(sample, channel, output plane)` for every plane of `out[N, C, hw]`,
/// per sample in parallel when the tensor is large (as the f32 kernels
/// split), with `buf` scratch of the task's.
fn for_each_plane<E: Send>(
    out: &mut [E],
    c: usize,
    hw: usize,
    f: impl Fn(&mut Vec<f32>, usize, usize, &mut [E]) + Sync + Send,
) {
    let sample = c * hw;
    if sample == 0 {
        return;
    }
    let run = |buf: &mut Vec<f32>, s: usize, os: &mut [E]| {
        for (ch, op) in os.chunks_exact_mut(hw).enumerate() {
            f(buf, s, ch, op);
        }
    };
    if out.len() >= PAR_MIN_ELEMS {
        out.par_chunks_mut(sample).enumerate().for_each_init(Vec::new, |buf, (s, os)| run(buf, s, os));
    } else {
        let mut buf = Vec::new();
        out.chunks_mut(sample).enumerate().for_each(|(s, os)| run(&mut buf, s, os));
    }
}

/// `f(channel, widened planes, f32 output plane)` for each plane of the `K`
/// f16 inputs, each output plane rounded into `out` (the generic path; the
/// AVX-512 kernels widen and round in their loads and stores instead).
fn per_plane<const K: usize>(
    inputs: [&[f16]; K],
    out: &mut [f16],
    c: usize,
    hw: usize,
    f: impl Fn(usize, [&[f32]; K], &mut [f32]) + Sync + Send,
) {
    for_each_plane(out, c, hw, |buf, s, ch, op| {
        let st = scratch(buf, (K + 1) * hw);
        let (ins, o) = st.split_at_mut(K * hw);
        let off = (s * c + ch) * hw;
        for (x, dst) in inputs.iter().zip(ins.chunks_exact_mut(hw)) {
            widen_into(&x[off..][..hw], dst);
        }
        let planes: [&[f32]; K] = std::array::from_fn(|k| &ins[k * hw..][..hw]);
        f(ch, planes, o);
        round_into(o, op);
    });
}

/// [`cpu::normalize_affine`] of f16 `x`, in f16.
pub fn normalize_affine(
    x: &[f16],
    c: usize,
    hw: usize,
    mean: &[f32],
    invstd: &[f32],
    weight: &[f32],
    bias: &[f32],
) -> Vec<f16> {
    let (scale, shift) = cpu::affine_coefficients(c, mean, invstd, weight, bias);
    affine(x, c, hw, &scale, &shift, Then::Nothing)
}

/// What follows BatchNorm's output in the same pass.
#[derive(Clone, Copy)]
pub enum Then<'a> {
    Nothing,
    Relu,
    /// A residual block's end: the add of this (shortcut) tensor, then ReLU.
    AddRelu(&'a [f16]),
}

/// `out = round(x * scale + shift)` per channel, then (`then`) the add of
/// another tensor, rounded, and ReLU of the rounded value.
fn affine(x: &[f16], c: usize, hw: usize, scale: &[f32], shift: &[f32], then: Then<'_>) -> Vec<f16> {
    #[cfg(target_arch = "x86_64")]
    if super::avx512::usable() {
        let fill = |out: &mut [MaybeUninit<f16>]| {
            for_each_plane(out, c, hw, |_, s, ch, op| {
                let at = (s * c + ch) * hw..(s * c + ch + 1) * hw;
                let ab = (scale[ch], shift[ch]);
                match then {
                    Then::AddRelu(other) => {
                        super::avx512_f16::affine_add_relu_plane(&x[at.clone()], &other[at], ab, op)
                    }
                    _ => super::avx512_f16::affine_plane(&x[at], ab, matches!(then, Then::Relu), op),
                }
            })
        };
        // SAFETY: the planes of `out` cover it, and `affine_plane` and
        // `affine_add_relu_plane` write every element of their plane.
        return unsafe { written_by(x.len(), fill) };
    }
    let mut out = vec![f16::ZERO; x.len()];
    let affine_plane = |ch: usize, xp: &[f32], op: &mut [f32]| {
        let (a, b) = (scale[ch], shift[ch]);
        for (o, &v) in op.iter_mut().zip(xp) {
            *o = v * a + b;
        }
    };
    match then {
        Then::AddRelu(other) => per_plane([x, other], &mut out, c, hw, |ch, [xp, sp], op| {
            affine_plane(ch, xp, op);
            // BatchNorm's output and the sum each rounded to f16 as the ops store them.
            round_trip(op);
            for (o, s) in op.iter_mut().zip(sp) {
                *o += s;
            }
            round_trip(op);
            crate::ops::relu::cpu::forward_inplace(op);
        }),
        _ => per_plane([x], &mut out, c, hw, |ch, [xp], op| {
            affine_plane(ch, xp, op);
            if matches!(then, Then::Relu) {
                // Each value rounded to f16 (BatchNorm's output) before ReLU sees it.
                round_trip(op);
                crate::ops::relu::cpu::forward_inplace(op);
            }
        }),
    }
    out
}

/// [`cpu::backward_dx`] of f16 `x` and `dy`, in f16; with `relu`, of the
/// gradient that ReLU's backward makes of `dy` (see [`backward_sums`]).
#[allow(clippy::too_many_arguments)]
pub fn backward_dx(
    x: &[f16],
    dy: &[f16],
    c: usize,
    hw: usize,
    mean: &[f32],
    invstd: &[f32],
    weight: &[f32],
    sums: &BackwardSums,
    count: usize,
    relu: Option<ReluAfter<'_>>,
) -> Vec<f16> {
    let coef = cpu::dx_coefficients(c, mean, invstd, weight, sums, count);
    #[cfg(target_arch = "x86_64")]
    if super::avx512::usable() {
        let fill = |dx: &mut [MaybeUninit<f16>]| {
            for_each_plane(dx, c, hw, |_, s, ch, op| {
                let off = (s * c + ch) * hw;
                let (xp, dp) = (&x[off..][..hw], &dy[off..][..hw]);
                match relu {
                    Some(r) => {
                        super::avx512_f16::dx_plane_relu(xp, dp, (r.scale[ch], r.shift[ch]), coef[ch], op)
                    }
                    None => super::avx512_f16::dx_plane_f16(xp, dp, coef[ch], op),
                }
            })
        };
        // SAFETY: the planes of `dx` cover it, and both plane kernels write
        // every element of theirs.
        return unsafe { written_by(x.len(), fill) };
    }
    assert!(relu.is_none(), "batch_norm: the fused ReLU backward needs AVX-512");
    let mut dx = vec![f16::ZERO; x.len()];
    per_plane([x, dy], &mut dx, c, hw, |ch, [xp, dp], op| {
        let (k, p, q) = coef[ch];
        for ((o, &xv), &g) in op.iter_mut().zip(xp).zip(dp) {
            *o = k * g + p * xv + q;
        }
    });
    dx
}

/// [`normalize_affine`] followed by ReLU, as the two ops in sequence store
/// it: each value is rounded to f16 (BatchNorm's output) before ReLU sees it.
pub fn normalize_affine_relu(
    x: &[f16],
    c: usize,
    hw: usize,
    mean: &[f32],
    invstd: &[f32],
    weight: &[f32],
    bias: &[f32],
) -> Vec<f16> {
    let (scale, shift) = cpu::affine_coefficients(c, mean, invstd, weight, bias);
    affine(x, c, hw, &scale, &shift, Then::Relu)
}

/// [`normalize_affine`] followed by `then` (ReLU, or a residual block's add
/// and ReLU), as the ops in sequence store it: BatchNorm's output and the
/// sum each rounded to f16 before the next op sees them.
pub fn normalize_affine_then(
    x: &[f16],
    (c, hw): (usize, usize),
    (mean, invstd): (&[f32], &[f32]),
    (weight, bias): (&[f32], &[f32]),
    then: Then<'_>,
) -> Vec<f16> {
    let (scale, shift) = cpu::affine_coefficients(c, mean, invstd, weight, bias);
    affine(x, c, hw, &scale, &shift, then)
}
