//! GPU parity of kernels/optim.cu against [`Optimizer::step`]: several steps,
//! one of them skipped for overflow, masters, model copy and state compared
//! (the kernels reproduce the CPU's rounding, so the f32 results should be
//! the same bits; the bound is rel < 1e-6). Skips without a GPU.

use super::*;
use crate::cuda::testing::{download, upload};
use crate::ops::testing::rand_vec_f32;

const SIZES: [usize; 3] = [3, 1000, 37];

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&a, &e)) in got.iter().zip(want).enumerate() {
        let rel = (a - e).abs() / e.abs().max(1e-30);
        assert!(a.is_finite() && (a == e || rel < 1e-6), "{what}[{i}]: gpu {a} cpu {e} (rel {rel})");
    }
}

fn split(flat: &[f32]) -> Vec<Vec<f32>> {
    let mut off = 0;
    SIZES
        .iter()
        .map(|&n| {
            off += n;
            flat[off - n..off].to_vec()
        })
        .collect()
}

/// `steps` steps of `cfg` on both sides; the steps listed in `skipped` have
/// the overflow flag set (the CPU does not step then, as Amp::step).
fn parity<T: DeviceFloat>(test: &str, cfg: OptimizerConfig, with_model: bool) {
    parity_decaying::<T>(test, cfg, with_model, &[true; SIZES.len()]);
}

/// `parity` with weight decay on the parameters `decay` marks only.
fn parity_decaying<T: DeviceFloat>(test: &str, cfg: OptimizerConfig, with_model: bool, decay: &[bool]) {
    let Some(gpu) = crate::cuda::test_gpu(test) else { return };
    let total: usize = SIZES.iter().sum();
    let init = rand_vec_f32(total, 1);
    let mut cpu = Optimizer::new(cfg, &SIZES).unwrap().with_decay_mask(decay).unwrap();
    let mut cpu_params = split(&init);
    let mut dev = DeviceOptimizer::from_host(&gpu, &cpu).unwrap();
    let mut master = upload::<f32>(&gpu, &init);
    // The model copy starts poisoned: every element must be written by a step.
    let mut model = upload::<T>(&gpu, &vec![f32::NAN; total]);
    let skipped = [2usize];
    for step in 0..5 {
        let grads = rand_vec_f32(total, 100 + step as u64);
        let lr = 0.05 / (1.0 + step as f32);
        let skip = skipped.contains(&step);
        let flag = gpu.stream().clone_htod(&[i32::from(skip)]).unwrap();
        let g = upload::<f32>(&gpu, &grads);
        {
            let mut mv = model.as_view_mut();
            let model_arg = with_model.then_some(&mut mv);
            dev.step::<T>(&gpu, &mut master.as_view_mut(), &g.as_view(), model_arg, lr, &flag).unwrap();
        }
        if !skip {
            let gs = split(&grads);
            let gref: Vec<&[f32]> = gs.iter().map(Vec::as_slice).collect();
            let mut views: Vec<&mut [f32]> = cpu_params.iter_mut().map(Vec::as_mut_slice).collect();
            cpu.step(&mut views, &gref, lr).unwrap();
        }
        let want: Vec<f32> = cpu_params.concat();
        assert_close(&format!("{test} step {step} masters"), &download(&gpu, &master), &want);
        if with_model && step == 0 {
            let rounded: Vec<f32> = want.iter().map(|&v| T::from_f32(v).to_f32()).collect();
            assert_eq!(
                download(&gpu, &model),
                rounded,
                "{test}: the model copy is the masters rounded to its type"
            );
        }
    }
    let host = dev.to_host(&gpu).unwrap();
    assert_eq!(host.step_count(), cpu.step_count(), "{test}: skipped steps are not counted");
    assert_eq!(host.decay(), decay, "{test}: the decay flags come back");
    let (a, b) = (host.state_tensors(), cpu.state_tensors());
    assert_eq!(a.len(), b.len(), "{test}: state tensors");
    for ((na, ia, va), (nb, ib, vb)) in a.iter().zip(&b) {
        assert_eq!((na, ia), (nb, ib));
        assert_close(&format!("{test} state {na}[{ia}]"), va, vb);
    }
    if with_model {
        let rounded: Vec<f32> = cpu_params.concat().iter().map(|&v| T::from_f32(v).to_f32()).collect();
        assert_eq!(download(&gpu, &model), rounded, "{test}: final model copy");
    }
}

fn sgd_momentum() -> OptimizerConfig {
    OptimizerConfig { momentum: 0.9, dampening: 0.1, weight_decay: 1e-3, ..OptimizerConfig::sgd(0.05) }
}

#[test]
fn sgd_plain_matches_cpu_f32_model() {
    parity::<f32>("sgd_plain_matches_cpu_f32_model", OptimizerConfig::sgd(0.05), false);
}

#[test]
fn sgd_momentum_dampening_decay_matches_cpu_f16_model() {
    parity::<half::f16>("sgd_momentum_dampening_decay_matches_cpu_f16_model", sgd_momentum(), true);
}

