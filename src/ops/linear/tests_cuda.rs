//! GPU linear vs the CPU twin (`super::super::{forward, backward}`) on fresh
//! random inputs with odd sizes; outputs poisoned with NaN before each launch.

use super::*;
use crate::cuda::Gpu;
use crate::ops::linear as cpu;
use crate::ops::testing::rand_vec_f32;
use crate::tensor::{DType, Tensor};
use cudarc::driver::CudaSlice;
use half::f16;

/// (N, in, out): odd, a single row/feature, and the MNIST head (1568 -> 10).
const SIZES: &[(usize, usize, usize)] = &[(3, 13, 5), (7, 33, 1), (1, 5, 10), (100, 1568, 10), (37, 129, 70)];

/// One element type under test: its conversions, dtype and tolerance.
trait Case: BlasElem {
    const DTYPE: DType;
    const TOL: f32;
    fn of(v: f32) -> Self;
    fn back(self) -> f32;
}

impl Case for f32 {
    const DTYPE: DType = DType::F32;
    const TOL: f32 = 1e-5;
    fn of(v: f32) -> f32 {
        v
    }
    fn back(self) -> f32 {
        self
    }
}

impl Case for f16 {
    const DTYPE: DType = DType::F16;
    const TOL: f32 = 1e-2;
    fn of(v: f32) -> f16 {
        f16::from_f32(v)
    }
    fn back(self) -> f32 {
        self.to_f32()
    }
}

/// A CPU tensor of dtype T and the same values on the GPU.
fn pair<T: Case>(gpu: &Gpu, shape: &[usize], seed: u64) -> (Tensor, CudaSlice<T>) {
    let t = Tensor::from_f32_as(shape, rand_vec_f32(shape.iter().product(), seed), T::DTYPE).unwrap();
    let host: Vec<T> = t.to_f32_vec().into_iter().map(T::of).collect();
    (t, gpu.stream().clone_htod(&host).unwrap())
}

fn poisoned<T: Case>(gpu: &Gpu, n: usize) -> CudaSlice<T> {
    gpu.stream().clone_htod(&vec![T::of(f32::NAN); n]).unwrap()
}

fn download<T: Case>(gpu: &Gpu, d: &CudaSlice<T>) -> Vec<f32> {
    gpu.stream().clone_dtoh(d).unwrap().into_iter().map(T::back).collect()
}

/// max |got - want| / max |want|; any NaN fails (an unwritten element).
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(!g.is_nan(), "{what}: NaN at {i} (unwritten or poisoned)");
        worst = worst.max((g - w).abs() / scale);
    }
    assert!(worst < tol, "{what}: relative error {worst} >= {tol}");
}

fn forward_case<T: Case>(gpu: &Gpu, blas: &Blas, with_bias: bool) {
    for (s, &(n, i, o)) in SIZES.iter().enumerate() {
        let seed = 10 * s as u64;
        let (x, dx_) = pair::<T>(gpu, &[n, i], seed + 1);
        let (w, dw_) = pair::<T>(gpu, &[o, i], seed + 2);
        let (b, db_) = pair::<T>(gpu, &[o], seed + 3);
        let mut y = poisoned::<T>(gpu, n * o);
        let bias = db_.as_view();
        forward(
            gpu,
            blas,
            n,
            i,
            o,
            &dx_.as_view(),
            &dw_.as_view(),
            with_bias.then_some(&bias),
            &mut y.as_view_mut(),
        )
        .unwrap();
        let want = cpu::forward(&x, &w, with_bias.then_some(&b)).unwrap();
        let what = format!("forward {} N={n} in={i} out={o} bias={with_bias}", T::SUFFIX);
        assert_close(&what, &download(gpu, &y), &want.to_f32_vec(), T::TOL);
    }
}

