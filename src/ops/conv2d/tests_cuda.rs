//! GPU parity for kernels/conv2d.cu: each kernel against straightforward
//! loops here, and im2col/col2im/bias chained with a host GEMM against the
//! CPU twin (`conv2d::forward` / `backward`), which pins the column layout
//! to the convolution it must feed.

use super::{bias_add, bias_grad, col2im, col_len, im2col, ColLayout};
use crate::cuda::testing::{assert_close, download, poisoned, rounded, tol, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::Gpu;
use crate::ops::conv2d::cpu::ConvGeom;
use crate::ops::conv2d::{self, out_size, Conv2dArgs};
use crate::ops::testing::rand_vec_f32;
use crate::tensor::Tensor;
use half::f16;

/// `[n, c, h, w, o, k, stride, padding]`
fn geom([n, c, h, w, o, k, stride, padding]: [usize; 8]) -> ConvGeom {
    let (ho, wo) = (out_size(h, k, stride, padding), out_size(w, k, stride, padding));
    ConvGeom { n, c, h, w, o, k, stride, padding, ho, wo }
}

const GEOMS: [[usize; 8]; 6] = [
    [3, 5, 7, 7, 4, 5, 1, 2],
    [1, 1, 28, 28, 16, 5, 1, 2], // MNIST conv1, one image
    [2, 3, 13, 11, 5, 3, 2, 1],
    [3, 2, 9, 7, 3, 3, 3, 0],
    [2, 2, 5, 6, 3, 2, 1, 3], // padding wider than the kernel
    [2, 3, 8, 9, 2, 4, 2, 3],
];

/// Position of (img, r, q) in `col`.
fn at(g: &ConvGeom, layout: ColLayout, img: usize, r: usize, q: usize) -> usize {
    match layout {
        ColLayout::PerImage => (img * g.ckk() + r) * g.out_hw() + q,
        ColLayout::Wide => (r * g.n + img) * g.out_hw() + q,
    }
}

/// The input pixel (flat index into x) that col entry (img, r, q) reads, if
/// it is not padding.
fn source(g: &ConvGeom, img: usize, r: usize, q: usize) -> Option<usize> {
    let (ci, ki, kj) = (r / (g.k * g.k), r / g.k % g.k, r % g.k);
    let ih = ((q / g.wo) * g.stride + ki).checked_sub(g.padding).filter(|&v| v < g.h)?;
    let iw = ((q % g.wo) * g.stride + kj).checked_sub(g.padding).filter(|&v| v < g.w)?;
    Some(((img * g.c + ci) * g.h + ih) * g.w + iw)
}

fn im2col_ref(g: &ConvGeom, x: &[f32], layout: ColLayout) -> Vec<f32> {
    let mut col = vec![0f32; col_len(g)];
    for img in 0..g.n {
        for r in 0..g.ckk() {
            for q in 0..g.out_hw() {
                col[at(g, layout, img, r, q)] = source(g, img, r, q).map_or(0.0, |i| x[i]);
            }
        }
    }
    col
}

/// Scatter-add in row order (the order the CPU's col2im adds in).
fn col2im_ref(g: &ConvGeom, col: &[f32], layout: ColLayout) -> Vec<f32> {
    let mut dx = vec![0f32; g.n * g.x_len()];
    for img in 0..g.n {
        for r in 0..g.ckk() {
            for q in 0..g.out_hw() {
                if let Some(i) = source(g, img, r, q) {
                    dx[i] += col[at(g, layout, img, r, q)];
                }
            }
        }
    }
    dx
}

/// `|got - want| <= tol * max(|want|, mag)` elementwise, never NaN; `mag`
/// is the sum of the magnitudes that went into each element, the scale a
/// reordered f32 reduction's error is proportional to.
fn assert_close_mag(what: &str, got: &[f32], want: &[f32], mag: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!(!g.is_nan(), "{what}[{i}]: NaN (unwritten or poisoned), expected {w}");
        assert!((g - w).abs() <= tol * w.abs().max(m), "{what}[{i}]: got {g}, expected {w} (scale {m})");
    }
}

