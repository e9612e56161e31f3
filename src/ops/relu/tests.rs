use super::cpu;
use super::*;
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};

fn relu_f64(x: &[f64]) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    cpu::forward(x, &mut y);
    y
}

#[test]
fn forward_matches_naive_small_and_threaded() {
    for (len, seed) in [(37usize, 1u64), (100_003, 2)] {
        let mut x = rand_vec_f32(len, seed);
        x[3] = f32::NAN;
        x[5] = 0.0;
        let xt = Tensor::from_vec(&[len], x.clone()).unwrap();
        let y = forward(&xt).unwrap();
        let got = y.as_f32().unwrap();
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            let want = if v.is_nan() { v } else { v.max(0.0) };
            assert!(g == want || (g.is_nan() && want.is_nan()), "y[{i}] = {g}, want {want} (x = {v})");
        }
        let mut xi = xt.clone();
        forward_(&mut xi).unwrap();
        let same = xi.as_f32().unwrap().iter().zip(got).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
        assert!(same, "forward_ differs from forward at len {len}");
    }
}

#[test]
fn backward_matches_finite_differences() {
    // Keep inputs away from the kink at 0, where the derivative is undefined.
    let x: Vec<f64> =
        rand_vec(200, 3).into_iter().map(|v| if v.abs() < 1e-3 { v + 0.01 } else { v }).collect();
    let r = rand_vec(200, 4);
    let y = relu_f64(&x);
    let mut dx = vec![0.0; x.len()];
    cpu::backward(&y, &r, &mut dx);
    check_grad("relu dx", &x, &dx, |xp| dot(&r, &relu_f64(xp)), 1e-6);
}

#[test]
fn tensor_backward_masks_on_output_and_inplace_agrees() {
    for (len, seed) in [(41usize, 5u64), (70_001, 6)] {
        let mut x = rand_vec_f32(len, seed);
        x[0] = 0.0;
        let dy = rand_vec_f32(len, seed + 100);
        let y = forward(&Tensor::from_vec(&[len], x.clone()).unwrap()).unwrap();
        let dyt = Tensor::from_vec(&[len], dy.clone()).unwrap();
        let dx = backward(&y, &dyt).unwrap();
        for (i, &g) in dx.as_f32().unwrap().iter().enumerate() {
            let want = if x[i] > 0.0 { dy[i] } else { 0.0 };
            assert_eq!(g, want, "dx[{i}] (x = {})", x[i]);
        }
        let mut dyi = dyt.clone();
        backward_(&y, &mut dyi).unwrap();
        assert_eq!(dyi.as_f32().unwrap(), dx.as_f32().unwrap(), "backward_ differs at len {len}");
    }
}

#[test]
fn shape_mismatch_is_an_error() {
    let y = Tensor::zeros(&[2, 3]);
    let m = backward(&y, &Tensor::zeros(&[3, 2])).unwrap_err().to_string();
    assert!(m.contains("relu backward: dy (must match y): expected shape [2, 3], got [3, 2]"), "{m}");
    let mut dy = Tensor::zeros(&[6]);
    let m = backward_(&y, &mut dy).unwrap_err().to_string();
    assert!(m.contains("relu backward_: dy (must match y): expected shape [2, 3], got [6]"), "{m}");
}
