//! GPU parity: kernels/dropout.cu against the CPU twins. Philox's words
//! must be identical (and Random123's known answers on the device too), and
//! dropout's mask and products identical bit for bit in both dtypes, at
//! lengths that end mid-group and beyond one grid.

use super::{apply, apply_, philox};
use crate::cuda::testing::{download, poisoned, rounded, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::{launch_1d, Gpu, BLOCK};
use crate::ops::dropout::{cpu, Mask};
use crate::ops::testing::rand_vec_f32;
use crate::rng::{philox4x32_10, Draws, MicroBatch};
use half::f16;

#[test]
fn philox_on_the_device_is_the_cpus() {
    let Some(gpu) = crate::cuda::test_gpu("philox_on_the_device_is_the_cpus") else { return };
    let mut cases: Vec<([u32; 4], [u32; 2])> = vec![
        ([0; 4], [0; 2]),
        ([u32::MAX; 4], [u32::MAX; 2]),
        ([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
    ];
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (s >> 32) as u32
    };
    let key = [next(), next()];
    for _ in 0..1000 {
        cases.push(([next(), next(), next(), next()], key));
    }
    // One key per launch: the KAT vectors first, then the random counters.
    for (range, key) in [(0..1, cases[0].1), (1..2, cases[1].1), (2..3, cases[2].1), (3..cases.len(), key)] {
        let ctr: Vec<u32> = cases[range.clone()].iter().flat_map(|c| c.0).collect();
        let want: Vec<u32> = cases[range].iter().flat_map(|c| philox4x32_10(c.0, key)).collect();
        let cd = gpu.stream().clone_htod(&ctr).unwrap();
        let mut od = gpu.stream().alloc_zeros::<u32>(ctr.len()).unwrap();
        philox(&gpu, &cd, key, &mut od).unwrap();
        let got: Vec<u32> = gpu.stream().clone_dtoh(&od).unwrap();
        assert_eq!(got, want, "key {key:08x?}");
    }
    // Random123's first known answer, computed on the device.
    let cd = gpu.stream().clone_htod(&[0u32; 4]).unwrap();
    let mut od = gpu.stream().alloc_zeros::<u32>(4).unwrap();
    philox(&gpu, &cd, [0, 0], &mut od).unwrap();
    let got: Vec<u32> = gpu.stream().clone_dtoh(&od).unwrap();
    assert_eq!(got, [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
}

fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = if w.is_nan() { g.is_nan() } else { g.to_bits() == w.to_bits() };
        assert!(same, "{what}[{i}]: got {g:e}, CPU gives {w:e}");
    }
}

fn check<T: DeviceFloat>(gpu: &Gpu, n: usize, p: f64, seed: u64) {
    let d = Draws { seed, rank: 1, at: MicroBatch { epoch: 3, index: seed } };
    let m = Mask::new(p, d.node(seed as usize));
    let mut xs = rand_vec_f32(n, seed);
    for (i, s) in [f32::INFINITY, f32::NAN, -0.0, 1e-40].iter().enumerate() {
        if i < n {
            xs[(i * 31) % n] = *s;
        }
    }
    let x = rounded::<T>(&xs);
    // The f16 kernel widens, multiplies in f32 and rounds once: the CPU
    // twin does the same (ops::dropout::apply_f16).
    let mut want = x.clone();
    cpu::apply(&m, &mut want, 0);
    let want = rounded::<T>(&want);
    let what = format!("dropout {} n={n} p={p}", T::SUFFIX);

    let xd = upload::<T>(gpu, &x);
    let mut yd = poisoned::<T>(gpu, n);
    apply(gpu, &m, &xd, &mut yd).unwrap();
    assert_identical(&what, &download(gpu, &yd), &want);

    let mut vd = upload::<T>(gpu, &x);
    apply_(gpu, &m, &mut vd).unwrap();
    assert_identical(&format!("{what} in place"), &download(gpu, &vd), &want);
}

#[test]
fn dropout_matches_cpu_f32_at_every_length_to_64() {
    let Some(gpu) = crate::cuda::test_gpu("dropout_matches_cpu_f32_at_every_length_to_64") else { return };
    for n in 1..=64 {
        check::<f32>(&gpu, n, 0.5, n as u64);
    }
    for p in [0.0, 0.1, 0.9, 1.0] {
        check::<f32>(&gpu, 3 * 5 * 7 * 13, p, 7);
    }
}

#[test]
fn dropout_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("dropout_matches_cpu_f16") else { return };
    for n in [1, 2, 3, 5, 63, 3 * 5 * 7 * 13] {
        check::<f16>(&gpu, n, 0.3, n as u64);
    }
}

#[test]
fn dropout_covers_more_groups_than_one_grid() {
    let Some(gpu) = crate::cuda::test_gpu("dropout_covers_more_groups_than_one_grid") else { return };
    // More groups of four than the capped grid has threads: a second lap.
    let n = 4 * (launch_1d(usize::MAX).grid_dim.0 as usize * BLOCK as usize) + 1003;
    check::<f32>(&gpu, n, 0.5, 11);
}

#[test]
fn dropout_refuses_mismatched_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("dropout_refuses_mismatched_buffers") else { return };
    let m = Mask::new(0.5, Draws::default().node(0));
    let x = upload::<f32>(&gpu, &[1.0; 10]);
    let mut y = poisoned::<f32>(&gpu, 9);
    let e = apply(&gpu, &m, &x, &mut y).unwrap_err().to_string();
    assert!(e.contains("dropout: y holds 9 elements, expected 10"), "{e}");
}
