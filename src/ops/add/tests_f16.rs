//! f16 add: computed in f32 and rounded once; mixed dtypes promote to f32.

use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::DType;

fn f16_of(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

#[test]
fn f16_plus_f16_rounds_the_f32_sum_once() {
    let a = vec![65504.0, 1.0, 2f32.powi(-24), -3.0, 0.1];
    let b = vec![65504.0, 2f32.powi(-11), 2f32.powi(-24), 3.0, 0.2];
    let (ta, tb) = (
        Tensor::from_f32_as(&[5], a, DType::F16).unwrap(),
        Tensor::from_f32_as(&[5], b, DType::F16).unwrap(),
    );
    let y = forward(&ta, &tb).unwrap();
    assert_eq!(y.dtype(), DType::F16);
    let (a, b) = (ta.to_f32_vec(), tb.to_f32_vec());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| f16_of(x + y)).collect();
    assert_eq!(y.to_f32_vec(), want);
    assert_eq!(want[0], f32::INFINITY, "overflows f16 on the store");
    assert_eq!(want[1], 1.0, "1 + 2^-11 is a tie, rounded to even");
    assert_eq!(want[2], 2f32.powi(-23), "subnormals add exactly");
    let mut acc = ta.clone();
    accumulate_(&mut acc, &tb).unwrap();
    assert_eq!(acc.dtype(), DType::F16);
    assert_eq!(acc.as_f16().unwrap(), y.as_f16().unwrap());
}

#[test]
fn mixed_dtypes_promote_to_f32_and_accumulate_keeps_dst_dtype() {
    let n = 3 * 4096 + 17; // several staging blocks and a partial one
    let (a, b) = (rand_vec_f32(n, 1), rand_vec_f32(n, 2));
    let a16 = Tensor::from_f32_as(&[n], a.clone(), DType::F16).unwrap();
    let b32 = Tensor::from_vec(&[n], b.clone()).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| f16_of(*x) + y).collect();
    for y in [forward(&a16, &b32).unwrap(), forward(&b32, &a16).unwrap()] {
        assert_eq!(y.dtype(), DType::F32);
        assert_eq!(y.as_f32().unwrap(), &want[..]);
    }

    // f32 dst, f16 src: the f16 values widened and added in f32.
    let mut d32 = b32.clone();
    accumulate_(&mut d32, &a16).unwrap();
    assert_eq!(d32.dtype(), DType::F32);
    assert_eq!(d32.as_f32().unwrap(), &want[..]);

    // f16 dst, f32 src: the f32 sum rounded once into f16.
    let mut d16 = a16.clone();
    accumulate_(&mut d16, &b32).unwrap();
    assert_eq!(d16.dtype(), DType::F16);
    let want16: Vec<f32> = want.iter().map(|&v| f16_of(v)).collect();
    assert_eq!(d16.to_f32_vec(), want16);
}

#[test]
fn many_small_f16_gradients_accumulate_like_f32_rounded_each_step() {
    // Each += rounds once: 2048 + 1 is a tie in f16 and stays 2048, while
    // the f32 sum of the same terms would move.
    let mut dst = Tensor::from_f32_as(&[1], vec![2048.0], DType::F16).unwrap();
    let one = Tensor::from_f32_as(&[1], vec![1.0], DType::F16).unwrap();
    for _ in 0..4 {
        accumulate_(&mut dst, &one).unwrap();
    }
    assert_eq!(dst.to_f32_vec(), vec![2048.0]);
    let three = Tensor::from_vec(&[1], vec![3.0]).unwrap();
    accumulate_(&mut dst, &three).unwrap();
    assert_eq!(dst.to_f32_vec(), vec![2052.0], "2051 rounds to even 2052");
}

/// The AVX-512 kernels store the bits of the generic path (widen blocks of
/// both, add in f32, round): every f16 that is not a NaN against a value
/// from elsewhere in that range (overflow, ties, subnormals, infinities,
/// zeros of both signs), a NaN operand on either side, every tail length up
/// to 40 and a tensor split across threads.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_f16_kernels_store_the_generic_paths_bits() {
    use crate::ops::half_emu::{avx512_usable, zip_map_inplace};
    use half::f16;
    if !avx512_usable() {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    let mut a: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|h| !h.is_nan()).collect();
    let n = a.len();
    let mut b: Vec<f16> = (0..n).map(|i| a[(i * 7919 + 13) % n]).collect();
    a[5] = f16::NAN;
    b[9] = f16::NAN;
    let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
    let mut slow = a.clone();
    zip_map_inplace(&b, &mut slow, |s, d| super::cpu::accumulate(d, s));
    for len in (1..=40).chain([n]) {
        let (x, y) = (&a[..len], &b[..len]);
        assert_eq!(bits(&avx512_f16::forward(x, y)), bits(&slow[..len]), "forward of {len}");
        let mut acc = x.to_vec();
        avx512_f16::accumulate(&mut acc, y);
        assert_eq!(bits(&acc), bits(&slow[..len]), "accumulate of {len}");
    }
}
