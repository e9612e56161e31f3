//! The fused BN + ReLU + MaxPool2d(2, 2) against the three ops run one by
//! one (Tensor level, f32) and against f64 finite differences.

use super::*;
use crate::ops::testing::{check_grad, cpu_ms, dot, rand_vec, rand_vec_f32};
use crate::ops::{max_pool2d, relu};

struct Case {
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    rm: Tensor,
    rv: Tensor,
}

fn case(n: usize, c: usize, h: usize, w: usize) -> Case {
    let len = n * c * h * w;
    // Offsets per element so some windows are all-negative after BN.
    let x: Vec<f32> =
        rand_vec_f32(len, 11).iter().enumerate().map(|(i, v)| v * 3.0 + (i % 5) as f32 - 2.0).collect();
    let weight: Vec<f32> = rand_vec_f32(c, 12).iter().map(|v| v + 1.2).collect();
    Case {
        x: Tensor::from_vec(&[n, c, h, w], x).unwrap(),
        weight: Tensor::from_vec(&[c], weight).unwrap(),
        bias: Tensor::from_vec(&[c], rand_vec_f32(c, 13)).unwrap(),
        rm: Tensor::from_vec(&[c], rand_vec_f32(c, 14)).unwrap(),
        rv: Tensor::full(&[c], 0.7),
    }
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: fused {g}, unfused {w}");
    }
}

#[test]
fn fused_matches_the_three_ops_forward_and_backward() {
    let (n, c, h, w) = (4, 3, 6, 10);
    let (momentum, eps) = (0.1f32, 1e-5f32);
    let k = case(n, c, h, w);

    // Unfused.
    let (mut rm_u, mut rv_u) = (k.rm.clone(), k.rv.clone());
    let (z, bn_saved) = forward_train(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm_u, running_var: &mut rv_u },
        BnHyper { momentum, eps },
    )
    .unwrap();
    let mut r = z;
    relu::forward_(&mut r).unwrap();
    let (y_u, idx) = max_pool2d::forward(&r, 2, 2).unwrap();
    let dy_data = rand_vec_f32(y_u.numel(), 15);
    let dy = Tensor::from_vec(y_u.shape(), dy_data).unwrap();
    let mut dr = max_pool2d::backward(&dy, &idx, r.shape()).unwrap();
    relu::backward_(&r, &mut dr).unwrap();
    let (mut dw_u, mut db_u) = (Tensor::full(&[c], 0.5), Tensor::full(&[c], -0.25));
    let dx_u =
        backward(&k.x, &k.weight, &bn_saved, &dr, BnGrads { dweight: &mut dw_u, dbias: &mut db_u }).unwrap();

    // Fused.
    let (mut rm_f, mut rv_f) = (k.rm.clone(), k.rv.clone());
    let (y_f, saved) = forward_train_relu_maxpool2(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm_f, running_var: &mut rv_f },
        BnHyper { momentum, eps },
    )
    .unwrap();
    assert_eq!(y_f.shape(), &[n, c, h / 2, w / 2]);
    assert_eq!(y_f.as_f32().unwrap(), y_u.as_f32().unwrap(), "pooled values must be identical");
    assert_eq!(rm_f.as_f32().unwrap(), rm_u.as_f32().unwrap());
    assert_eq!(rv_f.as_f32().unwrap(), rv_u.as_f32().unwrap());
    assert_eq!(saved.stats, bn_saved);
    let killed = saved.codes.iter().filter(|&&c| c == fused_cpu::KILLED).count();
    assert!(killed > 0 && killed < saved.codes.len(), "the case must mix live and killed windows ({killed})");

    let (mut dw_f, mut db_f) = (Tensor::full(&[c], 0.5), Tensor::full(&[c], -0.25));
    let dx_f = backward_relu_maxpool2(
        k.x.clone(),
        &k.weight,
        &saved,
        &dy,
        BnGrads { dweight: &mut dw_f, dbias: &mut db_f },
    )
    .unwrap();
    close("dx", dx_f.as_f32().unwrap(), dx_u.as_f32().unwrap(), 1e-5);
    close("dweight", dw_f.as_f32().unwrap(), dw_u.as_f32().unwrap(), 1e-5);
    close("dbias", db_f.as_f32().unwrap(), db_u.as_f32().unwrap(), 1e-5);
}

