//! f16 logits: the loss is computed in f32, dlogits is rounded to f16.

use super::*;
use crate::tensor::DType;

#[test]
fn f16_logits_give_the_f32_loss_and_f16_gradients() {
    let logits = Tensor::from_f32_as(&[2, 3], vec![0.1, 2.0, -1.0, 0.5, 0.5, 3.0], DType::F16).unwrap();
    let out = forward_backward(&logits, &[1, 2], 1.0).unwrap();
    let ref32 = forward_backward(&logits.to_dtype(DType::F32), &[1, 2], 1.0).unwrap();
    assert_eq!(out.loss, ref32.loss);
    assert_eq!(out.correct, 2);
    assert_eq!(out.dlogits.dtype(), DType::F16);
    assert_eq!(out.dlogits.as_f16().unwrap(), ref32.dlogits.to_dtype(DType::F16).as_f16().unwrap());
    assert_eq!(forward(&logits, &[1, 2]).unwrap(), forward(&logits.to_dtype(DType::F32), &[1, 2]).unwrap());
}

#[test]
fn a_loss_scale_too_large_for_f16_overflows_dlogits() {
    let logits = Tensor::from_f32_as(&[1, 2], vec![0.0, 0.0], DType::F16).unwrap();
    // dlogits = scale * (0.5 - onehot): 2^17 * 0.5 = 65536 > 65504.
    let out = forward_backward(&logits, &[0], 2f32.powi(17)).unwrap();
    assert_eq!(out.dlogits.to_f32_vec(), vec![f32::NEG_INFINITY, f32::INFINITY]);
    let ok = forward_backward(&logits, &[0], 2f32.powi(16)).unwrap();
    assert_eq!(ok.dlogits.to_f32_vec(), vec![-32768.0, 32768.0]);
}
