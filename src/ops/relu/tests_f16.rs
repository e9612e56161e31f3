//! f16 ReLU: exact (selection only), in place and out of place.

use super::*;
use crate::tensor::DType;

#[test]
fn f16_relu_forward_and_backward_keep_dtype_and_values() {
    let v = vec![-1.0, 0.0, 2f32.powi(-24), 65504.0, -65504.0, 0.333];
    let x = Tensor::from_f32_as(&[6], v, DType::F16).unwrap();
    let y = forward(&x).unwrap();
    let mut y2 = x.clone();
    forward_(&mut y2).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.as_f16().unwrap(), y2.as_f16().unwrap());
    let expect = vec![0.0, 0.0, 2f32.powi(-24), 65504.0, 0.0, half::f16::from_f32(0.333).to_f32()];
    assert_eq!(y.to_f32_vec(), expect);

    let dy = Tensor::from_f32_as(&[6], vec![1.0, 1.0, 1.0, f32::INFINITY, 7.0, 0.5], DType::F16).unwrap();
    let dx = backward(&y, &dy).unwrap();
    let mut dx2 = dy.clone();
    backward_(&y, &mut dx2).unwrap();
    assert_eq!(dx.dtype(), DType::F16);
    assert_eq!(dx.as_f16().unwrap(), dx2.as_f16().unwrap());
    assert_eq!(dx.to_f32_vec(), vec![0.0, 0.0, 1.0, f32::INFINITY, 0.0, 0.5]);
}
