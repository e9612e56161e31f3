//! Amp::step on a tiny model: skipped steps leave everything bit-identical,
//! clipping sees unscaled gradients, and master weights keep updates that
//! f16 weights round away.

use super::*;
use crate::config::OptLevel;
use crate::nn::layers::{AmpClass, LayerKind, Weights};
use crate::nn::{Model, Node, Param};
use crate::optim::{Optimizer, OptimizerConfig};
use crate::tensor::{DType, Tensor};

fn linear(w: Vec<f32>, b: Vec<f32>) -> Model {
    let out = b.len();
    let inp = w.len() / out;
    let param = |name: &str, v: Tensor| Param { name: name.into(), grad: Tensor::zeros(v.shape()), value: v };
    Model {
        layers: vec![Node {
            kind: LayerKind::Linear(crate::nn::layers::Linear {
                in_features: inp,
                out_features: out,
                bias: true,
                positions: None,
                init_std: None,
            }),
            weights: Weights {
                params: vec![
                    param("fc.weight", Tensor::from_vec(&[out, inp], w).unwrap()),
                    param("fc.bias", Tensor::from_vec(&[out], b).unwrap()),
                ],
                buffers: Vec::new(),
            },
            sync: None,
            tie: None,
        }],
        resolved: vec![crate::config::ResolvedLayer {
            name: "fc".into(),
            kind: LayerKind::Linear(crate::nn::layers::Linear {
                in_features: inp,
                out_features: out,
                bias: true,
                positions: None,
                init_std: None,
            }),
            inputs: vec![0],
            in_shape: vec![inp],
            out_shape: vec![out],
            key: "model.layers[0]".into(),
            tie: None,
        }],
        precision: Default::default(),
        draws: Default::default(),
    }
}

fn set_grads(model: &mut Model, grads: &[Vec<f32>]) {
    for (p, g) in model.params_mut().into_iter().zip(grads) {
        p.grad.copy_from_f32(g).unwrap();
    }
}

fn bits(model: &Model) -> Vec<Vec<u32>> {
    model.params().iter().map(|p| p.value.to_f32_vec().iter().map(|v| v.to_bits()).collect()).collect()
}

fn sgd_momentum(model: &Model) -> Optimizer {
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    Optimizer::new(OptimizerConfig { momentum: 0.9, weight_decay: 1e-4, ..OptimizerConfig::sgd(0.1) }, &sizes)
        .unwrap()
}

#[test]
fn an_overflowing_step_is_skipped_with_weights_and_state_bit_identical() {
    for level in [OptLevel::O1, OptLevel::O2] {
        for poison in [f32::INFINITY, f32::NAN] {
            let mut model = linear(vec![0.5, -0.25, 0.125, 1.0], vec![0.1, -0.1]);
            let policy = Policy::for_level(level);
            let mut amp = Amp::new(policy, LossScaler::dynamic(ScalerConfig::default()), &mut model);
            let mut opt = sgd_momentum(&model);
            let scale = amp.loss_scale();
            set_grads(&mut model, &[vec![scale * 0.01; 4], vec![scale * -0.02; 2]]);
            let first = amp.step(&mut model, &mut opt, 0.1, None, 1).unwrap();
            assert!(!first.skipped);
            model.params_mut().into_iter().for_each(|p| p.grad.fill_(0.0));

            let (w0, state0, count0) = (bits(&model), opt.state().to_vec(), opt.step_count());
            let masters0 = amp.masters().cloned();
            set_grads(&mut model, &[vec![1.0, poison, 1.0, 1.0], vec![1.0, 1.0]]);
            let out = amp.step(&mut model, &mut opt, 0.1, Some(1.0), 2).unwrap();
            assert!(out.skipped, "{level} {poison}");
            assert!(!out.grad_norm.is_finite(), "{level} {poison}: a skipped step's norm is not finite");
            assert_eq!(out.overflow.params, vec!["fc.weight".to_string()]);
            assert_eq!((out.loss_scale, amp.loss_scale()), (scale, scale / 2.0));
            assert_eq!(bits(&model), w0, "{level} {poison}: weights moved on a skipped step");
            assert_eq!(opt.state(), state0.as_slice(), "{level} {poison}: optimizer state moved");
            assert_eq!(opt.step_count(), count0);
            assert_eq!(amp.masters().cloned(), masters0);
            assert_eq!(amp.scaler.state().overflow_steps, 1);
        }
    }
}

