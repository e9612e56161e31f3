//! f16 max pooling keeps f16 values exactly (no arithmetic, only selection).

use super::*;
use crate::tensor::DType;

#[test]
fn f16_pooling_selects_exact_values_and_routes_f16_gradients() {
    let v = vec![1.0009766, 1.0, -2.0, 65504.0, 0.5, 2f32.powi(-24), -0.0, 3.0];
    let x = Tensor::from_f32_as(&[1, 2, 2, 2], v, DType::F16).unwrap();
    let (y, idx) = forward(&x, 2, 2).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    assert_eq!(y.to_f32_vec(), vec![65504.0, 3.0]);
    assert_eq!(idx, vec![3, 3]);
    let dy = Tensor::from_f32_as(&[1, 2, 1, 1], vec![1e5, 0.1], DType::F16).unwrap();
    let dx = backward(&dy, &idx, &[1, 2, 2, 2]).unwrap();
    assert_eq!(dx.dtype(), DType::F16);
    let dx = dx.to_f32_vec();
    assert_eq!(dx[3], f32::INFINITY, "1e5 was already inf in f16");
    assert_eq!(dx[7], half::f16::from_f32(0.1).to_f32());
    assert_eq!(dx.iter().filter(|v| **v == 0.0).count(), 6);
}
