//! GPU parity of kernels/batch_norm.cu against the CPU twins (mod.rs and
//! sync.rs), f32 and f16 activations with f32 parameters and statistics, odd
//! shapes, outputs poisoned with NaN before each launch. Skips without a GPU.

use super::*;
use crate::cuda::testing::{download, poisoned, tol, upload};
use crate::ops::batch_norm::{self as bn, cpu, sync, BatchNormSaved};
use crate::ops::testing::rand_vec_f32;
use crate::tensor::{DType, Tensor};
use cudarc::driver::CudaSlice;

const SHAPES: [[usize; 4]; 3] = [[3, 5, 7, 7], [2, 3, 13, 13], [5, 2, 1, 1]];

/// Relative error per element, with the buffer's mean magnitude as the
/// floor (values near zero come out of a cancellation in both twins).
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let floor = want.iter().map(|v| v.abs()).sum::<f32>() / want.len().max(1) as f32;
    for (i, (&a, &e)) in got.iter().zip(want).enumerate() {
        assert!(a.is_finite(), "{what}[{i}]: gpu {a} (cpu {e})");
        let rel = (a - e).abs() / e.abs().max(floor).max(1e-30);
        assert!(rel < tol, "{what}[{i}]: gpu {a} cpu {e} (rel {rel:e})");
    }
}

fn dtype<T: DeviceFloat>() -> DType {
    if T::SUFFIX == "f16" {
        DType::F16
    } else {
        DType::F32
    }
}

/// A random input already rounded to `T`, so both twins see the same values.
fn input<T: DeviceFloat>(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    // An offset mean, so a one-pass E[x^2] - mean^2 would lose digits.
    let v: Vec<f32> = rand_vec_f32(n, seed).iter().map(|x| 3.0 + 2.0 * x).collect();
    Tensor::from_f32_as(shape, v, dtype::<T>()).unwrap()
}

fn param(c: usize, seed: u64, base: f32) -> Vec<f32> {
    rand_vec_f32(c, seed).iter().map(|v| base + 0.5 * v).collect()
}

fn forward_train_case<T: DeviceFloat>(test: &str) {
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    for (k, shape) in SHAPES.iter().enumerate() {
        let c = shape[1];
        let x = input::<T>(shape, 10 + k as u64);
        let (w, b) = (param(c, 1, 1.0), param(c, 2, 0.0));
        let (rm0, rv0) = (param(c, 3, 0.0), param(c, 4, 1.0));
        let (mut rm, mut rv) =
            (Tensor::from_vec(&[c], rm0.clone()).unwrap(), Tensor::from_vec(&[c], rv0.clone()).unwrap());
        let wt = Tensor::from_vec(&[c], w.clone()).unwrap();
        let bt = Tensor::from_vec(&[c], b.clone()).unwrap();
        let (y, saved) = bn::forward_train(
            &x,
            BnParams { weight: &wt, bias: &bt },
            RunningStats { running_mean: &mut rm, running_var: &mut rv },
            BnHyper::default(),
        )
        .unwrap();

        let dx_ = upload::<T>(&gpu, &x.to_f32_vec());
        let (dw, db) = (upload::<f32>(&gpu, &w), upload::<f32>(&gpu, &b));
        let (mut drm, mut drv) = (upload::<f32>(&gpu, &rm0), upload::<f32>(&gpu, &rv0));
        let mut dy = poisoned::<T>(&gpu, x.numel());
        let (mut mean, mut invstd) = (poisoned::<f32>(&gpu, c), poisoned::<f32>(&gpu, c));
        forward_train(
            &gpu,
            &dx_.as_view(),
            shape,
            BnParams { weight: &dw.as_view(), bias: &db.as_view() },
            RunningStats { running_mean: &mut drm.as_view_mut(), running_var: &mut drv.as_view_mut() },
            BnHyper::default(),
            &mut dy.as_view_mut(),
            SavedStats { mean: &mut mean.as_view_mut(), invstd: &mut invstd.as_view_mut() },
            Epilogue::Default,
        )
        .unwrap();
        let ctx = format!("{test} {shape:?}");
        assert_close(&format!("{ctx} y"), &download(&gpu, &dy), &y.to_f32_vec(), tol::<T>());
        // Statistics are f32 from the same inputs whatever T is.
        assert_close(&format!("{ctx} mean"), &download(&gpu, &mean), &saved.mean, 1e-5);
        assert_close(&format!("{ctx} invstd"), &download(&gpu, &invstd), &saved.invstd, 1e-5);
        assert_close(&format!("{ctx} running_mean"), &download(&gpu, &drm), rm.as_f32().unwrap(), 1e-5);
        assert_close(&format!("{ctx} running_var"), &download(&gpu, &drv), rv.as_f32().unwrap(), 1e-5);

        // Eval with the updated running statistics.
        let ye = bn::forward_eval(
            &x,
            BnParams { weight: &wt, bias: &bt },
            RunningStats { running_mean: &rm, running_var: &rv },
            1e-5,
        )
        .unwrap();
        let mut out = poisoned::<T>(&gpu, x.numel());
        let (rmv, rvv) = (drm.as_view(), drv.as_view());
        forward_eval(
            &gpu,
            &dx_.as_view(),
            shape,
            BnParams { weight: &dw.as_view(), bias: &db.as_view() },
            RunningStats { running_mean: &rmv, running_var: &rvv },
            1e-5,
            &mut out.as_view_mut(),
            Epilogue::Default,
        )
        .unwrap();
        assert_close(&format!("{ctx} eval y"), &download(&gpu, &out), &ye.to_f32_vec(), tol::<T>());
    }
}

