//! GPU parity of kernels/amp.cu against the CPU scaler and clip_grad_norm_.
//! Skips (prints "skipped: no CUDA device") without a GPU.

use super::*;
use crate::amp::{clip_grad_norm_ as cpu_clip, Overflow};
use crate::cuda::testing::{download, poisoned, upload};
use crate::ops::testing::rand_vec_f32;
use crate::tensor::{DType, Tensor};

/// Gradients as they come out of a scaled backward: O(scale) values.
fn scaled_grads(sizes: &[usize], scale: f32, seed: u64) -> Vec<Vec<f32>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| rand_vec_f32(n, seed + i as u64).iter().map(|v| v * scale).collect())
        .collect()
}

fn unscale_case<T: DeviceFloat>(test: &str, dtype: DType) {
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    let scale = 1024.0;
    let sizes = [1usize, 257, 4099];
    for (case, poison) in
        [(0, None), (1, Some((1usize, 100usize, f32::INFINITY))), (2, Some((2, 4098, f32::NAN)))]
    {
        let mut host = scaled_grads(&sizes, scale, 10 * case);
        if let Some((b, i, v)) = poison {
            host[b][i] = v;
        }
        let tensors: Vec<Tensor> = host
            .iter()
            .zip(sizes)
            .map(|(v, n)| Tensor::from_f32_as(&[n], v.clone(), dtype).unwrap())
            .collect();
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|t| ("g", t)).collect();
        let cpu_scaler = LossScaler::dynamic(ScalerConfig { init_scale: scale, ..ScalerConfig::default() });
        let mut cpu_out = Vec::new();
        let overflow = cpu_scaler.unscale(&named, &mut cpu_out);

        let mut dev =
            DeviceScaler::dynamic(&gpu, ScalerConfig { init_scale: scale, ..ScalerConfig::default() })
                .unwrap();
        dev.begin_step(&gpu).unwrap();
        for (b, t) in tensors.iter().enumerate() {
            let g = upload::<T>(&gpu, &t.to_f32_vec());
            let mut out = poisoned(&gpu, sizes[b]);
            dev.unscale(&gpu, &g.as_view(), &mut out.as_view_mut()).unwrap();
            let got = download(&gpu, &out);
            for (i, (&a, &e)) in got.iter().zip(&cpu_out[b]).enumerate() {
                assert!(
                    a.to_bits() == e.to_bits() || (a.is_nan() && e.is_nan()),
                    "{test} case {case} buffer {b}[{i}]: gpu {a} cpu {e}"
                );
            }
        }
        assert_eq!(dev.skipped(&gpu).unwrap(), overflow.found(), "{test} case {case}: overflow flag");
    }
}

#[test]
fn unscale_matches_loss_scaler_bitwise_f32() {
    unscale_case::<f32>("unscale_matches_loss_scaler_bitwise_f32", DType::F32);
}

#[test]
fn unscale_matches_loss_scaler_bitwise_f16() {
    unscale_case::<half::f16>("unscale_matches_loss_scaler_bitwise_f16", DType::F16);
}

#[test]
fn unscale_refuses_a_wrong_output_length() {
    let Some(gpu) = crate::cuda::test_gpu("unscale_refuses_a_wrong_output_length") else { return };
    let mut dev = DeviceScaler::fixed(&gpu, 8.0).unwrap();
    let g = upload::<f32>(&gpu, &[1.0; 5]);
    let mut out = poisoned(&gpu, 4);
    let e = dev.unscale(&gpu, &g.as_view(), &mut out.as_view_mut()).unwrap_err().to_string();
    assert!(e.contains("amp unscale: out holds 4 elements, expected 5"), "{e}");
}

/// Drives the device scaler and the CPU scaler through the same sequence of
/// clean and overflowing steps and compares state and skip after each.
fn scaler_sequence(
    test: &str,
    cfg: ScalerConfig,
    overflows: &[bool],
) -> (DeviceScaler, LossScaler, Arc<Gpu>) {
    let gpu = crate::cuda::test_gpu(test).expect("caller checked");
    let mut dev = DeviceScaler::dynamic(&gpu, cfg).unwrap();
    let mut cpu = LossScaler::dynamic(cfg);
    for (step, &bad) in overflows.iter().enumerate() {
        let step = step as u64 + 1;
        let mut g = vec![0.5f32; 33];
        if bad {
            g[7] = f32::INFINITY;
        }
        dev.begin_step(&gpu).unwrap();
        let dg = upload::<f32>(&gpu, &g);
        let mut out = poisoned(&gpu, 33);
        dev.unscale(&gpu, &dg.as_view(), &mut out.as_view_mut()).unwrap();
        dev.update(&gpu, step).unwrap();
        let ov = if bad { Overflow { params: vec!["w".into()] } } else { Overflow::default() };
        match cpu.update(&ov, step) {
            Ok(skipped) => {
                assert_eq!(dev.skipped(&gpu).unwrap(), skipped, "{test} step {step}");
                assert_eq!(dev.state(&gpu).unwrap(), cpu.state(), "{test} step {step}");
                dev.check(&gpu).unwrap();
            }
            Err(_) => break,
        }
    }
    (dev, cpu, gpu)
}

use std::sync::Arc;

