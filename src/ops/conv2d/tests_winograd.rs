//! Winograd F(6x6, 3x3) against the direct AVX-512 kernels, conv by conv, on
//! the ResNets' 3x3 stride-1 shapes: forward, input gradient and weight
//! gradient, for every image count from 1 to 4 and counts that leave a
//! partial mosaic or batch of mosaics (see `winograd::Mosaic` and
//! `winograd::batch`), on 1, 2 and 3 threads, with
//! activation-like inputs (ReLU outputs: half zeros, the rest positive).
//! The bounds are rounding's, about 3x what was measured here (at most
//! 9.8e-6 of the output's largest magnitude, rms 3.1e-6 of its rms; 9e-6 at
//! most inside ResNet-20's training step), while a wrong edge tile, a
//! dropped image or an `=` for a `+=` is off by the size of the values
//! themselves (NaN where the kernels leave an element unwritten).

use super::avx512;
use super::cpu::ConvGeom;
use crate::ops::testing::rand_vec_f32;

/// Largest difference allowed, relative to the reference's largest magnitude.
const MAX_REL: f64 = 3e-5;
/// Root-mean-square difference allowed, relative to the reference's rms.
const RMS_REL: f64 = 1e-5;

/// `(max |a - b| / max |b|, rms(a - b) / rms(b))`; NaN anywhere in `a`
/// (an element never written) fails the comparison that follows.
fn errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut peak, mut max, mut sq, mut sq_b) = (0f64, 0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let d = (*x as f64 - *y as f64).abs();
        max = if d.is_nan() { f64::NAN } else { max.max(d) };
        sq += d * d;
        peak = peak.max((*y as f64).abs());
        sq_b += *y as f64 * *y as f64;
    }
    (max / peak, (sq / sq_b).sqrt())
}

fn assert_close(what: &str, a: &[f32], b: &[f32]) {
    let (max, rms) = errors(a, b);
    assert!(max <= MAX_REL && rms <= RMS_REL, "{what}: max error {max:e} of the peak, rms {rms:e}");
}

