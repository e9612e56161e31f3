//! GPU parity: kernels/gelu.cu against the CPU twin (src/ops/gelu/cpu.rs).
//! Both run the same f32 operations in the same order, each rounded to
//! nearest, with no library function between them: identical bits, f32 and
//! f16 (rounded once from the same f32).

use super::{backward, forward};
use crate::cuda::testing::{assert_identical, download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu};
use crate::ops::gelu::cpu;
use crate::ops::testing::rand_vec_f32;

fn check<T: DeviceFloat>(gpu: &Gpu, n: usize, tanh: bool, seed: u64) {
    let what = format!("gelu {} n={n} tanh={tanh}", T::SUFFIX);
    // Spread over [-12, 12]: both tails, where Φ saturates or underflows
    // toward 0, and the middle; and the values where exp's range ends.
    let mut x: Vec<f32> = rand_vec_f32(n, seed).iter().map(|v| 12.0 * v).collect();
    // (No NaN or infinity: the NaNs they produce carry a payload of each
    // processor's own.)
    for (slot, v) in x.iter_mut().zip([-14.0, 14.0, -13.2, 13.3, -9.6, 0.0, 6e4, -6e4]) {
        *slot = v;
    }
    let x = rounded::<T>(&x);
    let mut y_cpu = vec![0f32; n];
    cpu::forward(&x, &mut y_cpu, tanh);
    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, n);
    forward(gpu, &xd, &mut yd, tanh).unwrap();
    assert_identical(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));

    let dy = rounded::<T>(&rand_vec_f32(n, seed + 1));
    let mut dx_cpu = vec![0f32; n];
    cpu::backward(&x, &dy, &mut dx_cpu, tanh);
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, n);
    backward(gpu, &xd, &dyd, &mut dxd, tanh).unwrap();
    assert_identical(&format!("{what}: dx"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    for tanh in [false, true] {
        // The baby GPT's MLP activations ([12, 64, 512]), and lengths around
        // the block size so the last element meets the buffer's end.
        check::<T>(gpu, 12 * 64 * 512, tanh, seed);
        for n in (1..=64).chain([255, 256, 257]) {
            check::<T>(gpu, n, tanh, seed + n as u64);
        }
    }
}

#[test]
fn gelu_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("gelu_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 500);
}

#[test]
fn gelu_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("gelu_matches_cpu_f16") else { return };
    all_cases::<half::f16>(&gpu, 600);
}

#[test]
fn gelu_refuses_mismatched_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("gelu_refuses_mismatched_buffers") else { return };
    let x = upload::<f32>(&gpu, &[0.0; 8]);
    let mut y = poisoned::<f32>(&gpu, 7);
    let e = forward(&gpu, &x, &mut y, false).unwrap_err().to_string();
    assert!(e.contains("gelu forward: y holds 7 elements, expected 8"), "{e}");
    let e = backward(&gpu, &x, &y, &mut y.clone(), true).unwrap_err().to_string();
    assert!(e.contains("gelu backward: dy holds 7 elements, expected 8"), "{e}");
}
