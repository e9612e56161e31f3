use super::cpu::{self, ConvGeom};
use super::*;
use crate::ops::testing::{check_grad, cpu_ms, dot, rand_vec, rand_vec_f32};

/// (n, c, h, w, o, k, stride, padding, bias)
type Cfg = (usize, usize, usize, usize, usize, usize, usize, usize, bool);

const FORWARD_CFGS: &[Cfg] = &[
    (2, 1, 5, 5, 3, 3, 1, 0, true),
    (3, 3, 7, 6, 4, 3, 2, 1, true),
    (2, 2, 9, 9, 5, 5, 1, 2, false),
    (1, 4, 6, 7, 2, 3, 3, 2, true),
    (3, 16, 14, 14, 8, 5, 1, 2, true),
    (2, 3, 8, 8, 2, 1, 1, 0, true),
    (5, 2, 5, 5, 3, 5, 2, 2, false),
    (2, 2, 7, 5, 3, 4, 2, 1, true),
    (1, 1, 28, 28, 16, 5, 1, 2, true),
    (0, 2, 5, 5, 3, 3, 1, 1, true),
    // Stride 1 with H != W, an even kernel and padding wider than the kernel.
    (2, 2, 7, 5, 3, 4, 1, 1, true),
    (1, 2, 4, 4, 2, 3, 1, 3, true),
    // O = 32 with a deep reduction takes the transposed forward GEMM.
    (2, 3, 9, 8, 32, 5, 1, 2, true),
    (3, 8, 9, 9, 32, 3, 2, 1, false),
];

fn geom(cfg: Cfg) -> ConvGeom {
    let (n, c, h, w, o, k, stride, padding, _) = cfg;
    let (ho, wo) = (out_size(h, k, stride, padding), out_size(w, k, stride, padding));
    ConvGeom { n, c, h, w, o, k, stride, padding, ho, wo }
}

fn naive(g: &ConvGeom, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; g.n * g.o * g.ho * g.wo];
    for n in 0..g.n {
        for o in 0..g.o {
            for oh in 0..g.ho {
                for ow in 0..g.wo {
                    let mut s = b.map_or(0.0, |b| b[o]);
                    for c in 0..g.c {
                        for ki in 0..g.k {
                            for kj in 0..g.k {
                                let ih = (oh * g.stride + ki) as isize - g.padding as isize;
                                let iw = (ow * g.stride + kj) as isize - g.padding as isize;
                                if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize {
                                    continue;
                                }
                                let xv = x[((n * g.c + c) * g.h + ih as usize) * g.w + iw as usize];
                                s += xv * w[((o * g.c + c) * g.k + ki) * g.k + kj];
                            }
                        }
                    }
                    y[((n * g.o + o) * g.ho + oh) * g.wo + ow] = s;
                }
            }
        }
    }
    y
}

fn fwd64(g: &ConvGeom, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
    let mut y = vec![0.0; g.n * g.y_len()];
    cpu::forward(g, x, w, b, &mut y);
    y
}

fn args(cfg: Cfg) -> Conv2dArgs {
    Conv2dArgs { stride: cfg.6, padding: cfg.7 }
}

#[test]
fn out_size_follows_pytorch_formula() {
    assert_eq!(out_size(28, 5, 1, 2), 28);
    assert_eq!(out_size(7, 3, 2, 1), 4);
    assert_eq!(out_size(6, 3, 3, 2), 3);
    assert_eq!(out_size(5, 5, 1, 0), 1);
    assert_eq!(out_size(3, 5, 1, 0), 0);
    assert_eq!(out_size(3, 5, 0, 1), 0);
}

