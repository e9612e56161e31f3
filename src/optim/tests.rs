//! Optimizer tests: hand-computed first steps, and several steps against an
//! f64 reference written from PyTorch's documented algorithms (not from the
//! kernels above: it uses the textbook bias-corrected form).

use std::path::Path;

use super::*;
use crate::ops::testing::rand_vec_f32;

const SIZES: [usize; 3] = [7, 1, 33];
const STEPS: u64 = 6;

fn sgd_cfg(lr: f32, momentum: f32, dampening: f32, nesterov: bool, weight_decay: f32) -> OptimizerConfig {
    OptimizerConfig { momentum, dampening, nesterov, weight_decay, ..OptimizerConfig::sgd(lr) }
}

/// Steps `opt` on a single one-element parameter with constant gradient `g`,
/// returning the parameter after each step.
fn scalar_trajectory(cfg: OptimizerConfig, p0: f32, g: f32, steps: usize) -> Vec<f32> {
    let lr = cfg.lr;
    let mut opt = Optimizer::new(cfg, &[1]).unwrap();
    let mut p = [p0];
    (0..steps)
        .map(|_| {
            opt.step(&mut [&mut p[..]], &[&[g]], lr).unwrap();
            p[0]
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(err <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs reference {w} (error {err:e})");
    }
}

#[test]
fn sgd_momentum_known_pytorch_values() {
    // buf = 1, 1.9, 2.71; p = 1 - 0.1*1 = 0.9, 0.9 - 0.19 = 0.71, 0.71 - 0.271 = 0.439.
    let got = scalar_trajectory(sgd_cfg(0.1, 0.9, 0.0, false, 0.0), 1.0, 1.0, 3);
    assert_close(&got, &[0.9, 0.71, 0.439], 1e-6, "p");
}

#[test]
fn sgd_hand_computed_variants() {
    // Plain: p -= lr * g.
    assert_close(&scalar_trajectory(OptimizerConfig::sgd(0.1), 1.0, 2.0, 2), &[0.8, 0.6], 1e-6, "plain");
    // Nesterov: d = g + m*buf: 1.9 then 1 + 0.9*1.9 = 2.71.
    let got = scalar_trajectory(sgd_cfg(0.1, 0.9, 0.0, true, 0.0), 1.0, 1.0, 2);
    assert_close(&got, &[0.81, 0.539], 1e-6, "nesterov");
    // Dampening skipped on the first step: buf = 1, then 0.9 + 0.5*1 = 1.4.
    let got = scalar_trajectory(sgd_cfg(0.1, 0.9, 0.5, false, 0.0), 1.0, 1.0, 2);
    assert_close(&got, &[0.9, 0.76], 1e-6, "dampening");
    // Weight decay alone, zero gradient: p *= 1 - lr*wd each step.
    let got = scalar_trajectory(sgd_cfg(0.1, 0.0, 0.0, false, 0.1), 1.0, 0.0, 2);
    assert_close(&got, &[0.99, 0.9801], 1e-6, "weight decay");
}

#[test]
fn adam_first_step_moves_by_lr_times_sign() {
    for (p0, g) in [(0.5f32, 0.3f32), (0.5, -2.0), (-1.0, 1e-3)] {
        let got = scalar_trajectory(OptimizerConfig::adam(0.01), p0, g, 1);
        let want = f64::from(p0) - 0.01 * f64::from(g.signum());
        assert_close(&got, &[want], 1e-6, "adam step 1");
    }
    // With |g| == eps the step is halved: g / (|g| + eps).
    let cfg = OptimizerConfig { eps: 1e-4, ..OptimizerConfig::adam(0.01) };
    assert_close(&scalar_trajectory(cfg, 0.0, 1e-4, 1), &[-0.005], 1e-6, "eps");
    // A zero gradient leaves the parameter where it is.
    assert_eq!(scalar_trajectory(OptimizerConfig::adam(0.01), 0.25, 0.0, 3), vec![0.25; 3]);
    // Constant gradient: m_hat = g and v_hat = g^2 at every step.
    let got = scalar_trajectory(OptimizerConfig::adam(0.01), 1.0, 0.5, 3);
    assert_close(&got, &[0.99, 0.98, 0.97], 1e-6, "constant gradient");
}

#[test]
fn adam_and_adamw_weight_decay_first_step() {
    // Adam folds decay into the gradient: g' = 0.1 + 0.5*1 > 0, so one lr down.
    let cfg = OptimizerConfig { weight_decay: 0.5, ..OptimizerConfig::adam(0.01) };
    assert_close(&scalar_trajectory(cfg, 1.0, 0.1, 1), &[0.99], 1e-6, "adam");
    // Adam: g' = -0.1 + 0.5 > 0 flips the direction of the step.
    let cfg = OptimizerConfig { weight_decay: 0.5, ..OptimizerConfig::adam(0.01) };
    assert_close(&scalar_trajectory(cfg, 1.0, -0.1, 1), &[0.99], 1e-6, "adam flipped");
    // AdamW decays the weight first: 1 * (1 - 0.01*0.5) - 0.01*sign(-0.1).
    let cfg = OptimizerConfig { weight_decay: 0.5, ..OptimizerConfig::adamw(0.01) };
    assert_close(&scalar_trajectory(cfg, 1.0, -0.1, 1), &[0.995 + 0.01], 1e-6, "adamw");
}

/// Independent f64 reference, following the algorithm boxes of the PyTorch
/// docs for SGD and Adam/AdamW.
struct Reference {
    cfg: OptimizerConfig,
    params: Vec<Vec<f64>>,
    buf: Vec<Option<Vec<f64>>>,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    t: i32,
}

impl Reference {
    fn new(cfg: &OptimizerConfig, params: &[Vec<f32>]) -> Self {
        let widened: Vec<Vec<f64>> =
            params.iter().map(|p| p.iter().map(|&x| f64::from(x)).collect()).collect();
        let zeros: Vec<Vec<f64>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        Reference {
            cfg: cfg.clone(),
            params: widened,
            buf: vec![None; params.len()],
            m: zeros.clone(),
            v: zeros,
            t: 0,
        }
    }

    fn step(&mut self, grads: &[Vec<f32>], lr: f64) {
        let c = &self.cfg;
        // Hyperparameters as a Python user writes them (0.9, not 0.9f32).
        let h = |x: f32| x.to_string().parse::<f64>().unwrap();
        let (mu, tau, lambda, b1, b2, eps) =
            (h(c.momentum), h(c.dampening), h(c.weight_decay), h(c.betas.0), h(c.betas.1), h(c.eps));
        self.t += 1;
        for (i, grad) in grads.iter().enumerate() {
            let theta = &mut self.params[i];
            let mut g: Vec<f64> = grad.iter().map(|&x| f64::from(x)).collect();
            match c.kind {
                OptimizerKind::Sgd => {
                    g.iter_mut().zip(theta.iter()).for_each(|(g, p)| *g += lambda * p);
                    if mu != 0.0 {
                        let b = match self.buf[i].take() {
                            None => g.clone(),
                            Some(b) => b.iter().zip(&g).map(|(b, g)| mu * b + (1.0 - tau) * g).collect(),
                        };
                        g = if c.nesterov {
                            g.iter().zip(&b).map(|(g, b)| g + mu * b).collect()
                        } else {
                            b.clone()
                        };
                        self.buf[i] = Some(b);
                    }
                    theta.iter_mut().zip(&g).for_each(|(p, g)| *p -= lr * g);
                }
                OptimizerKind::Adam | OptimizerKind::AdamW => {
                    if c.kind == OptimizerKind::AdamW {
                        theta.iter_mut().for_each(|p| *p -= lr * lambda * *p);
                    } else {
                        g.iter_mut().zip(theta.iter()).for_each(|(g, p)| *g += lambda * p);
                    }
                    for j in 0..g.len() {
                        self.m[i][j] = b1 * self.m[i][j] + (1.0 - b1) * g[j];
                        self.v[i][j] = b2 * self.v[i][j] + (1.0 - b2) * g[j] * g[j];
                        let m_hat = self.m[i][j] / (1.0 - b1.powi(self.t));
                        let v_hat = self.v[i][j] / (1.0 - b2.powi(self.t));
                        theta[j] -= lr * m_hat / (v_hat.sqrt() + eps);
                    }
                }
            }
        }
    }
}

/// Runs `cfg` for STEPS steps on random parameters and gradients (a changing
/// lr, as from a schedule) beside the reference, comparing parameters and
/// state after every step.
fn check_against_reference(cfg: OptimizerConfig) {
    let mut params: Vec<Vec<f32>> =
        SIZES.iter().enumerate().map(|(i, &n)| rand_vec_f32(n, 100 + i as u64)).collect();
    let mut reference = Reference::new(&cfg, &params);
    let mut opt = Optimizer::new(cfg.clone(), &SIZES).unwrap();
    for step in 0..STEPS {
        let grads: Vec<Vec<f32>> =
            SIZES.iter().enumerate().map(|(i, &n)| rand_vec_f32(n, 1000 * step + i as u64)).collect();
        let lr = cfg.lr * (1.0 - 0.1 * step as f32);
        let mut views: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
        let grad_views: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        opt.step(&mut views, &grad_views, lr).unwrap();
        reference.step(&grads, widen(lr));
        let what = format!("{cfg:?} step {}", step + 1);
        for (i, p) in params.iter().enumerate() {
            assert_close(p, &reference.params[i], 1e-6, &format!("{what} param {i}"));
        }
        for (name, i, values) in opt.state_tensors() {
            let want = match name {
                "momentum_buffer" => reference.buf[i].clone().unwrap(),
                "exp_avg" => reference.m[i].clone(),
                "exp_avg_sq" => reference.v[i].clone(),
                other => panic!("unknown state {other}"),
            };
            assert_close(values, &want, 1e-6, &format!("{what} {name} {i}"));
        }
    }
    assert_eq!(opt.step_count(), STEPS);
}

#[test]
fn sgd_matches_reference() {
    check_against_reference(OptimizerConfig::sgd(0.1));
    check_against_reference(sgd_cfg(0.1, 0.9, 0.0, false, 0.0));
    check_against_reference(sgd_cfg(0.05, 0.8, 0.3, false, 0.0));
    check_against_reference(sgd_cfg(0.1, 0.9, 0.0, true, 0.0));
    check_against_reference(sgd_cfg(0.1, 0.0, 0.0, false, 1e-2));
    check_against_reference(sgd_cfg(0.1, 0.9, 0.1, false, 5e-4));
    check_against_reference(sgd_cfg(0.1, 0.9, 0.0, true, 5e-4));
}

#[test]
fn adam_matches_reference() {
    check_against_reference(OptimizerConfig::adam(1e-3));
    check_against_reference(OptimizerConfig::adam(0.05));
    check_against_reference(OptimizerConfig { weight_decay: 0.1, ..OptimizerConfig::adam(0.01) });
    check_against_reference(OptimizerConfig { betas: (0.5, 0.9), eps: 1e-3, ..OptimizerConfig::adam(0.01) });
    // beta1 >= 0.5 takes lerp's other branch.
    check_against_reference(OptimizerConfig { betas: (0.3, 0.99), ..OptimizerConfig::adam(0.01) });
}

#[test]
fn adamw_matches_reference() {
    check_against_reference(OptimizerConfig::adamw(1e-3));
    check_against_reference(OptimizerConfig { weight_decay: 0.3, ..OptimizerConfig::adamw(0.05) });
    check_against_reference(OptimizerConfig { weight_decay: 0.0, ..OptimizerConfig::adamw(0.01) });
}

#[test]
fn widen_recovers_the_written_decimal() {
    assert_eq!(widen(0.9), 0.9f64);
    assert_eq!(widen(0.999), 0.999f64);
    assert_eq!(widen(1e-8), 1e-8f64);
    assert_ne!(f64::from(0.9f32), 0.9f64);
    // Not a short decimal: stays the f32's own value to within its rounding.
    let x = 1.0f32 / 3.0;
    assert_eq!(widen(x) as f32, x);
}

fn run_steps(opt: &mut Optimizer, params: &mut [Vec<f32>], first: u64, count: u64) {
    for step in first..first + count {
        let grads: Vec<Vec<f32>> =
            params.iter().enumerate().map(|(i, p)| rand_vec_f32(p.len(), 7 * step + i as u64)).collect();
        let mut views: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
        let grad_views: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        opt.step(&mut views, &grad_views, 0.01).unwrap();
    }
}

#[test]
fn state_round_trip_resumes_bit_for_bit() {
    for cfg in [sgd_cfg(0.1, 0.9, 0.0, true, 1e-4), OptimizerConfig::adam(0.01), OptimizerConfig::adamw(0.01)]
    {
        let init: Vec<Vec<f32>> = SIZES.iter().map(|&n| rand_vec_f32(n, n as u64)).collect();
        let mut straight = Optimizer::new(cfg.clone(), &SIZES).unwrap();
        let mut straight_params = init.clone();
        run_steps(&mut straight, &mut straight_params, 0, 5);

        let mut first = Optimizer::new(cfg.clone(), &SIZES).unwrap();
        let mut resumed_params = init.clone();
        run_steps(&mut first, &mut resumed_params, 0, 3);
        let saved: Vec<(String, usize, Vec<f32>)> =
            first.state_tensors().into_iter().map(|(name, i, v)| (name.to_string(), i, v.to_vec())).collect();
        let expected = if cfg.kind == OptimizerKind::Sgd { SIZES.len() } else { 2 * SIZES.len() };
        assert_eq!(saved.len(), expected);
        let borrowed: Vec<(&str, usize, &[f32])> =
            saved.iter().map(|(n, i, v)| (n.as_str(), *i, v.as_slice())).collect();
        let mut second = Optimizer::new(cfg.clone(), &SIZES).unwrap();
        second.load_state_tensors(Path::new("optim.safetensors"), first.step_count(), &borrowed).unwrap();
        assert_eq!(second.step_count(), 3);
        assert_eq!(second.state(), first.state());
        run_steps(&mut second, &mut resumed_params, 3, 2);

        let bits = |ps: &[Vec<f32>]| ps.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&straight_params), bits(&resumed_params), "{cfg:?}");
        assert_eq!(straight.state(), second.state());
    }
}

