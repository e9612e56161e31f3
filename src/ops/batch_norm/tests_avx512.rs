//! The AVX-512 BatchNorm kernels against the generic ones (which the other
//! tests check against the unfused ops and finite differences): bit for bit,
//! except the fused backward sums (reassociated, 1e-5 relative).

use super::avx512;
use super::cpu::plane_sums_generic;
use super::fused_cpu::{forward_plane_generic, plane_dx_generic, plane_sums_generic as pool_sums_generic};
use crate::ops::testing::rand_vec_f32;

/// (h, w) of pooled planes: odd pooled widths, one past a vector, one window.
const PLANES: &[(usize, usize)] = &[(28, 28), (14, 14), (6, 34), (2, 2), (4, 66), (10, 32), (8, 30)];

/// Values with ties inside windows, all-negative windows, zeros and NaNs.
fn input(len: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> = rand_vec_f32(len, seed).iter().map(|v| (v * 4.0).round() / 4.0 - 0.3).collect();
    for (i, v) in x.iter_mut().enumerate() {
        if i % 97 == 5 {
            *v = f32::NAN;
        } else if i % 41 == 7 {
            *v = 0.0;
        }
    }
    x
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: avx512 {a}, generic {b}");
    }
}

#[test]
fn plane_sums_equal_the_generic_bit_for_bit() {
    if !avx512::usable() {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    for (i, len) in [1usize, 15, 16, 17, 196, 784, 1023, 1024, 1025, 2500].into_iter().enumerate() {
        let p: Vec<f32> = rand_vec_f32(len, 50 + i as u64).iter().map(|v| v * 3.0 + 7.0).collect();
        let shift = p[0];
        assert_eq!(avx512::plane_sums(&p, shift), plane_sums_generic(&p, shift), "len {len}");
    }
}

#[test]
fn fused_planes_equal_the_generic() {
    if !avx512::usable() {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    for (i, &(h, w)) in PLANES.iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        let op = (h / 2) * (w / 2);
        let x = input(h * w, seed);
        let (scale, shift) = (1.3f32, -0.2f32);
        let (mut y, mut codes) = (vec![7.0f32; op], vec![9u8; op]);
        avx512::forward_plane(&x, w, scale, shift, &mut y, &mut codes);
        let (mut y0, mut codes0) = (vec![7.0f32; op], vec![9u8; op]);
        forward_plane_generic(&x, w, scale, shift, &mut y0, &mut codes0);
        same_bits(&format!("{h}x{w} y"), &y, &y0);
        assert_eq!(codes, codes0, "{h}x{w} codes");
        assert!(codes.contains(&super::fused_cpu::KILLED), "{h}x{w}: no killed window");

        // The backward on finite inputs with the codes just made.
        let x: Vec<f32> = x.iter().map(|v| if v.is_nan() { 0.5 } else { *v }).collect();
        let dy = rand_vec_f32(op, seed + 1);
        let mean = 0.1f32;
        let (s, q) = avx512::pool_plane_sums(&x, &dy, &codes, w, mean);
        let (s0, q0) = pool_sums_generic(&x, &dy, &codes, w, mean);
        let scale_s = dy.iter().map(|v| f64::from(v.abs())).sum::<f64>().max(1.0);
        let scale_q = x.iter().zip(&dy).map(|(a, b)| f64::from((a * b).abs())).sum::<f64>().max(1.0);
        assert!((s - s0).abs() <= 1e-5 * scale_s, "{h}x{w} sum dy: {s} vs {s0}");
        assert!((q - q0).abs() <= 1e-5 * scale_q, "{h}x{w} sum dy*x: {q} vs {q0}");

        let kpq = (0.7f32, -0.3f32, 0.05f32);
        let (mut dx, mut dx0) = (x.clone(), x.clone());
        avx512::pool_plane_dx(&mut dx, &dy, &codes, w, kpq);
        plane_dx_generic(&mut dx0, &dy, &codes, w, kpq);
        same_bits(&format!("{h}x{w} dx"), &dx, &dx0);
    }
}
