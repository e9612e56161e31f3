use super::cpu;
use super::*;
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};

/// Straightforward two-pass reference: per channel mean, biased and unbiased
/// variance, in f64.
fn naive_stats(x: &[f64], n: usize, c: usize, hw: usize) -> Vec<(f64, f64, f64)> {
    (0..c)
        .map(|ch| {
            let vals: Vec<f64> = (0..n).flat_map(|i| x[(i * c + ch) * hw..][..hw].to_vec()).collect();
            let m = vals.len() as f64;
            let mean = vals.iter().sum::<f64>() / m;
            let ss: f64 = vals.iter().map(|v| (v - mean) * (v - mean)).sum();
            (mean, ss / m, ss / (m - 1.0))
        })
        .collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&a| a as f64).collect()
}

/// The training forward composed from the f64 kernels, as the finite
/// differences see it.
fn train_forward_f64(x: &[f64], w: &[f64], b: &[f64], n: usize, c: usize, hw: usize, eps: f64) -> Vec<f64> {
    let sums = cpu::local_sums(x, n, c, hw);
    let st = cpu::batch_stats::<f64>(&sums.sum, &sums.sumsq, sums.count, eps);
    let mut out = vec![0.0; x.len()];
    cpu::normalize_affine(x, c, hw, &st.mean, &st.invstd, w, b, &mut out);
    out
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: got {g}, want {w}");
    }
}

#[test]
fn forward_train_matches_naive_and_updates_running_stats() {
    let (n, c, h, w) = (3, 5, 7, 9); // hw = 63: exercises the lane remainder
    let hw = h * w;
    let x: Vec<f32> =
        rand_vec_f32(n * c * hw, 1).iter().enumerate().map(|(i, v)| v * 2.0 + (i % 3) as f32).collect();
    let wt = rand_vec_f32(c, 2);
    let bs = rand_vec_f32(c, 3);
    let rm0 = rand_vec_f32(c, 4);
    let rv0: Vec<f32> = rand_vec_f32(c, 5).iter().map(|v| v.abs() + 0.5).collect();
    let (momentum, eps) = (0.1f32, 1e-5f32);

    let xt = Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap();
    let mut rm = Tensor::from_vec(&[c], rm0.clone()).unwrap();
    let mut rv = Tensor::from_vec(&[c], rv0.clone()).unwrap();
    let (y, saved) = forward_train(
        &xt,
        BnParams {
            weight: &Tensor::from_vec(&[c], wt.clone()).unwrap(),
            bias: &Tensor::from_vec(&[c], bs.clone()).unwrap(),
        },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper { momentum, eps },
    )
    .unwrap();
    assert_eq!(y.shape(), &[n, c, h, w]);

    let xd = f64s(&x);
    let st = naive_stats(&xd, n, c, hw);
    let mut want_y = vec![0.0; x.len()];
    for i in 0..n {
        for ch in 0..c {
            let (mean, var, _) = st[ch];
            for k in 0..hw {
                let idx = (i * c + ch) * hw + k;
                want_y[idx] = (xd[idx] - mean) / (var + eps as f64).sqrt() * wt[ch] as f64 + bs[ch] as f64;
            }
        }
    }
    assert_close("y", y.as_f32().unwrap(), &want_y, 1e-5);
    let m = momentum as f64;
    let want_rm: Vec<f64> = (0..c).map(|ch| (1.0 - m) * rm0[ch] as f64 + m * st[ch].0).collect();
    let want_rv: Vec<f64> = (0..c).map(|ch| (1.0 - m) * rv0[ch] as f64 + m * st[ch].2).collect();
    assert_close("running_mean", rm.as_f32().unwrap(), &want_rm, 1e-6);
    assert_close("running_var", rv.as_f32().unwrap(), &want_rv, 1e-6);
    let want_mean: Vec<f64> = st.iter().map(|s| s.0).collect();
    let want_invstd: Vec<f64> = st.iter().map(|s| 1.0 / (s.1 + eps as f64).sqrt()).collect();
    assert_close("saved.mean", &saved.mean, &want_mean, 1e-6);
    assert_close("saved.invstd", &saved.invstd, &want_invstd, 1e-6);
}