#[test]
fn sgd_nesterov_matches_cpu_f32_model() {
    let cfg =
        OptimizerConfig { momentum: 0.9, nesterov: true, weight_decay: 5e-4, ..OptimizerConfig::sgd(0.05) };
    parity::<f32>("sgd_nesterov_matches_cpu_f32_model", cfg, true);
}

#[test]
fn adam_with_l2_matches_cpu_f16_model() {
    let cfg = OptimizerConfig { weight_decay: 1e-2, ..OptimizerConfig::adam(1e-3) };
    parity::<half::f16>("adam_with_l2_matches_cpu_f16_model", cfg, true);
}

#[test]
fn adamw_matches_cpu_f32_and_f16() {
    parity::<f32>("adamw_matches_cpu_f32", OptimizerConfig::adamw(1e-3), false);
    parity::<half::f16>("adamw_matches_cpu_f16", OptimizerConfig::adamw(1e-3), true);
}

/// nanoGPT's groups: the middle parameter (a LayerNorm weight, say) is not
/// decayed, its neighbours are.
#[test]
fn per_parameter_weight_decay_matches_cpu() {
    let mask = [true, false, true];
    let adamw = OptimizerConfig { weight_decay: 0.1, ..OptimizerConfig::adamw(1e-3) };
    parity_decaying::<half::f16>("per_parameter_weight_decay_matches_cpu (adamw)", adamw, true, &mask);
    let adam = OptimizerConfig { weight_decay: 1e-2, ..OptimizerConfig::adam(1e-3) };
    parity_decaying::<f32>("per_parameter_weight_decay_matches_cpu (adam)", adam, false, &mask);
    parity_decaying::<f32>(
        "per_parameter_weight_decay_matches_cpu (sgd)",
        sgd_momentum(),
        true,
        &[false, true, false],
    );
}

#[test]
fn a_state_loaded_from_the_cpu_continues_like_the_cpu() {
    let Some(gpu) = crate::cuda::test_gpu("a_state_loaded_from_the_cpu_continues_like_the_cpu") else {
        return;
    };
    let total: usize = SIZES.iter().sum();
    for cfg in [sgd_momentum(), OptimizerConfig::adam(1e-3)] {
        let mut cpu = Optimizer::new(cfg.clone(), &SIZES).unwrap();
        let mut params = split(&rand_vec_f32(total, 3));
        let gs = split(&rand_vec_f32(total, 4));
        let gref: Vec<&[f32]> = gs.iter().map(Vec::as_slice).collect();
        for _ in 0..2 {
            let mut views: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
            cpu.step(&mut views, &gref, 0.01).unwrap();
        }
        let mut dev = DeviceOptimizer::from_host(&gpu, &cpu).unwrap();
        let mut master = upload::<f32>(&gpu, &params.concat());
        let g = upload::<f32>(&gpu, &gs.concat());
        let flag = gpu.stream().clone_htod(&[0i32]).unwrap();
        dev.step::<f32>(&gpu, &mut master.as_view_mut(), &g.as_view(), None, 0.01, &flag).unwrap();
        let mut views: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
        cpu.step(&mut views, &gref, 0.01).unwrap();
        assert_close("after resume", &download(&gpu, &master), &params.concat());
        assert_eq!(dev.step_count(&gpu).unwrap(), 3);
    }
}

#[test]
fn wrong_lengths_bad_lr_and_bad_config_are_refused() {
    let Some(gpu) = crate::cuda::test_gpu("wrong_lengths_bad_lr_and_bad_config_are_refused") else { return };
    let total: usize = SIZES.iter().sum();
    let mut dev = DeviceOptimizer::new(&gpu, OptimizerConfig::sgd(0.1), &SIZES).unwrap();
    let mut master = upload::<f32>(&gpu, &vec![0.0; total]);
    let short = upload::<f32>(&gpu, &vec![0.0; total - 1]);
    let flag = gpu.stream().clone_htod(&[0i32]).unwrap();
    let e = dev.step::<f32>(&gpu, &mut master.as_view_mut(), &short.as_view(), None, 0.1, &flag).unwrap_err();
    assert!(e.to_string().contains("optimizer step: gradients holds 1039 elements, expected 1040"), "{e}");
    let g = upload::<f32>(&gpu, &vec![0.0; total]);
    let e =
        dev.step::<f32>(&gpu, &mut master.as_view_mut(), &g.as_view(), None, f32::NAN, &flag).unwrap_err();
    assert!(e.to_string().contains("learning rate NaN is not a finite number >= 0"), "{e}");
    let bad = OptimizerConfig { momentum: -1.0, ..OptimizerConfig::sgd(0.1) };
    let e = DeviceOptimizer::new(&gpu, bad, &SIZES).err().unwrap().to_string();
    assert!(e.contains("Invalid momentum value: -1"), "{e}");
}
