//! f16 batch norm: statistics in f32, output in the input's dtype; f32
//! parameters with f16 activations (O2's keep_batchnorm_fp32) keep f32 state.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

fn h(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

#[test]
fn f16_input_with_fp32_params_keeps_f32_running_stats_and_rounds_outputs() {
    let x = h(&[4, 2, 3, 3], rand_vec_f32(72, 1));
    let (w, b) = (Tensor::full(&[2], 1.5), Tensor::full(&[2], 0.25));
    let (mut rm, mut rv) = (Tensor::zeros(&[2]), Tensor::full(&[2], 1.0));
    let (y, saved) = forward_train(
        &x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    assert_eq!((y.dtype(), rm.dtype(), rv.dtype()), (DType::F16, DType::F32, DType::F32));
    let (mut rm32, mut rv32) = (Tensor::zeros(&[2]), Tensor::full(&[2], 1.0));
    let (y32, saved32) = forward_train(
        &x.to_dtype(DType::F32),
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm32, running_var: &mut rv32 },
        BnHyper::default(),
    )
    .unwrap();
    assert_eq!(saved, saved32);
    assert_eq!(rm.as_f32().unwrap(), rm32.as_f32().unwrap());
    assert_eq!(y.as_f16().unwrap(), y32.to_dtype(DType::F16).as_f16().unwrap());

    let dy = h(&[4, 2, 3, 3], rand_vec_f32(72, 2));
    let (mut dw, mut db) = (Tensor::zeros(&[2]), Tensor::zeros(&[2]));
    let dx = backward(&x, &w, &saved, &dy, BnGrads { dweight: &mut dw, dbias: &mut db }).unwrap();
    assert_eq!((dx.dtype(), dw.dtype()), (DType::F16, DType::F32));
    let ev = forward_eval(
        &x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &rm, running_var: &rv },
        1e-5,
    )
    .unwrap();
    assert_eq!(ev.dtype(), DType::F16);
}

