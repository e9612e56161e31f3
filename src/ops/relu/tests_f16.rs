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

/// Every f16 but the signalling NaNs (which the generic path's conversions
/// quiet and the AVX-512 kernels keep), in order and at every offset and
/// tail length up to 40, then all 63,488 at once (split across threads).
#[cfg(target_arch = "x86_64")]
fn every_f16() -> Vec<half::f16> {
    let signalling = |b: u16| b & 0x7c00 == 0x7c00 && b & 0x03ff != 0 && b & 0x0200 == 0;
    (0..=u16::MAX).filter(|&b| !signalling(b)).map(half::f16::from_bits).collect()
}

/// The AVX-512 kernels store the bits of the generic path (widen a block,
/// select in f32, round back).
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_f16_kernels_store_the_generic_paths_bits() {
    use crate::ops::half_emu::avx512_usable;
    if !avx512_usable() {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    let all = every_f16();
    let bits = |v: &[half::f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
    let mut cases: Vec<(usize, usize)> =
        (1..=40).flat_map(|len| (0..3).map(move |at| (at * 1000 + len, len))).collect();
    cases.push((0, all.len()));
    for (at, len) in cases {
        let (start, end) = (at.min(all.len() - len), at.min(all.len() - len) + len);
        let x = &all[start..end];
        let (mut fast, mut slow) = (x.to_vec(), x.to_vec());
        avx512_f16::forward_inplace(&mut fast);
        map_inplace(&mut slow, cpu::forward_inplace);
        assert_eq!(bits(&fast), bits(&slow), "forward over {start}..{end}");

        // Every value as y, against gradients taken from elsewhere in the range.
        let dy: Vec<half::f16> = (0..len).map(|i| all[(start + i * 7919) % all.len()]).collect();
        let (mut fast, mut slow) = (dy.clone(), dy.clone());
        avx512_f16::backward_inplace(x, &mut fast);
        zip_map_inplace(x, &mut slow, cpu::backward_inplace);
        assert_eq!(bits(&fast), bits(&slow), "backward over {start}..{end}");

        // The gradient of a value read twice: summed, then masked.
        let other: Vec<half::f16> = (0..len).map(|i| all[(start + i * 104_729 + 17) % all.len()]).collect();
        let (mut fast, mut slow) = (dy.clone(), dy.clone());
        avx512_f16::add_backward_inplace(x, &mut fast, &other);
        crate::ops::add::avx512_f16::accumulate(&mut slow, &other);
        zip_map_inplace(x, &mut slow, cpu::backward_inplace);
        assert_eq!(bits(&fast), bits(&slow), "add backward over {start}..{end}");
    }
}

/// `add_backward_` is `accumulate_` then `backward_`, bit for bit, in every
/// dtype mix (the fused kernel for f16, the two ops otherwise), and refuses
/// a gradient of another shape.
#[test]
fn add_backward_is_accumulate_then_backward() {
    let y = vec![-1.0, 0.0, -0.0, 3.0, 1e-7, 65504.0, f32::NAN, 2.0];
    let dy = vec![1.0, 2.0, 3.0, 0.1, 5.0, 65504.0, 1.0, f32::INFINITY];
    let other = vec![0.5, -2.0, 1.0, 0.2, -5.0, 65504.0, 1.0, f32::NEG_INFINITY];
    let dts = [DType::F16, DType::F32];
    for (dy_t, o_t, y_t) in dts.iter().flat_map(|&a| dts.iter().flat_map(move |&b| dts.map(|c| (a, b, c)))) {
        let t = |v: &[f32], dt| Tensor::from_f32_as(&[8], v.to_vec(), dt).unwrap();
        let (y, other) = (t(&y, y_t), t(&other, o_t));
        let mut fused = t(&dy, dy_t);
        add_backward_(&y, &mut fused, &other).unwrap();
        let mut want = t(&dy, dy_t);
        crate::ops::add::accumulate_(&mut want, &other).unwrap();
        backward_(&y, &mut want).unwrap();
        let bits = |t: &Tensor| t.to_f32_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&want), "dy {dy_t:?}, other {o_t:?}, y {y_t:?}");
    }
    let mut dy = Tensor::zeros(&[8]);
    let err = add_backward_(&Tensor::zeros(&[8]), &mut dy, &Tensor::zeros(&[4])).unwrap_err().to_string();
    assert!(err.contains("other reader's dy") && err.contains("[4]"), "{err}");
}
