//! RMSNorm's CPU kernels against finite differences, and kernels/rmsnorm.cu
//! against them: both sum in the same orders in f32 and round f16
//! activations once, so every output (y, rstd, dx, weight.grad) must be
//! identical, bit for bit, in both dtypes.

use super::cpu;
use super::cuda::{backward, backward_workspace_len, forward, Saved};
use crate::cuda::testing::{assert_identical, download, poisoned, rounded, upload};
use crate::cuda::{DeviceFloat, Gpu, Rows};
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};
use crate::tensor::as_uninit;
use half::f16;

const C: usize = 6;
const N: usize = 5;

fn forward64(x: &[f64], w: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut rstd) = (vec![0.0; x.len()], vec![0.0; N]);
    cpu::forward(C, x, w, 1e-5, as_uninit(&mut y), &mut rstd);
    (y, rstd)
}

#[test]
fn forward_gives_each_row_a_unit_mean_square() {
    let x: Vec<f64> = rand_vec(N * C, 1).iter().map(|v| v * 3.0 + 1.0).collect();
    let (y, _) = forward64(&x, None);
    for row in y.chunks(C) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / C as f64;
        assert!((ms - 1.0).abs() < 1e-4, "mean square {ms}");
    }
}

#[test]
fn backward_matches_finite_differences_with_and_without_a_weight() {
    let x = rand_vec(N * C, 2);
    let w: Vec<f64> = rand_vec(C, 3).iter().map(|v| v + 1.5).collect();
    let r = rand_vec(N * C, 5);
    for affine in [true, false] {
        let weight = affine.then_some(&w[..]);
        let (_, rstd) = forward64(&x, weight);
        let (mut dx, mut dw) = (vec![0.0; N * C], vec![0.5; C]);
        let dw_arg = affine.then_some(&mut dw[..]);
        cpu::backward(C, &x, weight, &rstd, &r, Some(as_uninit(&mut dx)), dw_arg);
        check_grad("rmsnorm dx", &x, &dx, |x| dot(&r, &forward64(x, weight).0), 1e-6);
        if affine {
            // The weight's gradient was added to 0.5.
            let dw: Vec<f64> = dw.iter().map(|v| v - 0.5).collect();
            check_grad("rmsnorm dweight", &w, &dw, |w| dot(&r, &forward64(&x, Some(w)).0), 1e-6);
        }
        // Without dx asked for, the weight's gradient is the same.
        let mut dw2 = [0.5; C];
        cpu::backward(C, &x, weight, &rstd, &r, None, affine.then_some(&mut dw2[..]));
        assert_eq!(dw2[..], dw[..]);
    }
}

fn check<T: DeviceFloat>(gpu: &Gpu, shape: Rows, affine: bool, seed: u64) {
    let what = format!("rmsnorm {} {shape:?} affine={affine}", T::SUFFIX);
    let Rows { rows, c } = shape;
    let n = rows * c;
    let eps = 1e-5;
    let x = rounded::<T>(&rand_vec_f32(n, seed).iter().map(|v| 3.0 * v + 0.5).collect::<Vec<_>>());
    let w = affine.then(|| rand_vec_f32(c, seed + 1));
    let (mut y_cpu, mut rstd_cpu) = (vec![0f32; n], vec![0f32; rows]);
    cpu::forward(c, &x, w.as_deref(), eps, as_uninit(&mut y_cpu), &mut rstd_cpu);
    let xd = upload::<T>(gpu, &x);
    let wd = w.as_ref().map(|w| upload::<f32>(gpu, w));
    let (mut yd, mut rd) = (poisoned::<T>(gpu, n), poisoned::<f32>(gpu, rows));
    let wv = wd.as_ref().map(|w| w.as_view());
    forward(gpu, shape, &xd.as_view(), wv.as_ref(), eps, &mut yd.as_view_mut(), &mut rd.as_view_mut()).unwrap();
    assert_identical(&format!("{what}: y"), &download(gpu, &yd), &rounded::<T>(&y_cpu));
    assert_identical(&format!("{what}: rstd"), &download(gpu, &rd), &rstd_cpu);

    let dy = rounded::<T>(&rand_vec_f32(n, seed + 3));
    // A gradient already holding values: the weight's rule is `+=`.
    let dw0 = rand_vec_f32(c, seed + 4);
    let (mut dx_cpu, mut dw_cpu) = (vec![0f32; n], dw0.clone());
    let dw_arg = affine.then_some(&mut dw_cpu[..]);
    cpu::backward(c, &x, w.as_deref(), &rstd_cpu, &dy, Some(as_uninit(&mut dx_cpu)), dw_arg);
    let dyd = upload::<T>(gpu, &dy);
    let (mut dxd, mut dwd) = (poisoned::<T>(gpu, n), upload::<f32>(gpu, &dw0));
    let mut ws = poisoned::<f32>(gpu, backward_workspace_len(shape));
    let saved = Saved { x: xd.as_view(), rstd: rd.as_view(), weight: wv };
    let (mut dwv, mut wsv) = (dwd.as_view_mut(), ws.as_view_mut());
    let grads = affine.then_some((&mut dwv, &mut wsv));
    backward(gpu, shape, &saved, &dyd.as_view(), Some(&mut dxd.as_view_mut()), grads).unwrap();
    assert_identical(&format!("{what}: dx"), &download(gpu, &dxd), &rounded::<T>(&dx_cpu));
    assert_identical(&format!("{what}: weight.grad"), &download(gpu, &dwd), &dw_cpu);
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    let rows = |rows, c| Rows { rows, c };
    // A GPT's width over [12, 64] tokens, more rows than one chunk.
    check::<T>(gpu, rows(12 * 64, 128), true, seed);
    check::<T>(gpu, rows(130, 17), false, seed + 1);
    // Every width 1..64 (a row's last element anywhere in a warp) and every
    // row count 1..64 (the weight gradient's chunks ending anywhere).
    for k in 1..=64 {
        check::<T>(gpu, rows(3, k), k % 2 == 0, seed + 100 + k as u64);
        check::<T>(gpu, rows(k, 5), k % 2 == 1, seed + 200 + k as u64);
    }
}