#[test]
fn forward_train_and_eval_match_cpu_f32() {
    forward_train_case::<f32>("forward_train_and_eval_match_cpu_f32");
}

#[test]
fn forward_train_and_eval_match_cpu_f16() {
    forward_train_case::<half::f16>("forward_train_and_eval_match_cpu_f16");
}

fn backward_case<T: DeviceFloat>(test: &str) {
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    for (k, shape) in SHAPES.iter().enumerate() {
        let c = shape[1];
        let x = input::<T>(shape, 20 + k as u64);
        let g = Tensor::from_f32_as(shape, rand_vec_f32(x.numel(), 30 + k as u64), dtype::<T>()).unwrap();
        let w = param(c, 5, 1.0);
        let wt = Tensor::from_vec(&[c], w.clone()).unwrap();
        let saved = BatchNormSaved { mean: param(c, 6, 3.0), invstd: param(c, 7, 0.6) };
        // dweight/dbias start nonzero: the gradients accumulate.
        let (dw0, db0) = (param(c, 8, 0.0), param(c, 9, 0.0));
        let (mut dwt, mut dbt) =
            (Tensor::from_vec(&[c], dw0.clone()).unwrap(), Tensor::from_vec(&[c], db0.clone()).unwrap());
        let dx = bn::backward(&x, &wt, &saved, &g, BnGrads { dweight: &mut dwt, dbias: &mut dbt }).unwrap();

        let (xd, gd, wd) =
            (upload::<T>(&gpu, &x.to_f32_vec()), upload::<T>(&gpu, &g.to_f32_vec()), upload::<f32>(&gpu, &w));
        let (md, id) = (upload::<f32>(&gpu, &saved.mean), upload::<f32>(&gpu, &saved.invstd));
        let (mut dwd, mut dbd) = (upload::<f32>(&gpu, &dw0), upload::<f32>(&gpu, &db0));
        let mut sums = poisoned::<f32>(&gpu, 2 * c);
        let mut dxd = poisoned::<T>(&gpu, x.numel());
        backward(
            &gpu,
            &xd.as_view(),
            &gd.as_view(),
            shape,
            SavedStats { mean: &md.as_view(), invstd: &id.as_view() },
            &wd.as_view(),
            &mut sums.as_view_mut(),
            BnGrads { dweight: &mut dwd.as_view_mut(), dbias: &mut dbd.as_view_mut() },
            &mut dxd.as_view_mut(),
        )
        .unwrap();
        let ctx = format!("{test} {shape:?}");
        assert_close(&format!("{ctx} dx"), &download(&gpu, &dxd), &dx.to_f32_vec(), tol::<T>());
        assert_close(&format!("{ctx} dweight"), &download(&gpu, &dwd), dwt.as_f32().unwrap(), 1e-5);
        assert_close(&format!("{ctx} dbias"), &download(&gpu, &dbd), dbt.as_f32().unwrap(), 1e-5);
    }
}

