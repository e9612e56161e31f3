use super::cpu::{self, Geometry};
use super::*;
use crate::ops::testing::{check_grad, dot, rand_vec, rand_vec_f32};

fn args(k: [usize; 2], s: [usize; 2], p: [usize; 2]) -> AvgPool2dArgs {
    AvgPool2dArgs { kernel: k, stride: s, padding: p }
}

/// Plain loops over the zero-padded input: every window position is read
/// (padding as 0.0), row-major, and the sum divided by `kh * kw`.
fn naive(x: &[f32], planes: usize, h: usize, w: usize, a: AvgPool2dArgs) -> Vec<f32> {
    let ([kh, kw], [sh, sw], [ph, pw]) = (a.kernel, a.stride, a.padding);
    let (oh, ow) = ((h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1);
    let mut y = Vec::new();
    for p in 0..planes {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut sum = 0.0f32;
                for ky in 0..kh {
                    for kx in 0..kw {
                        let (iy, ix) =
                            ((oy * sh + ky) as isize - ph as isize, (ox * sw + kx) as isize - pw as isize);
                        let inside = (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix);
                        sum += if inside { x[p * h * w + iy as usize * w + ix as usize] } else { 0.0 };
                    }
                }
                y.push(sum / (kh * kw) as f32);
            }
        }
    }
    y
}

