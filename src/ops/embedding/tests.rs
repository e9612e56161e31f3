use super::cpu;
use crate::ops::testing::{check_grad, dot, rand_vec};
use crate::tensor::Tensor;

#[test]
fn forward_gathers_rows_and_backward_sums_repeated_ids() {
    let (v, c) = (5, 3);
    let w = rand_vec(v * c, 1);
    let ids = [4, 0, 4, 2, 4];
    let r = rand_vec(ids.len() * c, 2);
    let f = |w: &[f64]| {
        let mut y = vec![0.0; ids.len() * c];
        cpu::forward(c, &ids, w, &mut y);
        dot(&r, &y)
    };
    let mut dw = vec![0.0; v * c];
    cpu::backward(c, &ids, &r, &mut dw);
    check_grad("embedding dweight", &w, &dw, f, 1e-8);
    // Rows never looked up get nothing.
    assert!(dw[c..2 * c].iter().chain(&dw[3 * c..4 * c]).all(|&g| g == 0.0));
}

#[test]
fn ids_out_of_range_or_fractional_are_errors() {
    let x = Tensor::from_vec(&[3], vec![0.0, 2.0, 7.0]).unwrap();
    let e = super::ids(&x, 5).unwrap_err().to_string();
    assert!(e.contains("id 7 at position 2 is not in 0..5 (num_embeddings)"), "{e}");
    let x = Tensor::from_vec(&[2], vec![1.5, -1.0]).unwrap();
    assert!(super::ids(&x, 5).unwrap_err().to_string().contains("id 1.5 at position 0"));
    assert_eq!(super::ids(&Tensor::from_vec(&[2], vec![4.0, 0.0]).unwrap(), 5).unwrap(), vec![4, 0]);
}
