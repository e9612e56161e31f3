//! The f16 BatchNorm + ReLU + MaxPool2d(2, 2) block against the three f16
//! ops in sequence (BatchNorm + ReLU, max-pool; their backward in reverse),
//! and its AVX-512 plane kernels against the generic ones: bit for bit, with
//! ties inside windows, signed zeros, all-negative windows, NaN and inf.

use super::f16_pool::{self, dx_plane_generic, dz_plane_generic, forward_plane_generic, Scratch};
use super::fused_cpu::KILLED;
use super::*;
use crate::ops::testing::rand_vec_f32;
use crate::ops::{max_pool2d, relu};
use crate::tensor::DType;
use half::f16;

/// Values on a quarter grid (ties inside windows), zeros of both signs.
fn grid(len: usize, seed: u64) -> Vec<f32> {
    let mut v: Vec<f32> = rand_vec_f32(len, seed).iter().map(|x| (x * 8.0).round() / 4.0 - 0.3).collect();
    for (i, x) in v.iter_mut().enumerate() {
        if i % 41 == 7 {
            *x = 0.0;
        } else if i % 43 == 11 {
            *x = -0.0;
        }
    }
    v
}

fn f16_tensor(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32_as(shape, v, DType::F16).unwrap()
}

/// The bits of each value, every NaN as one: the sign and payload of a NaN
/// an operation creates are the compiler's choice (LLVM may commute the
/// operands of an add, and x86 returns the first operand's NaN), so the ops
/// in sequence do not fix them either.
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f32_vec().iter().map(|&v| f64_bits(f64::from(v))).collect()
}

fn f64_bits(v: f64) -> u64 {
    if v.is_nan() {
        u64::MAX
    } else {
        v.to_bits()
    }
}

fn same(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (g, w) = (bits(got), bits(want));
    let diff = g.iter().zip(&w).position(|(a, b)| a != b);
    assert!(diff.is_none(), "{what}: first differing element {diff:?} of {}", g.len());
}

fn same_f32(what: &str, got: &[f32], want: &[f32]) {
    let b = |v: &[f32]| v.iter().map(|&x| f64_bits(f64::from(x))).collect::<Vec<_>>();
    assert_eq!(b(got), b(want), "{what}");
}

/// Runs the fused block and the ops in sequence on `x` and the pooled
/// gradient `dy`, and checks every output bit for bit.
fn check_block(what: &str, x: &Tensor, dy: &Tensor) {
    let c = x.shape()[1];
    let w = Tensor::from_vec(&[c], rand_vec_f32(c, 7).iter().map(|v| 1.0 + v).collect()).unwrap();
    let b = Tensor::from_vec(&[c], rand_vec_f32(c, 8).iter().map(|v| v * 0.5).collect()).unwrap();
    let state = || (Tensor::from_vec(&[c], rand_vec_f32(c, 9)).unwrap(), Tensor::full(&[c], 1.5));
    let ((mut rm, mut rv), (mut rm0, mut rv0)) = (state(), state());

    let (y, saved) = forward_train_relu_maxpool2(
        x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm, running_var: &mut rv },
        BnHyper::default(),
    )
    .unwrap();
    let (r, stats) = forward_train_relu(
        x,
        BnParams { weight: &w, bias: &b },
        RunningStats { running_mean: &mut rm0, running_var: &mut rv0 },
        BnHyper::default(),
    )
    .unwrap();
    let (y0, idx) = max_pool2d::forward(&r, 2, 2).unwrap();
    same(&format!("{what} y"), &y, &y0);
    same(&format!("{what} running_mean"), &rm, &rm0);
    same(&format!("{what} running_var"), &rv, &rv0);
    same_f32(&format!("{what} mean"), &saved.stats.mean, &stats.mean);
    same_f32(&format!("{what} invstd"), &saved.stats.invstd, &stats.invstd);

    let grads = || (Tensor::full(&[c], 0.25), Tensor::full(&[c], -0.5));
    let ((mut dw, mut db), (mut dw0, mut db0)) = (grads(), grads());
    let dx = backward_relu_maxpool2(x.clone(), &w, &saved, dy, BnGrads { dweight: &mut dw, dbias: &mut db })
        .unwrap();
    let mut d = max_pool2d::backward(dy, &idx, x.shape()).unwrap();
    relu::backward_(&r, &mut d).unwrap();
    let dx0 = backward(x, &w, &stats, &d, BnGrads { dweight: &mut dw0, dbias: &mut db0 }).unwrap();
    same(&format!("{what} dx"), &dx, &dx0);
    same(&format!("{what} dweight"), &dw, &dw0);
    same(&format!("{what} dbias"), &db, &db0);
}