/// The backward as PyTorch's CPU kernel writes it: each output scatters
/// `dy / divisor` over its window (inside the input), outputs in order.
fn naive_backward(dy: &[f32], planes: usize, h: usize, w: usize, a: AvgPool2dArgs) -> Vec<f32> {
    let ([kh, kw], [sh, sw], [ph, pw]) = (a.kernel, a.stride, a.padding);
    let (oh, ow) = ((h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1);
    let mut dx = vec![0.0f32; planes * h * w];
    for p in 0..planes {
        for oy in 0..oh {
            for ox in 0..ow {
                let g = dy[(p * oh + oy) * ow + ox] / (kh * kw) as f32;
                for ky in 0..kh {
                    for kx in 0..kw {
                        let (iy, ix) =
                            ((oy * sh + ky) as isize - ph as isize, (ox * sw + kx) as isize - pw as isize);
                        if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                            dx[p * h * w + iy as usize * w + ix as usize] += g;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// (n, c, h, w, args): square and rectangular windows, overlaps, gaps
/// (stride > kernel), padding on one or both axes, dropped floor-mode
/// edges, global pooling of a ResNet's last stages, and shapes large enough
/// for the threaded path.
fn cases() -> Vec<(usize, usize, usize, usize, AvgPool2dArgs)> {
    vec![
        (2, 3, 8, 8, args([2, 2], [2, 2], [0, 0])),
        (1, 2, 7, 9, args([3, 3], [2, 2], [1, 1])),
        (2, 1, 6, 5, args([3, 2], [1, 2], [1, 0])),
        (1, 3, 10, 11, args([3, 3], [3, 3], [0, 1])),
        (1, 2, 5, 7, args([2, 4], [3, 1], [1, 2])),
        (1, 1, 4, 4, args([5, 5], [1, 1], [2, 2])),
        (2, 64, 8, 8, AvgPool2dArgs::global(8, 8)),
        (3, 32, 7, 7, AvgPool2dArgs::global(7, 7)),
        (8, 16, 32, 31, args([3, 3], [2, 2], [1, 1])),
        (4, 128, 8, 8, AvgPool2dArgs::global(8, 8)),
    ]
}

#[test]
fn forward_matches_naive_for_various_geometries() {
    for (seed, (n, c, h, w, a)) in cases().into_iter().enumerate() {
        let x = rand_vec_f32(n * c * h * w, seed as u64 + 1);
        let y = forward(&Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap(), a).unwrap();
        let (oh, ow) = a.out_hw(h, w).unwrap();
        assert_eq!(y.shape(), &[n, c, oh, ow], "{a:?} on {h}x{w}");
        // Adding a padded 0.0 to a sum leaves it unchanged, so the same order
        // gives the same bits.
        assert_eq!(y.as_f32().unwrap(), &naive(&x, n * c, h, w, a)[..], "{a:?} on {h}x{w}");
    }
}

#[test]
fn known_values_and_global_pooling_is_the_plane_mean() {
    let x = Tensor::from_vec(&[1, 1, 3, 3], (1..=9).map(|v| v as f32).collect()).unwrap();
    let y = forward(&x, args([2, 2], [1, 1], [0, 0])).unwrap();
    assert_eq!(y.as_f32().unwrap(), &[3.0, 4.0, 6.0, 7.0]);
    // Padded 3x3 windows at stride 2: the zeros count, so a corner window
    // holding 1, 2, 4, 5 gives 12 / 9, as nn.AvgPool2d(3, 2, 1) does.
    let y = forward(&x, args([3, 3], [2, 2], [1, 1])).unwrap();
    assert_eq!(y.shape(), &[1, 1, 2, 2]);
    assert_eq!(y.as_f32().unwrap(), &[12.0 / 9.0, 16.0 / 9.0, 24.0 / 9.0, 28.0 / 9.0]);

    let (n, c, h, w) = (2, 3, 7, 7);
    let x = rand_vec_f32(n * c * h * w, 5);
    let y =
        forward(&Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap(), AvgPool2dArgs::global(h, w)).unwrap();
    assert_eq!(y.shape(), &[n, c, 1, 1]);
    for (p, &v) in y.as_f32().unwrap().iter().enumerate() {
        let sum: f32 = x[p * h * w..(p + 1) * h * w].iter().sum();
        assert_eq!(v, sum / 49.0, "plane {p}");
    }
}

#[test]
fn backward_matches_finite_differences() {
    let geoms = [
        (7, 8, args([2, 2], [2, 2], [0, 0])),
        (7, 6, args([3, 3], [2, 2], [1, 1])),
        (5, 6, args([3, 2], [1, 2], [1, 1])),
        (6, 6, AvgPool2dArgs::global(6, 6)),
    ];
    for (seed, (h, w, a)) in geoms.into_iter().enumerate() {
        let planes = 3;
        let (oh, ow) = a.out_hw(h, w).unwrap();
        let g = Geometry { h, w, oh, ow, args: a };
        let x = rand_vec(planes * h * w, 10 + seed as u64);
        let r = rand_vec(planes * oh * ow, 20 + seed as u64);
        let mut dx = vec![f64::NAN; x.len()];
        cpu::backward(&r, g, &mut dx);
        let pool = |xp: &[f64]| {
            let mut y = vec![0.0; r.len()];
            cpu::forward(xp, g, &mut y);
            y
        };
        check_grad(&format!("avg_pool2d dx {a:?}"), &x, &dx, |xp| dot(&r, &pool(xp)), 1e-6);
    }
}

#[test]
fn tensor_backward_matches_the_scatter_in_output_order() {
    for (seed, (n, c, h, w, a)) in cases().into_iter().enumerate() {
        let (oh, ow) = a.out_hw(h, w).unwrap();
        let dy = rand_vec_f32(n * c * oh * ow, 40 + seed as u64);
        let dx = backward(&Tensor::from_vec(&[n, c, oh, ow], dy.clone()).unwrap(), &[n, c, h, w], a).unwrap();
        assert_eq!(dx.shape(), &[n, c, h, w]);
        assert_eq!(dx.as_f32().unwrap(), &naive_backward(&dy, n * c, h, w, a)[..], "{a:?} on {h}x{w}");
    }
    // Floor mode drops the last row and column: they get no gradient.
    let a = args([2, 2], [2, 2], [0, 0]);
    let dx = backward(&Tensor::full(&[1, 1, 2, 2], 4.0), &[1, 1, 5, 5], a).unwrap();
    let dx = dx.as_f32().unwrap();
    assert!(dx[..4].iter().all(|&v| v == 1.0), "{dx:?}");
    assert!(dx[20..].iter().chain(dx.iter().skip(4).step_by(5)).all(|&v| v == 0.0), "{dx:?}");
}

#[test]
fn errors_name_the_problem() {
    let x = Tensor::zeros(&[1, 2, 3, 5]);
    let m = forward(&x, args([0, 2], [1, 1], [0, 0])).unwrap_err().to_string();
    assert!(
        m.contains("avg_pool2d: kernel and stride must be positive, got kernel [0, 2], stride [1, 1]"),
        "{m}"
    );
    let m = forward(&x, args([2, 2], [1, 0], [0, 0])).unwrap_err().to_string();
    assert!(m.contains("got kernel [2, 2], stride [1, 0]"), "{m}");
    let m = forward(&x, args([3, 3], [1, 1], [1, 2])).unwrap_err().to_string();
    assert!(m.contains("avg_pool2d: padding [1, 2] must be at most half the kernel [3, 3]"), "{m}");
    let m = forward(&x, args([4, 2], [1, 1], [0, 1])).unwrap_err().to_string();
    assert!(m.contains("avg_pool2d: the 4x2 window is larger than the 3x5 input padded by [0, 1]"), "{m}");
    let m = forward(&x, args([1 << 40, 1], [1, 1], [0, 0])).unwrap_err().to_string();
    assert!(m.contains("do not fit in i32"), "{m}");
    let m = forward(&Tensor::zeros(&[2, 3, 5]), args([2, 2], [2, 2], [0, 0])).unwrap_err().to_string();
    assert!(m.contains("avg_pool2d forward: expected a 4-D [N, C, H, W] input, got shape [2, 3, 5]"), "{m}");
    // Padding exactly half the kernel is allowed, and a window as large as
    // the padded input gives one output.
    assert_eq!(args([4, 4], [1, 1], [2, 2]).out_hw(1, 1).unwrap(), (2, 2));
    assert_eq!(args([3, 5], [2, 2], [1, 0]).out_hw(1, 5).unwrap(), (1, 1));

    let a = args([2, 2], [2, 2], [0, 0]);
    let m = backward(&Tensor::zeros(&[1, 2, 1, 3]), &[1, 2, 3, 5], a).unwrap_err().to_string();
    assert!(
        m.contains("avg_pool2d backward: dy (for an input of shape [1, 2, 3, 5]): expected shape [1, 2, 1, 2], got [1, 2, 1, 3]"),
        "{m}"
    );
    let m = backward(&Tensor::zeros(&[1, 2, 1, 2]), &[1, 2, 3], a).unwrap_err().to_string();
    assert!(
        m.contains("avg_pool2d backward: expected a 4-D [N, C, H, W] x_shape, got shape [1, 2, 3]"),
        "{m}"
    );
    let m = backward(&Tensor::zeros(&[2, 1, 2]), &[1, 2, 3, 5], a).unwrap_err().to_string();
    assert!(m.contains("expected a 4-D [N, C, H, W] dy, got shape [2, 1, 2]"), "{m}");
}
