use super::*;
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};

fn naive(n: usize, in_f: usize, out_f: usize, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; n * out_f];
    for i in 0..n {
        for o in 0..out_f {
            let mut s = b.map_or(0.0, |b| b[o]);
            for k in 0..in_f {
                s += x[i * in_f + k] * w[o * in_f + k];
            }
            y[i * out_f + o] = s;
        }
    }
    y
}

fn fwd64(n: usize, in_f: usize, out_f: usize, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; n * out_f];
    cpu::forward(n, in_f, out_f, x, w, b, crate::tensor::as_uninit(&mut y));
    y
}

const CFGS: &[(usize, usize, usize, bool)] =
    &[(1, 1, 1, true), (4, 7, 3, true), (5, 33, 10, false), (100, 1568, 10, true), (0, 4, 3, true)];

#[test]
fn forward_matches_naive_loop() {
    for (i, &(n, in_f, out_f, bias)) in CFGS.iter().enumerate() {
        let s = 10 * i as u64;
        let (x, w, b) = (rand_vec(n * in_f, s), rand_vec(out_f * in_f, s + 1), rand_vec(out_f, s + 2));
        let b = bias.then_some(b.as_slice());
        let want = naive(n, in_f, out_f, &x, &w, b);
        for (a, e) in fwd64(n, in_f, out_f, &x, &w, b).iter().zip(&want) {
            assert!((a - e).abs() < 1e-10, "{n}x{in_f}->{out_f}: {a} vs {e}");
        }

        let to32 = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
        let xt = Tensor::from_vec(&[n, in_f], to32(&x)).unwrap();
        let wt = Tensor::from_vec(&[out_f, in_f], to32(&w)).unwrap();
        let bt = b.map(|b| Tensor::from_vec(&[out_f], to32(b)).unwrap());
        let y = forward(&xt, &wt, bt.as_ref()).unwrap();
        assert_eq!(y.shape(), &[n, out_f]);
        for (a, e) in y.as_f32().unwrap().iter().zip(&want) {
            assert!((*a as f64 - e).abs() < 1e-4 * e.abs().max(1.0), "f32 {a} vs {e}");
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    for (i, &(n, in_f, out_f, bias)) in
        [(1, 1, 1, true), (4, 7, 3, true), (6, 13, 5, false)].iter().enumerate()
    {
        let s = 100 + 10 * i as u64;
        let (x, w, b, r) = (
            rand_vec(n * in_f, s),
            rand_vec(out_f * in_f, s + 1),
            rand_vec(out_f, s + 2),
            rand_vec(n * out_f, s + 3),
        );
        let bo = bias.then_some(b.as_slice());
        let mut dw = vec![0.0; w.len()];
        let mut db = vec![0.0; if bias { out_f } else { 0 }];
        let mut dx = vec![f64::NAN; x.len()];
        cpu::backward(
            n,
            in_f,
            out_f,
            &x,
            &w,
            &r,
            &mut dw,
            bias.then_some(db.as_mut_slice()),
            Some(crate::tensor::as_uninit(&mut dx)),
        );
        let tol = 1e-6;
        check_grad("linear dweight", &w, &dw, |wp| dot(&r, &fwd64(n, in_f, out_f, &x, wp, bo)), tol);
        check_grad("linear dx", &x, &dx, |xp| dot(&r, &fwd64(n, in_f, out_f, xp, &w, bo)), tol);
        if bias {
            check_grad("linear dbias", &b, &db, |bp| dot(&r, &fwd64(n, in_f, out_f, &x, &w, Some(bp))), tol);
        }
    }
}

fn case() -> (Tensor, Tensor, Tensor) {
    let (n, in_f, out_f) = (5, 9, 4);
    (
        Tensor::from_vec(&[n, in_f], rand_vec_f32(n * in_f, 1)).unwrap(),
        Tensor::from_vec(&[out_f, in_f], rand_vec_f32(out_f * in_f, 2)).unwrap(),
        Tensor::from_vec(&[n, out_f], rand_vec_f32(n * out_f, 3)).unwrap(),
    )
}

#[test]
fn tensor_backward_matches_f64_kernel_and_accumulates() {
    let (x, w, dy) = case();
    let mut dw = Tensor::zeros(w.shape());
    let mut db = Tensor::zeros(&[4]);
    let dx = backward(&x, &w, &dy, &mut dw, Some(&mut db), true).unwrap().unwrap();
    assert_eq!(dx.shape(), x.shape());

    let to64 = |t: &Tensor| t.as_f32().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>();
    let (mut dw64, mut db64, mut dx64) = (vec![0.0; 36], vec![0.0; 4], vec![0.0; 45]);
    cpu::backward(
        5,
        9,
        4,
        &to64(&x),
        &to64(&w),
        &to64(&dy),
        &mut dw64,
        Some(&mut db64),
        Some(crate::tensor::as_uninit(&mut dx64)),
    );
    for (got, want) in [(&dw, &dw64), (&db, &db64), (&dx, &dx64)] {
        for (a, e) in got.as_f32().unwrap().iter().zip(want) {
            assert!((*a as f64 - e).abs() < 1e-5, "{a} vs {e}");
        }
    }

    // A second call adds the same gradient again; dx is recomputed, not added.
    let dx2 = backward(&x, &w, &dy, &mut dw, Some(&mut db), true).unwrap().unwrap();
    for (two, one) in dw.as_f32().unwrap().iter().zip(&dw64).chain(db.as_f32().unwrap().iter().zip(&db64)) {
        assert!((*two as f64 - 2.0 * one).abs() < 1e-5, "{two} vs 2 * {one}");
    }
    assert_eq!(dx.as_f32().unwrap(), dx2.as_f32().unwrap());
    assert!(backward(&x, &w, &dy, &mut dw, None, false).unwrap().is_none());
}

fn shape_err<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(e @ Error::Shape(_)) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn shape_errors_are_clear() {
    let (x, w, dy) = case();
    let cases = [
        (
            shape_err(forward(&Tensor::zeros(&[5, 9, 1]), &w, None)),
            "linear: input must be 2-D [N, in_features], got shape [5, 9, 1]",
        ),
        (
            shape_err(forward(&x, &Tensor::zeros(&[36]), None)),
            "linear: weight must be 2-D [out_features, in_features], got shape [36]",
        ),
        (
            shape_err(forward(&x, &Tensor::zeros(&[4, 8]), None)),
            "linear: weight [4, 8] expects 8 input features but input [5, 9] has 9",
        ),
        (shape_err(forward(&x, &w, Some(&Tensor::zeros(&[3])))), "linear bias: expected shape [4], got [3]"),
    ];
    for (msg, want) in cases {
        assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
    }
    let mut dw = Tensor::zeros(w.shape());
    let msg = shape_err(backward(&x, &w, &Tensor::zeros(&[5, 3]), &mut dw, None, true));
    assert!(msg.contains("linear dy: expected shape [5, 4], got [5, 3]"), "{msg}");
    let mut bad_dw = Tensor::zeros(&[9, 4]);
    let msg = shape_err(backward(&x, &w, &dy, &mut bad_dw, None, true));
    assert!(msg.contains("linear dweight: expected shape [4, 9], got [9, 4]"), "{msg}");
    let mut bad_db = Tensor::zeros(&[5]);
    let msg = shape_err(backward(&x, &w, &dy, &mut dw, Some(&mut bad_db), true));
    assert!(msg.contains("linear dbias: expected shape [4], got [5]"), "{msg}");
    assert!(dw.as_f32().unwrap().iter().all(|v| *v == 0.0), "a failed call changed dweight");
}

/// Microseconds per call of the baby GPT's products (768 rows), split into
/// blocks of rows (`cpu`) against the `gemm` crate's own threading, on the
/// pool as configured:
/// `RAYON_NUM_THREADS=2 cargo test --release --lib linear_timing -- --ignored --nocapture`.
#[test]
#[ignore = "a timing, not a check"]
fn linear_timing() {
    use crate::ops::gemm::{gemm, Par};
    let n = 768;
    for (in_f, out_f) in [(128, 384), (128, 128), (128, 512), (512, 128), (128, 98)] {
        let x = crate::ops::testing::rand_vec_f32(n * in_f, 1);
        let w = crate::ops::testing::rand_vec_f32(out_f * in_f, 2);
        let dy = crate::ops::testing::rand_vec_f32(n * out_f, 3);
        let (mut y, mut dx, mut dw) = (vec![0f32; n * out_f], vec![0f32; n * in_f], vec![0f32; out_f * in_f]);
        let mut best = [f64::MAX; 4];
        for _ in 0..200 {
            let t = std::time::Instant::now();
            super::cpu::forward(n, in_f, out_f, &x, &w, None, crate::tensor::as_uninit(&mut y));
            best[0] = best[0].min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            gemm(n, out_f, in_f, &x, false, &w, true, &mut y, false, Par::Rayon(0));
            best[1] = best[1].min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            super::cpu::backward(
                n,
                in_f,
                out_f,
                &x,
                &w,
                &dy,
                &mut dw,
                None,
                Some(crate::tensor::as_uninit(&mut dx)),
            );
            best[2] = best[2].min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            rayon::join(
                || gemm(out_f, in_f, n, &dy, true, &x, false, &mut dw, true, Par::Rayon(0)),
                || gemm(n, in_f, out_f, &dy, false, &w, false, &mut dx, false, Par::Rayon(0)),
            );
            best[3] = best[3].min(t.elapsed().as_secs_f64());
        }
        let gf = |s: f64, m: f64| m * 2.0 * (n * in_f * out_f) as f64 / s / 1e9;
        println!(
            "{n}x{in_f}->{out_f}: forward {:.0} us ({:.0} GFLOP/s) vs crate-threaded {:.0} us ({:.0}); \
             backward {:.0} us ({:.0}) vs {:.0} us ({:.0})",
            best[0] * 1e6,
            gf(best[0], 1.0),
            best[1] * 1e6,
            gf(best[1], 1.0),
            best[2] * 1e6,
            gf(best[2], 2.0),
            best[3] * 1e6,
            gf(best[3], 2.0)
        );
    }
}
