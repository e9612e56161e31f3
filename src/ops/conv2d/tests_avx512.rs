//! The AVX-512 kernels against the generic f64 kernels (which the other tests
//! check against a naive loop and finite differences).

use super::avx512;
use super::cpu::{self, ConvGeom};
use super::out_size;
use crate::ops::testing::rand_vec;

/// (n, c, h, w, o, k, padding): stride 1, padding < k.
const CFGS: &[(usize, usize, usize, usize, usize, usize, usize)] = &[
    (3, 1, 28, 28, 16, 5, 2),
    (4, 16, 14, 14, 32, 5, 2),
    (2, 3, 7, 5, 5, 3, 1),
    (2, 2, 6, 9, 17, 4, 0),
    (1, 5, 5, 5, 40, 5, 4),
    (3, 9, 8, 6, 3, 1, 0),
    (2, 2, 3, 3, 48, 3, 2),
    (5, 1, 4, 4, 1, 2, 1),
    (3, 1, 13, 11, 7, 3, 1),
    (2, 1, 9, 17, 21, 5, 2),
    // The direct kernels (K = 5, rows of at least 14 pixels): three channel
    // vectors (a two-vector and a one-vector block) and rows of 16 (an
    // overlapping last tile), forward and dx.
    (2, 4, 16, 16, 48, 5, 2),
    // No padding, 27 output columns, O = 20; dx with C = 4 over 31 columns.
    (2, 4, 9, 31, 20, 5, 0),
    // Forward too narrow (12 columns: GEMM tiles), dx direct (14 columns).
    (1, 6, 18, 14, 33, 5, 1),
    // Padding 4: 19 output columns, O = 17 (1 lane of the second vector).
    (2, 4, 12, 15, 17, 5, 4),
    // 31 output columns (two full tiles and an overlap), dx over 29.
    (1, 20, 6, 29, 16, 5, 3),
    // Winograd F(4x4, 5x5) (5x5, at least 8 channels each way): output
    // sizes off the 4 x 4 tiles (partial tiles), every padding, channels off
    // the 16 lanes, and whole tiles only (8 x 4).
    (3, 8, 13, 11, 9, 5, 2),
    (2, 17, 9, 7, 33, 5, 0),
    (2, 9, 6, 5, 8, 5, 4),
    (1, 8, 5, 5, 8, 5, 3),
    (5, 12, 15, 16, 20, 5, 1),
    (2, 8, 8, 4, 16, 5, 2),
];

fn geom(cfg: (usize, usize, usize, usize, usize, usize, usize)) -> ConvGeom {
    let (n, c, h, w, o, k, padding) = cfg;
    let (ho, wo) = (out_size(h, k, 1, padding), out_size(w, k, 1, padding));
    ConvGeom { n, c, h, w, o, k, stride: 1, padding, ho, wo }
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&a| a as f32).collect()
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (a, e)) in got.iter().zip(want).enumerate() {
        assert!((*a as f64 - e).abs() <= 1e-5 * scale, "{what}[{i}]: {a} vs {e}");
    }
}

fn check(cfg: (usize, usize, usize, usize, usize, usize, usize), seed: u64) {
    let g = geom(cfg);
    if !avx512::usable(&g) {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    // Inputs rounded to f32 first, so both sides multiply the same numbers.
    let r64 = |len, s| rand_vec(len, s).iter().map(|&v| v as f32 as f64).collect::<Vec<f64>>();
    let (x, w, b) = (r64(g.n * g.x_len(), seed), r64(g.o * g.ckk(), seed + 1), r64(g.o, seed + 2));
    let dy = r64(g.n * g.y_len(), seed + 3);
    let dw0 = r64(w.len(), seed + 4);
    let db0 = r64(g.o, seed + 5);

    let mut y64 = vec![0.0; g.n * g.y_len()];
    cpu::forward(&g, &x, &w, Some(&b), &mut y64);
    let mut y = vec![f32::NAN; y64.len()];
    avx512::forward(&g, &f32s(&x), &f32s(&w), Some(&f32s(&b)), avx512::as_uninit(&mut y));
    close(&format!("{cfg:?} y"), &y, &y64);
    let mut y = vec![f32::NAN; y64.len()];
    avx512::forward_direct(&g, &f32s(&x), &f32s(&w), Some(&f32s(&b)), avx512::as_uninit(&mut y));
    close(&format!("{cfg:?} y (direct)"), &y, &y64);

    let (mut dw64, mut db64, mut dx64) = (dw0.clone(), db0.clone(), vec![0.0; x.len()]);
    cpu::backward(&g, &x, &w, &dy, &mut dw64, Some(&mut db64), Some(&mut dx64));
    // Both weight-gradient kernels, whichever `backward` picks here.
    for pixel in [false, true] {
        let (mut dw, mut db, mut dx) = (f32s(&dw0), f32s(&db0), vec![f32::NAN; x.len()]);
        let (xf, wf, dyf) = (f32s(&x), f32s(&w), f32s(&dy));
        avx512::backward_with(
            &g,
            &xf,
            &wf,
            &dyf,
            &mut dw,
            Some(&mut db),
            Some(avx512::as_uninit(&mut dx)),
            pixel,
        );
        close(&format!("{cfg:?} pixel {pixel} dw"), &dw, &dw64);
        close(&format!("{cfg:?} pixel {pixel} db"), &db, &db64);
        close(&format!("{cfg:?} pixel {pixel} dx"), &dx, &dx64);

        // Without dx and bias: the same dw.
        let mut dw = f32s(&dw0);
        avx512::backward_with(&g, &xf, &wf, &dyf, &mut dw, None, None, pixel);
        close(&format!("{cfg:?} pixel {pixel} dw only"), &dw, &dw64);
    }
    // Whichever kernels `backward` picks (Winograd where it fits).
    let (xf, wf, dyf) = (f32s(&x), f32s(&w), f32s(&dy));
    let (mut dw, mut db, mut dx) = (f32s(&dw0), f32s(&db0), vec![f32::NAN; x.len()]);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, Some(&mut db), Some(avx512::as_uninit(&mut dx)));
    close(&format!("{cfg:?} dw (backward's pick)"), &dw, &dw64);
    close(&format!("{cfg:?} db (backward's pick)"), &db, &db64);
    close(&format!("{cfg:?} dx (backward's pick)"), &dx, &dx64);
    let mut dw = f32s(&dw0);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, None, None);
    close(&format!("{cfg:?} dw only (backward's pick)"), &dw, &dw64);
}

