//! GPU parity: kernels/layer_norm.cu against the CPU twin
//! (src/ops/layer_norm/cpu.rs). Both sum in the same orders in f32 (the
//! parameter gradients in the same row chunks) and round f16 activations
//! once, so every output (y, mean, rstd, dx, weight.grad, bias.grad) must be
//! identical, bit for bit, in both dtypes.

use super::{backward, backward_workspace_len, forward, Affine, Rows, SavedStats};
use crate::cuda::testing::{assert_identical, download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu};
use crate::ops::layer_norm::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

fn check<T: DeviceFloat>(gpu: &Gpu, shape: Rows, bias: bool, seed: u64) {
    let what = format!("layer_norm {} {shape:?} bias={bias}", T::SUFFIX);
    let Rows { rows, c } = shape;
    let n = rows * c;
    let eps = 1e-5;
    // An offset mean, so the centering matters.
    let x: Vec<f32> = rounded::<T>(&rand_vec_f32(n, seed).iter().map(|v| 3.0 * v + 0.5).collect::<Vec<_>>());
    let w = rand_vec_f32(c, seed + 1);
    let b = bias.then(|| rand_vec_f32(c, seed + 2));

    let (mut y_cpu, mut mean_cpu, mut rstd_cpu) = (vec![0f32; n], vec![0f32; rows], vec![0f32; rows]);
    cpu::forward(
        c,
        &x,
        &w,
        b.as_deref(),
        eps,
        crate::tensor::as_uninit(&mut y_cpu),
        &mut mean_cpu,
        &mut rstd_cpu,
    );
    let (xd, wd) = (upload::<T>(gpu, &x), upload::<f32>(gpu, &w));
    let bd = b.as_ref().map(|b| upload::<f32>(gpu, b));
    let mut yd = poisoned::<T>(gpu, n);
    let (mut md, mut rd) = (poisoned::<f32>(gpu, rows), poisoned::<f32>(gpu, rows));
    let bv = bd.as_ref().map(|b| b.as_view());
    let params = Affine { weight: &wd.as_view(), bias: bv.as_ref() };
    let saved = SavedStats { mean: &mut md.as_view_mut(), rstd: &mut rd.as_view_mut() };
    forward(gpu, &xd.as_view(), shape, params, eps, &mut yd.as_view_mut(), saved).unwrap();
    assert_identical(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));
    assert_identical(&format!("{what}: mean"), &download(gpu, &md), &mean_cpu);
    assert_identical(&format!("{what}: rstd"), &download(gpu, &rd), &rstd_cpu);

    let dy = rounded::<T>(&rand_vec_f32(n, seed + 3));
    // Gradients already holding values: the parameters' rule is `+=`.
    let dw0 = rand_vec_f32(c, seed + 4);
    let db0 = rand_vec_f32(c, seed + 5);
    let (mut dx_cpu, mut dw_cpu, mut db_cpu) = (vec![0f32; n], dw0.clone(), db0.clone());
    let db_arg = if bias { Some(&mut db_cpu[..]) } else { None };
    cpu::backward(
        c,
        &x,
        &w,
        &mean_cpu,
        &rstd_cpu,
        &dy,
        crate::tensor::as_uninit(&mut dx_cpu),
        &mut dw_cpu,
        db_arg,
    );
    let dyd = upload::<T>(gpu, &dy);
    let mut dxd = poisoned::<T>(gpu, n);
    let (mut dwd, mut dbd) = (upload::<f32>(gpu, &dw0), upload::<f32>(gpu, &db0));
    let mut ws = poisoned::<f32>(gpu, backward_workspace_len(shape));
    let mut dbv = dbd.as_view_mut();
    let grads = Affine { weight: &mut dwd.as_view_mut(), bias: bias.then_some(&mut dbv) };
    let saved = SavedStats { mean: &md.as_view(), rstd: &rd.as_view() };
    let (xv, dyv) = (xd.as_view(), dyd.as_view());
    backward(
        gpu,
        &xv,
        shape,
        &wd.as_view(),
        saved,
        &dyv,
        Some(&mut dxd.as_view_mut()),
        grads,
        &mut ws.as_view_mut(),
    )
    .unwrap();
    assert_identical(&format!("{what}: dx"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
    assert_identical(&format!("{what}: weight.grad"), &download(gpu, &dwd), &dw_cpu);
    let want_db = if bias { db_cpu } else { db0 };
    assert_identical(&format!("{what}: bias.grad"), &download(gpu, &dbd), &want_db);
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    let rows = |rows, c| Rows { rows, c };
    // The baby GPT's ln over [12, 64, 128], one chunk exactly, chunks with a
    // short last one, one value per row, and a single row.
    for (i, (shape, bias)) in [
        (rows(12 * 64, 128), false),
        (rows(12 * 64, 128), true),
        (rows(64, 32), true),
        (rows(130, 17), true),
        (rows(129, 3), false),
        (rows(7, 1), true),
        (rows(1, 33), false),
    ]
    .into_iter()
    .enumerate()
    {
        check::<T>(gpu, shape, bias, seed + 10 * i as u64);
    }
    // Every width 1..64 (a row's last element anywhere in a warp) and every
    // row count 1..64 (the gradients' chunks ending anywhere).
    for k in 1..=64 {
        check::<T>(gpu, rows(3, k), k % 2 == 0, seed + 100 + k as u64);
        check::<T>(gpu, rows(k, 5), k % 2 == 1, seed + 200 + k as u64);
    }
}

#[test]
fn layer_norm_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("layer_norm_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 300);
}

#[test]
fn layer_norm_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("layer_norm_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 400);
}

#[test]
fn layer_norm_refuses_wrong_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("layer_norm_refuses_wrong_buffers") else { return };
    let shape = Rows { rows: 4, c: 8 };
    let x = upload::<f32>(&gpu, &[0.0; 32]);
    let w = upload::<f32>(&gpu, &[1.0; 7]);
    let mut y = poisoned::<f32>(&gpu, 32);
    let (mut m, mut r) = (poisoned::<f32>(&gpu, 4), poisoned::<f32>(&gpu, 4));
    let saved = SavedStats { mean: &mut m.as_view_mut(), rstd: &mut r.as_view_mut() };
    let params = Affine { weight: &w.as_view(), bias: None };
    let e = forward(&gpu, &x.as_view(), shape, params, 1e-5, &mut y.as_view_mut(), saved).unwrap_err();
    assert!(e.to_string().contains("layer_norm forward: weight holds 7 elements, expected 8"), "{e}");
    let w = upload::<f32>(&gpu, &[1.0; 8]);
    let mut dw = poisoned::<f32>(&gpu, 8);
    let mut ws = poisoned::<f32>(&gpu, backward_workspace_len(shape) - 1);
    let saved = SavedStats { mean: &m.as_view(), rstd: &r.as_view() };
    let grads = Affine { weight: &mut dw.as_view_mut(), bias: None };
    let (xv, dyv) = (x.as_view(), x.as_view());
    let e = backward(
        &gpu,
        &xv,
        shape,
        &w.as_view(),
        saved,
        &dyv,
        Some(&mut y.as_view_mut()),
        grads,
        &mut ws.as_view_mut(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("layer_norm backward: workspace holds 15 elements, expected 16"), "{e}");
}
