//! f16 conv2d: f16 inputs, f32 accumulation, outputs and grads rounded to f16.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

const ARGS: Conv2dArgs = Conv2dArgs { stride: 1, padding: 1 };

fn h(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

#[test]
fn f16_forward_and_backward_match_f32_on_the_same_values_rounded_once() {
    let (x, w, b) = (
        h(&[2, 3, 5, 5], rand_vec_f32(150, 1)),
        h(&[4, 3, 3, 3], rand_vec_f32(108, 2)),
        h(&[4], rand_vec_f32(4, 3)),
    );
    let f = |t: &Tensor| t.to_dtype(DType::F32);
    let y = forward(&x, &w, Some(&b), ARGS).unwrap();
    let y32 = forward(&f(&x), &f(&w), Some(&f(&b)), ARGS).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.as_f16().unwrap(), y32.to_dtype(DType::F16).as_f16().unwrap());

    let dy = h(&[2, 4, 5, 5], rand_vec_f32(200, 4));
    let (mut dw, mut db) =
        (Tensor::zeros_dtype(&[4, 3, 3, 3], DType::F16), Tensor::zeros_dtype(&[4], DType::F16));
    let dx = backward(&x, &w, &dy, ARGS, &mut dw, Some(&mut db), true).unwrap().unwrap();
    let (mut dw32, mut db32) = (Tensor::zeros(&[4, 3, 3, 3]), Tensor::zeros(&[4]));
    let dx32 = backward(&f(&x), &f(&w), &f(&dy), ARGS, &mut dw32, Some(&mut db32), true).unwrap().unwrap();
    assert_eq!(dx.as_f16().unwrap(), dx32.to_dtype(DType::F16).as_f16().unwrap());
    assert_eq!(dw.as_f16().unwrap(), dw32.to_dtype(DType::F16).as_f16().unwrap());
    assert_eq!(db.as_f16().unwrap(), db32.to_dtype(DType::F16).as_f16().unwrap());
}

#[test]
fn f16_grads_overflow_to_inf_like_a_scaled_loss_on_the_gpu() {
    // A loss scale of 2^16 on dy makes the weight gradient exceed f16's range.
    let x = h(&[1, 1, 2, 2], vec![1.0; 4]);
    let w = h(&[1, 1, 1, 1], vec![1.0]);
    let dy = h(&[1, 1, 2, 2], vec![65504.0; 4]);
    let mut dw = Tensor::zeros_dtype(&[1, 1, 1, 1], DType::F16);
    let args = Conv2dArgs { stride: 1, padding: 0 };
    let dx = backward(&x, &w, &dy, args, &mut dw, None, true).unwrap().unwrap();
    assert_eq!(dw.to_f32_vec(), vec![f32::INFINITY]);
    assert!(dx.to_f32_vec().iter().all(|v| *v == 65504.0), "dx itself stays finite");
}

#[test]
fn f16_forward_underflows_small_products_to_zero() {
    let x = h(&[1, 1, 1, 1], vec![1e-4]);
    let w = h(&[1, 1, 1, 1], vec![1e-4]);
    let y = forward(&x, &w, None, Conv2dArgs { stride: 1, padding: 0 }).unwrap();
    assert_eq!(y.to_f32_vec(), vec![0.0]);
}
