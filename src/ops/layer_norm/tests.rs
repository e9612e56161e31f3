use super::cpu;
use crate::ops::testing::{check_grad, dot, rand_vec};
use crate::tensor::{DType, Tensor};

const C: usize = 6;
const N: usize = 5;

fn forward64(x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let (mut y, mut m, mut r) = (vec![0.0; x.len()], vec![0.0; N], vec![0.0; N]);
    cpu::forward(C, x, w, b, 1e-5, crate::tensor::as_uninit(&mut y), &mut m, &mut r);
    y
}

#[test]
fn forward_normalizes_each_row() {
    let x: Vec<f64> = rand_vec(N * C, 1).iter().map(|v| v * 3.0 + 1.0).collect();
    let y = forward64(&x, &[1.0; C], None);
    for row in y.chunks(C) {
        let mean = row.iter().sum::<f64>() / C as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / C as f64;
        assert!(mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-3, "mean {mean} var {var}");
    }
}

#[test]
fn backward_matches_finite_differences_with_and_without_bias() {
    let x = rand_vec(N * C, 2);
    let w: Vec<f64> = rand_vec(C, 3).iter().map(|v| v + 1.5).collect();
    let b = rand_vec(C, 4);
    let r = rand_vec(N * C, 5);
    for with_bias in [true, false] {
        let bias = with_bias.then_some(&b[..]);
        let (mut y, mut m, mut rs) = (vec![0.0; N * C], vec![0.0; N], vec![0.0; N]);
        cpu::forward(C, &x, &w, bias, 1e-5, crate::tensor::as_uninit(&mut y), &mut m, &mut rs);
        let (mut dx, mut dw, mut db) = (vec![0.0; N * C], vec![0.5; C], vec![0.25; C]);
        cpu::backward(
            C,
            &x,
            &w,
            &m,
            &rs,
            &r,
            crate::tensor::as_uninit(&mut dx),
            &mut dw,
            with_bias.then_some(&mut db[..]),
        );
        check_grad("layer_norm dx", &x, &dx, |x| dot(&r, &forward64(x, &w, bias)), 1e-6);
        // The weight's and bias's gradients were added to 0.5 and 0.25.
        let dw: Vec<f64> = dw.iter().map(|v| v - 0.5).collect();
        check_grad("layer_norm dweight", &w, &dw, |w| dot(&r, &forward64(&x, w, bias)), 1e-6);
        if with_bias {
            let db: Vec<f64> = db.iter().map(|v| v - 0.25).collect();
            check_grad("layer_norm dbias", &b, &db, |b| dot(&r, &forward64(&x, &w, Some(b))), 1e-6);
        } else {
            assert_eq!(db, vec![0.25; C], "no bias: nothing is added to a bias gradient");
        }
    }
}

#[test]
fn f16_statistics_are_f32() {
    // Values whose squares overflow f16 (>65504): f32 statistics keep the output finite.
    let xs: Vec<f32> = (0..C).map(|k| 300.0 + 10.0 * k as f32).collect();
    let x = Tensor::from_vec(&[1, C], xs).unwrap().into_dtype(DType::F16);
    let w = Tensor::full(&[C], 1.0).into_dtype(DType::F16);
    let (y, stats) = super::forward(&x, &w, None, 1e-5).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert!(y.to_f32_vec().iter().all(|v| v.is_finite()), "{:?}", y.to_f32_vec());
    assert!((stats.mean[0] - 325.0).abs() < 1e-3);
}