/// Compares the kernels [`avx512::forward`] and [`avx512::backward`] pick
/// (Winograd where it fits) with the direct ones on `n` images of `c x s x
/// s` to `c` channels (ResNet's stride-1 convs keep their width), padding 1.
fn check(n: usize, c: usize, s: usize, seed: u64) {
    let g = ConvGeom { n, c, h: s, w: s, o: c, k: 3, stride: 1, padding: 1, ho: s, wo: s };
    if !avx512::usable(&g) {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    let (fwd, bwd) = avx512::takes_winograd(&g);
    assert!(fwd, "{g:?}: the forward should take Winograd");
    let what = format!("n {n}, {c} channels, {s}x{s}, {} threads", rayon::current_num_threads());
    let x: Vec<f32> = rand_vec_f32(n * g.x_len(), seed).into_iter().map(|v| v.max(0.0)).collect();
    let w: Vec<f32> =
        rand_vec_f32(c * g.ckk(), seed + 1).iter().map(|v| v / (3.0 * c as f32).sqrt()).collect();
    let dy = rand_vec_f32(n * g.y_len(), seed + 2);
    let (dw0, db0) = (rand_vec_f32(w.len(), seed + 3), rand_vec_f32(c, seed + 4));

    let (mut y, mut y_ref) = (vec![f32::NAN; dy.len()], vec![f32::NAN; dy.len()]);
    avx512::forward(&g, &x, &w, None, crate::tensor::as_uninit(&mut y));
    avx512::forward_direct(&g, &x, &w, None, crate::tensor::as_uninit(&mut y_ref));
    assert_close(&format!("{what}: y"), &y, &y_ref);
    assert_ne!(y, y_ref, "{what}: Winograd's rounding should differ from the direct kernels'");

    // dw and db are added into (from values of their own size, so a kernel
    // that overwrote them would be off by as much), dx written in full.
    let (mut dw, mut db, mut dx) = (dw0.clone(), db0.clone(), vec![f32::NAN; x.len()]);
    avx512::backward(&g, &x, &w, &dy, &mut dw, Some(&mut db), Some(crate::tensor::as_uninit(&mut dx)));
    let (mut dw_ref, mut db_ref, mut dx_ref) = (dw0.clone(), db0.clone(), vec![f32::NAN; x.len()]);
    let pixel = avx512::dw_pixel(&g);
    let dx_out = Some(crate::tensor::as_uninit(&mut dx_ref));
    avx512::backward_with(&g, &x, &w, &dy, &mut dw_ref, Some(&mut db_ref), dx_out, pixel);
    let added = |d: &[f32], d0: &[f32]| d.iter().zip(d0).map(|(a, b)| a - b).collect::<Vec<f32>>();
    // The weight gradient's own scale, not dw0's, sets its bound.
    assert_close(&format!("{what}: dw"), &added(&dw, &dw0), &added(&dw_ref, &dw0));
    assert_close(&format!("{what}: db"), &db, &db_ref);
    assert_close(&format!("{what}: dx"), &dx, &dx_ref);
    if bwd {
        assert_ne!(dx, dx_ref, "{what}: Winograd's rounding should differ from the direct kernels'");
    }

    // Without dx or db (the first conv of a model): the same dw.
    let mut dw_only = dw0.clone();
    avx512::backward(&g, &x, &w, &dy, &mut dw_only, None, None);
    assert_close(&format!("{what}: dw without dx"), &added(&dw_only, &dw0), &added(&dw_ref, &dw0));
}

/// ResNet-20 on 28x28 images (Fashion-MNIST) and on CIFAR's 32x32: each
/// stage's stride-1 3x3 conv at 1 to 4 images (the sizes leave 4, 2, 1,
/// 2 and 4 rows and columns of the last tiles off the image), and image
/// counts that end in a partial mosaic (4 images a mosaic at 14x14, 16x16
/// and 8x8, 9 at 7x7) or batch of mosaics (18 images at 7x7, 12 at 8x8),
/// on 1, 2 and 3 threads (which decide the runs of images per task).
#[test]
fn winograd_3x3_matches_the_direct_kernels_on_resnet_shapes() {
    let stages: [(usize, usize, &[usize]); 6] = [
        (16, 28, &[1, 2, 3, 4]),
        (32, 14, &[1, 2, 3, 4, 5, 7]),
        (64, 7, &[1, 2, 3, 4, 9, 11, 40, 70]),
        (16, 32, &[1, 3]),
        (32, 16, &[2, 4]),
        (64, 8, &[3, 4, 17, 40]),
    ];
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for (i, &(c, s, counts)) in stages.iter().enumerate() {
                for &n in counts {
                    check(n, c, s, 7000 + 100 * i as u64 + n as u64);
                }
            }
        });
    }
}

/// The mosaics (see `winograd::Mosaic`): 3 x 3 images of 7x7 (16 tiles for
/// 9 images instead of 36), 2 x 2 of 14x14 (25 for 4 instead of 36), 2 x 2
/// of CIFAR's 8x8, 5 x 5 of 4x4 (16 tiles for 25 images instead of 25);
/// one image where a mosaic saves nothing (28x28) or
/// where the output is not the input's size (no gap is then both sides'
/// padding), and for 5x5 kernels.
#[test]
fn winograd_lays_small_images_out_in_mosaics() {
    let g = |c, s, k, padding| {
        let o = super::out_size(s, k, 1, padding);
        ConvGeom { n: 64, c, h: s, w: s, o: c, k, stride: 1, padding, ho: o, wo: o }
    };
    for (geom, want) in [
        (g(64, 7, 3, 1), (3, 3, (8, 8))),
        (g(32, 14, 3, 1), (2, 2, (15, 15))),
        (g(256, 8, 3, 1), (2, 2, (9, 9))),
        (g(16, 28, 3, 1), (1, 1, (29, 29))),
        (g(512, 4, 3, 1), (5, 5, (5, 5))),
        (g(16, 7, 3, 0), (1, 1, (9, 9))),
        (g(16, 7, 3, 2), (1, 1, (11, 11))),
        (g(16, 14, 5, 2), (1, 1, (16, 16))),
    ] {
        assert_eq!(avx512::winograd_mosaic(&geom), want, "{geom:?}");
    }
}