#[test]
fn fresh_state_tensors() {
    let sgd = Optimizer::new(sgd_cfg(0.1, 0.9, 0.0, false, 0.0), &SIZES).unwrap();
    assert!(sgd.state_tensors().is_empty(), "no momentum buffer before the first step");
    let adam = Optimizer::new(OptimizerConfig::adam(0.1), &SIZES).unwrap();
    let names: Vec<(&str, usize, usize)> =
        adam.state_tensors().iter().map(|&(n, i, v)| (n, i, v.len())).collect();
    assert_eq!(names[..2], [("exp_avg", 0, 7), ("exp_avg_sq", 0, 7)]);
    assert_eq!(names.len(), 6);
}

fn err_contains<T: std::fmt::Debug>(result: Result<T>, want: &str) {
    let err = result.expect_err(want).to_string();
    assert!(err.contains(want), "error {err:?} should contain {want:?}");
}

#[test]
fn invalid_hyperparameters_are_refused() {
    let new = |cfg: OptimizerConfig| Optimizer::new(cfg, &[3]);
    err_contains(new(OptimizerConfig::sgd(-0.1)), "`lr`: Invalid learning rate: -0.1");
    err_contains(new(OptimizerConfig::adam(f32::NAN)), "Invalid learning rate: NaN");
    err_contains(new(sgd_cfg(0.1, -0.5, 0.0, false, 0.0)), "`momentum`: Invalid momentum value: -0.5");
    err_contains(new(sgd_cfg(0.1, 0.9, 0.0, false, -1.0)), "Invalid weight_decay value: -1");
    err_contains(new(sgd_cfg(0.1, 0.9, f32::INFINITY, false, 0.0)), "Invalid dampening value: inf");
    err_contains(
        new(sgd_cfg(0.1, 0.0, 0.0, true, 0.0)),
        "Nesterov momentum requires a momentum and zero dampening",
    );
    err_contains(new(sgd_cfg(0.1, 0.9, 0.1, true, 0.0)), "(momentum = 0.9, dampening = 0.1)");
    err_contains(
        new(OptimizerConfig { eps: -1.0, ..OptimizerConfig::adam(0.1) }),
        "Invalid epsilon value: -1",
    );
    err_contains(
        new(OptimizerConfig { betas: (-0.1, 0.999), ..OptimizerConfig::adamw(0.1) }),
        "Invalid beta parameter at index 0: -0.1",
    );
    err_contains(
        new(OptimizerConfig { betas: (0.9, 1.0), ..OptimizerConfig::adam(0.1) }),
        "Invalid beta parameter at index 1: 1",
    );
    err_contains(Optimizer::new(OptimizerConfig::sgd(0.1), &[]), "optimizer got an empty parameter list");
    // Fields another kind ignores are not checked.
    assert!(new(OptimizerConfig { momentum: -1.0, ..OptimizerConfig::adam(0.1) }).is_ok());
    assert!(new(OptimizerConfig { betas: (2.0, 2.0), ..OptimizerConfig::sgd(0.1) }).is_ok());
}