#[test]
fn backward_matches_cpu_f32() {
    backward_case::<f32>("backward_matches_cpu_f32");
}

#[test]
fn backward_matches_cpu_f16() {
    backward_case::<half::f16>("backward_matches_cpu_f16");
}

/// What sync.rs all-reduces for one rank's batch: [count, sum[c], sumsq[c]].
/// The bits of a downloaded buffer (f16 values widen exactly).
fn bits(gpu: &Gpu, b: &CudaSlice<impl DeviceFloat>) -> Vec<u32> {
    download(gpu, b).iter().map(|v| v.to_bits()).collect()
}

/// The ReLU and add + ReLU epilogues against BatchNorm's plain kernels
/// followed by add.cu's and relu.cu's, bit for bit, in the training and the
/// evaluation forward.
fn relu_epilogue_case<T: DeviceFloat>(test: &str) {
    use crate::ops::{add::cuda as add, relu::cuda as relu};
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    for (k, shape) in SHAPES.iter().enumerate() {
        let (c, numel) = (shape[1], shape.iter().product::<usize>());
        let ctx = format!("{test} {shape:?}");
        let x = input::<T>(shape, 30 + k as u64);
        let xd = upload::<T>(&gpu, &x.to_f32_vec());
        let (w, b) = (upload::<f32>(&gpu, &param(c, 5, 1.0)), upload::<f32>(&gpu, &param(c, 6, 0.0)));
        let train = |epilogue: Epilogue<'_, '_, T>| {
            let (mut rm, mut rv) =
                (upload::<f32>(&gpu, &param(c, 7, 0.0)), upload::<f32>(&gpu, &param(c, 8, 1.0)));
            let (mut mean, mut invstd) = (poisoned::<f32>(&gpu, c), poisoned::<f32>(&gpu, c));
            let mut y = poisoned::<T>(&gpu, numel);
            forward_train(
                &gpu,
                &xd.as_view(),
                shape,
                BnParams { weight: &w.as_view(), bias: &b.as_view() },
                RunningStats { running_mean: &mut rm.as_view_mut(), running_var: &mut rv.as_view_mut() },
                BnHyper::default(),
                &mut y.as_view_mut(),
                SavedStats { mean: &mut mean.as_view_mut(), invstd: &mut invstd.as_view_mut() },
                epilogue,
            )
            .unwrap();
            (y, mean, invstd, rm, rv)
        };
        let (plain, mean, invstd, rm, rv) = train(Epilogue::Default);
        let mut want = poisoned::<T>(&gpu, numel);
        relu::forward(&gpu, &plain, &mut want).unwrap();
        let (fused, fmean, finvstd, frm, frv) = train(Epilogue::Relu);
        assert_eq!(bits(&gpu, &fused), bits(&gpu, &want), "{ctx}: training forward");
        let zeros = download(&gpu, &fused).iter().filter(|&&v| v == 0.0).count();
        assert!(zeros > 0 && zeros < numel, "{ctx}: ReLU zeroed {zeros} of {numel}");
        for (what, a, e) in [
            ("mean", &fmean, &mean),
            ("invstd", &finvstd, &invstd),
            ("running_mean", &frm, &rm),
            ("running_var", &frv, &rv),
        ] {
            assert_eq!(bits(&gpu, a), bits(&gpu, e), "{ctx}: {what}");
        }

        let eval = |epilogue: Epilogue<'_, '_, T>| {
            let mut y = poisoned::<T>(&gpu, numel);
            let (rmv, rvv) = (rm.as_view(), rv.as_view());
            forward_eval(
                &gpu,
                &xd.as_view(),
                shape,
                BnParams { weight: &w.as_view(), bias: &b.as_view() },
                RunningStats { running_mean: &rmv, running_var: &rvv },
                1e-5,
                &mut y.as_view_mut(),
                epilogue,
            )
            .unwrap();
            y
        };
        let mut want_eval = poisoned::<T>(&gpu, numel);
        relu::forward(&gpu, &eval(Epilogue::Default), &mut want_eval).unwrap();
        assert_eq!(bits(&gpu, &eval(Epilogue::Relu)), bits(&gpu, &want_eval), "{ctx}: eval forward");

        // A residual of the same scale: the sum's sign varies.
        let r = upload::<T>(
            &gpu,
            &input::<T>(shape, 50 + k as u64).to_f32_vec().iter().map(|v| 2.5 - v).collect::<Vec<_>>(),
        );
        let then_add_relu = |y: &CudaSlice<T>| {
            let (mut sum, mut out) = (poisoned::<T>(&gpu, numel), poisoned::<T>(&gpu, numel));
            add::forward(&gpu, y, &r, &mut sum).unwrap();
            relu::forward(&gpu, &sum, &mut out).unwrap();
            bits(&gpu, &out)
        };
        let rv = r.as_view();
        let (fused, ..) = train(Epilogue::AddRelu(&rv));
        assert_eq!(bits(&gpu, &fused), then_add_relu(&plain), "{ctx}: training forward, add + ReLU");
        let zeros = download(&gpu, &fused).iter().filter(|&&v| v == 0.0).count();
        assert!(zeros > 0 && zeros < numel, "{ctx}: add + ReLU zeroed {zeros} of {numel}");
        let want = then_add_relu(&eval(Epilogue::Default));
        assert_eq!(bits(&gpu, &eval(Epilogue::AddRelu(&rv))), want, "{ctx}: eval forward, add + ReLU");
        let short = r.slice(..numel - 1);
        let e = forward_apply(
            &gpu,
            &xd.as_view(),
            shape,
            SavedStats { mean: &mean.as_view(), invstd: &invstd.as_view() },
            BnParams { weight: &w.as_view(), bias: &b.as_view() },
            &mut poisoned::<T>(&gpu, numel).as_view_mut(),
            Epilogue::AddRelu(&short),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(&format!("residual holds {} elements, expected {numel}", numel - 1)), "{e}");
    }
}

