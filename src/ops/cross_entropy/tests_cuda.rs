//! GPU parity: kernels/cross_entropy.cu against the CPU twin
//! (src/ops/cross_entropy/cpu.rs). The logits the device sees are the CPU's
//! inputs exactly (f16 values widened), so the loss is held to the f32
//! tolerance for both dtypes; dlogits to the tolerance of its dtype.

use super::{forward, forward_backward, CrossEntropyTotals};
use crate::cuda::testing::{assert_close, download, poisoned, rounded, tol, upload};
use crate::cuda::DeviceFloat;
use crate::cuda::Gpu;
use crate::ops::cross_entropy::cpu;
use crate::ops::testing::rand_vec_f32;
use half::f16;

fn labels_for(n: usize, c: usize, seed: u64) -> Vec<u32> {
    rand_vec_f32(n, seed).iter().map(|v| (((v + 1.0) / 2.0 * c as f32) as u32).min(c as u32 - 1)).collect()
}

/// Half the rows labelled with their first maximum (a hit), the rest with
/// their last maximum (a miss exactly when the row has a tie).
fn tie_labels(x: &[f32], c: usize) -> Vec<u32> {
    x.chunks(c)
        .enumerate()
        .map(|(r, row)| {
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let first = row.iter().position(|&v| v == m).unwrap();
            let last = row.iter().rposition(|&v| v == m).unwrap();
            (if r % 2 == 0 { first } else { last }) as u32
        })
        .collect()
}

fn assert_loss(what: &str, got: f64, want: f64) {
    assert!(!got.is_nan(), "{what}: NaN loss sum, CPU gives {want}");
    assert!((got - want).abs() <= 1e-5 * want.abs().max(1e-3), "{what}: loss sum {got}, CPU gives {want}");
}

fn check<T: DeviceFloat>(gpu: &Gpu, x: &[f32], labels: &[u32], c: usize, grad_scale: f32) {
    let n = labels.len();
    let what = format!("cross_entropy {} [{n}, {c}] scale {grad_scale}", T::SUFFIX);
    let x = rounded::<T>(x);
    let mut d_cpu = vec![0f32; n * c];
    let (sum_cpu, hits_cpu) = cpu::forward_backward(&x, labels, c, grad_scale, &mut d_cpu);
    let d_cpu = rounded::<T>(&d_cpu);

    let xd = upload::<T>(gpu, &x);
    let ld = gpu.stream().clone_htod(labels).unwrap();
    let sd = gpu.stream().clone_htod(&[grad_scale]).unwrap();
    let mut dd = poisoned::<T>(gpu, n * c);
    // Room for more rows than this batch: only the first n may be used.
    let mut totals = CrossEntropyTotals::new(gpu, n + 7).unwrap();
    forward_backward(gpu, &xd, &ld, [n, c], &sd, &mut dd, &mut totals).unwrap();
    let (sum, hits) = totals.read(gpu).unwrap();
    assert_loss(&what, sum, sum_cpu);
    assert_eq!(hits as usize, hits_cpu, "{what}: hits");
    assert_close(&format!("{what}: dlogits"), &download(gpu, &dd), &d_cpu, tol::<T>());

    // Evaluation adds to the same totals; after a reset it starts over.
    forward(gpu, &xd, &ld, [n, c], &mut totals).unwrap();
    let (sum2, hits2) = totals.read(gpu).unwrap();
    assert_loss(&format!("{what} (accumulated)"), sum2, 2.0 * sum_cpu);
    assert_eq!(hits2 as usize, 2 * hits_cpu, "{what}: accumulated hits");
    let (eval_sum, eval_hits) = cpu::forward(&x, labels, c);
    totals.reset(gpu).unwrap();
    forward(gpu, &xd, &ld, [n, c], &mut totals).unwrap();
    let (sum3, hits3) = totals.read(gpu).unwrap();
    assert_loss(&format!("{what} (eval after reset)"), sum3, eval_sum);
    assert_eq!(hits3 as usize, eval_hits, "{what}: eval hits");
}

fn all_cases<T: DeviceFloat>(gpu: &Gpu, seed: u64) {
    for (i, &(n, c)) in [(3, 5), (100, 10), (37, 33), (7, 1000), (1, 1)].iter().enumerate() {
        let s = seed + 10 * i as u64;
        let x: Vec<f32> = rand_vec_f32(n * c, s).iter().map(|v| v * 6.0).collect();
        check::<T>(gpu, &x, &labels_for(n, c, s + 1), c, 1.0);
        check::<T>(gpu, &x, &labels_for(n, c, s + 2), c, 1024.0);
    }
    // Large logits: the max shift keeps exp finite.
    let x: Vec<f32> = rand_vec_f32(5 * 7, seed + 100).iter().map(|v| v * 300.0).collect();
    check::<T>(gpu, &x, &labels_for(5, 7, seed + 101), 7, 1.0);
    // Ties: the first maximum is the prediction, as on the CPU.
    for (n, c) in [(41, 6), (9, 70)] {
        let x: Vec<f32> = rand_vec_f32(n * c, seed + 200).iter().map(|v| (v * 2.0).round()).collect();
        check::<T>(gpu, &x, &tie_labels(&x, c), c, 1.0);
    }
}

