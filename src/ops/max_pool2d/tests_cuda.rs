//! GPU parity: kernels/max_pool2d.cu against the CPU twin
//! (src/ops/max_pool2d/cpu.rs). Pooling only selects, so values and indices
//! must be identical; the backward sums in the CPU's order, so it is held to
//! the parity tolerance only for the f16 rounding.

use super::{backward, forward, out_shape};
use crate::cuda::testing::{assert_close, download, poisoned, rounded, tol, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::Gpu;
use crate::ops::max_pool2d::cpu::{self, Geometry};
use crate::ops::testing::rand_vec_f32;
use half::f16;

/// How the input is generated.
#[derive(Clone, Copy)]
enum Input {
    Random,
    /// Few distinct values, so most windows hold ties.
    Ties,
    /// Random with NaNs and -inf mixed in.
    Special,
}

fn input(len: usize, seed: u64, kind: Input) -> Vec<f32> {
    let mut v = rand_vec_f32(len, seed);
    match kind {
        Input::Random => {}
        Input::Ties => v.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
        Input::Special => {
            for i in (0..len).step_by(11) {
                v[i] = f32::NAN;
            }
            for i in (5..len).step_by(7) {
                v[i] = f32::NEG_INFINITY;
            }
        }
    }
    v
}

fn check<T: DeviceFloat>(gpu: &Gpu, x_shape: [usize; 4], k: usize, s: usize, kind: Input, seed: u64) {
    let what = format!("max_pool2d {} {x_shape:?} k{k} s{s}", T::SUFFIX);
    let [_, _, h, w] = x_shape;
    let x_len: usize = x_shape.iter().product();
    let out = out_shape(x_shape, k, s).unwrap();
    let len: usize = out.iter().product();
    let x = rounded::<T>(&input(x_len, seed, kind));
    let g = Geometry { h, w, kernel: k, stride: s };
    let mut y_cpu = vec![0f32; len];
    let mut idx_cpu = vec![0u32; len];
    cpu::forward(&x, g, &mut y_cpu, &mut idx_cpu);

    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, len);
    let mut idxd = gpu.stream().clone_htod(&vec![u32::MAX; len]).unwrap();
    assert_eq!(forward(gpu, &xd, x_shape, k, s, &mut yd, &mut idxd).unwrap(), out);
    let idx: Vec<u32> = gpu.stream().clone_dtoh(&idxd).unwrap();
    assert_eq!(idx, idx_cpu, "{what}: indices");
    for (i, (a, b)) in download(gpu, &yd).iter().zip(&y_cpu).enumerate() {
        let same = if b.is_nan() { a.is_nan() } else { a == b };
        assert!(same, "{what}: y[{i}] = {a}, CPU gives {b}");
    }

    let dy = rounded::<T>(&rand_vec_f32(len, seed + 1));
    let mut dx_cpu = vec![0f32; x_len];
    cpu::backward(&dy, &idx_cpu, h * w, out[2] * out[3], &mut dx_cpu).unwrap();
    let dx_cpu = rounded::<T>(&dx_cpu);
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, x_len);
    backward(gpu, &dyd, &idxd, x_shape, k, s, &mut dxd).unwrap();
    assert_close(&format!("{what}: dx"), &download(gpu, &dxd), &dx_cpu, tol::<T>());
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    // MNIST's 2x2/2, odd sizes (a floor-mode remainder row and column).
    check::<T>(gpu, [3, 5, 7, 7], 2, 2, Input::Random, seed);
    check::<T>(gpu, [3, 5, 13, 11], 2, 2, Input::Ties, seed + 2);
    check::<T>(gpu, [2, 3, 9, 9], 2, 2, Input::Special, seed + 4);
    // Overlapping windows: one input can be chosen by several outputs.
    check::<T>(gpu, [3, 5, 13, 13], 3, 2, Input::Random, seed + 6);
    check::<T>(gpu, [3, 5, 7, 13], 3, 1, Input::Ties, seed + 8);
    check::<T>(gpu, [2, 3, 11, 9], 3, 1, Input::Special, seed + 10);
    // Gaps between windows (stride > kernel) and a single window.
    check::<T>(gpu, [1, 2, 13, 13], 2, 3, Input::Random, seed + 12);
    check::<T>(gpu, [2, 2, 5, 5], 5, 1, Input::Ties, seed + 14);
}

#[test]
fn max_pool2d_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("max_pool2d_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 100);
}

#[test]
fn max_pool2d_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("max_pool2d_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 200);
}

#[test]
fn max_pool2d_refuses_bad_geometry_and_buffers() {
    let e = out_shape([1, 1, 4, 4], 5, 1).unwrap_err().to_string();
    assert!(e.contains("kernel_size 5 is larger than the 4x4 input"), "{e}");
    let e = out_shape([1, 1, 4, 4], 2, 0).unwrap_err().to_string();
    assert!(e.contains("kernel_size and stride must be positive"), "{e}");
    assert_eq!(out_shape([3, 5, 7, 7], 2, 2).unwrap(), [3, 5, 3, 3]);
    let Some(gpu) = crate::cuda::test_gpu("max_pool2d_refuses_bad_geometry_and_buffers") else { return };
    let x = upload::<f32>(&gpu, &[0.0; 3 * 5 * 7 * 7]);
    let mut y = poisoned::<f32>(&gpu, 3 * 5 * 9);
    let mut idx = gpu.stream().alloc_zeros::<u32>(3 * 5 * 8).unwrap();
    let e = forward(&gpu, &x, [3, 5, 7, 7], 2, 2, &mut y, &mut idx).unwrap_err().to_string();
    assert!(e.contains("max_pool2d forward: indices holds 120 elements, expected 135"), "{e}");
    let mut dx = poisoned::<f32>(&gpu, 10);
    let e = backward(&gpu, &y, &idx, [3, 5, 7, 7], 2, 2, &mut dx).unwrap_err().to_string();
    assert!(e.contains("max_pool2d backward: indices holds 120 elements, expected 135"), "{e}");
}
