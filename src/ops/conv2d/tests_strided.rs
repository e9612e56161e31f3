//! The strided AVX-512 kernels (`avx512/strided.rs`) against the generic
//! f64 kernels (which `tests.rs` checks against a naive loop and finite
//! differences): forward, input gradient, weight and bias gradients (added
//! into), on the ResNets' downsampling convs and on sizes, strides,
//! paddings and channel counts off every block, on 1 and 3 threads; and
//! f16 activations, whose results are the f32 kernels' rounded.

use super::avx512;
use super::cpu::{self, ConvGeom};
use super::out_size;
use crate::ops::testing::rand_vec;
use crate::tensor::as_uninit;
use half::f16;

/// (n, c, h, w, o, k, stride, padding)
type Cfg = (usize, usize, usize, usize, usize, usize, usize, usize);

const CFGS: &[Cfg] = &[
    // ResNet-20's downsampling convs on 28x28 (Fashion-MNIST) and CIFAR's 32x32.
    (3, 16, 28, 28, 32, 3, 2, 1),
    (3, 16, 28, 28, 32, 1, 2, 0),
    (2, 32, 14, 14, 64, 3, 2, 1),
    (2, 32, 14, 14, 64, 1, 2, 0),
    (2, 16, 32, 32, 32, 3, 2, 1),
    (2, 64, 8, 8, 128, 1, 2, 0),
    // Odd sizes (a class of the input gradient one pixel shorter), channels
    // off the lanes and the channel blocks, stride 3, a 5x5 kernel, padding
    // 0 and 2, a 1x1 kernel with padding.
    (2, 9, 15, 13, 17, 3, 2, 1),
    (1, 12, 11, 16, 40, 3, 2, 0),
    (2, 8, 17, 10, 8, 3, 3, 1),
    (1, 10, 13, 12, 24, 5, 2, 2),
    (2, 8, 9, 9, 16, 1, 3, 0),
    (1, 20, 6, 7, 33, 3, 2, 2),
    // 1x1 stride 2 reads only every other pixel: odd sides, channels off
    // the lanes, rows of more than 16 such pixels (35 = 16 + 16 + 3).
    (2, 9, 15, 13, 17, 1, 2, 0),
    (1, 20, 5, 70, 24, 1, 2, 0),
];

fn geom(cfg: Cfg) -> ConvGeom {
    let (n, c, h, w, o, k, stride, padding) = cfg;
    let (ho, wo) = (out_size(h, k, stride, padding), out_size(w, k, stride, padding));
    ConvGeom { n, c, h, w, o, k, stride, padding, ho, wo }
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

fn check(cfg: Cfg, seed: u64) {
    let g = geom(cfg);
    if !avx512::usable(&g) {
        eprintln!("no AVX-512 on this CPU: kernel not checked");
        return;
    }
    // Inputs rounded to f32 first, so both sides multiply the same numbers.
    let r64 = |len, s| rand_vec(len, s).iter().map(|&v| v as f32 as f64).collect::<Vec<f64>>();
    let (x, w, b) = (r64(g.n * g.x_len(), seed), r64(g.o * g.ckk(), seed + 1), r64(g.o, seed + 2));
    let dy = r64(g.n * g.y_len(), seed + 3);
    let (dw0, db0) = (r64(w.len(), seed + 4), r64(g.o, seed + 5));

    let mut y64 = vec![0.0; g.n * g.y_len()];
    cpu::forward(&g, &x, &w, Some(&b), &mut y64);
    let mut y = vec![f32::NAN; y64.len()];
    avx512::forward(&g, &f32s(&x), &f32s(&w), Some(&f32s(&b)), as_uninit(&mut y));
    close(&format!("{cfg:?} y"), &y, &y64);

    let (mut dw64, mut db64, mut dx64) = (dw0.clone(), db0.clone(), vec![0.0; x.len()]);
    cpu::backward(&g, &x, &w, &dy, &mut dw64, Some(&mut db64), Some(&mut dx64));
    let (xf, wf, dyf) = (f32s(&x), f32s(&w), f32s(&dy));
    let (mut dw, mut db, mut dx) = (f32s(&dw0), f32s(&db0), vec![f32::NAN; x.len()]);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw, Some(&mut db), Some(as_uninit(&mut dx)));
    close(&format!("{cfg:?} dw"), &dw, &dw64);
    close(&format!("{cfg:?} db"), &db, &db64);
    close(&format!("{cfg:?} dx"), &dx, &dx64);
    // Without dx and bias: the same dw.
    let mut dw_only = f32s(&dw0);
    avx512::backward(&g, &xf, &wf, &dyf, &mut dw_only, None, None);
    assert_eq!(dw_only, dw, "{cfg:?}: dw without dx");

    // f16 activations: the f32 kernels' sums, rounded once.
    let h16 = |v: &[f32]| v.iter().map(|&a| f16::from_f32(a)).collect::<Vec<f16>>();
    let (xh, dyh) = (h16(&xf), h16(&dyf));
    let (xr, dyr): (Vec<f32>, Vec<f32>) =
        (xh.iter().map(|v| v.to_f32()).collect(), dyh.iter().map(|v| v.to_f32()).collect());
    let mut y32 = vec![0f32; y.len()];
    avx512::forward(&g, &xr, &wf, None, as_uninit(&mut y32));
    let mut yh = vec![f16::NAN; y.len()];
    avx512::forward(&g, &xh, &wf, None, as_uninit(&mut yh));
    assert_eq!(yh, h16(&y32), "{cfg:?}: f16 y");
    let (mut dw32, mut dx32) = (vec![0f32; w.len()], vec![0f32; x.len()]);
    avx512::backward(&g, &xr, &wf, &dyr, &mut dw32, None, Some(as_uninit(&mut dx32)));
    let (mut dwh, mut dxh) = (vec![0f32; w.len()], vec![f16::NAN; x.len()]);
    avx512::backward(&g, &xh, &wf, &dyh, &mut dwh, None, Some(as_uninit(&mut dxh)));
    assert_eq!(dwh, dw32, "{cfg:?}: f16 dw");
    assert_eq!(dxh, h16(&dx32), "{cfg:?}: f16 dx");
}

#[test]
fn strided_kernels_match_the_generic_ones() {
    for (i, &cfg) in CFGS.iter().enumerate() {
        check(cfg, 5000 + 10 * i as u64);
    }
}

#[test]
fn strided_kernels_match_the_generic_ones_on_three_threads() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    pool.install(|| {
        check((7, 16, 14, 14, 32, 3, 2, 1), 6000);
        check((5, 32, 7, 7, 64, 1, 2, 0), 6010);
        check((0, 16, 14, 14, 32, 3, 2, 1), 6020);
    });
}

/// Fewer than 8 channels either way (a 3-channel stem) stay on the GEMM path.
#[test]
fn strided_kernels_take_eight_channels_or_more() {
    if !std::arch::is_x86_feature_detected!("avx512bw") {
        return;
    }
    assert!(avx512::usable(&geom((1, 16, 28, 28, 32, 3, 2, 1))));
    assert!(!avx512::usable(&geom((1, 3, 32, 32, 64, 7, 2, 3))));
    assert!(!avx512::usable(&geom((1, 16, 28, 28, 4, 3, 2, 1))));
}