#[test]
fn forward_f64_matches_naive_loop() {
    for (i, &cfg) in FORWARD_CFGS.iter().enumerate() {
        let g = geom(cfg);
        let x = rand_vec(g.n * g.x_len(), 100 + i as u64);
        let w = rand_vec(g.o * g.ckk(), 200 + i as u64);
        let b = rand_vec(g.o, 300 + i as u64);
        let b = cfg.8.then_some(b.as_slice());
        let got = fwd64(&g, &x, &w, b);
        let want = naive(&g, &x, &w, b);
        for (j, (a, e)) in got.iter().zip(&want).enumerate() {
            assert!((a - e).abs() < 1e-10, "cfg {cfg:?}: y[{j}] = {a}, naive {e}");
        }
    }
}

#[test]
fn forward_tensor_f32_matches_naive_loop() {
    for (i, &cfg) in FORWARD_CFGS.iter().enumerate() {
        let g = geom(cfg);
        let (n, c, h, w, o, k) = (g.n, g.c, g.h, g.w, g.o, g.k);
        let xv = rand_vec_f32(n * g.x_len(), 400 + i as u64);
        let wv = rand_vec_f32(o * g.ckk(), 500 + i as u64);
        let bv = rand_vec_f32(o, 600 + i as u64);
        let xt = Tensor::from_vec(&[n, c, h, w], xv.clone()).unwrap();
        let wt = Tensor::from_vec(&[o, c, k, k], wv.clone()).unwrap();
        let bt = Tensor::from_vec(&[o], bv.clone()).unwrap();
        let y = forward(&xt, &wt, cfg.8.then_some(&bt), args(cfg)).unwrap();
        assert_eq!(y.shape(), &[n, o, g.ho, g.wo]);
        let to64 = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let b64 = to64(&bv);
        let want = naive(&g, &to64(&xv), &to64(&wv), cfg.8.then_some(b64.as_slice()));
        for (a, e) in y.as_f32().unwrap().iter().zip(&want) {
            assert!((*a as f64 - e).abs() < 1e-4, "cfg {cfg:?}: {a} vs {e}");
        }
    }
}

/// Every gradient the backward produces, against central differences of
/// `dot(r, forward(x, w, b))`.
fn check_backward(cfg: Cfg, need_dx: bool, seed: u64) {
    let g = geom(cfg);
    let x = rand_vec(g.n * g.x_len(), seed);
    let w = rand_vec(g.o * g.ckk(), seed + 1);
    let b = rand_vec(g.o, seed + 2);
    let r = rand_vec(g.n * g.y_len(), seed + 3);
    let bias = cfg.8;
    let bo = bias.then_some(b.as_slice());

    let mut dw = vec![0.0; w.len()];
    let mut db = vec![0.0; if bias { g.o } else { 0 }];
    let mut dx = vec![f64::NAN; x.len()];
    cpu::backward(
        &g,
        &x,
        &w,
        &r,
        &mut dw,
        bias.then_some(db.as_mut_slice()),
        need_dx.then_some(dx.as_mut_slice()),
    );

    let tol = 1e-6;
    check_grad(&format!("{cfg:?} dweight"), &w, &dw, |wp| dot(&r, &fwd64(&g, &x, wp, bo)), tol);
    if bias {
        check_grad(&format!("{cfg:?} dbias"), &b, &db, |bp| dot(&r, &fwd64(&g, &x, &w, Some(bp))), tol);
    }
    if need_dx {
        check_grad(&format!("{cfg:?} dx"), &x, &dx, |xp| dot(&r, &fwd64(&g, xp, &w, bo)), tol);
    } else {
        assert!(dx.iter().all(|v| v.is_nan()), "dx written although not requested");
    }
}

#[test]
fn backward_matches_finite_differences() {
    let cfgs: &[Cfg] = &[
        (2, 1, 5, 5, 3, 3, 1, 0, true),
        (3, 3, 7, 6, 4, 3, 2, 1, true),
        (2, 2, 6, 6, 3, 5, 1, 2, false),
        (1, 2, 6, 7, 2, 3, 3, 2, true),
        (2, 2, 7, 5, 3, 4, 2, 1, true),
        (3, 2, 4, 4, 2, 1, 1, 0, true),
        (2, 2, 7, 5, 3, 4, 1, 1, true),
        (1, 2, 4, 4, 2, 3, 1, 3, false),
        (2, 3, 5, 4, 32, 5, 1, 2, true),
    ];
    for (i, &cfg) in cfgs.iter().enumerate() {
        check_backward(cfg, true, 1000 + 10 * i as u64);
    }
}