fn check_unfold<T: DeviceFloat>(gpu: &Gpu, g: &ConvGeom, layout: ColLayout, seed: u64) {
    let what = format!("conv2d {} {g:?} {layout:?}", T::SUFFIX);
    let x = rounded::<T>(&rand_vec_f32(g.n * g.x_len(), seed));
    let xd = upload::<T>(gpu, &x);
    let mut cold = poisoned::<T>(gpu, col_len(g));
    im2col(gpu, g, &xd, layout, &mut cold).unwrap();
    assert_close(&format!("{what}: im2col"), &download(gpu, &cold), &im2col_ref(g, &x, layout), tol::<T>());

    let col = rounded::<T>(&rand_vec_f32(col_len(g), seed + 1));
    let cold = upload::<T>(gpu, &col);
    let mut dxd = poisoned::<T>(gpu, g.n * g.x_len());
    col2im(gpu, g, &cold, layout, &mut dxd).unwrap();
    let want = rounded::<T>(&col2im_ref(g, &col, layout));
    assert_close(&format!("{what}: col2im"), &download(gpu, &dxd), &want, tol::<T>());
}

fn check_bias<T: DeviceFloat>(gpu: &Gpu, [n, o, hw]: [usize; 3], seed: u64) {
    let what = format!("conv2d {} bias [{n}, {o}, {hw}]", T::SUFFIX);
    let y = rounded::<T>(&rand_vec_f32(n * o * hw, seed));
    let b = rounded::<T>(&rand_vec_f32(o, seed + 1));
    let want: Vec<f32> = y.iter().enumerate().map(|(i, v)| v + b[i / hw % o]).collect();
    let mut yd = upload::<T>(gpu, &y);
    bias_add(gpu, [n, o, hw], &mut yd, &upload::<T>(gpu, &b)).unwrap();
    assert_close(&format!("{what}: bias_add"), &download(gpu, &yd), &rounded::<T>(&want), tol::<T>());

    let dy = rounded::<T>(&rand_vec_f32(n * o * hw, seed + 2));
    let mut sum = vec![0f64; o];
    let mut mag = vec![0f32; o];
    for (i, v) in dy.iter().enumerate() {
        sum[i / hw % o] += *v as f64;
        mag[i / hw % o] += v.abs();
    }
    let dyd = upload::<T>(gpu, &dy);
    // Overwrite: the NaN poison must not leak into the result.
    let mut dbd = poisoned::<T>(gpu, o);
    bias_grad(gpu, [n, o, hw], &dyd, &mut dbd, false).unwrap();
    let want: Vec<f32> = sum.iter().map(|&s| s as f32).collect();
    assert_close_mag(&format!("{what}: bias_grad"), &download(gpu, &dbd), &want, &mag, tol::<T>());
    // Accumulate onto an existing gradient.
    let db0 = rounded::<T>(&rand_vec_f32(o, seed + 3));
    let mut dbd = upload::<T>(gpu, &db0);
    bias_grad(gpu, [n, o, hw], &dyd, &mut dbd, true).unwrap();
    let want: Vec<f32> = sum.iter().zip(&db0).map(|(&s, &d)| (s + d as f64) as f32).collect();
    let mag: Vec<f32> = mag.iter().zip(&db0).map(|(m, d)| m + d.abs()).collect();
    assert_close_mag(&format!("{what}: bias_grad +="), &download(gpu, &dbd), &want, &mag, tol::<T>());
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    for (i, &gs) in GEOMS.iter().enumerate() {
        let g = geom(gs);
        check_unfold::<T>(gpu, &g, ColLayout::PerImage, seed + 10 * i as u64);
        check_unfold::<T>(gpu, &g, ColLayout::Wide, seed + 10 * i as u64 + 5);
    }
    // MNIST's bias shapes (batch 100), and odd ones.
    for (i, shape) in
        [[3, 5, 49], [100, 16, 784], [100, 32, 196], [1, 3, 1], [7, 300, 3]].into_iter().enumerate()
    {
        check_bias::<T>(gpu, shape, seed + 100 + 10 * i as u64);
    }
}

