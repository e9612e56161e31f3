//! f16 conv2d: f16 inputs, f32 accumulation, outputs and grads rounded to f16.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

const ARGS: Conv2dArgs = Conv2dArgs { stride: 1, padding: 1 };

fn h(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

/// f16 conv2d of `x` and `w` (`[O, C, K, K]`) forward and backward equals
/// the f32 conv2d of the same values with its results rounded once.
fn same_as_f32_rounded_once(x: &[usize], w: &[usize], args: Conv2dArgs, seed: u64) {
    let len = |s: &[usize]| s.iter().product::<usize>();
    let (xt, wt, bt) = (
        h(x, rand_vec_f32(len(x), seed)),
        h(w, rand_vec_f32(len(w), seed + 1)),
        h(&w[..1], rand_vec_f32(w[0], seed + 2)),
    );
    let f = |t: &Tensor| t.to_dtype(DType::F32);
    let y = forward(&xt, &wt, Some(&bt), args).unwrap();
    let y32 = forward(&f(&xt), &f(&wt), Some(&f(&bt)), args).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.as_f16().unwrap(), y32.to_dtype(DType::F16).as_f16().unwrap(), "y of {x:?} * {w:?}");

    let dy = h(y.shape(), rand_vec_f32(y.numel(), seed + 3));
    let (mut dw, mut db) = (Tensor::zeros_dtype(w, DType::F16), Tensor::zeros_dtype(&w[..1], DType::F16));
    let dx = backward(&xt, &wt, &dy, args, &mut dw, Some(&mut db), true).unwrap().unwrap();
    let (mut dw32, mut db32) = (Tensor::zeros(w), Tensor::zeros(&w[..1]));
    let dx32 = backward(&f(&xt), &f(&wt), &f(&dy), args, &mut dw32, Some(&mut db32), true).unwrap().unwrap();
    assert_eq!(dx.as_f16().unwrap(), dx32.to_dtype(DType::F16).as_f16().unwrap(), "dx of {x:?} * {w:?}");
    assert_eq!(dw.as_f16().unwrap(), dw32.to_dtype(DType::F16).as_f16().unwrap(), "dw of {x:?} * {w:?}");
    assert_eq!(db.as_f16().unwrap(), db32.to_dtype(DType::F16).as_f16().unwrap(), "db of {x:?} * {w:?}");
}

#[test]
fn f16_forward_and_backward_match_f32_on_the_same_values_rounded_once() {
    same_as_f32_rounded_once(&[2, 3, 5, 5], &[4, 3, 3, 3], ARGS, 1);
}

#[test]
fn f16_kernels_that_widen_in_their_loads_and_round_in_their_stores_match_f32_rounded_once() {
    // MNIST's conv1 and conv2 shapes (on AVX-512: the wide-layout GEMM with
    // the pixel-lane weight gradient, and Winograd), whose f16 activations
    // are converted inside the kernels' loads and stores.
    let args = Conv2dArgs { stride: 1, padding: 2 };
    same_as_f32_rounded_once(&[3, 1, 28, 28], &[16, 1, 5, 5], args, 10);
    same_as_f32_rounded_once(&[3, 16, 14, 14], &[32, 16, 5, 5], args, 20);
    // ResNet-20's 3x3 convs: Winograd F(6x6, 3x3) at 28x28, 14x14 and 7x7.
    same_as_f32_rounded_once(&[2, 16, 28, 28], &[16, 16, 3, 3], ARGS, 30);
    same_as_f32_rounded_once(&[2, 32, 14, 14], &[32, 32, 3, 3], ARGS, 40);
    same_as_f32_rounded_once(&[2, 64, 7, 7], &[64, 64, 3, 3], ARGS, 50);
}

#[test]
fn f16_strided_convs_widen_and_round_an_image_at_a_time_and_match_f32_rounded_once() {
    // ResNet's stride-2 convs (the GEMM path, which widens each image into
    // its padded scratch, or into a copy without padding, and rounds each
    // output image), several images a task, and an odd stride and size.
    let s = |stride, padding| Conv2dArgs { stride, padding };
    same_as_f32_rounded_once(&[9, 16, 28, 28], &[32, 16, 3, 3], s(2, 1), 60);
    same_as_f32_rounded_once(&[9, 16, 28, 28], &[32, 16, 1, 1], s(2, 0), 70);
    same_as_f32_rounded_once(&[3, 32, 14, 14], &[64, 32, 3, 3], s(2, 1), 80);
    same_as_f32_rounded_once(&[2, 3, 11, 9], &[5, 3, 3, 3], s(3, 2), 90);
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