#[test]
fn backward_without_dx_leaves_it_untouched() {
    check_backward((3, 1, 6, 6, 4, 5, 1, 2, true), false, 77);
}

#[test]
fn backward_uneven_split_over_threads() {
    // 5 images over 3 threads: tasks of 2, 2 and 1 image.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    pool.install(|| check_backward((5, 2, 5, 5, 3, 3, 1, 1, true), true, 55));
    // 1 image: the products themselves go parallel.
    pool.install(|| check_backward((1, 2, 6, 6, 3, 3, 2, 1, true), true, 66));
}

struct Case {
    x: Tensor,
    w: Tensor,
    dy: Tensor,
    a: Conv2dArgs,
}

fn case() -> Case {
    let (n, c, h, o, k) = (3, 2, 6, 4, 3);
    let a = Conv2dArgs { stride: 1, padding: 1 };
    Case {
        x: Tensor::from_vec(&[n, c, h, h], rand_vec_f32(n * c * h * h, 1)).unwrap(),
        w: Tensor::from_vec(&[o, c, k, k], rand_vec_f32(o * c * k * k, 2)).unwrap(),
        dy: Tensor::from_vec(&[n, o, h, h], rand_vec_f32(n * o * h * h, 3)).unwrap(),
        a,
    }
}

#[test]
fn tensor_backward_f32_matches_f64_kernel() {
    let t = case();
    let mut dw = Tensor::zeros(t.w.shape());
    let mut db = Tensor::zeros(&[4]);
    let dx = backward(&t.x, &t.w, &t.dy, t.a, &mut dw, Some(&mut db), true).unwrap().unwrap();
    assert_eq!(dx.shape(), t.x.shape());

    let to64 = |t: &Tensor| t.as_f32().unwrap().iter().map(|&v| v as f64).collect::<Vec<_>>();
    let g = geom((3, 2, 6, 6, 4, 3, 1, 1, true));
    let (mut dw64, mut db64, mut dx64) = (vec![0.0; dw.numel()], vec![0.0; 4], vec![0.0; dx.numel()]);
    cpu::backward(&g, &to64(&t.x), &to64(&t.w), &to64(&t.dy), &mut dw64, Some(&mut db64), Some(&mut dx64));
    for (got, want) in [(&dw, &dw64), (&db, &db64), (&dx, &dx64)] {
        for (a, e) in got.as_f32().unwrap().iter().zip(want) {
            assert!((*a as f64 - e).abs() < 1e-4, "{a} vs {e}");
        }
    }
}

#[test]
fn backward_accumulates_weight_and_bias_grads() {
    let t = case();
    let mut dw = Tensor::zeros(t.w.shape());
    let mut db = Tensor::zeros(&[4]);
    let dx1 = backward(&t.x, &t.w, &t.dy, t.a, &mut dw, Some(&mut db), true).unwrap().unwrap();
    let (dw1, db1) = (dw.as_f32().unwrap().to_vec(), db.as_f32().unwrap().to_vec());
    let dx2 = backward(&t.x, &t.w, &t.dy, t.a, &mut dw, Some(&mut db), true).unwrap().unwrap();
    for (two, one) in dw.as_f32().unwrap().iter().zip(&dw1).chain(db.as_f32().unwrap().iter().zip(&db1)) {
        assert!((two - 2.0 * one).abs() <= 1e-6 * one.abs().max(1.0), "{two} vs 2 * {one}");
    }
    assert!(dw1.iter().any(|v| *v != 0.0));
    // dx is a fresh result each call, not accumulated.
    assert_eq!(dx1.as_f32().unwrap(), dx2.as_f32().unwrap());
    // Without need_dx nothing is returned.
    assert!(backward(&t.x, &t.w, &t.dy, t.a, &mut dw, None, false).unwrap().is_none());
}

