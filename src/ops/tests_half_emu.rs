//! The AVX-512 f16 conversions against the `half` crate's (F16C where the
//! CPU has it): the same bits for every f16, and for f32 values at, beside
//! and between f16 rounding boundaries, NaN payloads included, at every
//! tail length.

use super::half_emu::{round_into, round_to_vec, widen_into, widen_to_vec};
use half::{f16, slice::HalfFloatSliceExt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn widening_equals_half_for_every_f16() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut want = vec![0.0f32; all.len()];
    all.convert_to_f32_slice(&mut want);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut got = vec![1.0f32; all.len()];
    widen_into(&all, &mut got);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&widen_to_vec(&all)), bits(&want));
    for len in 0..40 {
        let mut got = vec![1.0f32; len];
        widen_into(&all[1000..1000 + len], &mut got);
        assert_eq!(bits(&got), bits(&want[1000..1000 + len]), "length {len}");
    }
}

#[test]
fn rounding_equals_half_at_and_between_boundaries() {
    let mut src = Vec::new();
    // Every f16 widened, and the f32 values one ulp and half an f16 ulp away
    // (ties to even, and just off them), over the whole range, overflow and
    // subnormals included.
    for h in 0..=u16::MAX {
        let v = f16::from_bits(h).to_f32();
        let b = v.to_bits();
        src.extend([v, f32::from_bits(b.wrapping_add(1)), f32::from_bits(b.wrapping_sub(1))]);
        src.extend([f32::from_bits(b.wrapping_add(1 << 12)), f32::from_bits(b.wrapping_add((1 << 12) + 1))]);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    src.extend((0..100_000).map(|_| f32::from_bits(rng.random::<u32>())));
    let mut want = vec![f16::ZERO; src.len()];
    want.convert_from_f32_slice(&src);
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut got = vec![f16::ONE; src.len()];
    round_into(&src, &mut got);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&round_to_vec(&src)), bits(&want));
    for len in 0..40 {
        let mut got = vec![f16::ONE; len];
        round_into(&src[77..77 + len], &mut got);
        assert_eq!(bits(&got), bits(&want[77..77 + len]), "length {len}");
    }
}

/// CPU time of the conversions against `half`'s on an MNIST conv output
/// (100 x 16 x 28 x 28), into fresh vectors as the casts do:
/// `cargo test --release --lib widen_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn widen_timing() {
    use crate::ops::testing::cpu_ms;
    let n = 100 * 16 * 28 * 28;
    let h: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 1000) as f32 * 0.01)).collect();
    let f: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
    for _ in 0..3 {
        let t = cpu_ms();
        for _ in 0..20 {
            std::hint::black_box(widen_to_vec(&h));
        }
        let t1 = cpu_ms();
        for _ in 0..20 {
            let mut out = vec![0.0f32; n];
            h.convert_to_f32_slice(&mut out);
            std::hint::black_box(out);
        }
        let t2 = cpu_ms();
        for _ in 0..20 {
            std::hint::black_box(round_to_vec(&f));
        }
        let t3 = cpu_ms();
        for _ in 0..20 {
            let mut out = vec![f16::ZERO; n];
            out.convert_from_f32_slice(&f);
            std::hint::black_box(out);
        }
        let t4 = cpu_ms();
        println!(
            "widen {:.1} ms vs half {:.1} ms; round {:.1} vs half {:.1}",
            t1 - t,
            t2 - t1,
            t3 - t2,
            t4 - t3
        );
    }
}

/// The whole-vector conversions, split over the pool when large, give the
/// `half` crate's bits at every size around the split.
#[test]
fn vector_conversions_split_over_the_pool_give_the_same_bits() {
    for len in [0, 5, 65_535, 65_536, 65_537, 200_003] {
        let wide: Vec<f32> = crate::ops::testing::rand_vec_f32(len, 11).iter().map(|v| v * 7e4).collect();
        let want16: Vec<f16> = wide.iter().map(|&v| f16::from_f32(v)).collect();
        let got16 = round_to_vec(&wide);
        assert!(got16.iter().zip(&want16).all(|(g, w)| g.to_bits() == w.to_bits()), "round, {len}");
        assert_eq!(got16.len(), len);
        let back = widen_to_vec(&want16);
        assert!(back.iter().zip(&want16).all(|(g, w)| g.to_bits() == w.to_f32().to_bits()), "widen, {len}");
        assert_eq!(back.len(), len);
    }
}
