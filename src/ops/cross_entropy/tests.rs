use super::cpu;
use super::*;
use crate::ops::testing::{check_grad, rand_vec, rand_vec_f32};

/// Textbook formulas in f64: per-row loss, softmax and first-argmax.
fn naive(logits: &[f32], labels: &[u32], c: usize) -> (Vec<f64>, Vec<f64>, usize) {
    let (mut losses, mut soft, mut correct) = (Vec::new(), Vec::new(), 0);
    for (row, &l) in logits.chunks(c).zip(labels) {
        let r: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
        losses.push(m + z.ln() - r[l as usize]);
        soft.extend(r.iter().map(|v| (v - m).exp() / z));
        let arg = (0..c).fold(0, |a, j| if r[j] > r[a] { j } else { a });
        correct += usize::from(arg == l as usize);
    }
    (losses, soft, correct)
}

#[test]
fn forward_backward_matches_naive_with_large_logits() {
    let (n, c) = (13, 10);
    // Logits in the thousands: exp() without max-subtraction would overflow.
    let logits: Vec<f32> = rand_vec_f32(n * c, 1).iter().map(|v| v * 8.0 + 1000.0).collect();
    let labels: Vec<u32> = (0..n as u32).map(|i| (i * 7) % c as u32).collect();
    let grad_scale = 128.0f32;
    let lt = Tensor::from_vec(&[n, c], logits.clone()).unwrap();
    let out = forward_backward(&lt, &labels, grad_scale).unwrap();

    let (losses, soft, correct) = naive(&logits, &labels, c);
    let mean = losses.iter().sum::<f64>() / n as f64;
    assert!((out.loss as f64 - mean).abs() <= 1e-5 * mean.abs().max(1.0), "loss {} vs {mean}", out.loss);
    assert_eq!(out.correct, correct);
    assert!(correct > 0 && correct < n, "test data should mix hits and misses, got {correct}");
    assert_eq!(out.dlogits.shape(), &[n, c]);
    for (i, &g) in out.dlogits.as_f32().unwrap().iter().enumerate() {
        let onehot = if labels[i / c] as usize == i % c { 1.0 } else { 0.0 };
        let want = grad_scale as f64 * (soft[i] - onehot) / n as f64;
        assert!((g as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "dlogits[{i}] {g} vs {want}");
    }

    let (sum, hits) = forward(&lt, &labels).unwrap();
    assert!((sum - mean * n as f64).abs() <= 1e-4, "eval sum {sum} vs {}", mean * n as f64);
    assert_eq!(hits, correct);
}

#[test]
fn gradient_of_mean_loss_matches_finite_differences() {
    let (n, c) = (5, 7);
    let x: Vec<f64> = rand_vec(n * c, 2).iter().map(|v| v * 3.0).collect();
    let labels = [0u32, 6, 3, 3, 1];
    let mut d = vec![0.0; x.len()];
    cpu::forward_backward(&x, &labels, c, 1.0, &mut d);
    check_grad("cross_entropy dlogits", &x, &d, |xp| cpu::forward(xp, &labels, c).0 / n as f64, 1e-6);
}

#[test]
fn argmax_ties_count_only_the_first() {
    let lt = Tensor::from_vec(&[2, 3], vec![2.0, 2.0, 0.0, 2.0, 2.0, 0.0]).unwrap();
    let (_, hits) = forward(&lt, &[0, 1]).unwrap();
    assert_eq!(hits, 1, "row 0 (label 0) hits, row 1 (label 1) misses the first max");
}

#[test]
fn errors_name_the_problem() {
    let lt = Tensor::zeros(&[3, 4]);
    let m = forward_backward(&lt, &[0, 4, 1], 1.0).unwrap_err().to_string();
    assert!(m.contains("label 4 in row 1 is out of range for 4 classes"), "{m}");
    let m = forward(&lt, &[0, 1, 9]).unwrap_err().to_string();
    assert!(m.contains("cross_entropy forward: label 9 in row 2 is out of range for 4 classes"), "{m}");
    let m = forward_backward(&lt, &[0, 1], 1.0).unwrap_err().to_string();
    assert!(m.contains("2 labels for 3 rows of logits (shape [3, 4])"), "{m}");
    let m = forward(&Tensor::zeros(&[12]), &[0]).unwrap_err().to_string();
    assert!(m.contains("expected [N, C] logits, got shape [12]"), "{m}");
    let m = forward_backward(&Tensor::zeros(&[0, 4]), &[], 1.0).unwrap_err().to_string();
    assert!(m.contains("empty batch"), "{m}");
}