fn shape_err(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(e @ Error::Shape(_)) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn forward_shape_errors_are_clear() {
    let a = Conv2dArgs { stride: 1, padding: 0 };
    let x = Tensor::zeros(&[2, 3, 8, 8]);
    let w = Tensor::zeros(&[4, 3, 3, 3]);
    let cases: Vec<(Result<Tensor>, &str)> = vec![
        (
            forward(&Tensor::zeros(&[3, 8, 8]), &w, None, a),
            "conv2d: input must be 4-D [N, C, H, W], got shape [3, 8, 8]",
        ),
        (
            forward(&x, &Tensor::zeros(&[4, 3, 9]), None, a),
            "conv2d: weight must be 4-D [O, C, K, K], got shape [4, 3, 9]",
        ),
        (
            forward(&x, &Tensor::zeros(&[4, 3, 3, 2]), None, a),
            "only square kernels are supported, weight [4, 3, 3, 2] has a 3x2 kernel",
        ),
        (
            forward(&x, &Tensor::zeros(&[4, 1, 3, 3]), None, a),
            "weight [4, 1, 3, 3] expects 1 input channels but input [2, 3, 8, 8] has 3",
        ),
        (forward(&x, &w, Some(&Tensor::zeros(&[5])), a), "conv2d bias: expected shape [4], got [5]"),
        (
            forward(&x, &w, None, Conv2dArgs { stride: 0, padding: 0 }),
            "conv2d: stride must be at least 1, got 0",
        ),
        (
            forward(&x, &Tensor::zeros(&[4, 3, 11, 11]), None, a),
            "conv2d: kernel 11x11 does not fit input 8x8 with padding 0",
        ),
        (
            forward(&Tensor::zeros(&[2, 0, 8, 8]), &Tensor::zeros(&[4, 0, 3, 3]), None, a),
            "zero-sized dimension in input [2, 0, 8, 8]",
        ),
    ];
    for (r, want) in cases {
        let msg = shape_err(r);
        assert!(msg.contains(want), "message {msg:?} lacks {want:?}");
    }
}

#[test]
fn backward_shape_errors_are_clear() {
    let t = case();
    let mut dw = Tensor::zeros(t.w.shape());
    let db = Tensor::zeros(&[4]);
    let bad_dy = Tensor::zeros(&[3, 4, 5, 6]);
    let msg = shape_err(backward(&t.x, &t.w, &bad_dy, t.a, &mut dw, None, true));
    assert!(msg.contains("conv2d dy: expected shape [3, 4, 6, 6], got [3, 4, 5, 6]"), "{msg}");
    let mut bad_dw = Tensor::zeros(&[4, 2, 3]);
    let msg = shape_err(backward(&t.x, &t.w, &t.dy, t.a, &mut bad_dw, None, true));
    assert!(msg.contains("conv2d dweight: expected shape [4, 2, 3, 3], got [4, 2, 3]"), "{msg}");
    let mut bad_db = Tensor::zeros(&[3]);
    let msg = shape_err(backward(&t.x, &t.w, &t.dy, t.a, &mut dw, Some(&mut bad_db), true));
    assert!(msg.contains("conv2d dbias: expected shape [4], got [3]"), "{msg}");
    // Nothing was accumulated by the failed calls.
    assert!(dw.as_f32().unwrap().iter().chain(db.as_f32().unwrap()).all(|v| *v == 0.0));
}

/// CPU time of the MNIST ConvNet's two convolutions at batch 100 (not an
/// assertion: run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn conv_timing_mnist_batch100() {
    let layers = [("conv1 1->16 28x28", 1, 28, 16, false), ("conv2 16->32 14x14", 16, 14, 32, true)];
    for (name, c, hw, o, need_dx) in layers {
        let n = 100;
        let x = Tensor::from_vec(&[n, c, hw, hw], rand_vec_f32(n * c * hw * hw, 1)).unwrap();
        let w = Tensor::from_vec(&[o, c, 5, 5], rand_vec_f32(o * c * 25, 2)).unwrap();
        let b = Tensor::from_vec(&[o], rand_vec_f32(o, 3)).unwrap();
        let a = Conv2dArgs { stride: 1, padding: 2 };
        let dy = Tensor::from_vec(&[n, o, hw, hw], rand_vec_f32(n * o * hw * hw, 4)).unwrap();
        let mut dw = Tensor::zeros(w.shape());
        let mut db = Tensor::zeros(&[o]);
        let iters = 30;
        let (mut tf, mut tb) = (f64::MAX, f64::MAX);
        let (mut sf, mut sb) = (0.0, 0.0);
        for i in 0..iters + 3 {
            let t0 = cpu_ms();
            let y = forward(&x, &w, Some(&b), a).unwrap();
            let t1 = cpu_ms();
            let dx = backward(&x, &w, &dy, a, &mut dw, Some(&mut db), need_dx).unwrap();
            let t2 = cpu_ms();
            std::hint::black_box((y, dx));
            if i >= 3 {
                let (f, bk) = (t1 - t0, t2 - t1);
                (tf, tb, sf, sb) = (tf.min(f), tb.min(bk), sf + f, sb + bk);
            }
        }
        let it = iters as f64;
        println!(
            "{name} (threads {}): CPU time forward {:.2} ms (min {tf:.2}), backward{} {:.2} ms (min {tb:.2})",
            rayon::current_num_threads(),
            sf / it,
            if need_dx { "+dx" } else { "" },
            sb / it
        );
    }
}