#[test]
fn conv2d_pieces_match_reference_loops_f32() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_pieces_match_reference_loops_f32") else { return };
    all_cases::<f32>(&gpu, 700);
}

#[test]
fn conv2d_pieces_match_reference_loops_f16() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_pieces_match_reference_loops_f16") else { return };
    all_cases::<f16>(&gpu, 800);
}

/// `out[img][a][q] = sum_b m[a][b] * col(img, b, q)` in f64 (the host
/// stand-in for cuBLAS), with the magnitude sum of each output alongside.
fn host_gemm(
    a_rows: usize,
    m: &[f32],
    m_t: bool,
    b_rows: usize,
    n: usize,
    hw: usize,
    col: impl Fn(usize, usize, usize) -> f32,
) -> (Vec<f32>, Vec<f32>) {
    let (mut out, mut mag) = (vec![0f32; n * a_rows * hw], vec![0f32; n * a_rows * hw]);
    for img in 0..n {
        for a in 0..a_rows {
            for q in 0..hw {
                let (mut s, mut s_abs) = (0f64, 0f64);
                for b in 0..b_rows {
                    let w = if m_t { m[b * a_rows + a] } else { m[a * b_rows + b] } as f64;
                    let v = col(img, b, q) as f64;
                    s += w * v;
                    s_abs += (w * v).abs();
                }
                out[(img * a_rows + a) * hw + q] = s as f32;
                mag[(img * a_rows + a) * hw + q] = s_abs as f32;
            }
        }
    }
    (out, mag)
}

#[test]
fn conv2d_pieces_with_a_gemm_reproduce_the_cpu_conv2d() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_pieces_with_a_gemm_reproduce_the_cpu_conv2d") else {
        return;
    };
    for (i, &gs) in GEOMS.iter().enumerate() {
        for layout in [ColLayout::PerImage, ColLayout::Wide] {
            let g = geom(gs);
            let what = format!("conv2d {g:?} {layout:?}");
            let seed = 900 + 10 * i as u64;
            let x = rand_vec_f32(g.n * g.x_len(), seed);
            let w = rand_vec_f32(g.o * g.ckk(), seed + 1);
            let b = rand_vec_f32(g.o, seed + 2);
            let dy = rand_vec_f32(g.n * g.y_len(), seed + 3);
            let xt = Tensor::from_vec(&[g.n, g.c, g.h, g.w], x.clone()).unwrap();
            let wt = Tensor::from_vec(&[g.o, g.c, g.k, g.k], w.clone()).unwrap();
            let bt = Tensor::from_vec(&[g.o], b.clone()).unwrap();
            let dyt = Tensor::from_vec(&[g.n, g.o, g.ho, g.wo], dy.clone()).unwrap();
            let args = Conv2dArgs { stride: g.stride, padding: g.padding };
            let y_cpu = conv2d::forward(&xt, &wt, Some(&bt), args).unwrap().into_f32_vec().unwrap();
            let mut dwt = Tensor::zeros(&[g.o, g.c, g.k, g.k]);
            let mut dbt = Tensor::zeros(&[g.o]);
            let dx_cpu =
                conv2d::backward(&xt, &wt, &dyt, args, &mut dwt, Some(&mut dbt), true).unwrap().unwrap();
            let (dx_cpu, db_cpu) = (dx_cpu.into_f32_vec().unwrap(), dbt.into_f32_vec().unwrap());

            // Forward: im2col, y = W * col on the host, bias on the device.
            let xd = upload::<f32>(&gpu, &x);
            let mut cold = poisoned::<f32>(&gpu, col_len(&g));
            im2col(&gpu, &g, &xd, layout, &mut cold).unwrap();
            let col = download(&gpu, &cold);
            let (y, mag) = host_gemm(g.o, &w, false, g.ckk(), g.n, g.out_hw(), |img, r, q| {
                col[at(&g, layout, img, r, q)]
            });
            let mut yd = upload::<f32>(&gpu, &y);
            bias_add(&gpu, [g.n, g.o, g.out_hw()], &mut yd, &upload::<f32>(&gpu, &b)).unwrap();
            let mag: Vec<f32> =
                mag.iter().enumerate().map(|(j, m)| m + b[j / g.out_hw() % g.o].abs()).collect();
            assert_close_mag(&format!("{what}: y"), &download(&gpu, &yd), &y_cpu, &mag, 1e-5);

            // dx: dcol = W^T * dy on the host, laid out for col2im.
            let (dcol_img, mag) = host_gemm(g.ckk(), &w, true, g.o, g.n, g.out_hw(), |img, o, q| {
                dy[(img * g.o + o) * g.out_hw() + q]
            });
            let mut dcol = vec![0f32; col_len(&g)];
            let mut dcol_mag = vec![0f32; col_len(&g)];
            for img in 0..g.n {
                for r in 0..g.ckk() {
                    for q in 0..g.out_hw() {
                        let from = (img * g.ckk() + r) * g.out_hw() + q;
                        dcol[at(&g, layout, img, r, q)] = dcol_img[from];
                        dcol_mag[at(&g, layout, img, r, q)] = mag[from];
                    }
                }
            }
            let mut dxd = poisoned::<f32>(&gpu, g.n * g.x_len());
            col2im(&gpu, &g, &upload::<f32>(&gpu, &dcol), layout, &mut dxd).unwrap();
            let dx_mag = col2im_ref(&g, &dcol_mag, layout);
            assert_close_mag(&format!("{what}: dx"), &download(&gpu, &dxd), &dx_cpu, &dx_mag, 1e-5);

            let mut dbd = poisoned::<f32>(&gpu, g.o);
            bias_grad(&gpu, [g.n, g.o, g.out_hw()], &upload::<f32>(&gpu, &dy), &mut dbd, false).unwrap();
            let mut db_mag = vec![0f32; g.o];
            for (j, v) in dy.iter().enumerate() {
                db_mag[j / g.out_hw() % g.o] += v.abs();
            }
            assert_close_mag(&format!("{what}: db"), &download(&gpu, &dbd), &db_cpu, &db_mag, 1e-5);
        }
    }
}

