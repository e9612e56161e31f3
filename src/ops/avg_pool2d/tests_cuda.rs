//! GPU parity: kernels/avg_pool2d.cu against the CPU twin
//! (src/ops/avg_pool2d/cpu.rs). Both sum in the same order in f32 and round
//! f16 once, so the outputs must be identical, bit for bit, in both dtypes.

use super::{backward, forward, out_shape};
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::Gpu;
use crate::ops::avg_pool2d::cpu::{self, Geometry};
use crate::ops::avg_pool2d::AvgPool2dArgs;
use crate::ops::testing::rand_vec_f32;
use half::f16;

fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "{what}[{i}]: got {g:e}, CPU gives {w:e}");
    }
}

fn check<T: DeviceFloat>(gpu: &Gpu, x_shape: [usize; 4], a: AvgPool2dArgs, seed: u64) {
    let what = format!("avg_pool2d {} {x_shape:?} {a:?}", T::SUFFIX);
    let [_, _, h, w] = x_shape;
    let x_len: usize = x_shape.iter().product();
    let out = out_shape(x_shape, a).unwrap();
    let len: usize = out.iter().product();
    let g = Geometry { h, w, oh: out[2], ow: out[3], args: a };

    let x = rounded::<T>(&rand_vec_f32(x_len, seed));
    let mut y_cpu = vec![0f32; len];
    cpu::forward(&x, g, &mut y_cpu);
    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, len);
    forward(gpu, &xd, x_shape, a, &mut yd).unwrap();
    assert_identical(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));

    let dy = rounded::<T>(&rand_vec_f32(len, seed + 1));
    let mut dx_cpu = vec![0f32; x_len];
    cpu::backward(&dy, g, &mut dx_cpu);
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, x_len);
    backward(gpu, &dyd, x_shape, a, &mut dxd).unwrap();
    assert_identical(&format!("{what}: dx"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
}

fn args(k: [usize; 2], s: [usize; 2], p: [usize; 2]) -> AvgPool2dArgs {
    AvgPool2dArgs { kernel: k, stride: s, padding: p }
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    // Global pooling of a ResNet's last stages.
    check::<T>(gpu, [2, 64, 8, 8], AvgPool2dArgs::global(8, 8), seed);
    check::<T>(gpu, [3, 32, 7, 7], AvgPool2dArgs::global(7, 7), seed + 2);
    // 2x2/2 on odd sizes (a dropped row and column), overlapping padded
    // windows, rectangular windows and strides, gaps (stride > kernel).
    check::<T>(gpu, [3, 5, 7, 7], args([2, 2], [2, 2], [0, 0]), seed + 4);
    check::<T>(gpu, [2, 3, 13, 11], args([3, 3], [2, 2], [1, 1]), seed + 6);
    check::<T>(gpu, [2, 3, 9, 10], args([3, 2], [1, 2], [1, 1]), seed + 8);
    check::<T>(gpu, [1, 2, 13, 13], args([2, 3], [3, 4], [1, 0]), seed + 10);
    // A window larger than the unpadded input.
    check::<T>(gpu, [2, 2, 3, 3], args([5, 4], [1, 1], [2, 2]), seed + 12);
    // Inputs of every length from 1 to 64 elements (global pooling of a
    // 1 x n row) and outputs of every length (n planes of 2x2 pooled to
    // one), so an off-by-one at either buffer's end meets the emulator's
    // exact-byte bounds.
    for n in 1..=64 {
        check::<T>(gpu, [1, 1, 1, n], AvgPool2dArgs::global(1, n), seed + 14 + n as u64);
        check::<T>(gpu, [1, n, 2, 2], args([2, 2], [2, 2], [0, 0]), seed + 100 + n as u64);
    }
}

#[test]
fn avg_pool2d_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("avg_pool2d_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 100);
}

#[test]
fn avg_pool2d_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("avg_pool2d_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 200);
}

#[test]
fn avg_pool2d_refuses_bad_geometry_and_buffers() {
    let e = out_shape([1, 1, 4, 4], args([5, 5], [1, 1], [0, 0])).unwrap_err().to_string();
    assert!(e.contains("the 5x5 window is larger than the 4x4 input padded by [0, 0]"), "{e}");
    let e = out_shape([1, 1, 4, 4], args([3, 3], [1, 1], [2, 0])).unwrap_err().to_string();
    assert!(e.contains("padding [2, 0] must be at most half the kernel [3, 3]"), "{e}");
    assert_eq!(out_shape([3, 5, 7, 7], args([3, 3], [2, 2], [1, 1])).unwrap(), [3, 5, 4, 4]);
    let Some(gpu) = crate::cuda::test_gpu("avg_pool2d_refuses_bad_geometry_and_buffers") else { return };
    let a = args([2, 2], [2, 2], [0, 0]);
    let x = upload::<f32>(&gpu, &[0.0; 3 * 5 * 7 * 7]);
    let mut y = poisoned::<f32>(&gpu, 3 * 5 * 8);
    let e = forward(&gpu, &x, [3, 5, 7, 7], a, &mut y).unwrap_err().to_string();
    assert!(e.contains("avg_pool2d forward: y holds 120 elements, expected 135"), "{e}");
    let e = forward(&gpu, &x, [3, 5, 7, 8], a, &mut y).unwrap_err().to_string();
    assert!(e.contains("avg_pool2d forward: x holds 735 elements, expected 840"), "{e}");
    let mut dx = poisoned::<f32>(&gpu, 10);
    let e = backward(&gpu, &y, [3, 5, 7, 7], a, &mut dx).unwrap_err().to_string();
    assert!(e.contains("avg_pool2d backward: dy holds 120 elements, expected 135"), "{e}");
    let dy = upload::<f32>(&gpu, &[0.0; 135]);
    let e = backward(&gpu, &dy, [3, 5, 7, 7], a, &mut dx).unwrap_err().to_string();
    assert!(e.contains("avg_pool2d backward: dx holds 10 elements, expected 735"), "{e}");
}