#[test]
fn rmsnorm_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("rmsnorm_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 300);
}

#[test]
fn rmsnorm_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("rmsnorm_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 400);
}

#[test]
fn rmsnorm_refuses_wrong_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("rmsnorm_refuses_wrong_buffers") else { return };
    let shape = Rows { rows: 4, c: 8 };
    let x = upload::<f32>(&gpu, &[0.0; 32]);
    let w = upload::<f32>(&gpu, &[1.0; 7]);
    let (mut y, mut r) = (poisoned::<f32>(&gpu, 32), poisoned::<f32>(&gpu, 4));
    let e = forward(&gpu, shape, &x.as_view(), Some(&w.as_view()), 1e-5, &mut y.as_view_mut(), &mut r.as_view_mut())
        .unwrap_err();
    assert!(e.to_string().contains("rmsnorm forward: weight holds 7 elements, expected 8"), "{e}");
    let w = upload::<f32>(&gpu, &[1.0; 8]);
    let (mut dw, mut ws) = (poisoned::<f32>(&gpu, 8), poisoned::<f32>(&gpu, backward_workspace_len(shape) - 1));
    let saved = Saved { x: x.as_view(), rstd: r.as_view(), weight: Some(w.as_view()) };
    let grads = Some((&mut dw.as_view_mut(), &mut ws.as_view_mut()));
    let e = backward(&gpu, shape, &saved, &x.as_view(), Some(&mut y.as_view_mut()), grads).unwrap_err();
    assert!(e.to_string().contains("rmsnorm backward: workspace holds 7 elements, expected 8"), "{e}");
}

/// The config errors a user can make in an `rmsnorm` table, each naming the key.
#[test]
fn config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    for (table, want) in [
        ("elementwise_affine = 1", "`elementwise_affine`: expected true or false, found signed int `1`"),
        ("eps = 0.0", "`model.layers[0].eps`: must be a positive number, got 0"),
        ("bias = false", "`model.layers[0].bias`: unknown key; valid keys in `model.layers[0]`: type, name, eps, elementwise_affine"),
    ] {
        let text = format!(
            "[model]\ninput_shape = [1, 2, 4]\n[[model.layers]]\ntype = \"rmsnorm\"\n{table}\n[[model.layers]]\n\
             type = \"flatten\"\n[[model.layers]]\ntype = \"linear\"\nout_features = 2\n[data]\ndataset = \"synthetic\"\nbatch_size = 4\nnum_classes = 2\n[optimizer]\nlr = 0.1\n"
        );
        std::fs::write(&path, text).unwrap();
        let e = crate::config::load(&path, &[]).unwrap_err().to_string();
        assert!(e.contains(want), "{table}: {e}");
    }
}