#[test]
fn conv2d_pieces_refuse_inconsistent_sizes() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_pieces_refuse_inconsistent_sizes") else { return };
    let g = geom([2, 3, 7, 7, 4, 3, 1, 1]);
    let x = upload::<f32>(&gpu, &vec![0.0; g.n * g.x_len()]);
    let mut col = poisoned::<f32>(&gpu, col_len(&g) - 1);
    let e = im2col(&gpu, &g, &x, ColLayout::PerImage, &mut col).unwrap_err().to_string();
    assert!(e.contains("conv2d im2col: col holds 2645 elements, expected 2646"), "{e}");
    let bad = ConvGeom { ho: 6, ..g };
    let mut col = poisoned::<f32>(&gpu, col_len(&bad));
    let e = im2col(&gpu, &bad, &x, ColLayout::Wide, &mut col).unwrap_err().to_string();
    assert!(e.contains("conv2d im2col: inconsistent convolution geometry"), "{e}");
    let mut dx = poisoned::<f32>(&gpu, 5);
    let col = poisoned::<f32>(&gpu, col_len(&g));
    let e = col2im(&gpu, &g, &col, ColLayout::PerImage, &mut dx).unwrap_err().to_string();
    assert!(e.contains("conv2d col2im: dx holds 5 elements, expected 294"), "{e}");
    let mut y = poisoned::<f32>(&gpu, 24);
    let e = bias_add(&gpu, [2, 4, 3], &mut y, &upload::<f32>(&gpu, &[0.0; 3])).unwrap_err().to_string();
    assert!(e.contains("conv2d bias_add: bias holds 3 elements, expected 4"), "{e}");
    let mut db = poisoned::<f32>(&gpu, 4);
    let e = bias_grad(&gpu, [2, 4, 4], &y, &mut db, false).unwrap_err().to_string();
    assert!(e.contains("conv2d bias_grad: dy holds 24 elements, expected 32"), "{e}");
}

