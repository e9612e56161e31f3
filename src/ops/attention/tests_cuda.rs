//! GPU parity: src/ops/attention/cuda.rs (cuBLAS GEMMs around
//! kernels/attention.cu's causal softmax) against the CPU twin
//! (src/ops/attention/cpu.rs). The GEMMs sum in cuBLAS's order, so f32 is
//! held to 1e-5 relative (floored at 1e-3 of the tensor's peak, for values
//! that cancel to nearly zero); f16, whose scores and probabilities are
//! rounded to f16 between the GEMMs, to 1e-2 of each tensor's peak. The
//! measured worst errors are printed. Every shape runs without and with
//! attention dropout (both sides drop the same probabilities: a mask off by
//! one element moves y by a whole probability times v).

use super::{backward, forward, Dropout};
use crate::cuda::blas::Blas;
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu};
use crate::ops::attention::cpu::{self, Dims};
use crate::ops::dropout::Mask;
use crate::ops::testing::rand_vec_f32;
use crate::rng::NodeDraws;
use half::f16;

/// The worst |got - want| over the peak |want|, after checking `T`'s bound.
fn compare<T: DeviceFloat>(what: &str, got: &[f32], want: &[f32]) -> f32 {
    let peak = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let worst = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    // Against the peak, as the other GEMM parity tests (linear): cuBLAS and
    // the CPU's GEMMs add in their own orders, and att v cancels to values
    // far below its terms, so an element's own relative error means little.
    let tol = if T::SUFFIX == "f16" { 1e-2 } else { 1e-5 };
    assert!(got.iter().all(|v| !v.is_nan()), "{what}: NaN");
    assert!(worst <= tol * peak, "{what}: worst error {worst:e} against a peak of {peak:e}");
    worst / peak
}

/// Parity of one shape with dropout probability `p` (0: none).
fn check<T: super::AttnFloat>(gpu: &Gpu, blas: &Blas, d: Dims, p: f64, seed: u64) {
    let what = format!("attention {} {d:?} p={p}", <T as DeviceFloat>::SUFFIX);
    let Dims { n, t, c, h } = d;
    let mask = (p > 0.0).then(|| Mask::new(p, NodeDraws { key: [seed as u32, 0x5eed], ctr_hi: [3, 1] }));
    let x = rounded::<T>(&rand_vec_f32(n * t * 3 * c, seed));
    let (mut y_cpu, mut att_cpu) = (vec![0f32; n * t * c], vec![0f32; n * h * t * t]);
    cpu::forward(d, &x, mask.as_ref(), &mut y_cpu, &mut att_cpu);
    let xd = upload::<T>(gpu, &x);
    let (mut yd, mut attd) = (poisoned::<T>(gpu, n * t * c), poisoned::<T>(gpu, n * h * t * t));
    let mut ws = poisoned::<T>(gpu, n * h * t * t);
    let mut wsv = ws.as_view_mut();
    let dropout = mask.as_ref().map(|mask| Dropout { mask, workspace: &mut wsv });
    forward(gpu, blas, &xd.as_view(), d, &mut yd.as_view_mut(), &mut attd.as_view_mut(), dropout).unwrap();
    let e_att = compare::<T>(&format!("{what}: att"), &download(gpu, &attd), &rounded::<T>(&att_cpu));
    let e_y = compare::<T>(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));

    let dy = rounded::<T>(&rand_vec_f32(n * t * c, seed + 1));
    let mut dx_cpu = vec![0f32; n * t * 3 * c];
    cpu::backward(d, &x, &att_cpu, &dy, mask.as_ref(), &mut dx_cpu);
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, n * t * 3 * c);
    let mut ws = poisoned::<T>(gpu, n * h * t * t);
    let (xv, av, dyv) = (xd.as_view(), attd.as_view(), dyd.as_view());
    let dxv = &mut dxd.as_view_mut();
    backward(gpu, blas, &xv, &av, d, &dyv, dxv, &mut ws.as_view_mut(), mask.as_ref()).unwrap();
    let e_dx = compare::<T>(&format!("{what}: dqkv"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
    println!("{what}: worst error over the peak: att {e_att:.2e}, y {e_y:.2e}, dqkv {e_dx:.2e}");
}

fn all_cases<T: super::AttnFloat>(gpu: &Gpu, seed: u64) {
    let blas = Blas::new(gpu, false).unwrap();
    // The baby GPT's attention (4 heads of 32 over a block of 64), with 3 of
    // its 12 samples; odd sizes, one head, heads of width 1, one position.
    for (i, d) in [
        Dims { n: 3, t: 64, c: 128, h: 4 },
        Dims { n: 2, t: 5, c: 6, h: 2 },
        Dims { n: 3, t: 17, c: 16, h: 1 },
        Dims { n: 2, t: 9, c: 3, h: 3 },
        Dims { n: 2, t: 1, c: 4, h: 2 },
    ]
    .into_iter()
    .enumerate()
    {
        for p in [0.0, 0.25] {
            check::<T>(gpu, &blas, d, p, seed + 10 * i as u64);
        }
    }
    // Every block length 1..64 (the rows end anywhere in a warp), and
    // dropping everything.
    let d = |t| Dims { n: 2, t, c: 4, h: 2 };
    for t in 1..=64 {
        check::<T>(gpu, &blas, d(t), if t % 2 == 0 { 0.1 } else { 0.0 }, seed + 100 + t as u64);
    }
    check::<T>(gpu, &blas, d(7), 1.0, seed + 200);
}

#[test]
fn attention_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("attention_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 900);
}

#[test]
fn attention_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("attention_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 1000);
}

#[test]
fn attention_refuses_bad_heads_and_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("attention_refuses_bad_heads_and_buffers") else { return };
    let blas = Blas::new(&gpu, false).unwrap();
    let d = Dims { n: 1, t: 2, c: 4, h: 3 };
    let x = upload::<f32>(&gpu, &[0.0; 24]);
    let (mut y, mut att) = (poisoned::<f32>(&gpu, 8), poisoned::<f32>(&gpu, 12));
    let e = forward(&gpu, &blas, &x.as_view(), d, &mut y.as_view_mut(), &mut att.as_view_mut(), None)
        .unwrap_err();
    assert!(e.to_string().contains("attention forward: width 4 does not split into 3 heads"), "{e}");
    let d = Dims { h: 2, ..d };
    let e = forward(&gpu, &blas, &x.as_view(), d, &mut y.as_view_mut(), &mut att.as_view_mut(), None)
        .unwrap_err();
    assert!(e.to_string().contains("attention forward: att holds 12 elements, expected 8"), "{e}");
    let mask = Mask::new(0.5, NodeDraws { key: [1, 2], ctr_hi: [0, 0] });
    let (mut att, mut ws) = (poisoned::<f32>(&gpu, 8), poisoned::<f32>(&gpu, 12));
    let dropout = Some(Dropout { mask: &mask, workspace: &mut ws.as_view_mut() });
    let e = forward(&gpu, &blas, &x.as_view(), d, &mut y.as_view_mut(), &mut att.as_view_mut(), dropout)
        .unwrap_err();
    assert!(
        e.to_string().contains("attention forward: dropout workspace holds 12 elements, expected 8"),
        "{e}"
    );
}