#[test]
fn clipping_acts_on_unscaled_gradients() {
    let mut model = linear(vec![0.0, 0.0], vec![0.0]);
    let scaler = LossScaler::dynamic(ScalerConfig { init_scale: 1024.0, ..ScalerConfig::default() });
    let mut amp = Amp::new(Policy::for_level(OptLevel::O1), scaler, &mut model);
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    let mut opt = Optimizer::new(OptimizerConfig::sgd(1.0), &sizes).unwrap();
    // Unscaled gradient (3, 4 | 0): norm 5; scaled by 1024 it would be 5120.
    set_grads(&mut model, &[vec![3.0 * 1024.0, 4.0 * 1024.0], vec![0.0]]);
    let out = amp.step(&mut model, &mut opt, 1.0, Some(1.0), 1).unwrap();
    assert_eq!(out.grad_norm, 5.0, "the unscaled norm before clipping");
    let w = model.params()[0].value.to_f32_vec();
    let coef = 1.0 / (5.0 + 1e-6);
    assert_eq!(w, vec![-3.0 * coef, -4.0 * coef]);
    // Below the threshold nothing is scaled.
    let mut g = vec![vec![0.3f32, 0.4]];
    assert_eq!(clip_grad_norm_(&mut g, 1.0), 0.5);
    assert_eq!(g, vec![vec![0.3, 0.4]]);
}

#[test]
fn o2_state_dict_holds_the_fp32_masters() {
    let mut model = Model::new(&seed_layers(), 1).unwrap();
    let mut amp = Amp::new(Policy::for_level(OptLevel::O2), LossScaler::fixed(1.0), &mut model);
    let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
    let mut opt = Optimizer::new(OptimizerConfig::sgd(1e-4), &sizes).unwrap();
    model.params_mut().into_iter().for_each(|p| p.grad.fill_(1.0));
    amp.step(&mut model, &mut opt, 1e-4, None, 1).unwrap();
    let sd = amp.state_dict(&model).unwrap();
    let masters = amp.masters().unwrap().masters();
    let idx = model.params().iter().position(|p| p.name == "fc.weight").unwrap();
    let w = sd.iter().find(|e| e.name == "fc.weight").unwrap();
    assert_eq!(w.value, crate::nn::StateValue::F32(masters[idx].clone()));
    assert_ne!(masters[idx], model.params()[idx].value.to_f32_vec(), "the f16 copy is rounded");
    assert!(sd.iter().any(|e| e.name == "layer1.1.running_var"), "buffers are kept");
}

#[test]
fn master_weights_keep_updates_that_f16_weights_round_away() {
    // lr * grad = 1e-4 is below half an f16 ulp at 1.0 (2^-12 ~ 2.4e-4 below, 2^-11 above).
    let run = |level: OptLevel| {
        let mut model = linear(vec![1.0], vec![0.0]);
        let mut amp = Amp::new(Policy::for_level(level), LossScaler::fixed(1.0), &mut model);
        assert_eq!(model.params()[0].value.dtype(), DType::F16);
        let sizes: Vec<usize> = model.params().iter().map(|p| p.value.numel()).collect();
        let mut opt = Optimizer::new(OptimizerConfig::sgd(1e-4), &sizes).unwrap();
        for step in 1..=10 {
            set_grads(&mut model, &[vec![1.0], vec![0.0]]);
            amp.step(&mut model, &mut opt, 1e-4, None, step).unwrap();
        }
        let master = amp.masters().map(|m| m.masters()[0][0]);
        (model.params()[0].value.to_f32_vec()[0], master)
    };
    let (o3_weight, o3_master) = run(OptLevel::O3);
    assert_eq!(o3_master, None);
    assert_eq!(o3_weight, 1.0, "O3: every 1e-4 update rounds away in f16");
    let (o2_weight, o2_master) = run(OptLevel::O2);
    let master = o2_master.unwrap();
    assert!((master - 0.999).abs() < 1e-6, "O2: the f32 master accumulates 10 updates: {master}");
    assert_eq!(o2_weight, half::f16::from_f32(master).to_f32());
    assert!(o2_weight < 1.0, "O2: the f16 copy follows the master");
}

fn seed_layers() -> Vec<crate::config::ResolvedLayer> {
    let path = crate::testing::repo_root().join("configs/mnist_o0.toml");
    crate::config::model::resolve(&crate::config::load(&path, &[]).unwrap().model).unwrap()
}

#[test]
fn cast_model_follows_the_policy() {
    let resolved = seed_layers();
    for (level, conv, bn) in [
        (OptLevel::O0, DType::F32, DType::F32),
        (OptLevel::O1, DType::F32, DType::F32),
        (OptLevel::O2, DType::F16, DType::F32),
        (OptLevel::O3, DType::F16, DType::F16),
    ] {
        let mut model = Model::new(&resolved, 1).unwrap();
        cast_model(&mut model, &Policy::for_level(level));
        for layer in &model.layers {
            let w = &layer.weights;
            match layer.kind.amp_class() {
                AmpClass::Fp16 | AmpClass::Fp32 => {
                    let weight = &w.params[0];
                    assert_eq!((weight.value.dtype(), weight.grad.dtype()), (conv, conv), "{level}")
                }
                AmpClass::BatchNorm => {
                    let running_var = w.tensor(1, "batchnorm2d").unwrap();
                    assert_eq!((w.params[0].value.dtype(), running_var.dtype()), (bn, bn), "{level}")
                }
                AmpClass::Passthrough | AmpClass::Promote => {
                    assert!(w.params.is_empty() && w.buffers.is_empty())
                }
            }
        }
    }
}