/// `conv2d::forward` / `backward` on the CPU over `T`-rounded inputs
/// (f16 through the CPU's widened path): y, dw0 + dW, db0 + dB, dx.
#[allow(clippy::too_many_arguments)]
fn cpu_conv(
    g: &ConvGeom,
    dtype: crate::tensor::DType,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    dy: &[f32],
    dw0: &[f32],
    db0: &[f32],
) -> [Vec<f32>; 4] {
    let t = |shape: &[usize], v: &[f32]| Tensor::from_f32_as(shape, v.to_vec(), dtype).unwrap();
    let (xs, ws, ys) = ([g.n, g.c, g.h, g.w], [g.o, g.c, g.k, g.k], [g.n, g.o, g.ho, g.wo]);
    let (xt, wt, bt, dyt) = (t(&xs, x), t(&ws, w), t(&[g.o], b), t(&ys, dy));
    let args = Conv2dArgs { stride: g.stride, padding: g.padding };
    let y = conv2d::forward(&xt, &wt, Some(&bt), args).unwrap().to_f32_vec();
    let (mut dwt, mut dbt) = (t(&ws, dw0), t(&[g.o], db0));
    let dx = conv2d::backward(&xt, &wt, &dyt, args, &mut dwt, Some(&mut dbt), true).unwrap().unwrap();
    [y, dwt.to_f32_vec(), dbt.to_f32_vec(), dx.to_f32_vec()]
}

fn check_chained<T: DeviceFloat + crate::cuda::blas::BlasElem>(gpu: &Gpu, gs: [usize; 8], seed: u64) {
    use crate::tensor::DType;
    let g = geom(gs);
    let what = format!("conv2d {} {g:?}", <T as DeviceFloat>::SUFFIX);
    let dtype = if <T as DeviceFloat>::SUFFIX == "f16" { DType::F16 } else { DType::F32 };
    let r = |len, s| rounded::<T>(&rand_vec_f32(len, s));
    let (x, w, b) = (r(g.n * g.x_len(), seed), r(g.o * g.ckk(), seed + 1), r(g.o, seed + 2));
    let (dy, dw0, db0) = (r(g.n * g.y_len(), seed + 3), r(g.o * g.ckk(), seed + 4), r(g.o, seed + 5));
    let want = cpu_conv(&g, dtype, &x, &w, &b, &dy, &dw0, &db0);
    // The bound on each result's error: the same sums over magnitudes.
    let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
    let mag = cpu_conv(&g, DType::F32, &abs(&x), &abs(&w), &abs(&b), &abs(&dy), &abs(&dw0), &abs(&db0));

    let blas = crate::cuda::blas::Blas::new(gpu, false).unwrap();
    let (xd, wd, bd, dyd) =
        (upload::<T>(gpu, &x), upload::<T>(gpu, &w), upload::<T>(gpu, &b), upload::<T>(gpu, &dy));
    // Scratch larger than this conv needs, as a model's shared scratch is.
    let mut col = poisoned::<T>(gpu, col_len(&g) + 7);
    let mut dy_t = poisoned::<T>(gpu, super::dy_t_len(&g) + 3);
    let mut yd = poisoned::<T>(gpu, g.n * g.y_len());
    let (mut colv, mut yv) = (col.as_view_mut(), yd.as_view_mut());
    super::forward(gpu, &blas, &g, &xd.as_view(), &wd.as_view(), Some(&bd.as_view()), &mut colv, &mut yv)
        .unwrap();
    let tol = tol::<T>();
    assert_close_mag(&format!("{what}: y"), &download(gpu, &yd), &want[0], &mag[0], tol);

    let (mut dwd, mut dbd) = (upload::<T>(gpu, &dw0), upload::<T>(gpu, &db0));
    let mut dxd = poisoned::<T>(gpu, g.n * g.x_len());
    super::backward(
        gpu,
        &blas,
        &g,
        &xd.as_view(),
        &wd.as_view(),
        &dyd.as_view(),
        &mut col.as_view_mut(),
        &mut dy_t.as_view_mut(),
        &mut dwd.as_view_mut(),
        Some(&mut dbd.as_view_mut()),
        Some(&mut dxd.as_view_mut()),
    )
    .unwrap();
    assert_close_mag(&format!("{what}: dw (accumulated)"), &download(gpu, &dwd), &want[1], &mag[1], tol);
    assert_close_mag(&format!("{what}: db (accumulated)"), &download(gpu, &dbd), &want[2], &mag[2], tol);
    assert_close_mag(&format!("{what}: dx"), &download(gpu, &dxd), &want[3], &mag[3], tol);

    // Without a bias and without dx (the first layer): y is still fully written.
    let mut yd = poisoned::<T>(gpu, g.n * g.y_len());
    super::forward(
        gpu,
        &blas,
        &g,
        &xd.as_view(),
        &wd.as_view(),
        None,
        &mut col.as_view_mut(),
        &mut yd.as_view_mut(),
    )
    .unwrap();
    let want_nb: Vec<f32> = (0..want[0].len()).map(|i| want[0][i] - b[i / g.out_hw() % g.o]).collect();
    assert_close_mag(&format!("{what}: y without bias"), &download(gpu, &yd), &want_nb, &mag[0], tol);
    let mut dwd = upload::<T>(gpu, &dw0);
    super::backward(
        gpu,
        &blas,
        &g,
        &xd.as_view(),
        &wd.as_view(),
        &dyd.as_view(),
        &mut col.as_view_mut(),
        &mut dy_t.as_view_mut(),
        &mut dwd.as_view_mut(),
        None,
        None,
    )
    .unwrap();
    assert_close_mag(&format!("{what}: dw without dx"), &download(gpu, &dwd), &want[1], &mag[1], tol);
}

