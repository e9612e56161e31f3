use super::cpu::{self, Dims};
use crate::ops::dropout::Mask;
use crate::ops::testing::{check_grad, dot, rand_vec};
use crate::rng::{Draws, MicroBatch};

const D: Dims = Dims { n: 2, t: 5, c: 6, h: 2 };

fn forward64(x: &[f64], mask: Option<&Mask>) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; D.n * D.t * D.c];
    let mut att = vec![0.0; D.n * D.h * D.t * D.t];
    cpu::forward(D, x, mask, &mut y, &mut att);
    (y, att)
}

#[test]
fn rows_are_causal_distributions() {
    let x: Vec<f64> = rand_vec(D.n * D.t * 3 * D.c, 1).iter().map(|v| v * 3.0).collect();
    let (y, att) = forward64(&x, None);
    for (r, row) in att.chunks(D.t).enumerate() {
        let i = r % D.t;
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12, "row {r}: {row:?}");
        assert!(row[i + 1..].iter().all(|&a| a == 0.0), "row {r} sees the future: {row:?}");
    }
    // Position 0 attends only to itself: its output is its own v.
    for n in 0..D.n {
        let out = &y[n * D.t * D.c..n * D.t * D.c + D.c];
        let v0 = &x[n * D.t * 3 * D.c + 2 * D.c..n * D.t * 3 * D.c + 3 * D.c];
        assert_eq!(out, v0);
    }
}

#[test]
fn backward_matches_finite_differences_with_and_without_dropout() {
    let x = rand_vec(D.n * D.t * 3 * D.c, 2);
    let r = rand_vec(D.n * D.t * D.c, 3);
    let draws = Draws { seed: 9, rank: 0, at: MicroBatch { epoch: 1, index: 2 } }.node(4);
    let m = Mask::new(0.3, draws);
    for mask in [None, Some(&m)] {
        let (_, att) = forward64(&x, mask);
        let mut dx = vec![0.0; x.len()];
        cpu::backward(D, &x, &att, &r, mask, &mut dx);
        check_grad("attention dqkv", &x, &dx, |x| dot(&r, &forward64(x, mask).0), 1e-6);
    }
}