#[test]
fn avx512_matches_generic_kernels() {
    for (i, &cfg) in CFGS.iter().enumerate() {
        check(cfg, 3000 + 10 * i as u64);
    }
}

#[test]
fn avx512_matches_generic_kernels_on_three_threads() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    pool.install(|| {
        check((7, 3, 9, 8, 20, 5, 2), 4000);
        check((1, 2, 6, 6, 3, 3, 1), 4010);
        check((0, 2, 6, 6, 3, 3, 1), 4020);
    });
}

/// The checks above reach the direct kernels: MNIST's conv2 forward and its
/// input gradient take them, conv1 (25 reduction rows) does not.
#[test]
fn direct_kernels_cover_mnist_conv2() {
    use super::avx512_direct::fits;
    assert!(fits(5, 14, 16 * 25) && fits(5, 14, 32 * 25));
    assert!(!fits(5, 28, 25) && !fits(3, 14, 400) && !fits(5, 12, 400));
}

/// Winograd F(4x4, 5x5) rounds more than the direct kernels (its transforms
/// add terms of up to hundreds of times an input before the products cancel
/// back), but stays within a few f32 ulps: on MNIST's conv2 geometry,
/// measured relative to the exact result, rms errors of 1.9e-6 (forward),
/// 2.3e-6 (input gradient) and 3.1e-6 (weight gradient), max errors about
/// 5e-6 of the largest value, against 3-5e-7 rms for the direct kernels
/// (F(2x2, 5x5) measured 1.2e-6, 1.5e-6 and 3.3e-6). A transform mistake
/// that cancels on small inputs would not.
#[test]
fn winograd_error_stays_within_a_few_ulps_on_mnist_conv2() {
    let g = geom((32, 16, 14, 14, 32, 5, 2));
    if !avx512::usable(&g) {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    let r64 = |len, s| rand_vec(len, s).iter().map(|&v| v as f32 as f64).collect::<Vec<f64>>();
    let (x, w, dy) = (r64(g.n * g.x_len(), 1), r64(g.o * g.ckk(), 2), r64(g.n * g.y_len(), 3));
    let mut y64 = vec![0.0; g.n * g.y_len()];
    cpu::forward(&g, &x, &w, None, &mut y64);
    let (mut dw64, mut dx64) = (vec![0.0; w.len()], vec![0.0; x.len()]);
    cpu::backward(&g, &x, &w, &dy, &mut dw64, None, Some(&mut dx64));
    // (rms error / rms, max error / max |exact|)
    let err = |got: &[f32], want: &[f64]| {
        let rms =
            |v: &mut dyn Iterator<Item = f64>| (v.map(|e| e * e).sum::<f64>() / want.len() as f64).sqrt();
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let max = got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
        let e = rms(&mut got.iter().zip(want).map(|(a, b)| *a as f64 - b)) / rms(&mut want.iter().copied());
        (e, max / scale)
    };
    let (xf, wf, dyf) = (f32s(&x), f32s(&w), f32s(&dy));
    let mut y = vec![0f32; y64.len()];
    avx512::forward(&g, &xf, &wf, None, avx512::as_uninit(&mut y));
    let (mut dw, mut dx) = (vec![0f32; w.len()], vec![0f32; x.len()]);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, None, Some(avx512::as_uninit(&mut dx)));
    for (what, (rms, max)) in [("y", err(&y, &y64)), ("dx", err(&dx, &dx64)), ("dw", err(&dw, &dw64))] {
        eprintln!("winograd {what}: rms error {rms:.2e}, max error {max:.2e} of the largest value");
        assert!(rms < 8e-6 && max < 4e-5, "winograd {what}: rms error {rms:e}, max {max:e}");
    }
}