#[test]
fn all_f16_running_stats_are_rounded_on_store_and_outputs_overflow() {
    // O3: parameters and running statistics are f16 too.
    let x = h(&[2, 1, 1, 2], vec![0.0, 1.0, 2.0, 3.0]);
    let (w, b) = (h(&[1], vec![60000.0]), h(&[1], vec![0.0]));
    let (mut rm, mut rv) = (h(&[1], vec![0.0]), h(&[1], vec![1.0]));
    let (y, _) = forward_train(
        &x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    // running_mean = 0.1 * 1.5 = 0.15, stored as the nearest f16.
    assert_eq!(rm.as_f16().unwrap()[0], half::f16::from_f32(0.15));
    assert_eq!(rv.dtype(), DType::F16);
    let y = y.to_f32_vec();
    assert_eq!(y[3], f32::INFINITY, "xhat = 1.34 at x = 3; 1.34 * 60000 > 65504: {y:?}");
}

/// The f16 plane kernels (AVX-512 where the CPU has it) store, bit for bit,
/// `round(x * scale + shift)`, ReLU of that rounded value, and
/// `round(k * dy + p * x + q)` computed in f32 on widened values: planes of
/// every length 1..40 (masked tails), ResNet's 49, 196 and 784, and a tensor
/// large enough to split across threads; values that round to overflow, to
/// subnormals and to zeros of either sign, infinities and NaN.
#[test]
fn f16_plane_kernels_store_the_f32_formulas_rounded_once() {
    use half::f16 as h16;
    let special = [
        0.0f32,
        -0.0,
        1e-7,
        -1e-7,
        6e-8,
        -3e-8,
        65504.0,
        -65504.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let plane_sizes: Vec<(usize, usize, usize)> =
        (1..=40).map(|hw| (2, 3, hw)).chain([(3, 2, 49), (2, 2, 196), (2, 1, 784), (24, 2, 784)]).collect();
    for (seed, &(n, c, hw)) in plane_sizes.iter().enumerate() {
        let len = n * c * hw;
        let mut xv = rand_vec_f32(len, 100 + seed as u64);
        for (i, v) in xv.iter_mut().enumerate().filter(|(i, _)| i % 7 == 3) {
            *v = special[i % special.len()];
        }
        let x: Vec<h16> = xv.iter().map(|&v| h16::from_f32(v * 3.0)).collect();
        let dy: Vec<h16> = rand_vec_f32(len, 200 + seed as u64).iter().map(|&v| h16::from_f32(v)).collect();
        // Channel 0 overflows; the last (of several) scales by 2^-12 without
        // a shift, so tiny negative x round to -0, which ReLU keeps.
        let tiny = |ch: usize| c > 1 && ch == c - 1;
        let mean: Vec<f32> = (0..c).map(|ch| if tiny(ch) { 0.0 } else { 0.1 * ch as f32 - 0.05 }).collect();
        let invstd: Vec<f32> = (0..c).map(|ch| if tiny(ch) { 1.0 } else { 1.7 + ch as f32 }).collect();
        let weight: Vec<f32> = (0..c)
            .map(|ch| {
                if ch == 0 {
                    30000.0
                } else if tiny(ch) {
                    2f32.powi(-12)
                } else {
                    0.9
                }
            })
            .collect();
        let bias: Vec<f32> = (0..c).map(|ch| if tiny(ch) { 0.0 } else { 0.25 - 0.5 * ch as f32 }).collect();
        let (scale, shift) = cpu::affine_coefficients(c, &mean, &invstd, &weight, &bias);
        let sums = cpu::BackwardSums { sum_dy: vec![0.5; c], sum_dy_xhat: vec![-1.25; c] };
        let coef = cpu::dx_coefficients(c, &mean, &invstd, &weight, &sums, n * hw);
        let ch_of = |i: usize| i / hw % c;

        let y = f16::normalize_affine(&x, c, hw, &mean, &invstd, &weight, &bias);
        let yr = f16::normalize_affine_relu(&x, c, hw, &mean, &invstd, &weight, &bias);
        let dx = f16::backward_dx(&x, &dy, c, hw, &mean, &invstd, &weight, &sums, n * hw, None);
        for i in 0..len {
            let (ch, xf) = (ch_of(i), x[i].to_f32());
            let t = h16::from_f32(xf * scale[ch] + shift[ch]);
            let relu = if t.to_f32() < 0.0 { h16::ZERO } else { t };
            let (k, p, q) = coef[ch];
            let d = h16::from_f32(k * dy[i].to_f32() + p * xf + q);
            let what = format!("[{n}, {c}, {hw}] at {i}, x = {xf}");
            assert_eq!(y[i].to_bits(), t.to_bits(), "normalize_affine {what}");
            assert_eq!(yr[i].to_bits(), relu.to_bits(), "normalize_affine_relu {what}");
            assert_eq!(dx[i].to_bits(), d.to_bits(), "backward_dx {what}");
        }
    }
}

/// `backward_relu` (ReLU's mask recomputed inside BatchNorm's backward)
/// against what it replaces: ReLU's backward on the kept output of
/// `forward_train_relu`, then `backward`. Bit for bit in dx, dweight and
/// dbias, over planes with and without a 16-lane tail, longer than one
/// 1,024 block, and channels whose outputs round to +-0 (ReLU drops those)
/// or run into f16's overflow.
#[test]
fn fused_relu_backward_matches_relu_backward_then_batch_norm_backward() {
    for (seed, &(n, c, hh, ww)) in
        [(3, 4, 7, 5), (2, 3, 33, 33), (4, 2, 4, 4), (1, 5, 1, 19)].iter().enumerate()
    {
        let shape = [n, c, hh, ww];
        let len = n * c * hh * ww;
        let mut xv = rand_vec_f32(len, 300 + seed as u64);
        for (i, v) in xv.iter_mut().enumerate() {
            if i % 11 == 4 {
                *v = 0.0;
            }
        }
        let x = h(&shape, xv);
        // Channel 0 scales to below f16's smallest subnormal with no shift
        // (outputs round to +0 and -0, which ReLU both drops), channel 1
        // overflows, the rest are ordinary.
        let wv: Vec<f32> = (0..c).map(|ch| [2f32.powi(-30), 5e4, 1.25][ch.min(2)]).collect();
        let bv: Vec<f32> = (0..c).map(|ch| if ch == 0 { 0.0 } else { 0.1 - 0.2 * ch as f32 }).collect();
        let (w, b) = (Tensor::from_vec(&[c], wv).unwrap(), Tensor::from_vec(&[c], bv).unwrap());
        let params = BnParams { weight: &w, bias: &b };
        let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
        let running = RunningStats { running_mean: &mut rm, running_var: &mut rv };
        let (y, saved) = forward_train_relu(&x, params, running, BnHyper::default()).unwrap();
        let dy = h(&shape, rand_vec_f32(len, 400 + seed as u64));
        if !backward_relu_fits(&x, params) {
            return;
        }

        let (mut dw_a, mut db_a) = (Tensor::full(&[c], 0.5), Tensor::full(&[c], -0.5));
        let mut dz = dy.clone();
        crate::ops::relu::backward_(&y, &mut dz).unwrap();
        let grads = BnGrads { dweight: &mut dw_a, dbias: &mut db_a };
        let dx_a = backward(&x, &w, &saved, &dz, grads).unwrap();

        let (mut dw_b, mut db_b) = (Tensor::full(&[c], 0.5), Tensor::full(&[c], -0.5));
        let grads = BnGrads { dweight: &mut dw_b, dbias: &mut db_b };
        let dx_b = backward_relu(&x, params, &saved, &dy, grads).unwrap();

        let bits16 = |t: &Tensor| t.as_f16().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let bits32 = |t: &Tensor| t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits16(&dx_a), bits16(&dx_b), "dx {shape:?}");
        assert_eq!(bits32(&dw_a), bits32(&dw_b), "dweight {shape:?}");
        assert_eq!(bits32(&db_a), bits32(&db_b), "dbias {shape:?}");
        // The mask did something: some of dy was dropped and some passed.
        let dropped = bits16(&dz).iter().zip(bits16(&dy)).filter(|(a, b)| a != &b).count();
        assert!(dropped > 0 && dropped < len, "{dropped} of {len} dropped in {shape:?}");
    }
}

/// `backward_relu` outside what it fits is an error that says so, not a
/// wrong answer: f32 activations keep ReLU's output for its own backward.
#[test]
fn fused_relu_backward_refuses_f32_activations() {
    let x = Tensor::from_vec(&[2, 1, 2, 2], rand_vec_f32(8, 1)).unwrap();
    let (w, b) = (Tensor::full(&[1], 1.0), Tensor::full(&[1], 0.0));
    let params = BnParams { weight: &w, bias: &b };
    assert!(!backward_relu_fits(&x, params));
    let saved = BatchNormSaved { mean: vec![0.0], invstd: vec![1.0] };
    let (mut dw, mut db) = (Tensor::zeros(&[1]), Tensor::zeros(&[1]));
    let grads = BnGrads { dweight: &mut dw, dbias: &mut db };
    let msg = backward_relu(&x, params, &saved, &x, grads).unwrap_err().to_string();
    assert!(msg.contains("backward_relu: needs f16 x and dy"), "{msg}");
}

/// A residual block's end in one pass (`forward_train_add_relu`) against
/// BatchNorm, the add and ReLU in turn: the same f16 bits (values near zero
/// after the add, where a sum rounded to -0 or a BatchNorm output rounded
/// before the add decides the sign, included), either operand order of the
/// add, the same running statistics and saved statistics; and f32
/// activations (no fused pass) still equal to the ops in turn. Planes of
/// 40 values: the AVX-512 kernel's whole and masked vectors.
#[test]
fn fused_add_relu_forward_matches_batch_norm_then_add_then_relu() {
    let (n, c, hw) = (3, 4, 40);
    let shape = [n, c, 8, 5];
    let x = h(&shape, rand_vec_f32(n * c * hw, 21));
    let (w, b) = (Tensor::from_vec(&[c], vec![1.5, -0.5, 0.75, 2.0]).unwrap(), Tensor::full(&[c], 0.125));
    let (mut rm0, mut rv0) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
    let params = BnParams { weight: &w, bias: &b };
    // The shortcut: minus BatchNorm's output (roughly) plus a little, so
    // many sums land within an ulp of zero.
    let (z_ref, _) = forward_train(
        &x,
        params,
        RunningStats { running_mean: &mut rm0, running_var: &mut rv0 },
        BnHyper::default(),
    )
    .unwrap();
    let noise = rand_vec_f32(n * c * hw, 22);
    let s: Vec<f32> =
        z_ref.to_dtype(DType::F32).as_f32().unwrap().iter().zip(&noise).map(|(z, e)| -z + 1e-3 * e).collect();
    for dt in [DType::F16, DType::F32] {
        let (x, s) = (x.to_dtype(dt), Tensor::from_f32_as(&shape, s.clone(), dt).unwrap());
        for swap in [false, true] {
            let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
            let (y, saved) = forward_train_add_relu(
                &x,
                &s,
                params,
                RunningStats { running_mean: &mut rm, running_var: &mut rv },
                BnHyper::default(),
            )
            .unwrap();
            let (mut rm2, mut rv2) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
            let (z, saved2) = forward_train(
                &x,
                params,
                RunningStats { running_mean: &mut rm2, running_var: &mut rv2 },
                BnHyper::default(),
            )
            .unwrap();
            let mut want =
                if swap { crate::ops::add::forward(&s, &z) } else { crate::ops::add::forward(&z, &s) }
                    .unwrap();
            crate::ops::relu::forward_(&mut want).unwrap();
            assert_eq!(y.dtype(), dt);
            let bits = |t: &Tensor| {
                t.to_dtype(DType::F32).as_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(bits(&y), bits(&want), "{dt:?}, swap {swap}");
            assert_eq!(saved, saved2);
            assert_eq!(rm.as_f32().unwrap(), rm2.as_f32().unwrap());
            assert_eq!(rv.as_f32().unwrap(), rv2.as_f32().unwrap());
        }
    }
    // Some sums did land on zero or below (the ReLU had work to do).
    let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
    let s16 = Tensor::from_f32_as(&shape, s, DType::F16).unwrap();
    let (y, _) = forward_train_add_relu(
        &x,
        &s16,
        params,
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let zeros = y.as_f16().unwrap().iter().filter(|v| v.to_f32() == 0.0).count();
    assert!(zeros > n * c * hw / 4, "only {zeros} outputs at zero");
}
