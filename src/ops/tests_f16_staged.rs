//! The f16 kernels that widen and round block by block (conv2d on AVX-512,
//! BatchNorm with f32 parameters, ReLU, max-pool) give bit for bit what
//! widening the whole tensor, running the f32 op and rounding gave, on
//! MNIST-sized tensors that take the parallel paths, with values that
//! overflow f16 on store, subnormals and signed zeros among them.

use super::batch_norm::{BnGrads, BnHyper, BnParams, RunningStats};
use super::{batch_norm, conv2d, max_pool2d, relu};
use crate::ops::testing::rand_vec_f32;
use crate::tensor::{DType, Tensor};

/// An f16 tensor of `shape` with random values times `scale`, salted with
/// values at f16's edges.
fn f16_tensor(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let mut v: Vec<f32> = rand_vec_f32(shape.iter().product(), seed).iter().map(|x| x * scale).collect();
    let edges = [6.0e-8, -6.0e-8, 0.0, -0.0, 65504.0, -65504.0, 1.0e-5];
    for (i, e) in edges.iter().enumerate() {
        let at = (i * 7919 + seed as usize) % v.len();
        v[at] = *e;
    }
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

fn f32_of(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F32)
}

fn same_f16(what: &str, got: &Tensor, want_f32: &Tensor) {
    assert_eq!(got.dtype(), DType::F16, "{what}");
    let want = want_f32.to_dtype(DType::F16);
    let (g, w) = (got.as_f16().unwrap(), want.as_f16().unwrap());
    let diff = g.iter().zip(w).position(|(a, b)| a.to_bits() != b.to_bits());
    assert!(diff.is_none(), "{what}: first differing element {diff:?}");
}

#[test]
fn conv2d_f16_matches_widened_f32_bitwise() {
    let args = conv2d::Conv2dArgs { stride: 1, padding: 2 };
    for (n, c, o, hw) in [(9, 1, 16, 28), (7, 16, 32, 14)] {
        let x = f16_tensor(&[n, c, hw, hw], 1, 1.0);
        let w = f16_tensor(&[o, c, 5, 5], 2, 0.2);
        let b = f16_tensor(&[o], 3, 0.1);
        let y = conv2d::forward(&x, &w, Some(&b), args).unwrap();
        same_f16("conv y", &y, &conv2d::forward(&f32_of(&x), &f32_of(&w), Some(&f32_of(&b)), args).unwrap());

        // dy large enough that some weight gradients overflow f16.
        let dy = f16_tensor(&[n, o, hw, hw], 4, 3000.0);
        let mut dw = Tensor::zeros_dtype(w.shape(), DType::F16);
        let mut db = Tensor::zeros_dtype(b.shape(), DType::F16);
        let dx = conv2d::backward(&x, &w, &dy, args, &mut dw, Some(&mut db), true).unwrap().unwrap();
        let (mut dw32, mut db32) = (Tensor::zeros(w.shape()), Tensor::zeros(b.shape()));
        let dx32 =
            conv2d::backward(&f32_of(&x), &f32_of(&w), &f32_of(&dy), args, &mut dw32, Some(&mut db32), true)
                .unwrap()
                .unwrap();
        same_f16("conv dx", &dx, &dx32);
        same_f16("conv dw", &dw, &dw32);
        same_f16("conv db", &db, &db32);
    }
}

