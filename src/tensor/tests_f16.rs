//! f16 storage: casts round to nearest-even, overflow to inf, underflow gradually.

use super::*;

#[test]
fn f32_to_f16_rounds_to_nearest_even() {
    // 1 + 2^-11 lies halfway between 1 and the next f16 (1 + 2^-10): ties go to even (1).
    // 1 + 3*2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: ties go to even (1 + 2^-9).
    let x = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 1.0 + 1.5 * 2f32.powi(-11)];
    let t = Tensor::from_vec(&[3], x.to_vec()).unwrap().to_dtype(DType::F16);
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_f32_vec(), vec![1.0, 1.0 + 2f32.powi(-9), 1.0 + 2f32.powi(-10)]);
}

#[test]
fn f16_overflows_to_inf_and_underflows_to_subnormal_then_zero() {
    let x = vec![65504.0, 65520.0, -70000.0, 2f32.powi(-24), 2f32.powi(-26), f32::NAN];
    let t = Tensor::from_f32_as(&[6], x, DType::F16).unwrap();
    let v = t.to_f32_vec();
    assert_eq!(v[0], 65504.0, "f16 max is kept");
    assert_eq!(v[1], f32::INFINITY, "65520 rounds up past f16 max");
    assert_eq!(v[2], f32::NEG_INFINITY);
    assert_eq!(v[3], 2f32.powi(-24), "smallest subnormal is kept");
    assert_eq!(v[4], 0.0, "below half the smallest subnormal flushes to 0");
    assert!(v[5].is_nan());
}

#[test]
fn round_trip_widening_is_exact_and_accessors_check_dtype() {
    let h: Vec<f16> = [0.1f32, -3.5, 1e-5].iter().map(|&x| f16::from_f32(x)).collect();
    let t = Tensor::from_f16_vec(&[3], h.clone()).unwrap();
    assert_eq!(t.to_dtype(DType::F32).to_dtype(DType::F16).as_f16().unwrap(), h.as_slice());
    assert!(t.as_f32().is_err());
    let mut z = Tensor::zeros_dtype(&[2, 2], DType::F16);
    z.copy_from_f32(&[1.0, 2.0, 3.0, 1e6]).unwrap();
    assert_eq!(z.to_f32_vec(), vec![1.0, 2.0, 3.0, f32::INFINITY]);
    assert!(z
        .copy_from_f32(&[1.0])
        .unwrap_err()
        .to_string()
        .contains("1 values for a tensor of shape [2, 2]"));
    z.fill_(0.0);
    assert_eq!(z.into_f32_vec().unwrap(), vec![0.0; 4]);
    assert!(Tensor::from_f16_vec(&[2], vec![f16::ONE]).is_err());
}