#[test]
fn epilogues_are_batch_norm_then_add_and_relu_bit_for_bit_f32() {
    relu_epilogue_case::<f32>("epilogues_are_batch_norm_then_add_and_relu_bit_for_bit_f32");
}

#[test]
fn epilogues_are_batch_norm_then_add_and_relu_bit_for_bit_f16() {
    relu_epilogue_case::<half::f16>("epilogues_are_batch_norm_then_add_and_relu_bit_for_bit_f16");
}

fn cpu_local_buf(x: &Tensor) -> Vec<f32> {
    let [n, c, h, w] = *x.shape() else { unreachable!() };
    let s = cpu::local_sums(&x.to_f32_vec(), n, c, h * w);
    let mut buf = vec![s.count as f32];
    buf.extend(s.sum.iter().chain(&s.sumsq).map(|&v| v as f32));
    buf
}

fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn sync_case<T: DeviceFloat>(test: &str) {
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    // Two ranks with uneven batches, one GPU.
    let (s0, s1) = ([3usize, 5, 7, 7], [2usize, 5, 7, 7]);
    let c = 5;
    let (x0, x1) = (input::<T>(&s0, 40), input::<T>(&s1, 41));
    let (w, b) = (param(c, 1, 1.0), param(c, 2, 0.0));
    let (wt, bt) = (Tensor::from_vec(&[c], w.clone()).unwrap(), Tensor::from_vec(&[c], b.clone()).unwrap());
    let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
    let other = cpu_local_buf(&x1);
    let x0f = Tensor::from_vec(&s0, x0.to_f32_vec()).unwrap();
    let mut reduce = |buf: Vec<f32>| Ok(add(&buf, &other));
    let (y0, saved, count) = sync::forward_train(
        &x0f,
        BnParams { weight: &wt, bias: &bt },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
        &mut reduce,
    )
    .unwrap();

    let ctx = test.to_string();
    let (xd0, xd1) = (upload::<T>(&gpu, &x0.to_f32_vec()), upload::<T>(&gpu, &x1.to_f32_vec()));
    let mut bufs = Vec::new();
    for (xd, s) in [(&xd0, &s0), (&xd1, &s1)] {
        let mut out = poisoned::<f32>(&gpu, 1 + 2 * c);
        local_sums(&gpu, &xd.as_view(), s, &mut out.as_view_mut()).unwrap();
        bufs.push(download(&gpu, &out));
    }
    assert_close(&format!("{ctx} local sums rank 1"), &bufs[1], &other, 1e-5);
    let totals = upload::<f32>(&gpu, &add(&bufs[0], &bufs[1]));
    let (mut mean, mut invstd) = (poisoned::<f32>(&gpu, c), poisoned::<f32>(&gpu, c));
    let (mut drm, mut drv) = (upload::<f32>(&gpu, &[0.0; 5]), upload::<f32>(&gpu, &[1.0; 5]));
    sync_stats(
        &gpu,
        &totals.as_view(),
        c,
        BnHyper::default(),
        SavedStats { mean: &mut mean.as_view_mut(), invstd: &mut invstd.as_view_mut() },
        RunningStats { running_mean: &mut drm.as_view_mut(), running_var: &mut drv.as_view_mut() },
    )
    .unwrap();
    assert_close(&format!("{ctx} mean"), &download(&gpu, &mean), &saved.mean, 1e-5);
    assert_close(&format!("{ctx} invstd"), &download(&gpu, &invstd), &saved.invstd, 1e-5);
    assert_close(&format!("{ctx} running_var"), &download(&gpu, &drv), rv.as_f32().unwrap(), 1e-5);
    let (wd, bd) = (upload::<f32>(&gpu, &w), upload::<f32>(&gpu, &b));
    let mut y = poisoned::<T>(&gpu, x0.numel());
    let (mv, iv) = (mean.as_view(), invstd.as_view());
    let params = BnParams { weight: &wd.as_view(), bias: &bd.as_view() };
    let saved_d = SavedStats { mean: &mv, invstd: &iv };
    forward_apply(&gpu, &xd0.as_view(), &s0, saved_d, params, &mut y.as_view_mut(), Epilogue::Default)
        .unwrap();
    let y0 = y0.to_dtype(dtype::<T>()).to_f32_vec();
    assert_close(&format!("{ctx} y rank 0"), &download(&gpu, &y), &y0, tol::<T>());

    // Backward: the other rank's (sum dy, sum dy*xhat) with the global stats.
    let (g0, g1) = (rand_vec_f32(x0.numel(), 50), rand_vec_f32(x1.numel(), 51));
    let g0 = Tensor::from_f32_as(&s0, g0, dtype::<T>()).unwrap().to_f32_vec();
    let g1 = Tensor::from_f32_as(&s1, g1, dtype::<T>()).unwrap().to_f32_vec();
    let ob = cpu::backward_sums(&x1.to_f32_vec(), &g1, 2, c, 49, &saved.mean, &saved.invstd);
    let other_b: Vec<f32> = ob.sum_dy.iter().chain(&ob.sum_dy_xhat).map(|&v| v as f32).collect();
    let mut reduce_b = |buf: Vec<f32>| Ok(add(&buf, &other_b));
    let (mut dwt, mut dbt) = (Tensor::zeros(&[c]), Tensor::zeros(&[c]));
    let g0t = Tensor::from_vec(&s0, g0.clone()).unwrap();
    let dx0 = sync::backward(
        &x0f,
        &wt,
        &saved,
        count,
        &g0t,
        BnGrads { dweight: &mut dwt, dbias: &mut dbt },
        &mut reduce_b,
    )
    .unwrap();
    let (gd0, gd1) = (upload::<T>(&gpu, &g0), upload::<T>(&gpu, &g1));
    let mut local = Vec::new();
    let (mut dwd, mut dbd) = (upload::<f32>(&gpu, &[0.0; 5]), upload::<f32>(&gpu, &[0.0; 5]));
    for (xd, gd, s) in [(&xd0, &gd0, &s0), (&xd1, &gd1, &s1)] {
        let mut sums = poisoned::<f32>(&gpu, 2 * c);
        let (mut w_, mut b_) = (upload::<f32>(&gpu, &[0.0; 5]), upload::<f32>(&gpu, &[0.0; 5]));
        let (dwv, dbv) = if local.is_empty() { (&mut dwd, &mut dbd) } else { (&mut w_, &mut b_) };
        let (mv, iv) = (mean.as_view(), invstd.as_view());
        backward_reduce(
            &gpu,
            &xd.as_view(),
            &gd.as_view(),
            s,
            SavedStats { mean: &mv, invstd: &iv },
            &mut sums.as_view_mut(),
            BnGrads { dweight: &mut dwv.as_view_mut(), dbias: &mut dbv.as_view_mut() },
        )
        .unwrap();
        local.push(download(&gpu, &sums));
    }
    assert_close(&format!("{ctx} backward sums rank 1"), &local[1], &other_b, 1e-5);
    assert_close(
        &format!("{ctx} dweight rank 0 (local)"),
        &download(&gpu, &dwd),
        dwt.as_f32().unwrap(),
        1e-5,
    );
    assert_close(&format!("{ctx} dbias rank 0 (local)"), &download(&gpu, &dbd), dbt.as_f32().unwrap(), 1e-5);
    let global = upload::<f32>(&gpu, &add(&local[0], &local[1]));
    let mut dx = poisoned::<T>(&gpu, x0.numel());
    let (mv, iv) = (mean.as_view(), invstd.as_view());
    backward_dx(
        &gpu,
        &xd0.as_view(),
        &gd0.as_view(),
        &s0,
        SavedStats { mean: &mv, invstd: &iv },
        &wd.as_view(),
        ReducedSums { sums: &global.as_view(), count },
        &mut dx.as_view_mut(),
    )
    .unwrap();
    let dx0 = dx0.to_dtype(dtype::<T>()).to_f32_vec();
    assert_close(&format!("{ctx} dx rank 0"), &download(&gpu, &dx), &dx0, tol::<T>());
}

