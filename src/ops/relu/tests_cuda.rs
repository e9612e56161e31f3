//! GPU parity: kernels/relu.cu against the CPU twin (src/ops/relu/cpu.rs).
//! ReLU is exact, so the outputs must be identical, special values included.

use super::{backward, forward};
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::{launch_1d, Gpu, BLOCK};
use crate::ops::relu::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

/// Random values with the cases the comparisons must agree on mixed in.
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut v = rand_vec_f32(n, seed);
    let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e-30, 1e-30];
    for (i, s) in special.iter().enumerate() {
        v[(i * 37) % n] = *s;
    }
    v
}

/// Same value, NaN matching NaN, and the same sign of zero.
fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() };
        assert!(same, "{what}[{i}]: got {g:e}, CPU gives {w:e}");
    }
}

fn check<T: DeviceFloat>(gpu: &Gpu, n: usize, seed: u64) {
    let x = rounded::<T>(&inputs(n, seed));
    let dy = rounded::<T>(&rand_vec_f32(n, seed + 1));
    let mut y_cpu = vec![0f32; n];
    cpu::forward(&x, &mut y_cpu);
    let mut dx_cpu = vec![0f32; n];
    cpu::backward(&y_cpu, &dy, &mut dx_cpu);
    let what = |op: &str| format!("relu {op} {} n={n}", T::SUFFIX);

    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, n);
    forward(gpu, &xd, &mut yd).unwrap();
    assert_identical(&what("forward"), &download(gpu, &yd), &y_cpu);

    // The backward reads the GPU forward's output, as in training.
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, n);
    backward(gpu, &yd, &dyd, &mut dxd).unwrap();
    assert_identical(&what("backward"), &download(gpu, &dxd), &dx_cpu);
}

#[test]
fn relu_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("relu_matches_cpu_f32") else { return };
    check::<f32>(&gpu, 3 * 5 * 7 * 13, 1);
    check::<f32>(&gpu, 1, 2);
}

#[test]
fn relu_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("relu_matches_cpu_f16") else { return };
    check::<f16>(&gpu, 3 * 5 * 7 * 13, 3);
    check::<f16>(&gpu, 1, 4);
}

#[test]
fn relu_covers_more_elements_than_one_grid() {
    let Some(gpu) = crate::cuda::test_gpu("relu_covers_more_elements_than_one_grid") else { return };
    // More than the capped grid launches threads, so the grid-stride loop
    // must take a second lap.
    let n = launch_1d(usize::MAX).grid_dim.0 as usize * BLOCK as usize + 1001;
    check::<f32>(&gpu, n, 5);
}

#[test]
fn relu_refuses_mismatched_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("relu_refuses_mismatched_buffers") else { return };
    let x = upload::<f32>(&gpu, &[1.0; 10]);
    let mut y = poisoned::<f32>(&gpu, 9);
    let e = forward(&gpu, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("relu forward: y holds 9 elements, expected 10"), "{e}");
    let dy = upload::<f32>(&gpu, &[1.0; 11]);
    let mut dx = poisoned::<f32>(&gpu, 10);
    let e = backward(&gpu, &x, &dy, &mut dx).unwrap_err().to_string();
    assert!(e.contains("relu backward: dy holds 11 elements, expected 10"), "{e}");
}