#[test]
fn large_batch_takes_the_parallel_paths_and_still_matches() {
    // 2 * 16 * 32 * 32 = 32768 elements: at the rayon threshold.
    let (n, c, h, w) = (2, 16, 32, 32);
    let k = case(n, c, h, w);
    let (mut rm, mut rv) = (k.rm.clone(), k.rv.clone());
    let (z, bn_saved) = forward_train(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let mut r = z;
    relu::forward_(&mut r).unwrap();
    let (y_u, idx) = max_pool2d::forward(&r, 2, 2).unwrap();
    let (y_f, saved) = forward_train_relu_maxpool2(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut k.rm.clone(), running_var: &mut k.rv.clone() },
        BnHyper::default(),
    )
    .unwrap();
    assert_eq!(y_f.as_f32().unwrap(), y_u.as_f32().unwrap());
    let dy = Tensor::from_vec(y_u.shape(), rand_vec_f32(y_u.numel(), 16)).unwrap();
    let mut dr = max_pool2d::backward(&dy, &idx, r.shape()).unwrap();
    relu::backward_(&r, &mut dr).unwrap();
    let (mut dw_u, mut db_u) = (Tensor::zeros(&[c]), Tensor::zeros(&[c]));
    let dx_u =
        backward(&k.x, &k.weight, &bn_saved, &dr, BnGrads { dweight: &mut dw_u, dbias: &mut db_u }).unwrap();
    let (mut dw_f, mut db_f) = (Tensor::zeros(&[c]), Tensor::zeros(&[c]));
    let dx_f = backward_relu_maxpool2(
        k.x.clone(),
        &k.weight,
        &saved,
        &dy,
        BnGrads { dweight: &mut dw_f, dbias: &mut db_f },
    )
    .unwrap();
    close("dx", dx_f.as_f32().unwrap(), dx_u.as_f32().unwrap(), 1e-5);
    close("dweight", dw_f.as_f32().unwrap(), dw_u.as_f32().unwrap(), 1e-4);
    close("dbias", db_f.as_f32().unwrap(), db_u.as_f32().unwrap(), 1e-4);
}

/// The fused training forward from the f64 kernels, projected on `r`.
fn objective(x: &[f64], wt: &[f64], b: &[f64], r: &[f64], dims: (usize, usize, usize, usize)) -> f64 {
    let (n, c, h, w) = dims;
    let s = cpu::local_sums(x, n, c, h * w);
    let st = cpu::batch_stats::<f64>(&s.sum, &s.sumsq, s.count, 1e-5);
    let (scale, shift) = cpu::affine_coefficients(c, &st.mean, &st.invstd, wt, b);
    let mut y = vec![0.0; r.len()];
    let mut codes = vec![0u8; r.len()];
    fused_cpu::forward(x, c, h, w, &scale, &shift, &mut y, &mut codes);
    dot(r, &y)
}

#[test]
fn fused_backward_matches_finite_differences() {
    let dims @ (n, c, h, w) = (3, 2, 4, 6);
    let x = rand_vec(n * c * h * w, 21);
    let wt: Vec<f64> = rand_vec(c, 22).iter().map(|v| v + 1.5).collect();
    let b = rand_vec(c, 23);
    let r = rand_vec(n * c * (h / 2) * (w / 2), 24);

    let s = cpu::local_sums(&x, n, c, h * w);
    let st = cpu::batch_stats::<f64>(&s.sum, &s.sumsq, s.count, 1e-5);
    let (scale, shift) = cpu::affine_coefficients(c, &st.mean, &st.invstd, &wt, &b);
    let mut y = vec![0.0; r.len()];
    let mut codes = vec![0u8; r.len()];
    fused_cpu::forward(&x, c, h, w, &scale, &shift, &mut y, &mut codes);
    let sums = fused_cpu::backward_sums(&x, &r, &codes, n, c, h, w, &st.mean, &st.invstd);
    let mut dx = x.clone();
    fused_cpu::backward_dx(&mut dx, &r, &codes, c, h, w, &st.mean, &st.invstd, &wt, &sums, n * h * w);

    check_grad("bn_relu_pool dx", &x, &dx, |xp| objective(xp, &wt, &b, &r, dims), 1e-5);
    check_grad("bn_relu_pool dweight", &wt, &sums.sum_dy_xhat, |wp| objective(&x, wp, &b, &r, dims), 1e-5);
    check_grad("bn_relu_pool dbias", &b, &sums.sum_dy, |bp| objective(&x, &wt, bp, &r, dims), 1e-5);
}