#[test]
fn bad_step_arguments_are_refused_and_change_nothing() {
    let mut opt = Optimizer::new(sgd_cfg(0.1, 0.9, 0.0, false, 0.0), &[2, 3]).unwrap();
    let (mut a, mut b) = (vec![1.0f32; 2], vec![1.0f32; 3]);
    let (ga, gb) = (vec![1.0f32; 2], vec![1.0f32; 3]);
    err_contains(
        opt.step(&mut [&mut a[..]], &[&ga[..]], 0.1),
        "got 1 parameter tensors and 1 gradients, expected 2",
    );
    err_contains(
        opt.step(&mut [&mut a[..], &mut b[..]], &[&ga[..]], 0.1),
        "got 2 parameter tensors and 1 gradients",
    );
    err_contains(
        opt.step(&mut [&mut a[..], &mut b[..2]], &[&ga[..], &gb[..]], 0.1),
        "parameter 1 has 2 elements, expected 3",
    );
    err_contains(
        opt.step(&mut [&mut a[..], &mut b[..]], &[&ga[..], &gb[..1]], 0.1),
        "gradient 1 has 1 elements, expected 3",
    );
    err_contains(
        opt.step(&mut [&mut a[..], &mut b[..]], &[&ga[..], &gb[..]], -0.1),
        "learning rate -0.1 for step 1",
    );
    err_contains(opt.step(&mut [&mut a[..], &mut b[..]], &[&ga[..], &gb[..]], f32::NAN), "learning rate NaN");
    assert_eq!((a.as_slice(), b.as_slice()), (&[1.0; 2][..], &[1.0; 3][..]));
    assert_eq!(opt.step_count(), 0);
    assert!(opt.state_tensors().is_empty());
}