#[test]
fn large_offset_channels_keep_f32_accurate_statistics() {
    // MNIST-sized channels (100 * 28 * 28 = 78,400 values) sitting far from zero,
    // where naive f32 running sums lose several digits.
    let (n, c, hw) = (100, 2, 784);
    let x: Vec<f32> = rand_vec_f32(n * c * hw, 6).iter().map(|v| 30.0 + 0.5 * v).collect();
    let sums = cpu::local_sums(&x, n, c, hw);
    let st = cpu::batch_stats::<f32>(&sums.sum, &sums.sumsq, sums.count, 1e-5);
    let want = naive_stats(&f64s(&x), n, c, hw);
    for (ch, &(mean, var, var_u)) in want.iter().enumerate() {
        assert!(((st.mean[ch] as f64) - mean).abs() <= 1e-7 * mean.abs(), "mean[{ch}]");
        let want_invstd = 1.0 / (var + 1e-5).sqrt();
        assert!(((st.invstd[ch] as f64) - want_invstd).abs() <= 1e-6 * want_invstd, "invstd[{ch}]");
        assert!(((st.var_unbiased[ch] as f64) - var_u).abs() <= 1e-6 * var_u, "var_unbiased[{ch}]");
    }
}

#[test]
fn forward_eval_uses_running_stats() {
    let (n, c, h, w) = (2, 3, 5, 3);
    let hw = h * w;
    let x = rand_vec_f32(n * c * hw, 7);
    let wt = rand_vec_f32(c, 8);
    let bs = rand_vec_f32(c, 9);
    let rm = rand_vec_f32(c, 10);
    let rv: Vec<f32> = rand_vec_f32(c, 11).iter().map(|v| v.abs() + 0.1).collect();
    let t = |v: &Vec<f32>| Tensor::from_vec(&[c], v.clone()).unwrap();
    let y = forward_eval(
        &Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap(),
        BnParams { weight: &t(&wt), bias: &t(&bs) },
        RunningStats { running_mean: &t(&rm), running_var: &t(&rv) },
        1e-3,
    )
    .unwrap();
    let want: Vec<f64> = (0..x.len())
        .map(|idx| {
            let ch = (idx / hw) % c;
            (x[idx] as f64 - rm[ch] as f64) / (rv[ch] as f64 + 1e-3).sqrt() * wt[ch] as f64 + bs[ch] as f64
        })
        .collect();
    assert_close("eval y", y.as_f32().unwrap(), &want, 1e-5);
}

#[test]
fn backward_matches_finite_differences() {
    let (n, c, hw) = (3, 2, 15);
    let eps = 1e-5;
    let x = rand_vec(n * c * hw, 12);
    let w = rand_vec(c, 13);
    let b = rand_vec(c, 14);
    let r = rand_vec(n * c * hw, 15);

    let sums = cpu::local_sums(&x, n, c, hw);
    let st = cpu::batch_stats::<f64>(&sums.sum, &sums.sumsq, sums.count, eps);
    let bsums = cpu::backward_sums(&x, &r, n, c, hw, &st.mean, &st.invstd);
    let mut dx = vec![0.0; x.len()];
    cpu::backward_dx(&x, &r, c, hw, &st.mean, &st.invstd, &w, &bsums, sums.count, &mut dx);

    check_grad("batch_norm dx", &x, &dx, |xp| dot(&r, &train_forward_f64(xp, &w, &b, n, c, hw, eps)), 1e-6);
    check_grad(
        "batch_norm dweight",
        &w,
        &bsums.sum_dy_xhat,
        |wp| dot(&r, &train_forward_f64(&x, wp, &b, n, c, hw, eps)),
        1e-6,
    );
    check_grad(
        "batch_norm dbias",
        &b,
        &bsums.sum_dy,
        |bp| dot(&r, &train_forward_f64(&x, &w, bp, n, c, hw, eps)),
        1e-6,
    );
}

