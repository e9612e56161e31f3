//! Dropout on the CPU: the mask's statistics, its independence of chunking,
//! p = 0 and p = 1, f16 against widened f32, and backward against f64
//! finite differences.

use half::f16;

use super::{apply_, cpu, Mask};
use crate::ops::testing::rand_vec_f32;
use crate::rng::{Draws, MicroBatch};
use crate::tensor::{DType, Tensor};

fn mask(p: f64, node: usize) -> Mask {
    let d = Draws { seed: 42, rank: 0, at: MicroBatch { epoch: 1, index: 3 } };
    Mask::new(p, d.node(node))
}

#[test]
fn threshold_and_scale_follow_p() {
    let m = mask(0.5, 0);
    assert_eq!(m.threshold, 1 << 31);
    assert_eq!(m.scale, 2.0);
    assert_eq!(mask(0.0, 0).threshold, 0);
    assert_eq!(mask(0.0, 0).scale, 1.0);
    let all = mask(1.0, 0);
    assert_eq!((all.threshold, all.scale), (1 << 32, 0.0));
    assert_eq!(mask(0.1, 0).scale, (1.0f64 / 0.9) as f32);
}

#[test]
fn kept_fraction_is_one_minus_p_and_the_mean_is_preserved() {
    let n = 1 << 20;
    for (p, node) in [(0.1, 0), (0.5, 1), (0.9, 2)] {
        let m = mask(p, node);
        let kept = m.bits(n).iter().filter(|&&b| b).count() as f64 / n as f64;
        // Binomial standard deviation sqrt(p(1-p)/n) < 5e-4: 6 sigma.
        assert!((kept - (1.0 - p)).abs() < 3e-3, "p={p}: kept {kept}");
        let mut v = vec![1.0f32; n];
        cpu::apply_par(&m, &mut v);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 3e-3 * (1.0 / (1.0 - p)), "p={p}: mean {mean}");
        for (&y, &b) in v.iter().zip(&m.bits(n)) {
            assert_eq!(y, if b { m.scale } else { 0.0 });
        }
    }
}

#[test]
fn masks_differ_between_nodes_and_micro_batches() {
    let n = 4096;
    let a = mask(0.5, 0).bits(n);
    let b = mask(0.5, 1).bits(n);
    let d = Draws { seed: 42, rank: 0, at: MicroBatch { epoch: 1, index: 4 } };
    let c = Mask::new(0.5, d.node(0)).bits(n);
    let same = |x: &[bool], y: &[bool]| x.iter().zip(y).filter(|(a, b)| a == b).count();
    // Independent masks agree on about half the elements.
    assert!(same(&a, &b) < n * 6 / 10 && same(&a, &c) < n * 6 / 10);
}

#[test]
fn the_mask_does_not_depend_on_chunking_or_threads() {
    let n = (1 << 16) + 7;
    let m = mask(0.3, 5);
    let x = rand_vec_f32(n, 1);
    let mut whole = x.clone();
    cpu::apply(&m, &mut whole, 0);
    let mut par = x.clone();
    cpu::apply_par(&m, &mut par);
    assert_eq!(whole, par);
    // Odd chunk boundaries (mid-group) give the same values.
    let mut pieces = x.clone();
    let mut at = 0;
    for len in [1usize, 2, 5, 13, 4097].iter().cycle() {
        if at >= n {
            break;
        }
        let end = (at + len).min(n);
        cpu::apply(&m, &mut pieces[at..end], at as u64);
        at = end;
    }
    assert_eq!(whole, pieces);
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut t = Tensor::from_vec(&[n], x.clone()).unwrap();
        pool.install(|| apply_(&mut t, &m)).unwrap();
        assert_eq!(t.to_f32_vec(), whole, "{threads} threads");
    }
}

#[test]
fn p_zero_is_the_identity_and_p_one_is_zeros() {
    let x = rand_vec_f32(1001, 2);
    let mut t = Tensor::from_vec(&[7, 11, 13], x.clone()).unwrap();
    apply_(&mut t, &mask(0.0, 0)).unwrap();
    assert_eq!(t.to_f32_vec(), x);
    let mut t = Tensor::from_vec(&[1001], x).unwrap();
    apply_(&mut t, &mask(1.0, 0)).unwrap();
    assert!(t.to_f32_vec().iter().all(|&v| v == 0.0));
}

#[test]
fn non_finite_inputs_stay_non_finite_where_dropped() {
    // x * 0 as PyTorch's src * mask * scale: amp still sees the overflow.
    let m = mask(0.5, 0);
    let bits = m.bits(64);
    let mut v = vec![f32::INFINITY; 64];
    cpu::apply(&m, &mut v, 0);
    for (y, b) in v.iter().zip(bits) {
        assert!(if b { *y == f32::INFINITY } else { y.is_nan() }, "{y} kept={b}");
    }
}

#[test]
fn f16_is_the_f32_result_rounded_once() {
    let n = 3 * 4096 + 5;
    let m = mask(0.25, 3);
    let x16: Vec<f16> = rand_vec_f32(n, 3).iter().map(|&v| f16::from_f32(v * 100.0)).collect();
    let mut t = Tensor::from_f16_vec(&[n], x16.clone()).unwrap();
    apply_(&mut t, &m).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    let mut wide: Vec<f32> = x16.iter().map(|v| v.to_f32()).collect();
    cpu::apply(&m, &mut wide, 0);
    let want: Vec<f16> = wide.iter().map(|&v| f16::from_f32(v)).collect();
    assert_eq!(t.as_f16().unwrap(), want.as_slice());
}

#[test]
fn backward_matches_f64_finite_differences() {
    // L = sum(w * dropout(x)); dL/dx = w * mask / (1 - p), the backward's
    // own formula applied to dy = w.
    let n = 257;
    let m = mask(0.4, 9);
    let x: Vec<f64> = rand_vec_f32(n, 4).iter().map(|&v| v as f64).collect();
    let w: Vec<f64> = rand_vec_f32(n, 5).iter().map(|&v| v as f64).collect();
    let loss = |x: &[f64]| {
        let mut y = x.to_vec();
        cpu::apply(&m, &mut y, 0);
        y.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>()
    };
    let mut dx = w.clone();
    cpu::apply(&m, &mut dx, 0);
    let h = 1e-6;
    for i in 0..n {
        let (mut hi, mut lo) = (x.clone(), x.clone());
        hi[i] += h;
        lo[i] -= h;
        let fd = (loss(&hi) - loss(&lo)) / (2.0 * h);
        assert!((fd - dx[i]).abs() < 1e-6 * (1.0 + dx[i].abs()), "[{i}]: fd {fd}, backward {}", dx[i]);
    }
}
