//! Shared test helpers for the ops: seeded random inputs and the f64
//! central-difference gradient check every op's backward is held to.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Uniform values in [-1, 1), reproducible from `seed`.
pub fn rand_vec(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

pub fn rand_vec_f32(n: usize, seed: u64) -> Vec<f32> {
    rand_vec(n, seed).into_iter().map(|v| v as f32).collect()
}

/// Compares `analytic` (the gradient of the scalar `objective` at `x`) with
/// central differences, element by element. Panics naming the first element
/// that disagrees beyond `tol` (relative, floor 1).
pub fn check_grad(name: &str, x: &[f64], analytic: &[f64], objective: impl Fn(&[f64]) -> f64, tol: f64) {
    assert_eq!(x.len(), analytic.len(), "{name}: gradient length");
    let h = 1e-6;
    let mut xp = x.to_vec();
    for i in 0..x.len() {
        let orig = xp[i];
        xp[i] = orig + h;
        let fp = objective(&xp);
        xp[i] = orig - h;
        let fm = objective(&xp);
        xp[i] = orig;
        let numeric = (fp - fm) / (2.0 * h);
        let scale = numeric.abs().max(analytic[i].abs()).max(1.0);
        assert!(
            (numeric - analytic[i]).abs() <= tol * scale,
            "{name}: d/dx[{i}] analytic {} vs finite difference {numeric}",
            analytic[i]
        );
    }
}

/// `sum(r * y)`: projecting an op's output on a fixed random `r` turns it into
/// a scalar whose gradient w.r.t. the output is exactly `r`.
pub fn dot(r: &[f64], y: &[f64]) -> f64 {
    r.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// Process CPU time in ms: unlike wall time it does not count the time other
/// processes hold the cores, so it compares kernels on a busy machine (the
/// figures are CPU-ms summed over all threads). For the ignored timing tests.
pub fn cpu_ms() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 * 1e-6
}