#[test]
fn scaler_update_grows_backs_off_and_caps_like_the_cpu_scaler() {
    let test = "scaler_update_grows_backs_off_and_caps_like_the_cpu_scaler";
    if crate::cuda::test_gpu(test).is_none() {
        return;
    }
    let cfg = ScalerConfig {
        init_scale: 256.0,
        growth_interval: 3,
        max_loss_scale: 1024.0,
        ..ScalerConfig::default()
    };
    let pattern = [
        false, false, false, true, false, false, false, false, false, false, false, false, true, true, false,
    ];
    let (dev, cpu, gpu) = scaler_sequence(test, cfg, &pattern);
    assert_eq!(dev.state(&gpu).unwrap(), cpu.state());
    assert_eq!(dev.to_host(&gpu).unwrap(), cpu);
}

#[test]
fn scaler_below_min_scale_is_the_cpu_error_and_freezes_the_weights() {
    let test = "scaler_below_min_scale_is_the_cpu_error_and_freezes_the_weights";
    if crate::cuda::test_gpu(test).is_none() {
        return;
    }
    let cfg = ScalerConfig { init_scale: 4.0, min_loss_scale: 1.0, ..ScalerConfig::default() };
    let (mut dev, _, gpu) = scaler_sequence(test, cfg, &[true, true, true]);
    let e = dev.check(&gpu).unwrap_err().to_string();
    assert!(e.contains("step 3: gradients are inf or NaN even at the minimum loss scale 1"), "{e}");
    // From then on every step is marked as overflowing, even a clean one.
    dev.begin_step(&gpu).unwrap();
    dev.update(&gpu, 4).unwrap();
    assert!(dev.skipped(&gpu).unwrap());
    assert_eq!(dev.state(&gpu).unwrap().scale, 1.0);
}

#[test]
fn static_scale_overflow_is_the_cpu_error() {
    let Some(gpu) = crate::cuda::test_gpu("static_scale_overflow_is_the_cpu_error") else { return };
    let mut dev = DeviceScaler::fixed(&gpu, 128.0).unwrap();
    for (step, v) in [(1u64, 1.0f32), (2, f32::NAN)] {
        dev.begin_step(&gpu).unwrap();
        let g = upload::<half::f16>(&gpu, &[v; 9]);
        let mut out = poisoned(&gpu, 9);
        dev.unscale(&gpu, &g.as_view(), &mut out.as_view_mut()).unwrap();
        dev.update(&gpu, step).unwrap();
    }
    assert_eq!(dev.state(&gpu).unwrap().scale, 128.0);
    let e = dev.check(&gpu).unwrap_err().to_string();
    assert!(e.contains("step 2: gradients are inf or NaN with the static loss scale 128"), "{e}");
}

#[test]
fn scaler_error_messages_name_the_step_and_scale() {
    assert!(scaler_error(0, 5, 2.0).is_none());
    let e = scaler_error(1, 5, 2.0).unwrap().to_string();
    assert!(e.contains("step 5: gradients are inf or NaN with the static loss scale 2;"), "{e}");
    let e = scaler_error(2, 7, 1.0).unwrap().to_string();
    assert!(
        e.contains("step 7: gradients are inf or NaN even at the minimum loss scale 1 (amp.min_loss_scale)"),
        "{e}"
    );
}

fn rel(a: f32, e: f32) -> f32 {
    (a - e).abs() / e.abs().max(1e-30)
}

#[test]
fn grad_norm_and_clip_match_clip_grad_norm_over_two_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("grad_norm_and_clip_match_clip_grad_norm_over_two_buffers") else {
        return;
    };
    let sizes = [1001usize, 300_017];
    for max_norm in [0.5f32, 1e6] {
        let mut host = scaled_grads(&sizes, 1.0, 77);
        let mut bufs: Vec<CudaSlice<f32>> = host.iter().map(|v| upload::<f32>(&gpu, v)).collect();
        let cpu_norm = cpu_clip(&mut host, max_norm);
        let mut ws = poisoned(&gpu, NORM_PARTIALS);
        let mut sq = poisoned(&gpu, 1);
        let mut bits = Vec::new();
        for _repeat in 0..2 {
            for (i, b) in bufs.iter().enumerate() {
                grad_norm_sq(&gpu, &b.as_view(), &mut ws.as_view_mut(), &mut sq.as_view_mut(), i > 0)
                    .unwrap();
            }
            bits.push(download(&gpu, &sq)[0].to_bits());
        }
        assert_eq!(bits[0], bits[1], "the reduction is deterministic");
        let norm = f32::from_bits(bits[0]).sqrt();
        assert!(rel(norm, cpu_norm) < 1e-5, "norm gpu {norm} cpu {cpu_norm}");
        let dev = DeviceScaler::fixed(&gpu, 1.0).unwrap();
        for (b, h) in bufs.iter_mut().zip(&host) {
            clip_grad_norm_(&gpu, &mut b.as_view_mut(), &sq.as_view(), max_norm, dev.found_inf()).unwrap();
            let got = download(&gpu, b);
            let worst =
                got.iter().zip(h).map(|(&a, &e)| (a - e).abs() / e.abs().max(1e-3)).fold(0.0f32, f32::max);
            assert!(worst < 1e-5, "max_norm {max_norm}: clipped grads differ by {worst}");
        }
    }
}

#[test]
fn clip_refuses_a_non_positive_max_norm() {
    let Some(gpu) = crate::cuda::test_gpu("clip_refuses_a_non_positive_max_norm") else { return };
    let dev = DeviceScaler::fixed(&gpu, 1.0).unwrap();
    let mut g = upload::<f32>(&gpu, &[1.0; 3]);
    let sq = upload::<f32>(&gpu, &[3.0]);
    let e = clip_grad_norm_(&gpu, &mut g.as_view_mut(), &sq.as_view(), 0.0, dev.found_inf())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_norm must be a finite number > 0, got 0"), "{e}");
}
