//! f16 average pooling: the window is summed in f32 and rounded once, so
//! sums beyond f16's range and gradients below its precision come out as
//! the widened f32 computation rounded.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

#[test]
fn f16_sums_in_f32_and_rounds_once() {
    // Four times 65504 overflows f16, but not the f32 sum: the mean is exact.
    let v = vec![65504.0, 65504.0, 65504.0, 65504.0, 1.0, 2f32.powi(-11), 2f32.powi(-11), 2f32.powi(-11)];
    let x = Tensor::from_f32_as(&[1, 2, 2, 2], v, DType::F16).unwrap();
    let y = forward(&x, AvgPool2dArgs::global(2, 2)).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    // (1 + 3 * 2^-11) / 4 rounded once; rounding each partial sum to f16
    // would lose the 2^-11 terms (1 + 2^-11 is a tie that rounds to 1).
    let want = half::f16::from_f32((1.0 + 3.0 * 2f32.powi(-11)) / 4.0).to_f32();
    assert_eq!(y.to_f32_vec(), vec![65504.0, want]);
    assert_ne!(want, 0.25);

    let dy = Tensor::from_f32_as(&[1, 2, 1, 1], vec![65504.0, 2f32.powi(-22)], DType::F16).unwrap();
    let dx = backward(&dy, &[1, 2, 2, 2], AvgPool2dArgs::global(2, 2)).unwrap();
    assert_eq!(dx.dtype(), DType::F16);
    // 2^-22 / 4 = 2^-24 is f16's smallest subnormal, kept exactly.
    assert_eq!(dx.to_f32_vec(), [[16376.0; 4], [2f32.powi(-24); 4]].concat());
}

#[test]
fn f16_matches_the_widened_f32_op_rounded() {
    let a = AvgPool2dArgs { kernel: [3, 3], stride: [2, 2], padding: [1, 1] };
    let (n, c, h, w) = (2, 3, 9, 8);
    let x = Tensor::from_f32_as(&[n, c, h, w], rand_vec_f32(n * c * h * w, 3), DType::F16).unwrap();
    let y = forward(&x, a).unwrap();
    let want = forward(&x.to_dtype(DType::F32), a).unwrap().to_dtype(DType::F16);
    assert_eq!(y.as_f16().unwrap(), want.as_f16().unwrap());

    let dy = Tensor::from_f32_as(y.shape(), rand_vec_f32(y.numel(), 4), DType::F16).unwrap();
    let dx = backward(&dy, &[n, c, h, w], a).unwrap();
    let want = backward(&dy.to_dtype(DType::F32), &[n, c, h, w], a).unwrap().to_dtype(DType::F16);
    assert_eq!(dx.as_f16().unwrap(), want.as_f16().unwrap());
}

/// Global pooling's backward (its own path) equals the generic kernel's,
/// bit for bit, in f32 and in f16: signed zeros, subnormals, infinities,
/// NaN, values whose quotient rounds in f16.
#[test]
fn global_backward_equals_the_generic_kernel() {
    let (n, c, h, w) = (3, 5, 7, 6);
    let mut v = rand_vec_f32(n * c, 9);
    v[..6].copy_from_slice(&[-0.0, 0.0, 2f32.powi(-24), f32::INFINITY, f32::NAN, 65504.0]);
    let g = cpu::Geometry { h, w, oh: 1, ow: 1, args: AvgPool2dArgs::global(h, w) };
    for dt in [DType::F32, DType::F16] {
        let dy = Tensor::from_f32_as(&[n, c, 1, 1], v.clone(), dt).unwrap();
        let dx = backward(&dy, &[n, c, h, w], AvgPool2dArgs::global(h, w)).unwrap();
        assert_eq!(dx.dtype(), dt);
        let mut want = vec![0f32; n * c * h * w];
        cpu::backward(&dy.to_f32_vec(), g, &mut want);
        let want = Tensor::from_f32_as(&[n, c, h, w], want, dt).unwrap();
        let bits = |t: &Tensor| t.to_f32_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dx), bits(&want), "{dt:?}");
        assert!(
            dx.to_f32_vec()[..h * w].iter().all(|x| x.to_bits() == 0),
            "0 + -0 is +0, as the generic sum"
        );
    }
}
