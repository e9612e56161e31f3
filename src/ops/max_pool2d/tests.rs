use super::cpu::{self, Geometry};
use super::*;
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};

/// Plain loops: the max of each window and the first position holding it.
fn naive(x: &[f32], planes: usize, h: usize, w: usize, k: usize, s: usize) -> (Vec<f32>, Vec<u32>) {
    let (oh, ow) = ((h - k) / s + 1, (w - k) / s + 1);
    let (mut y, mut idx) = (Vec::new(), Vec::new());
    for p in 0..planes {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = (f32::NEG_INFINITY, usize::MAX);
                for ky in 0..k {
                    for kx in 0..k {
                        let i = (oy * s + ky) * w + ox * s + kx;
                        if best.1 == usize::MAX || x[p * h * w + i] > best.0 {
                            best = (x[p * h * w + i], i);
                        }
                    }
                }
                y.push(best.0);
                idx.push(best.1 as u32);
            }
        }
    }
    (y, idx)
}

fn pool_f64(x: &[f64], g: Geometry, planes: usize) -> Vec<f64> {
    let (oh, ow) = g.out_hw();
    let mut y = vec![0.0; planes * oh * ow];
    let mut idx = vec![0u32; y.len()];
    cpu::forward(x, g, &mut y, &mut idx);
    y
}

#[test]
fn forward_matches_naive_for_various_geometries() {
    // (n, c, h, w, kernel, stride): the MNIST case, odd sizes, overlapping
    // windows, dropped edges, and one large enough for the threaded path.
    let cases = [
        (2, 3, 28, 28, 2, 2),
        (1, 2, 7, 9, 3, 2),
        (2, 1, 6, 5, 2, 1),
        (1, 3, 10, 11, 3, 3),
        (1, 1, 5, 4, 4, 1),
        (8, 4, 33, 31, 2, 2),
    ];
    for (seed, &(n, c, h, w, k, s)) in cases.iter().enumerate() {
        // Odd seeds quantize the values, so many windows hold tied maxima.
        let x: Vec<f32> = rand_vec_f32(n * c * h * w, seed as u64 + 1)
            .into_iter()
            .map(|v| if seed % 2 == 1 { (v * 2.0).round() } else { v })
            .collect();
        let (y, idx) = forward(&Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap(), k, s).unwrap();
        let (wy, widx) = naive(&x, n * c, h, w, k, s);
        assert_eq!(y.shape(), &[n, c, (h - k) / s + 1, (w - k) / s + 1], "case {:?}", (n, c, h, w, k, s));
        assert_eq!(y.as_f32().unwrap(), &wy[..], "values, case {:?}", (n, c, h, w, k, s));
        assert_eq!(idx, widx, "indices, case {:?}", (n, c, h, w, k, s));
    }
}

#[test]
fn ties_pick_the_first_and_nan_propagates() {
    let x = Tensor::from_vec(&[1, 1, 2, 4], vec![1.0, 3.0, 5.0, 5.0, 3.0, 0.0, 5.0, f32::NAN]).unwrap();
    let (y, idx) = forward(&x, 2, 2).unwrap();
    let y = y.as_f32().unwrap();
    assert_eq!((y[0], idx[0]), (3.0, 1), "first of the tied 3.0s");
    assert!(y[1].is_nan(), "NaN window gives NaN, got {}", y[1]);
    assert_eq!(idx[1], 7, "the NaN's position");
    for (k, s) in [(2, 2), (2, 1), (3, 1)] {
        let all_neg_inf = Tensor::full(&[1, 1, 3, 3], f32::NEG_INFINITY);
        let (y, idx) = forward(&all_neg_inf, k, s).unwrap();
        assert_eq!((y.as_f32().unwrap()[0], idx[0]), (f32::NEG_INFINITY, 0), "k {k} s {s}");
    }
    // Two NaNs in one window: PyTorch's scan takes every NaN, so the last wins;
    // checked on the 2x2 fast path and on the general path (k = 3).
    let nan2 = vec![f32::NAN, 1.0, 9.0, 2.0, f32::NAN, 0.0, 3.0, 4.0, 5.0];
    let x = Tensor::from_vec(&[1, 1, 3, 3], nan2).unwrap();
    for (k, s, want_idx) in [(2, 2, 4), (3, 1, 4), (2, 1, 4)] {
        let (y, idx) = forward(&x, k, s).unwrap();
        assert!(y.as_f32().unwrap()[0].is_nan(), "k {k} s {s}: NaN propagates");
        assert_eq!(idx[0], want_idx, "k {k} s {s}: the last NaN");
    }
    // Ties on the general path: the first of the equal maxima.
    let tie = Tensor::from_vec(&[1, 1, 3, 3], vec![0.0, 7.0, 1.0, 7.0, 2.0, 7.0, 0.0, 0.0, 0.0]).unwrap();
    let (_, idx) = forward(&tie, 3, 1).unwrap();
    assert_eq!(idx, vec![1]);
}