/// Wall milliseconds per call (best of 5) of ResNet-20's strided convs at
/// batch 128, f32 and f16: `cargo test --release --lib
/// conv_timing_resnet20_strided -- --ignored --nocapture`.
#[test]
#[ignore]
fn conv_timing_resnet20_strided() {
    use std::time::Instant;
    let layers = [
        ("layer2.0.conv1 3x3/2 16->32 28x28", 16, 28, 32, 3, 1),
        ("layer2.0.downsample 1x1/2 16->32 28x28", 16, 28, 32, 1, 0),
        ("layer3.0.conv1 3x3/2 32->64 14x14", 32, 14, 64, 3, 1),
        ("layer3.0.downsample 1x1/2 32->64 14x14", 32, 14, 64, 1, 0),
    ];
    for dtype in [crate::tensor::DType::F32, crate::tensor::DType::F16] {
        for (name, c, hw, o, k, p) in layers {
            let n = 128;
            let a = Conv2dArgs { stride: 2, padding: p };
            let ho = out_size(hw, k, 2, p);
            let x = Tensor::from_vec(&[n, c, hw, hw], rand_vec_f32(n * c * hw * hw, 1))
                .unwrap()
                .into_dtype(dtype);
            let w = Tensor::from_vec(&[o, c, k, k], rand_vec_f32(o * c * k * k, 2)).unwrap();
            let dy = Tensor::from_vec(&[n, o, ho, ho], rand_vec_f32(n * o * ho * ho, 4))
                .unwrap()
                .into_dtype(dtype);
            let mut dw = Tensor::zeros(w.shape());
            let (mut tf, mut tb) = (f64::MAX, f64::MAX);
            for _ in 0..5 {
                let t0 = Instant::now();
                let y = forward(&x, &w, None, a).unwrap();
                let t1 = Instant::now();
                let dx = backward(&x, &w, &dy, a, &mut dw, None, true).unwrap();
                let t2 = Instant::now();
                std::hint::black_box((y, dx));
                tf = tf.min((t1 - t0).as_secs_f64() * 1e3);
                tb = tb.min((t2 - t1).as_secs_f64() * 1e3);
            }
            println!("{name} {dtype:?}: forward {tf:.2} ms, backward+dx {tb:.2} ms");
        }
    }
}