#[test]
fn bad_checkpoint_state_is_refused_and_changes_nothing() {
    let src = Path::new("run/optim.safetensors");
    let (m, v, short) = (vec![0.5f32; 2], vec![0.25f32; 2], vec![0.0f32; 1]);
    let mut adam = Optimizer::new(OptimizerConfig::adam(0.1), &[2]).unwrap();
    let before = adam.state().to_vec();
    type Entries<'a> = Vec<(&'a str, usize, &'a [f32])>;
    let cases: [(Entries, &str); 5] = [
        (
            vec![("exp_avg", 0, &m)],
            "missing optimizer state `exp_avg_sq` for parameter 0 (Adam after 4 steps)",
        ),
        (
            vec![("exp_avg", 0, &m), ("exp_avg_sq", 0, &short)],
            "`exp_avg_sq` for parameter 0 has 1 elements, expected 2",
        ),
        (vec![("exp_avg", 0, &m), ("exp_avg", 0, &v)], "`exp_avg` for parameter 0 is given twice"),
        (vec![("exp_avg", 1, &m)], "`exp_avg` for parameter 1, but the model has 1"),
        (vec![("momentum_buffer", 0, &m)], "unexpected optimizer state `momentum_buffer` for parameter 0"),
    ];
    for (tensors, want) in cases {
        let err = adam.load_state_tensors(src, 4, &tensors).expect_err(want).to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
        assert!(err.contains("run/optim.safetensors"), "{err:?} should name the file");
    }
    assert_eq!(adam.state(), &before[..]);
    assert_eq!(adam.step_count(), 0);

    let mut sgd = Optimizer::new(sgd_cfg(0.1, 0.9, 0.0, false, 0.0), &[2]).unwrap();
    err_contains(
        sgd.load_state_tensors(src, 3, &[]),
        "missing optimizer state `momentum_buffer` for parameter 0",
    );
    err_contains(
        sgd.load_state_tensors(src, 0, &[("momentum_buffer", 0, &m)]),
        "this SGD optimizer (momentum 0.9) after 0 steps has state: none",
    );
    let mut plain = Optimizer::new(OptimizerConfig::sgd(0.1), &[2]).unwrap();
    err_contains(plain.load_state_tensors(src, 3, &[("exp_avg", 0, &m)]), "has state: none");
    // Valid loads for the same optimizers.
    sgd.load_state_tensors(src, 3, &[("momentum_buffer", 0, &m)]).unwrap();
    assert_eq!(sgd.state(), &[ParamState::Sgd { momentum_buffer: Some(m.clone()) }]);
    plain.load_state_tensors(src, 3, &[]).unwrap();
    assert_eq!(plain.step_count(), 3);
}