/// (n, c, h, w): MNIST's two blocks, pooled widths past one vector, a
/// single window, planes past one 1,024-element sum block, batch 1, and a
/// batch large enough for the parallel paths.
const SHAPES: &[[usize; 4]] = &[
    [3, 2, 28, 28],
    [2, 3, 14, 14],
    [1, 2, 6, 34],
    [5, 1, 2, 2],
    [2, 2, 4, 66],
    [1, 1, 48, 46],
    [2, 2, 10, 32],
    [20, 16, 14, 14],
];

#[test]
fn f16_block_equals_the_ops_in_sequence() {
    for (i, &shape) in SHAPES.iter().enumerate() {
        let seed = 10 * i as u64;
        let len: usize = shape.iter().product();
        let pooled = [shape[0], shape[1], shape[2] / 2, shape[3] / 2];
        let x = f16_tensor(&shape, grid(len, seed));
        let dy = f16_tensor(&pooled, grid(len / 4, seed + 1).iter().map(|v| v * 3.0).collect());
        check_block(&format!("{shape:?}"), &x, &dy);
        // An f32 gradient from the layer after the block.
        let dy32 = Tensor::from_vec(&pooled, rand_vec_f32(len / 4, seed + 2)).unwrap();
        check_block(&format!("{shape:?} f32 dy"), &x, &dy32);
    }
}

#[test]
fn f16_block_with_overflow_nan_and_inf_equals_the_ops_in_sequence() {
    let shape = [2, 2, 6, 34];
    let len: usize = shape.iter().product();
    let pooled = [2, 2, 3, 17];
    // Values near f16's largest: the normalized output overflows to inf in
    // some windows, and a gradient overflows in dx.
    let big: Vec<f32> = grid(len, 3).iter().map(|v| v * 30000.0).collect();
    let dy: Vec<f32> = grid(len / 4, 4).iter().map(|v| v * 60000.0).collect();
    check_block("large", &f16_tensor(&shape, big.clone()), &f16_tensor(&pooled, dy.clone()));
    let mut with_nan = big;
    with_nan[100] = f32::NAN;
    with_nan[301] = f32::INFINITY;
    check_block("NaN x", &f16_tensor(&shape, with_nan), &f16_tensor(&pooled, dy.clone()));
    let mut nan_dy = dy;
    nan_dy[5] = f32::NAN;
    nan_dy[6] = f32::NEG_INFINITY;
    check_block("NaN dy", &f16_tensor(&shape, grid(len, 5)), &f16_tensor(&pooled, nan_dy));
}

fn h16(v: &[f32]) -> Vec<f16> {
    v.iter().map(|&x| f16::from_f32(x)).collect()
}

fn same16(what: &str, got: &[f16], want: &[f16]) {
    let b = |v: &f16| f64_bits(v.to_f64());
    let diff = got.iter().zip(want).position(|(x, y)| b(x) != b(y));
    assert!(diff.is_none(), "{what}: first differing element {diff:?}");
}

fn same_sums(what: &str, got: (f64, f64), want: (f64, f64)) {
    assert_eq!((f64_bits(got.0), f64_bits(got.1)), (f64_bits(want.0), f64_bits(want.1)), "{what}");
}

