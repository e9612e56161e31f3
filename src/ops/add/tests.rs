use super::*;
use crate::ops::testing::{rand_vec, rand_vec_f32};

#[test]
fn forward_and_accumulate_match_naive_small_and_threaded() {
    // A residual block's activation, an odd size, and one past the threaded
    // cut-off that is not a whole number of rayon chunks.
    for (seed, shape) in [vec![2, 16, 8, 8], vec![3, 5, 7], vec![1, 3, 129, 131]].into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let (a, b) = (rand_vec_f32(n, 2 * seed as u64 + 1), rand_vec_f32(n, 2 * seed as u64 + 2));
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let (ta, tb) = (Tensor::from_vec(&shape, a).unwrap(), Tensor::from_vec(&shape, b).unwrap());
        let y = forward(&ta, &tb).unwrap();
        assert_eq!(y.shape(), &shape[..]);
        assert_eq!(y.as_f32().unwrap(), &want[..], "forward {shape:?}");
        let mut acc = ta.clone();
        accumulate_(&mut acc, &tb).unwrap();
        assert_eq!(acc.as_f32().unwrap(), &want[..], "accumulate_ {shape:?}");
    }
}

#[test]
fn the_cpu_kernels_run_in_f64() {
    let (a, b) = (rand_vec(1000, 7), rand_vec(1000, 8));
    let mut y = vec![0.0f64; 1000];
    cpu::forward(&a, &b, crate::tensor::as_uninit(&mut y));
    let mut acc = a.clone();
    cpu::accumulate(&mut acc, &b);
    let want: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(y, want);
    assert_eq!(acc, want);
}

#[test]
fn special_values_follow_ieee() {
    let a = Tensor::from_vec(&[5], vec![f32::INFINITY, -0.0, f32::NAN, f32::MAX, -0.0]).unwrap();
    let b = Tensor::from_vec(&[5], vec![f32::NEG_INFINITY, 0.0, 1.0, f32::MAX, -0.0]).unwrap();
    let y = forward(&a, &b).unwrap().into_f32_vec().unwrap();
    assert!(y[0].is_nan() && y[2].is_nan(), "{y:?}");
    assert_eq!(y[1].to_bits(), 0.0f32.to_bits(), "-0 + 0 is +0");
    assert_eq!(y[3], f32::INFINITY);
    assert_eq!(y[4].to_bits(), (-0.0f32).to_bits(), "-0 + -0 is -0");
}

#[test]
fn errors_name_the_op_and_operands() {
    let (a, b) = (Tensor::zeros(&[2, 3]), Tensor::zeros(&[3, 2]));
    let m = forward(&a, &b).unwrap_err().to_string();
    assert!(m.contains("add forward: a has shape [2, 3] but b has shape [3, 2] (no broadcasting)"), "{m}");
    let mut d = Tensor::zeros(&[6]);
    let m = accumulate_(&mut d, &a).unwrap_err().to_string();
    assert!(m.contains("add accumulate_: dst has shape [6] but src has shape [2, 3]"), "{m}");
    assert_eq!(d.as_f32().unwrap(), &[0.0; 6], "dst untouched on error");
}