/// Images go to mosaics by their index in the batch, so the output's bits
/// do not depend on how many threads cut the batch into tasks, nor on what
/// the scratch held from earlier calls (a partial last mosaic's empty
/// slots are cleared): 40 and 70 images of 7x7 (4 and 7 images in the
/// last mosaic of 9), 23 of 14x14, on 1, 2 and 3 threads.
#[test]
fn winograd_mosaics_give_the_same_bits_on_any_thread_count() {
    for (n, c, s) in [(40, 64, 7), (70, 16, 7), (23, 32, 14)] {
        let g = ConvGeom { n, c, h: s, w: s, o: c, k: 3, stride: 1, padding: 1, ho: s, wo: s };
        if !avx512::usable(&g) {
            eprintln!("no AVX-512 on this CPU: kernel not checked");
            return;
        }
        let x: Vec<f32> = rand_vec_f32(n * g.x_len(), 11).into_iter().map(|v| v.max(0.0)).collect();
        let w = rand_vec_f32(c * g.ckk(), 12);
        let dy = rand_vec_f32(n * g.y_len(), 13);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let (mut y, mut dx) = (vec![f32::NAN; dy.len()], vec![f32::NAN; x.len()]);
                avx512::forward(&g, &x, &w, None, crate::tensor::as_uninit(&mut y));
                let mut dw = vec![0f32; w.len()];
                avx512::backward(&g, &x, &w, &dy, &mut dw, None, Some(crate::tensor::as_uninit(&mut dx)));
                (y, dx)
            })
        };
        let one = run(1);
        for threads in [2, 3] {
            let other = run(threads);
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same(&one.0, &other.0), "n {n}, {s}x{s}: y on {threads} threads differs from 1");
            assert!(same(&one.1, &other.1), "n {n}, {s}x{s}: dx on {threads} threads differs from 1");
        }
    }
}

/// Tiles across two images of a mosaic round both with the larger one's
/// values, as a tile within one image does with its largest pixels: next
/// to images 10x, 100x and 1000x its size, an image's error stays within
/// the bounds relative to the mosaic's largest output (measured 3.8e-4 of
/// its own peak beside 100x, and 4.2e-6 at equal sizes), not its own.
#[test]
fn winograd_mosaic_rounds_with_the_largest_neighbour() {
    let (n, c, s) = (9, 64, 7);
    let g = ConvGeom { n, c, h: s, w: s, o: c, k: 3, stride: 1, padding: 1, ho: s, wo: s };
    if !avx512::usable(&g) {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    assert_eq!(avx512::winograd_mosaic(&g), (3, 3, (8, 8)));
    for scale in [1.0f32, 10.0, 100.0, 1000.0] {
        let mut x: Vec<f32> = rand_vec_f32(n * g.x_len(), 11).into_iter().map(|v| v.max(0.0)).collect();
        // The even images (the corners and the centre of the 3 x 3) scaled.
        for (i, v) in x.iter_mut().enumerate() {
            if (i / g.x_len()).is_multiple_of(2) {
                *v *= scale;
            }
        }
        let w: Vec<f32> = rand_vec_f32(c * g.ckk(), 12).iter().map(|v| v / (3.0 * c as f32).sqrt()).collect();
        let (mut y, mut y_ref) = (vec![f32::NAN; n * g.y_len()], vec![f32::NAN; n * g.y_len()]);
        avx512::forward(&g, &x, &w, None, crate::tensor::as_uninit(&mut y));
        avx512::forward_direct(&g, &x, &w, None, crate::tensor::as_uninit(&mut y_ref));
        let peak = y_ref.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        let yl = g.y_len();
        let (mine, their) = (&y[yl..2 * yl], &y_ref[yl..2 * yl]);
        let own = their.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        let (max, _) = errors(mine, their);
        assert!(
            max * own <= MAX_REL * peak,
            "beside {scale}x: error {max:e} of its own peak {own}, mosaic's {peak}"
        );
    }
}
