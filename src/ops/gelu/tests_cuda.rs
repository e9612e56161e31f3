//! GPU parity: kernels/gelu.cu against the CPU twin (src/ops/gelu/cpu.rs).
//! Both evaluate in f64 and round once; the f64 erf/exp/tanh may differ in
//! their last f64 bits between the device and Rust, which can move an f32
//! rounding by one ulp, so f32 is held to 1 ulp and the count of inexact
//! elements is printed; f16 (rounded from the same f32) to identical bits
//! or one f16 ulp where the f32 values differed.

use super::{backward, forward};
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu};
use crate::ops::gelu::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

/// How far apart two same-signed floats of type `T` are, in `T`'s ulps.
fn ulps<T: DeviceFloat>(a: f32, b: f32) -> u32 {
    if a.to_bits() == b.to_bits() || (a == 0.0 && b == 0.0) {
        return 0;
    }
    if a.signum() != b.signum() || a.is_nan() || b.is_nan() {
        return u32::MAX;
    }
    let bits = |v: f32| -> u32 {
        if T::SUFFIX == "f16" {
            u32::from(f16::from_f32(v).to_bits() & 0x7fff)
        } else {
            v.to_bits() & 0x7fff_ffff
        }
    };
    bits(a).abs_diff(bits(b))
}

/// Every element within 1 ulp of `T`; returns how many were not identical.
fn assert_within_ulp<T: DeviceFloat>(what: &str, got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut off = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = ulps::<T>(g, w);
        assert!(d <= 1, "{what}[{i}]: got {g:e}, CPU gives {w:e} ({d} ulp apart)");
        off += usize::from(d > 0);
    }
    off
}

fn check<T: DeviceFloat>(gpu: &Gpu, n: usize, tanh: bool, seed: u64) {
    let what = format!("gelu {} n={n} tanh={tanh}", T::SUFFIX);
    // Spread over [-6, 6]: both tails, where erf saturates, and the middle.
    let x = rounded::<T>(&rand_vec_f32(n, seed).iter().map(|v| 6.0 * v).collect::<Vec<_>>());
    let mut y_cpu = vec![0f32; n];
    cpu::forward(&x, &mut y_cpu, tanh);
    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, n);
    forward(gpu, &xd, &mut yd, tanh).unwrap();
    let off_y = assert_within_ulp::<T>(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));

    let dy = rounded::<T>(&rand_vec_f32(n, seed + 1));
    let mut dx_cpu = vec![0f32; n];
    cpu::backward(&x, &dy, &mut dx_cpu, tanh);
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, n);
    backward(gpu, &xd, &dyd, &mut dxd, tanh).unwrap();
    let off_dx = assert_within_ulp::<T>(&format!("{what}: dx"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
    println!("{what}: {off_y} of y and {off_dx} of dx 1 ulp off the CPU, the rest identical");
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    for tanh in [false, true] {
        // The baby GPT's MLP activations ([12, 64, 512]), and lengths around
        // the block size so the last element meets the buffer's end.
        check::<T>(gpu, 12 * 64 * 512, tanh, seed);
        for n in [1, 255, 256, 257] {
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
    all_cases::<f16>(&gpu, 600);
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