#[test]
fn o1_runs_linear_in_f16_per_call_and_accumulates_into_fp32_grads() {
    // 1 + 2^-12 is not an f16: the per-call cast rounds it to 1.
    let mut model = linear(vec![1.0 + 2f32.powi(-12), 1.0], vec![0.0]);
    let _amp = Amp::new(Policy::for_level(OptLevel::O1), LossScaler::fixed(1.0), &mut model);
    assert_eq!(model.params()[0].value.dtype(), DType::F32, "O1 keeps the weights fp32");
    let x = Tensor::from_vec(&[1, 2], vec![1.0, 1.0]).unwrap();
    let (y, saved) = model.forward_train(x.clone()).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(y.as_f32().unwrap(), &[2.0], "computed with the f16 weight (f32 would give 2 + 2^-12)");
    model.backward(saved, Tensor::from_vec(&[1, 1], vec![0.5]).unwrap()).unwrap();
    let g = &model.params()[0].grad;
    assert_eq!((g.dtype(), g.to_f32_vec()), (DType::F32, vec![0.5, 0.5]));
    // A scaled gradient beyond f16's range overflows in the f16 backward, as on the GPU.
    model.zero_grad().unwrap();
    let (_, saved) = model.forward_train(x).unwrap();
    model.backward(saved, Tensor::from_vec(&[1, 1], vec![1e5]).unwrap()).unwrap();
    assert_eq!(model.params()[0].grad.to_f32_vec(), vec![f32::INFINITY; 2]);
    assert_eq!(model.params()[0].value.to_f32_vec(), vec![1.0 + 2f32.powi(-12), 1.0]);
}

#[test]
fn the_reported_norm_is_the_unscaled_pre_clip_norm_with_or_without_clipping() {
    // Same gradients at scale 1 (O0) and 2^10 (O2, f16 grads): the norm is the
    // unscaled one both ways, and the same whether clipping is on or off.
    let g = [vec![0.75f32, -1.5, 0.25, 2.0], vec![0.5, -0.125]];
    let want = (g.iter().flatten().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>()).sqrt() as f32;
    for (level, scale) in [(OptLevel::O0, 1.0f32), (OptLevel::O2, 1024.0)] {
        for clip in [None, Some(0.1f32)] {
            let mut model = linear(vec![0.5, -0.25, 0.125, 1.0], vec![0.1, -0.1]);
            let scaler = if scale == 1.0 {
                LossScaler::fixed(1.0)
            } else {
                LossScaler::dynamic(ScalerConfig { init_scale: scale, ..ScalerConfig::default() })
            };
            let mut amp = Amp::new(Policy::for_level(level), scaler, &mut model);
            let mut opt = sgd_momentum(&model);
            let scaled: Vec<Vec<f32>> = g.iter().map(|v| v.iter().map(|x| x * scale).collect()).collect();
            set_grads(&mut model, &scaled);
            let out = amp.step(&mut model, &mut opt, 0.1, clip, 1).unwrap();
            assert_eq!(out.grad_norm, want, "{level} clip {clip:?}");
            assert!(out.grad_norm > 0.1, "the reported norm is the one before clipping");
        }
    }
    assert_eq!(total_grad_norm(&g), want);
}

/// The norm of many chunks' worth of gradients: the same bits on pools of
/// 1 to 3 threads, and the f32 rounding of an f64 sum element after element.
#[test]
fn the_gradient_norm_does_not_depend_on_the_thread_count() {
    let grads: Vec<Vec<f32>> = [70_001usize, 3, 16_384, 40_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| crate::ops::testing::rand_vec_f32(n, i as u64 + 1).iter().map(|v| v * 1e3).collect())
        .collect();
    let sequential = grads.iter().flatten().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>().sqrt();
    let norms: Vec<f32> = (1..=3)
        .map(|t| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(t).build().expect("a test pool");
            pool.install(|| total_grad_norm(&grads))
        })
        .collect();
    assert!(norms.iter().all(|n| n.to_bits() == norms[0].to_bits()), "{norms:?}");
    assert!((f64::from(norms[0]) - sequential).abs() <= sequential * 1e-7, "{} vs {sequential}", norms[0]);
}
