//! Helpers for the GPU parity tests of every op family.

use crate::cuda::DeviceFloat;
use crate::cuda::Gpu;
use cudarc::driver::CudaSlice;

/// `host` rounded to `T` and copied to the device.
pub fn upload<T: DeviceFloat>(gpu: &Gpu, host: &[f32]) -> CudaSlice<T> {
    let v: Vec<T> = host.iter().map(|&x| T::from_f32(x)).collect();
    gpu.stream().clone_htod(&v).unwrap()
}

/// `host` rounded to `T` and back: the values the device actually sees.
pub fn rounded<T: DeviceFloat>(host: &[f32]) -> Vec<f32> {
    host.iter().map(|&x| T::from_f32(x).to_f32()).collect()
}

/// An output buffer full of NaN, so an element the kernel never writes
/// shows up in the comparison.
pub fn poisoned<T: DeviceFloat>(gpu: &Gpu, n: usize) -> CudaSlice<T> {
    gpu.stream().clone_htod(&vec![T::from_f32(f32::NAN); n]).unwrap()
}

pub fn download<T: DeviceFloat>(gpu: &Gpu, d: &CudaSlice<T>) -> Vec<f32> {
    let v: Vec<T> = gpu.stream().clone_dtoh(d).unwrap();
    v.into_iter().map(T::to_f32).collect()
}

/// The relative tolerance of the parity contract for `T`.
pub fn tol<T: DeviceFloat>() -> f32 {
    if T::SUFFIX == "f16" {
        1e-2
    } else {
        1e-5
    }
}

/// Every element within `tol` relative error (with a floor of `tol` times
/// 1e-3 of the largest reference magnitude, so values that cancel to
/// nearly zero are not held to a relative bound), and never NaN.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let floor = (peak * 1e-3).max(f32::MIN_POSITIVE);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(!g.is_nan(), "{what}[{i}]: NaN (unwritten or poisoned), expected {w}");
        assert!(
            (g - w).abs() <= tol * w.abs().max(floor),
            "{what}[{i}]: got {g}, expected {w} (relative tolerance {tol})"
        );
    }
}

/// Every element identical to the CPU's, bit for bit (the contract of the
/// kernels that add in the CPU twin's order).
pub fn assert_identical(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "{what}[{i}]: got {g:e}, CPU gives {w:e}");
    }
}