#[test]
fn tensor_backward_matches_f64_kernels_and_accumulates() {
    let (n, c, h, w) = (8, 3, 40, 40); // above PAR_MIN_ELEMS: the threaded paths
    let hw = h * w;
    let x = rand_vec_f32(n * c * hw, 16);
    let wt = rand_vec_f32(c, 17);
    let dy = rand_vec_f32(n * c * hw, 18);
    let xt = Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap();
    let wtt = Tensor::from_vec(&[c], wt.clone()).unwrap();
    let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
    let (_, saved) = forward_train(
        &xt,
        BnParams { weight: &wtt, bias: &Tensor::zeros(&[c]) },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let mut dw = Tensor::full(&[c], 1.0);
    let mut db = Tensor::full(&[c], -2.0);
    let dyt = Tensor::from_vec(&[n, c, h, w], dy.clone()).unwrap();
    let dx = backward(&xt, &wtt, &saved, &dyt, BnGrads { dweight: &mut dw, dbias: &mut db }).unwrap();

    let (xd, dyd, wd) = (f64s(&x), f64s(&dy), f64s(&wt));
    let sums = cpu::local_sums(&xd, n, c, hw);
    let st = cpu::batch_stats::<f64>(&sums.sum, &sums.sumsq, sums.count, 1e-5);
    let bs = cpu::backward_sums(&xd, &dyd, n, c, hw, &st.mean, &st.invstd);
    let mut want_dx = vec![0.0; x.len()];
    cpu::backward_dx(&xd, &dyd, c, hw, &st.mean, &st.invstd, &wd, &bs, sums.count, &mut want_dx);
    assert_close("dx", dx.as_f32().unwrap(), &want_dx, 1e-5);
    let want_dw: Vec<f64> = bs.sum_dy_xhat.iter().map(|s| s + 1.0).collect();
    let want_db: Vec<f64> = bs.sum_dy.iter().map(|s| s - 2.0).collect();
    assert_close("dweight (+= 1)", dw.as_f32().unwrap(), &want_dw, 1e-5);
    assert_close("dbias (+= -2)", db.as_f32().unwrap(), &want_db, 1e-5);
}

#[test]
fn split_batch_sums_reproduce_the_whole_batch() {
    // What SyncBatchNorm does: each shard reduces locally, the sums are added,
    // and every shard normalizes and back-propagates with the global values.
    let (c, hw) = (3, 10);
    let (n1, n2) = (2, 5); // uneven shards
    let x = rand_vec(((n1 + n2) * c) * hw, 19);
    let dy = rand_vec(x.len(), 20);
    let w = rand_vec(c, 21);
    let cut = n1 * c * hw;
    let whole = cpu::local_sums(&x, n1 + n2, c, hw);
    let (a, b) = (cpu::local_sums(&x[..cut], n1, c, hw), cpu::local_sums(&x[cut..], n2, c, hw));
    assert_eq!(a.count + b.count, whole.count);
    let add = |p: &[f64], q: &[f64]| -> Vec<f64> { p.iter().zip(q).map(|(u, v)| u + v).collect() };
    let st = cpu::batch_stats::<f64>(&add(&a.sum, &b.sum), &add(&a.sumsq, &b.sumsq), whole.count, 1e-5);
    let st_whole = cpu::batch_stats::<f64>(&whole.sum, &whole.sumsq, whole.count, 1e-5);
    for ch in 0..c {
        assert!((st.mean[ch] - st_whole.mean[ch]).abs() < 1e-12);
        assert!((st.invstd[ch] - st_whole.invstd[ch]).abs() < 1e-10);
    }
    let ba = cpu::backward_sums(&x[..cut], &dy[..cut], n1, c, hw, &st.mean, &st.invstd);
    let bb = cpu::backward_sums(&x[cut..], &dy[cut..], n2, c, hw, &st.mean, &st.invstd);
    let global = cpu::BackwardSums {
        sum_dy: add(&ba.sum_dy, &bb.sum_dy),
        sum_dy_xhat: add(&ba.sum_dy_xhat, &bb.sum_dy_xhat),
    };
    let mut dx = vec![0.0; x.len()];
    let (dxa, dxb) = dx.split_at_mut(cut);
    cpu::backward_dx(&x[..cut], &dy[..cut], c, hw, &st.mean, &st.invstd, &w, &global, whole.count, dxa);
    cpu::backward_dx(&x[cut..], &dy[cut..], c, hw, &st.mean, &st.invstd, &w, &global, whole.count, dxb);
    let bw = cpu::backward_sums(&x, &dy, n1 + n2, c, hw, &st.mean, &st.invstd);
    let mut want = vec![0.0; x.len()];
    cpu::backward_dx(&x, &dy, c, hw, &st.mean, &st.invstd, &w, &bw, whole.count, &mut want);
    for (i, (g, e)) in dx.iter().zip(&want).enumerate() {
        assert!((g - e).abs() < 1e-12, "dx[{i}]: {g} vs {e}");
    }
}

fn err_msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn errors_name_the_problem() {
    let (mut rm, mut rv) = (Tensor::zeros(&[2]), Tensor::full(&[2], 1.0));
    let w2 = Tensor::full(&[2], 1.0);
    let b2 = Tensor::zeros(&[2]);

    let x3 = Tensor::zeros(&[4, 2, 3]);
    let m = err_msg(forward_train(
        &x3,
        BnParams { weight: &w2, bias: &b2 },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    ));
    assert!(m.contains("expected a 4-D [N, C, H, W] input, got shape [4, 2, 3]"), "{m}");

    let x = Tensor::from_vec(&[2, 2, 2, 2], rand_vec_f32(16, 22)).unwrap();
    let w3 = Tensor::full(&[3], 1.0);
    let m = err_msg(forward_train(
        &x,
        BnParams { weight: &w3, bias: &b2 },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    ));
    assert!(m.contains("batch_norm forward_train: weight: expected shape [2], got [3]"), "{m}");
    let mut rv3 = Tensor::full(&[3], 1.0);
    let m = err_msg(forward_train(
        &x,
        BnParams { weight: &w2, bias: &b2 },
        RunningStats { running_mean: &mut rm, running_var: &mut rv3 },
        BnHyper::default(),
    ));
    assert!(m.contains("running_var: expected shape [2], got [3]"), "{m}");
    assert_eq!(rm.as_f32().unwrap(), &[0.0, 0.0], "a failed call must not move running_mean");
    let m = err_msg(forward_eval(
        &x,
        BnParams { weight: &w2, bias: &b2 },
        RunningStats { running_mean: &rm, running_var: &Tensor::full(&[1], 1.0) },
        1e-5,
    ));
    assert!(m.contains("batch_norm forward_eval: running_var: expected shape [2], got [1]"), "{m}");

    let x1 = Tensor::zeros(&[1, 2, 1, 1]);
    let m = err_msg(forward_train(
        &x1,
        BnParams { weight: &w2, bias: &b2 },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    ));
    assert!(
        m.contains("expected more than 1 value per channel when training, got input shape [1, 2, 1, 1]"),
        "{m}"
    );

    let (_, saved) = forward_train(
        &x,
        BnParams { weight: &w2, bias: &b2 },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let (mut dw, mut db) = (Tensor::zeros(&[2]), Tensor::zeros(&[2]));
    let dy_bad = Tensor::zeros(&[2, 2, 2, 1]);
    let m = err_msg(backward(&x, &w2, &saved, &dy_bad, BnGrads { dweight: &mut dw, dbias: &mut db }));
    assert!(m.contains("dy (must match x): expected shape [2, 2, 2, 2], got [2, 2, 2, 1]"), "{m}");
    let dy = Tensor::full(&[2, 2, 2, 2], 1.0);
    let mut db3 = Tensor::zeros(&[3]);
    let m = err_msg(backward(&x, &w2, &saved, &dy, BnGrads { dweight: &mut dw, dbias: &mut db3 }));
    assert!(m.contains("dbias: expected shape [2], got [3]"), "{m}");
    assert_eq!(dw.as_f32().unwrap(), &[0.0, 0.0], "a failed call must not touch dweight");
}