#[test]
fn cross_entropy_matches_cpu_f32() {
    let Some(gpu) = crate::cuda::test_gpu("cross_entropy_matches_cpu_f32") else { return };
    all_cases::<f32>(&gpu, 300);
}

#[test]
fn cross_entropy_matches_cpu_f16() {
    let Some(gpu) = crate::cuda::test_gpu("cross_entropy_matches_cpu_f16") else { return };
    all_cases::<f16>(&gpu, 400);
}

#[test]
fn cross_entropy_nan_and_infinite_rows_count_like_the_cpu() {
    let Some(gpu) = crate::cuda::test_gpu("cross_entropy_nan_and_infinite_rows_count_like_the_cpu") else {
        return;
    };
    let (n, c) = (6, 40);
    let mut x = rand_vec_f32(n * c, 500);
    x[c + 3] = f32::NAN; // row 1: the NaN is the argmax
    x[c + 35] = f32::NAN;
    x[2 * c..3 * c].fill(f32::NEG_INFINITY); // row 2: argmax 0
    x[4 * c + 17] = f32::INFINITY;
    let labels = [0, 3, 0, 5, 17, 9];
    let (sum_cpu, hits_cpu) = cpu::forward(&x, &labels, c);
    assert!(sum_cpu.is_nan());
    let xd = upload::<f32>(&gpu, &x);
    let ld = gpu.stream().clone_htod(&labels).unwrap();
    let mut totals = CrossEntropyTotals::new(&gpu, n).unwrap();
    forward(&gpu, &xd, &ld, [n, c], &mut totals).unwrap();
    let (sum, hits) = totals.read(&gpu).unwrap();
    assert!(sum.is_nan(), "a NaN row makes the loss NaN, got {sum}");
    assert_eq!(hits as usize, hits_cpu);
    // The premise: the NaN row, the all -inf row and the +inf row are hits.
    for r in [1, 2, 4] {
        assert_eq!(cpu::forward(&x[r * c..(r + 1) * c], &labels[r..r + 1], c).1, 1, "row {r}");
    }
}

#[test]
fn cross_entropy_out_of_range_label_gives_nan_not_garbage() {
    let Some(gpu) = crate::cuda::test_gpu("cross_entropy_out_of_range_label_gives_nan_not_garbage") else {
        return;
    };
    let (n, c) = (3, 5);
    let xd = upload::<f32>(&gpu, &rand_vec_f32(n * c, 600));
    let ld = gpu.stream().clone_htod(&[1u32, 5, 2]).unwrap();
    let sd = gpu.stream().clone_htod(&[1f32]).unwrap();
    let mut dd = poisoned::<f32>(&gpu, n * c);
    let mut totals = CrossEntropyTotals::new(&gpu, n).unwrap();
    forward_backward(&gpu, &xd, &ld, [n, c], &sd, &mut dd, &mut totals).unwrap();
    let (sum, _) = totals.read(&gpu).unwrap();
    assert!(sum.is_nan(), "loss {sum}");
    let d = download(&gpu, &dd);
    assert!(d[c..2 * c].iter().all(|v| v.is_nan()), "row 1 gradient {:?}", &d[c..2 * c]);
    assert!(d[..c].iter().chain(&d[2 * c..]).all(|v| v.is_finite()), "other rows {d:?}");
}

#[test]
fn cross_entropy_refuses_bad_shapes() {
    let Some(gpu) = crate::cuda::test_gpu("cross_entropy_refuses_bad_shapes") else { return };
    let xd = upload::<f32>(&gpu, &[0.0; 15]);
    let ld = gpu.stream().clone_htod(&[0u32; 3]).unwrap();
    let sd = gpu.stream().clone_htod(&[1f32; 2]).unwrap();
    let mut dd = poisoned::<f32>(&gpu, 15);
    let mut small = CrossEntropyTotals::new(&gpu, 2).unwrap();
    let e = forward(&gpu, &xd, &ld, [3, 5], &mut small).unwrap_err().to_string();
    assert!(e.contains("3 rows but the buffers were allocated for at most 2"), "{e}");
    let mut totals = CrossEntropyTotals::new(&gpu, 3).unwrap();
    let e = forward(&gpu, &xd, &ld, [3, 4], &mut totals).unwrap_err().to_string();
    assert!(e.contains("cross_entropy forward: logits holds 15 elements, expected 12"), "{e}");
    let e = forward(&gpu, &xd, &ld, [0, 5], &mut totals).unwrap_err().to_string();
    assert!(e.contains("empty logits [0, 5]"), "{e}");
    let e = forward_backward(&gpu, &xd, &ld, [3, 5], &sd, &mut dd, &mut totals).unwrap_err().to_string();
    assert!(e.contains("grad_scale holds 2 elements, expected 1"), "{e}");
}