#[test]
fn batch_norm_relu_max_pool_f16_match_widened_f32_bitwise() {
    let (n, c, hw) = (12, 16, 28);
    let x = f16_tensor(&[n, c, hw, hw], 5, 4.0);
    let (w, b) = (Tensor::from_vec(&[c], rand_vec_f32(c, 6)).unwrap(), Tensor::full(&[c], 0.25));
    let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
    let (mut rm32, mut rv32) = (rm.clone(), rv.clone());
    let (y, saved) = batch_norm::forward_train(
        &x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let (y32, saved32) = batch_norm::forward_train(
        &f32_of(&x),
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm32, running_var: &mut rv32 },
        BnHyper::default(),
    )
    .unwrap();
    same_f16("bn y", &y, &y32);
    assert_eq!(saved, saved32);
    assert_eq!(
        (rm.as_f32().unwrap(), rv.as_f32().unwrap()),
        (rm32.as_f32().unwrap(), rv32.as_f32().unwrap())
    );

    let mut r = y.clone();
    relu::forward_(&mut r).unwrap();
    let mut r32 = f32_of(&y);
    relu::forward_(&mut r32).unwrap();
    same_f16("relu y", &r, &r32);

    let (p, idx) = max_pool2d::forward(&r, 2, 2).unwrap();
    let (p32, idx32) = max_pool2d::forward(&f32_of(&r), 2, 2).unwrap();
    same_f16("pool y", &p, &p32);
    assert_eq!(idx, idx32);
    // Overlapping 3x3 windows at stride 2 add gradients in f32 before rounding.
    let (p3, idx3) = max_pool2d::forward(&r, 3, 2).unwrap();
    let dp3 = f16_tensor(p3.shape(), 7, 40000.0);
    let dr3 = max_pool2d::backward(&dp3, &idx3, r.shape()).unwrap();
    same_f16("pool3 dx", &dr3, &max_pool2d::backward(&f32_of(&dp3), &idx3, r.shape()).unwrap());

    let dp = f16_tensor(p.shape(), 8, 2.0);
    let mut dr = max_pool2d::backward(&dp, &idx, r.shape()).unwrap();
    same_f16("pool dx", &dr, &max_pool2d::backward(&f32_of(&dp), &idx, r.shape()).unwrap());
    let mut dr32 = f32_of(&dr);
    relu::backward_(&r, &mut dr).unwrap();
    relu::backward_(&f32_of(&r), &mut dr32).unwrap();
    same_f16("relu dx", &dr, &dr32);

    let (mut dw, mut db) = (Tensor::full(&[c], 0.5), Tensor::zeros(&[c]));
    let (mut dw32, mut db32) = (dw.clone(), db.clone());
    let dx = batch_norm::backward(&x, &w, &saved, &dr, BnGrads { dweight: &mut dw, dbias: &mut db }).unwrap();
    let dx32 = batch_norm::backward(
        &f32_of(&x),
        &w,
        &saved,
        &f32_of(&dr),
        BnGrads { dweight: &mut dw32, dbias: &mut db32 },
    )
    .unwrap();
    same_f16("bn dx", &dx, &dx32);
    assert_eq!(
        (dw.as_f32().unwrap(), db.as_f32().unwrap()),
        (dw32.as_f32().unwrap(), db32.as_f32().unwrap())
    );
}

#[test]
fn f16_kernels_keep_the_f32_errors() {
    let x = f16_tensor(&[2, 3, 4, 4], 9, 1.0);
    let w = Tensor::zeros(&[2]);
    let (mut rm, mut rv) = (Tensor::zeros(&[2]), Tensor::zeros(&[2]));
    let err = batch_norm::forward_train(
        &x,
        BnParams { weight: &w, bias: &w },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("batch_norm forward_train: weight") && err.contains("[3]"), "{err}");
    let one = f16_tensor(&[1, 3, 1, 1], 9, 1.0);
    let (w3, mut rm3, mut rv3) = (Tensor::zeros(&[3]), Tensor::zeros(&[3]), Tensor::zeros(&[3]));
    let err = batch_norm::forward_train(
        &one,
        BnParams { weight: &w3, bias: &w3 },
        RunningStats { running_mean: &mut rm3, running_var: &mut rv3 },
        BnHyper::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("more than 1 value per channel"), "{err}");
    let (_, idx) = max_pool2d::forward(&x, 2, 2).unwrap();
    let dy = f16_tensor(&[2, 3, 2, 2], 10, 1.0);
    let err = max_pool2d::backward(&dy, &idx, &[2, 3, 2, 2]).unwrap_err().to_string();
    assert!(err.contains("outside the 2x2 input plane"), "{err}");
}

#[test]
fn batch_norm_relu_in_one_pass_matches_the_two_ops() {
    let (n, c, hw) = (6, 16, 14);
    let (w, b) = (Tensor::from_vec(&[c], rand_vec_f32(c, 11)).unwrap(), Tensor::full(&[c], -0.125));
    // f16 activations (the one-pass kernel) and f32 ones (the two ops).
    for x in [f16_tensor(&[n, c, hw, hw], 12, 3.0), f16_tensor(&[n, c, hw, hw], 12, 3.0).to_dtype(DType::F32)]
    {
        let (mut rm, mut rv) = (Tensor::zeros(&[c]), Tensor::full(&[c], 1.0));
        let (mut rm2, mut rv2) = (rm.clone(), rv.clone());
        let (y, saved) = batch_norm::forward_train_relu(
            &x,
            BnParams { weight: &w, bias: &b },
            RunningStats { running_mean: &mut rm, running_var: &mut rv },
            BnHyper::default(),
        )
        .unwrap();
        let (mut y2, saved2) = batch_norm::forward_train(
            &x,
            BnParams { weight: &w, bias: &b },
            RunningStats { running_mean: &mut rm2, running_var: &mut rv2 },
            BnHyper::default(),
        )
        .unwrap();
        relu::forward_(&mut y2).unwrap();
        assert_eq!(y.dtype(), x.dtype());
        let bits = |t: &Tensor| t.to_f32_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&y2), "{:?}", x.dtype());
        let yv = y.to_f32_vec();
        assert!(yv.contains(&0.0) && yv.iter().any(|v| *v > 0.0), "the case must mix killed and live values");
        assert_eq!(saved, saved2);
        assert_eq!((rm.to_f32_vec(), rv.to_f32_vec()), (rm2.to_f32_vec(), rv2.to_f32_vec()));
    }
}
