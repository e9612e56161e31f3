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