fn backward_case<T: Case>(gpu: &Gpu, blas: &Blas, with_bias: bool, need_dx: bool) {
    for (s, &(n, i, o)) in SIZES.iter().enumerate() {
        let seed = 100 + 10 * s as u64;
        let (x, gx) = pair::<T>(gpu, &[n, i], seed + 1);
        let (w, gw) = pair::<T>(gpu, &[o, i], seed + 2);
        let (dy, gdy) = pair::<T>(gpu, &[n, o], seed + 3);
        // The gradients start non-zero: backward must add to them, not overwrite.
        let (mut dw, mut gdw) = pair::<T>(gpu, &[o, i], seed + 4);
        let (mut db, mut gdb) = pair::<T>(gpu, &[o], seed + 5);
        let mut gdx = poisoned::<T>(gpu, n * i);
        let mut dbv = gdb.as_view_mut();
        let mut dxv = gdx.as_view_mut();
        backward(
            gpu,
            blas,
            n,
            i,
            o,
            &gx.as_view(),
            &gw.as_view(),
            &gdy.as_view(),
            &mut gdw.as_view_mut(),
            with_bias.then_some(&mut dbv),
            need_dx.then_some(&mut dxv),
        )
        .unwrap();
        let want_dx = cpu::backward(&x, &w, &dy, &mut dw, with_bias.then_some(&mut db), need_dx).unwrap();
        let what = format!("backward {} N={n} in={i} out={o}", T::SUFFIX);
        assert_close(&format!("{what} dweight"), &download(gpu, &gdw), &dw.to_f32_vec(), T::TOL);
        // Without a bias gradient the buffer stays as it was (here: its random start).
        assert_close(&format!("{what} dbias"), &download(gpu, &gdb), &db.to_f32_vec(), T::TOL);
        let got_dx = download(gpu, &gdx);
        match want_dx {
            Some(want) => assert_close(&format!("{what} dx"), &got_dx, &want.to_f32_vec(), T::TOL),
            None => assert!(got_dx.iter().all(|v| v.is_nan()), "{what}: dx written although not requested"),
        }
    }
}

fn setup(name: &str) -> Option<(std::sync::Arc<Gpu>, Blas)> {
    let gpu = crate::cuda::test_gpu(name)?;
    let blas = Blas::new(&gpu, false).unwrap();
    Some((gpu, blas))
}

#[test]
fn linear_forward_matches_cpu_f32() {
    let Some((gpu, blas)) = setup("linear_forward_matches_cpu_f32") else { return };
    forward_case::<f32>(&gpu, &blas, true);
    forward_case::<f32>(&gpu, &blas, false);
}

#[test]
fn linear_forward_matches_cpu_f16() {
    let Some((gpu, blas)) = setup("linear_forward_matches_cpu_f16") else { return };
    forward_case::<f16>(&gpu, &blas, true);
    forward_case::<f16>(&gpu, &blas, false);
}

#[test]
fn linear_backward_matches_cpu_f32() {
    let Some((gpu, blas)) = setup("linear_backward_matches_cpu_f32") else { return };
    backward_case::<f32>(&gpu, &blas, true, true);
    backward_case::<f32>(&gpu, &blas, false, false);
}

#[test]
fn linear_backward_matches_cpu_f16() {
    let Some((gpu, blas)) = setup("linear_backward_matches_cpu_f16") else { return };
    backward_case::<f16>(&gpu, &blas, true, true);
    backward_case::<f16>(&gpu, &blas, false, false);
}

#[test]
fn linear_bias_grad_is_deterministic_over_many_rows() {
    let Some((gpu, blas)) = setup("linear_bias_grad_is_deterministic_over_many_rows") else { return };
    // 4099 rows, 65 columns: several row lanes, a partial column block.
    let (n, i, o) = (4099, 3, 65);
    let (_, gx) = pair::<f32>(&gpu, &[n, i], 1);
    let (_, gw) = pair::<f32>(&gpu, &[o, i], 2);
    let (_, gdy) = pair::<f32>(&gpu, &[n, o], 3);
    let run = || {
        let mut gdw = gpu.stream().alloc_zeros::<f32>(o * i).unwrap();
        let mut gdb = gpu.stream().alloc_zeros::<f32>(o).unwrap();
        let mut dbv = gdb.as_view_mut();
        backward(
            &gpu,
            &blas,
            n,
            i,
            o,
            &gx.as_view(),
            &gw.as_view(),
            &gdy.as_view(),
            &mut gdw.as_view_mut(),
            Some(&mut dbv),
            None,
        )
        .unwrap();
        download(&gpu, &gdb)
    };
    let first = run();
    assert_eq!(first, run(), "the bias gradient must be bitwise reproducible");
    let host = download(&gpu, &gdy);
    let want: Vec<f32> = (0..o).map(|c| (0..n).map(|r| host[r * o + c] as f64).sum::<f64>() as f32).collect();
    assert_close("dbias over 4099 rows", &first, &want, 1e-5);
}

#[test]
fn wrong_buffer_lengths_are_refused_before_any_launch() {
    let e = check_lens("linear (N=2, in=3, out=4) forward", &[("input", Some(6), 6), ("bias", Some(3), 4)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("linear (N=2, in=3, out=4) forward: bias has 3 elements, expected 4"), "{e}");
    assert!(check_lens("x", &[("dbias", None, 4), ("dx", Some(6), 6)]).is_ok());
}