#[test]
fn conv2d_forward_backward_match_the_cpu_conv2d_f32() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_forward_backward_match_the_cpu_conv2d_f32") else { return };
    for (i, &gs) in GEOMS.iter().enumerate() {
        check_chained::<f32>(&gpu, gs, 1100 + 10 * i as u64);
    }
    // MNIST's second conv at a small batch.
    check_chained::<f32>(&gpu, [3, 16, 14, 14, 32, 5, 1, 2], 1190);
}

#[test]
fn conv2d_forward_backward_match_the_cpu_conv2d_f16() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_forward_backward_match_the_cpu_conv2d_f16") else { return };
    for (i, &gs) in GEOMS.iter().enumerate() {
        check_chained::<f16>(&gpu, gs, 1200 + 10 * i as u64);
    }
    check_chained::<f16>(&gpu, [3, 16, 14, 14, 32, 5, 1, 2], 1290);
}

#[test]
fn conv2d_forward_backward_refuse_short_buffers() {
    let Some(gpu) = crate::cuda::test_gpu("conv2d_forward_backward_refuse_short_buffers") else { return };
    let blas = crate::cuda::blas::Blas::new(&gpu, false).unwrap();
    let g = geom([2, 3, 7, 7, 4, 3, 1, 1]);
    let x = upload::<f32>(&gpu, &vec![0.0; g.n * g.x_len()]);
    let w = upload::<f32>(&gpu, &vec![0.0; g.o * g.ckk()]);
    let mut col = poisoned::<f32>(&gpu, col_len(&g) - 1);
    let mut y = poisoned::<f32>(&gpu, g.n * g.y_len());
    let e = super::forward(
        &gpu,
        &blas,
        &g,
        &x.as_view(),
        &w.as_view(),
        None,
        &mut col.as_view_mut(),
        &mut y.as_view_mut(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("conv2d forward: col holds 2645 elements, needs at least 2646"), "{e}");
    let mut col = poisoned::<f32>(&gpu, col_len(&g));
    let mut dy_t = poisoned::<f32>(&gpu, super::dy_t_len(&g));
    let mut dw = poisoned::<f32>(&gpu, g.o * g.ckk() + 1);
    let e = super::backward(
        &gpu,
        &blas,
        &g,
        &x.as_view(),
        &w.as_view(),
        &y.as_view(),
        &mut col.as_view_mut(),
        &mut dy_t.as_view_mut(),
        &mut dw.as_view_mut(),
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("conv2d backward: dweight holds 109 elements, expected 108"), "{e}");
}