#[test]
fn backward_matches_finite_differences() {
    // Distinct random values, so no window has a tie the difference could flip.
    for (seed, (h, w, k, s)) in [(7, 8, 2, 2), (7, 6, 3, 2), (5, 5, 2, 1)].into_iter().enumerate() {
        let planes = 3;
        let g = Geometry { h, w, kernel: k, stride: s };
        let x = rand_vec(planes * h * w, 10 + seed as u64);
        let (oh, ow) = g.out_hw();
        let r = rand_vec(planes * oh * ow, 20 + seed as u64);
        let mut y = vec![0.0; r.len()];
        let mut idx = vec![0u32; r.len()];
        cpu::forward(&x, g, &mut y, &mut idx);
        let mut dx = vec![0.0; x.len()];
        cpu::backward(&r, &idx, h * w, oh * ow, &mut dx).unwrap();
        check_grad("max_pool2d dx", &x, &dx, |xp| dot(&r, &pool_f64(xp, g, planes)), 1e-6);
    }
}

#[test]
fn tensor_backward_scatters_and_adds_overlaps() {
    for (n, c, h, w, k, s) in [(2, 2, 6, 7, 3, 1), (8, 4, 32, 32, 2, 2)] {
        let x = rand_vec_f32(n * c * h * w, 30);
        let (y, idx) = forward(&Tensor::from_vec(&[n, c, h, w], x).unwrap(), k, s).unwrap();
        let dy = rand_vec_f32(y.numel(), 31);
        let dyt = Tensor::from_vec(y.shape(), dy.clone()).unwrap();
        let dx = backward(&dyt, &idx, &[n, c, h, w]).unwrap();
        let mut want = vec![0.0f32; n * c * h * w];
        let op = y.numel() / (n * c);
        for (j, (&g, &i)) in dy.iter().zip(&idx).enumerate() {
            want[(j / op) * h * w + i as usize] += g;
        }
        assert_eq!(dx.shape(), &[n, c, h, w]);
        assert_eq!(dx.as_f32().unwrap(), &want[..]);
    }
}

#[test]
fn errors_name_the_problem() {
    let x = Tensor::zeros(&[1, 2, 3, 5]);
    let m = forward(&x, 4, 1).unwrap_err().to_string();
    assert!(m.contains("max_pool2d forward: kernel_size 4 is larger than the 3x5 input (H x W)"), "{m}");
    let m = forward(&x, 0, 1).unwrap_err().to_string();
    assert!(m.contains("kernel_size and stride must be positive, got kernel_size 0, stride 1"), "{m}");
    let m = forward(&x, 2, 0).unwrap_err().to_string();
    assert!(m.contains("got kernel_size 2, stride 0"), "{m}");
    let m = forward(&Tensor::zeros(&[2, 3, 5]), 2, 2).unwrap_err().to_string();
    assert!(m.contains("expected a 4-D [N, C, H, W] input, got shape [2, 3, 5]"), "{m}");

    let dy = Tensor::zeros(&[1, 2, 1, 2]);
    let m = backward(&dy, &[0, 1, 2], &[1, 2, 3, 5]).unwrap_err().to_string();
    assert!(m.contains("max_pool2d backward: 3 indices for a dy of 4 elements (shape [1, 2, 1, 2])"), "{m}");
    let m = backward(&dy, &[0, 1, 2, 15], &[1, 2, 3, 5]).unwrap_err().to_string();
    assert!(m.contains("index 15 is outside the 3x5 input plane"), "{m}");
    let m = backward(&dy, &[0, 1, 2, 3], &[1, 3, 3, 5]).unwrap_err().to_string();
    assert!(m.contains("dy of shape [1, 2, 1, 2] cannot come from an input of shape [1, 3, 3, 5]"), "{m}");
}
