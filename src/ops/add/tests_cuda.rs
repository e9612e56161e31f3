//! GPU parity: kernels/add.cu against the CPU twin (src/ops/add/cpu.rs).
//! One f32 addition per element, rounded once for f16, so the outputs must
//! be identical, special values included.

use super::{accumulate, forward};
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::{launch_1d, Gpu, BLOCK};
use crate::ops::add::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

/// Random values with the cases IEEE addition must agree on mixed in.
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut v = rand_vec_f32(n, seed);
    let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 65504.0, 1e-7];
    for (i, s) in special.iter().enumerate() {
        v[(i * 37 + seed as usize) % n] = *s;
    }
    v
}

fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() };
        assert!(same, "{what}[{i}]: got {g:e}, CPU gives {w:e}");
    }
}

fn check<T: DeviceFloat>(gpu: &Gpu, n: usize, seed: u64) {
    let what = |op: &str| format!("add {op} {} n={n}", T::SUFFIX);
    let a = rounded::<T>(&inputs(n, seed));
    let b = rounded::<T>(&inputs(n, seed + 1));
    let mut y_cpu = vec![0f32; n];
    cpu::forward(&a, &b, crate::tensor::as_uninit(&mut y_cpu));
    let y_cpu = rounded::<T>(&y_cpu);

    let (ad, bd) = (upload::<T>(gpu, &a), upload::<T>(gpu, &b));
    let mut yd = poisoned::<T>(gpu, n);
    forward(gpu, &ad, &bd, &mut yd).unwrap();
    assert_identical(&what("forward"), &download(gpu, &yd), &y_cpu);

    let mut dst = upload::<T>(gpu, &a);
    accumulate(gpu, &mut dst, &bd).unwrap();
    assert_identical(&what("accumulate"), &download(gpu, &dst), &y_cpu);
    // A second += reads the first one's rounded result, as gradient
    // accumulation over several readers does.
    accumulate(gpu, &mut dst, &bd).unwrap();
    let mut twice = y_cpu.clone();
    cpu::accumulate(&mut twice, &b);
    assert_identical(&what("accumulate twice"), &download(gpu, &dst), &rounded::<T>(&twice));
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    // A ResNet stage's activations, odd sizes, and a single element.
    check::<T>(gpu, 2 * 64 * 8 * 8, seed);
    check::<T>(gpu, 3 * 32 * 7 * 7, seed + 2);
    check::<T>(gpu, 3 * 5 * 7 * 13, seed + 4);
    check::<T>(gpu, 1, seed + 6);
    // Every length from 1 to 64 elements, so an off-by-one at the end of
    // a buffer meets the emulator's exact-byte bounds at every alignment.
    for n in 1..=64 {
        check::<T>(gpu, n, seed + 8 + n as u64);
    }
}

#[test]
fn add_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("add_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 1);
}

#[test]
fn add_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("add_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 11);
}

#[test]
fn add_covers_more_elements_than_one_grid() {
    let Some(gpu) = crate::cuda::test_gpu("add_covers_more_elements_than_one_grid") else { return };
    // More than the capped grid launches threads, so the grid-stride loop
    // must take a second lap.
    let n = launch_1d(usize::MAX).grid_dim.0 as usize * BLOCK as usize + 1001;
    check::<f32>(&gpu, n, 21);
}

#[test]
fn add_refuses_mismatched_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("add_refuses_mismatched_buffers") else { return };
    let a = upload::<f32>(&gpu, &[1.0; 10]);
    let b = upload::<f32>(&gpu, &[1.0; 11]);
    let mut y = poisoned::<f32>(&gpu, 10);
    let e = forward(&gpu, &a, &b, &mut y).unwrap_err().to_string();
    assert!(e.contains("add forward: b holds 11 elements, expected 10"), "{e}");
    let mut y9 = poisoned::<f32>(&gpu, 9);
    let e = forward(&gpu, &a, &a, &mut y9).unwrap_err().to_string();
    assert!(e.contains("add forward: y holds 9 elements, expected 10"), "{e}");
    let mut dst = upload::<f32>(&gpu, &[1.0; 10]);
    let e = accumulate(&gpu, &mut dst, &b).unwrap_err().to_string();
    assert!(e.contains("add accumulate: src holds 11 elements, expected 10"), "{e}");
    assert_eq!(download(&gpu, &dst), vec![1.0; 10], "dst untouched on error");
}