/// One plane's values with NaN in some rows and values that overflow f16
/// once normalized.
fn plane_input(len: usize, seed: u64) -> Vec<f32> {
    let mut x = grid(len, seed);
    for (i, v) in x.iter_mut().enumerate() {
        if i % 97 == 5 {
            *v = f32::NAN;
        } else if i % 89 == 3 {
            *v = 60000.0;
        } else if i % 83 == 2 {
            *v = f32::NEG_INFINITY;
        }
    }
    x
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_f16_planes_equal_the_generic() {
    use super::avx512_f16;
    if !super::avx512::usable() {
        eprintln!("no AVX-512 on this CPU: kernels not checked");
        return;
    }
    let planes = [(28, 28), (14, 14), (6, 34), (2, 2), (4, 66), (10, 32), (8, 30), (48, 46)];
    for (i, &(h, w)) in planes.iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        let (ip, op) = (h * w, (h / 2) * (w / 2));
        for (case, x) in [grid(ip, seed), plane_input(ip, seed)].iter().enumerate() {
            let x = h16(x);
            let what = format!("{h}x{w} case {case}");
            let ab = (1.3f32, -0.2f32);
            let (mut y, mut codes) = (vec![f16::ONE; op], vec![9u8; op]);
            let nan = avx512_f16::forward_plane(&x, w, ab.0, ab.1, &mut y, &mut codes);
            let (mut y0, mut codes0) = (vec![f16::ONE; op], vec![9u8; op]);
            forward_plane_generic(&x, w, ab, &mut y0, &mut codes0, &mut Scratch::default());
            assert_eq!(nan, x.iter().any(|v| v.is_nan()), "{what}: NaN rows reported");
            if !nan {
                same16(&format!("{what} y"), &y, &y0);
                assert_eq!(codes, codes0, "{what} codes");
            }
            assert!(op < 8 || codes0.contains(&KILLED), "{what}: no killed window");

            let g = h16(&grid(op, seed + 1).iter().map(|v| v * 3.0).collect::<Vec<_>>());
            let (mut dz, mut dz0) = (vec![7.0f32; ip], vec![7.0f32; ip]);
            avx512_f16::dz_plane(&g, &codes0, w, &mut dz);
            dz_plane_generic(&g.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), &codes0, w, &mut dz0);
            same_f32(&format!("{what} dz"), &dz, &dz0);

            let xw: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
            let mean = 0.1f32;
            let sums = avx512_f16::plane_backward_sums(&x, &dz0, mean);
            same_sums(&what, sums, super::cpu::plane_backward_sums(&xw, &dz0, mean));
            // An f16 `dz` (a plain BatchNorm2d's dy) widened in the loads.
            let (gw, xs) = (g.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), &x[..op]);
            let sums = avx512_f16::plane_backward_sums(xs, &g, mean);
            same_sums(&what, sums, super::cpu::plane_backward_sums(&xw[..op], &gw, mean));
            let shift = xw[0];
            same_sums(&what, avx512_f16::plane_sums(&x, shift), super::cpu::plane_sums_generic(&xw, shift));

            for kpq in [(0.7f32, -0.3f32, 0.05f32), (3000.0, 20.0, -0.0)] {
                let (mut dx, mut dx0) = (x.clone(), x.clone());
                avx512_f16::dx_plane(&mut dx, &dz0, kpq);
                dx_plane_generic(&mut dx0, &dz0, kpq, &mut Vec::new());
                same16(&format!("{what} dx {kpq:?}"), &dx, &dx0);
            }
        }
    }
}

#[test]
fn generic_f16_planes_equal_the_ops_in_sequence() {
    // The generic plane kernels are what a CPU without AVX-512 runs: check
    // them against the tensor ops too, on a plane with NaN rows.
    let (n, c, h, w) = (1, 1, 10, 32);
    let x = h16(&plane_input(h * w, 41));
    let (ab, op) = ((0.9f32, 0.1f32), (h / 2) * (w / 2));
    let (mut y, mut codes) = (vec![f16::ZERO; op], vec![0u8; op]);
    forward_plane_generic(&x, w, ab, &mut y, &mut codes, &mut Scratch::default());
    let xt = Tensor::from_f16_vec(&[n, c, h, w], x).unwrap();
    let z: Vec<f32> = xt.to_f32_vec().iter().map(|v| v * ab.0 + ab.1).collect();
    let mut r = f16_tensor(&[n, c, h, w], z);
    relu::forward_(&mut r).unwrap();
    let (y0, idx) = max_pool2d::forward(&r, 2, 2).unwrap();
    same16("y", &y, y0.as_f16().unwrap());
    let rv = r.to_f32_vec();
    for (o, (&code, &at)) in codes.iter().zip(&idx).enumerate() {
        let live = rv[at as usize] > 0.0 || rv[at as usize].is_nan();
        assert_eq!(code < KILLED, live, "window {o}: code {code}, ReLU output {}", rv[at as usize]);
    }
    // The generic backward sums and dx through the public drivers agree
    // with the AVX-512 ones (or are them, on a CPU without AVX-512).
    let g = h16(&grid(op, 42));
    let sums = f16_pool::backward_sums(xt.as_f16().unwrap(), &g, &codes, n, c, h, w, &[0.1], &[2.0]);
    let mut dz = vec![0.0f32; h * w];
    dz_plane_generic(&g.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), &codes, w, &mut dz);
    let xw = xt.to_f32_vec();
    let (s, q) = super::cpu::plane_backward_sums(&xw, &dz, 0.1);
    same_sums("driver", (sums.sum_dy[0], sums.sum_dy_xhat[0]), (s, q * 2.0));
}