/// The hardware-FMA build of the update loops gives the same bits as the
/// portable one (which calls libm's `fmaf`), for every rule.
#[cfg(target_arch = "x86_64")]
#[test]
fn fma_and_portable_paths_agree_bit_for_bit() {
    if !std::arch::is_x86_feature_detected!("fma") {
        return;
    }
    let n = 1001;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (p0, g) = (rand_vec_f32(n, 1), rand_vec_f32(n, 2));
    for nesterov in [false, true] {
        let hp = sgd::SgdScalars::new(0.1, 0.9, 0.0, nesterov, 1e-4);
        let (mut pa, mut pb) = (p0.clone(), p0.clone());
        let (mut ba, mut bb) = (None, None);
        for _ in 0..3 {
            sgd::update_portable(&mut pa, &g, &mut ba, &hp);
            // SAFETY: FMA support checked above.
            unsafe { sgd::update_fma(&mut pb, &g, &mut bb, &hp) };
        }
        assert_eq!(bits(&pa), bits(&pb), "sgd nesterov={nesterov}");
    }
    for decoupled in [false, true] {
        for beta1 in [0.9, 0.2] {
            let (mut pa, mut pb) = (p0.clone(), p0.clone());
            let (mut ma, mut mb, mut va, mut vb) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
            for t in 1..4 {
                let hp = adam::AdamScalars::new(0.01, (beta1, 0.999), 1e-8, 0.1, decoupled, t);
                adam::update_portable(&mut pa, &g, &mut ma, &mut va, &hp);
                // SAFETY: FMA support checked above.
                unsafe { adam::update_fma(&mut pb, &g, &mut mb, &mut vb, &hp) };
            }
            assert_eq!(bits(&pa), bits(&pb), "adam decoupled={decoupled} beta1={beta1}");
            assert_eq!((bits(&ma), bits(&va)), (bits(&mb), bits(&vb)));
        }
    }
}