#[test]
fn sync_pieces_match_sync_batch_norm_over_two_uneven_ranks_f32() {
    sync_case::<f32>("sync_pieces_match_sync_batch_norm_over_two_uneven_ranks_f32");
}

#[test]
fn sync_pieces_match_sync_batch_norm_over_two_uneven_ranks_f16() {
    sync_case::<half::f16>("sync_pieces_match_sync_batch_norm_over_two_uneven_ranks_f16");
}

#[test]
fn bad_shapes_and_lengths_are_refused_before_launch() {
    let Some(gpu) = crate::cuda::test_gpu("bad_shapes_and_lengths_are_refused_before_launch") else { return };
    let x = upload::<f32>(&gpu, &[1.0; 12]);
    let p = upload::<f32>(&gpu, &[1.0; 3]);
    let (mut rm, mut rv, mut m, mut i) = (
        upload::<f32>(&gpu, &[0.0; 3]),
        upload::<f32>(&gpu, &[1.0; 3]),
        poisoned::<f32>(&gpu, 3),
        poisoned::<f32>(&gpu, 3),
    );
    let mut y = poisoned::<f32>(&gpu, 12);
    let mut run = |shape: &[usize], y: &mut CudaSlice<f32>| {
        forward_train(
            &gpu,
            &x.as_view(),
            shape,
            BnParams { weight: &p.as_view(), bias: &p.as_view() },
            RunningStats { running_mean: &mut rm.as_view_mut(), running_var: &mut rv.as_view_mut() },
            BnHyper::default(),
            &mut y.as_view_mut(),
            SavedStats { mean: &mut m.as_view_mut(), invstd: &mut i.as_view_mut() },
            Epilogue::Default,
        )
        .unwrap_err()
        .to_string()
    };
    let e = run(&[4, 3], &mut y);
    assert!(
        e.contains("batch_norm forward_train: expected a 4-D [N, C, H, W] input, got shape [4, 3]"),
        "{e}"
    );
    let e = run(&[1, 3, 1, 1], &mut y);
    assert!(e.contains("expected more than 1 value per channel when training"), "{e}");
    let e = run(&[2, 3, 2, 2], &mut y);
    assert!(e.contains("batch_norm forward_train: x holds 12 elements, expected 24"), "{e}");
    let mut short = poisoned::<f32>(&gpu, 11);
    let e = run(&[1, 3, 2, 2], &mut short);
    assert!(e.contains("batch_norm forward_train: y holds 11 elements, expected 12"), "{e}");
}
