//! f16 linear: f16 inputs, f32 accumulation, output rounded to f16 on store.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

fn h(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

#[test]
fn f16_forward_is_the_f32_gemm_of_the_f16_values_rounded_once() {
    let (n, i, o) = (3, 37, 5);
    let x = h(&[n, i], rand_vec_f32(n * i, 1));
    let w = h(&[o, i], rand_vec_f32(o * i, 2));
    let b = h(&[o], rand_vec_f32(o, 3));
    let y = forward(&x, &w, Some(&b)).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    let y32 =
        forward(&x.to_dtype(DType::F32), &w.to_dtype(DType::F32), Some(&b.to_dtype(DType::F32))).unwrap();
    assert_eq!(y.as_f16().unwrap(), y32.to_dtype(DType::F16).as_f16().unwrap());
    // The f16 result differs from the f32 one by at most half an f16 ulp (2^-11 relative).
    for (a, e) in y.to_f32_vec().iter().zip(y32.as_f32().unwrap()) {
        assert!((a - e).abs() <= e.abs() * 2f32.powi(-11) + 2f32.powi(-25), "{a} vs {e}");
    }
}

#[test]
fn f16_forward_overflows_to_inf_and_underflows_to_zero() {
    let x = h(&[1, 2], vec![300.0, 1e-4]);
    let w = h(&[2, 2], vec![300.0, 0.0, 0.0, 1e-4]);
    let y = forward(&x, &w, None).unwrap().to_f32_vec();
    assert_eq!(y[0], f32::INFINITY, "300*300 = 90000 > f16 max 65504");
    assert_eq!(y[1], 0.0, "1e-4 * 1e-4 = 1e-8 is below half the smallest f16 subnormal");
}

#[test]
fn f16_grads_accumulate_in_f32_and_round_once() {
    let x = h(&[2, 1], vec![2f32.powi(-12), 2f32.powi(-12)]);
    let w = h(&[1, 1], vec![1.0]);
    let dy = h(&[2, 1], vec![1.0, 1.0]);
    // dW = 1 + 2 * 2^-12 = 1 + 2^-11: a tie between 1 and 1 + 2^-10, so it rounds to even (1).
    let mut dw = h(&[1, 1], vec![1.0]);
    let mut db = h(&[1], vec![0.0]);
    let dx = backward(&x, &w, &dy, &mut dw, Some(&mut db), true).unwrap().unwrap();
    assert_eq!((dw.dtype(), db.dtype(), dx.dtype()), (DType::F16, DType::F16, DType::F16));
    assert_eq!(dw.to_f32_vec(), vec![1.0]);
    assert_eq!(db.to_f32_vec(), vec![2.0]);
    assert_eq!(dx.to_f32_vec(), vec![1.0, 1.0]);
    // A second contribution now pushes the f32 sum past the tie: 1 + 2^-11 + 2^-11 = 1 + 2^-10.
    let x2 = h(&[2, 1], vec![2f32.powi(-11), 2f32.powi(-11)]);
    backward(&x2, &w, &dy, &mut dw, None, false).unwrap();
    assert_eq!(dw.to_f32_vec(), vec![1.0 + 2f32.powi(-10)]);
}