#[test]
fn param_groups_decay_only_the_masked_parameters() {
    // nanoGPT's groups: [{decay, weight_decay=0.5}, {no decay, weight_decay=0.0}].
    // Each parameter steps exactly as a one-group optimizer with its group's decay.
    for cfg in [
        OptimizerConfig { weight_decay: 0.5, ..OptimizerConfig::adamw(0.01) },
        OptimizerConfig { weight_decay: 0.5, momentum: 0.9, ..OptimizerConfig::sgd(0.01) },
    ] {
        let lr = cfg.lr;
        let mut grouped =
            Optimizer::new(cfg.clone(), &[2, 2]).unwrap().with_decay_mask(&[true, false]).unwrap();
        assert!(!grouped.decays_every_param());
        let mut decayed = Optimizer::new(cfg.clone(), &[2]).unwrap();
        let mut plain = Optimizer::new(OptimizerConfig { weight_decay: 0.0, ..cfg.clone() }, &[2]).unwrap();
        let (mut a, mut b) = ([1.0f32, -2.0], [0.5f32, 3.0]);
        let (mut a1, mut b1) = (a, b);
        for g in [[0.1f32, -0.2], [0.3, 0.05], [-0.4, 0.2]] {
            grouped.step(&mut [&mut a[..], &mut b[..]], &[&g, &g], lr).unwrap();
            decayed.step(&mut [&mut a1[..]], &[&g], lr).unwrap();
            plain.step(&mut [&mut b1[..]], &[&g], lr).unwrap();
        }
        assert_eq!((a, b), (a1, b1), "{:?}", cfg.kind);
        assert_ne!(a1, {
            let mut c = [1.0f32, -2.0];
            let mut o = Optimizer::new(OptimizerConfig { weight_decay: 0.0, ..cfg.clone() }, &[2]).unwrap();
            for g in [[0.1f32, -0.2], [0.3, 0.05], [-0.4, 0.2]] {
                o.step(&mut [&mut c[..]], &[&g], lr).unwrap();
            }
            c
        });
    }
    let err =
        Optimizer::new(OptimizerConfig::adamw(0.1), &[2, 2]).unwrap().with_decay_mask(&[true]).unwrap_err();
    assert!(err.to_string().contains("weight decay mask has 1 entries for 2 parameters"), "{err}");
    // No decay at all: one group, whatever the mask.
    let o = Optimizer::new(OptimizerConfig::adam(0.1), &[2]).unwrap().with_decay_mask(&[false]).unwrap();
    assert!(o.decays_every_param());
}