#[test]
fn killed_windows_output_zero_and_pass_no_gradient() {
    // One channel; BN maps the first window to the lowest values.
    let x = Tensor::from_vec(&[1, 1, 2, 4], vec![-3.0, -2.0, 1.0, 2.0, -3.0, -2.5, 3.0, 0.5]).unwrap();
    let (wt, b) = (Tensor::full(&[1], 1.0), Tensor::zeros(&[1]));
    let (mut rm, mut rv) = (Tensor::zeros(&[1]), Tensor::full(&[1], 1.0));
    let (y, saved) = forward_train_relu_maxpool2(
        &x,
        BnParams { weight: &wt, bias: &b },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let yv = y.as_f32().unwrap();
    assert_eq!(yv[0], 0.0);
    assert!(yv[1] > 0.0);
    assert_eq!(saved.codes, vec![fused_cpu::KILLED, 2]);
    let xs: Vec<f64> = x.as_f32().unwrap().iter().map(|&v| v as f64).collect();
    let st = &saved.stats;
    let sums = fused_cpu::backward_sums(
        &xs,
        &[5.0, 7.0],
        &saved.codes,
        1,
        1,
        2,
        4,
        &[st.mean[0] as f64],
        &[st.invstd[0] as f64],
    );
    // Only the live window's gradient (7) reaches BN.
    assert_eq!(sums.sum_dy, vec![7.0]);
}

fn err_msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn fused_errors_name_the_problem() {
    let k = case(2, 3, 5, 4);
    let (mut rm, mut rv) = (k.rm.clone(), k.rv.clone());
    let msg = err_msg(forward_train_relu_maxpool2(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    ));
    assert!(msg.contains("even H and W") && msg.contains("[2, 3, 5, 4]"), "{msg}");

    let k = case(2, 3, 4, 4);
    let (_, saved) = forward_train_relu_maxpool2(
        &k.x,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let bad_dy = Tensor::zeros(&[2, 3, 4, 4]);
    let (mut dw, mut db) = (Tensor::zeros(&[3]), Tensor::zeros(&[3]));
    let msg = err_msg(backward_relu_maxpool2(
        k.x.clone(),
        &k.weight,
        &saved,
        &bad_dy,
        BnGrads { dweight: &mut dw, dbias: &mut db },
    ));
    assert!(msg.contains("dy (must be x pooled 2x2)"), "{msg}");

    let other = case(2, 3, 8, 4);
    let dy = Tensor::zeros(&[2, 3, 4, 2]);
    let msg = err_msg(backward_relu_maxpool2(
        other.x.clone(),
        &k.weight,
        &saved,
        &dy,
        BnGrads { dweight: &mut dw, dbias: &mut db },
    ));
    assert!(msg.contains("saved state") && msg.contains("does not fit"), "{msg}");

    let one = Tensor::zeros(&[1, 3, 0, 2]);
    let msg = err_msg(forward_train_relu_maxpool2(
        &one,
        BnParams { weight: &k.weight, bias: &k.bias },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    ));
    assert!(msg.contains("more than 1 value per channel"), "{msg}");
}

/// CPU time of the MNIST ConvNet's two fused BatchNorm blocks at batch 100
/// (not an assertion: run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn fused_timing_mnist_batch100() {
    for (c, hw) in [(16, 28), (32, 14)] {
        let n = 100;
        let k = case(n, c, hw, hw);
        let dy = Tensor::from_vec(&[n, c, hw / 2, hw / 2], rand_vec_f32(n * c * hw * hw / 4, 17)).unwrap();
        let (iters, mut tf, mut tb, mut sf, mut sb) = (30, f64::MAX, f64::MAX, 0.0, 0.0);
        for i in 0..iters + 3 {
            let (mut rm, mut rv) = (k.rm.clone(), k.rv.clone());
            let x = k.x.clone();
            let (mut dw, mut db) = (Tensor::zeros(&[c]), Tensor::zeros(&[c]));
            let t0 = cpu_ms();
            let (y, saved) = forward_train_relu_maxpool2(
                &x,
                BnParams { weight: &k.weight, bias: &k.bias },
                RunningStats { running_mean: &mut rm, running_var: &mut rv },
                BnHyper::default(),
            )
            .unwrap();
            let t1 = cpu_ms();
            let dx = backward_relu_maxpool2(
                x,
                &k.weight,
                &saved,
                &dy,
                BnGrads { dweight: &mut dw, dbias: &mut db },
            )
            .unwrap();
            let t2 = cpu_ms();
            std::hint::black_box((y, dx));
            if i >= 3 {
                let (f, b) = (t1 - t0, t2 - t1);
                (tf, tb, sf, sb) = (tf.min(f), tb.min(b), sf + f, sb + b);
            }
        }
        let it = iters as f64;
        println!(
            "bn+relu+pool {c}x{hw}x{hw} (threads {}): CPU time forward {:.2} ms (min {tf:.2}), backward {:.2} ms (min {tb:.2})",
            rayon::current_num_threads(),
            sf / it,
            sb / it
        );
    }
}
