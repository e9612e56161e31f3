//! The AVX-512 kernels against the generic f64 kernels (which the other tests
//! check against a naive loop and finite differences).

use super::avx512;
use super::cpu::{self, ConvGeom};
use super::out_size;
use crate::ops::testing::rand_vec;
use crate::tensor::as_uninit;

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
    // Winograd F(6x6, 3x3): the ResNets' stage shapes, output sizes off the
    // 6 x 6 tiles, every padding, channels off the lanes, whole tiles only.
    (2, 16, 28, 28, 16, 3, 1),
    (2, 32, 14, 14, 32, 3, 1),
    (2, 64, 7, 7, 64, 3, 1),
    (2, 9, 10, 13, 17, 3, 0),
    (1, 8, 5, 5, 8, 3, 2),
    (3, 12, 12, 6, 20, 3, 1),
    // Enough 9x9 images (3 x 3 to a mosaic of 25 tiles) that a task's
    // images end in a partial mosaic, forward and backward.
    (80, 8, 9, 9, 8, 3, 1),
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
    avx512::forward(&g, &f32s(&x), &f32s(&w), Some(&f32s(&b)), as_uninit(&mut y));
    close(&format!("{cfg:?} y"), &y, &y64);
    let mut y = vec![f32::NAN; y64.len()];
    avx512::forward_direct(&g, &f32s(&x), &f32s(&w), Some(&f32s(&b)), as_uninit(&mut y));
    close(&format!("{cfg:?} y (direct)"), &y, &y64);

    let (mut dw64, mut db64, mut dx64) = (dw0.clone(), db0.clone(), vec![0.0; x.len()]);
    cpu::backward(&g, &x, &w, &dy, &mut dw64, Some(&mut db64), Some(&mut dx64));
    // Both weight-gradient kernels, whichever `backward` picks here.
    for pixel in [false, true] {
        let (mut dw, mut db, mut dx) = (f32s(&dw0), f32s(&db0), vec![f32::NAN; x.len()]);
        let (xf, wf, dyf) = (f32s(&x), f32s(&w), f32s(&dy));
        avx512::backward_with(&g, &xf, &wf, &dyf, &mut dw, Some(&mut db), Some(as_uninit(&mut dx)), pixel);
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
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, Some(&mut db), Some(as_uninit(&mut dx)));
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
    winograd_error((32, 16, 14, 14, 32, 5, 2), 8e-6, 4e-5);
}

/// F(6x6, 3x3) has coefficients up to 32 in its output transform, yet on
/// ResNet-20's stage shapes (28x28, 14x14, 7x7, 16 images) it measured as
/// F(4x4, 5x5) does: relative to the exact result, rms errors of 2.0-3.0e-6
/// (forward), 2.0-3.1e-6 (input gradient) and 1.9-3.2e-6 (weight gradient),
/// max errors at most 9.4e-6 of the largest value; the same bounds hold.
#[test]
fn winograd_3x3_error_stays_within_a_few_ulps_on_resnet_shapes() {
    for cfg in [(16, 16, 28, 28, 16, 3, 1), (16, 32, 14, 14, 32, 3, 1), (16, 64, 7, 7, 64, 3, 1)] {
        winograd_error(cfg, 8e-6, 4e-5);
    }
}

/// Checks Winograd's rms and max errors on `cfg` against `rms_max` and
/// `max_max` (see the tests above).
fn winograd_error(cfg: (usize, usize, usize, usize, usize, usize, usize), rms_max: f64, max_max: f64) {
    let g = geom(cfg);
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
    avx512::forward(&g, &xf, &wf, None, as_uninit(&mut y));
    let (mut dw, mut dx) = (vec![0f32; w.len()], vec![0f32; x.len()]);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, None, Some(as_uninit(&mut dx)));
    for (what, (rms, max)) in [("y", err(&y, &y64)), ("dx", err(&dx, &dx64)), ("dw", err(&dw, &dw64))] {
        eprintln!("winograd {cfg:?} {what}: rms error {rms:.2e}, max error {max:.2e} of the largest value");
        assert!(rms < rms_max && max < max_max, "winograd {cfg:?} {what}: rms error {rms:e}, max {max:e}");
    }
}

/// Milliseconds per call of ResNet-20's 3x3 stride-1 convs at batch 128,
/// Winograd against the direct kernels, interleaved (the choice in
/// `winograd::fits` rests on these): `cargo test --release --lib
/// conv_timing_resnet20 -- --ignored --nocapture`.
#[test]
#[ignore]
fn conv_timing_resnet20() {
    use std::time::Instant;
    for cfg in [(128, 16, 28, 28, 16, 3, 1), (128, 32, 14, 14, 32, 3, 1), (128, 64, 7, 7, 64, 3, 1)] {
        let g = geom(cfg);
        if !avx512::usable(&g) {
            return;
        }
        let (x, w, dy) = (
            f32s(&rand_vec(g.n * g.x_len(), 1)),
            f32s(&rand_vec(g.o * g.ckk(), 2)),
            f32s(&rand_vec(g.n * g.y_len(), 3)),
        );
        let (mut y, mut dw, mut dx) = (vec![0f32; dy.len()], vec![0f32; w.len()], vec![0f32; x.len()]);
        let ms = |f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        };
        let mut best = [f64::INFINITY; 5];
        for _ in 0..5 {
            let t = [
                ms(&mut || avx512::forward(&g, &x, &w, None, as_uninit(&mut y))),
                ms(&mut || avx512::forward_direct(&g, &x, &w, None, as_uninit(&mut y))),
                ms(&mut || avx512::backward(&g, &x, &w, &dy, &mut dw, None, Some(as_uninit(&mut dx)))),
                ms(&mut || {
                    let pixel = super::avx512::dw_pixel(&g);
                    avx512::backward_with(&g, &x, &w, &dy, &mut dw, None, Some(as_uninit(&mut dx)), pixel)
                }),
                ms(&mut || avx512::backward_winograd(&g, &x, &w, &dy, &mut dw, &mut dx)),
            ];
            for (b, v) in best.iter_mut().zip(t) {
                *b = b.min(v);
            }
        }
        eprintln!(
            "{cfg:?}: forward chosen {:.2} ms, direct {:.2} ms; backward chosen {:.2} ms, direct {:.2} ms, winograd {:.2} ms",
            best[0], best[1], best[2], best[3], best[4]
        );
    }
}
