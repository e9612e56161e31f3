use super::cpu;
use crate::ops::testing::{check_grad, dot, rand_vec};
use crate::tensor::Tensor;

#[test]
fn exact_and_tanh_forms_match_known_values() {
    // torch.nn.functional.gelu(torch.tensor([-3., -1., 0., 0.5, 2.]), approximate=...)
    let x = [-3.0f64, -1.0, 0.0, 0.5, 2.0];
    let exact = [-0.004_049_73, -0.158_655_25, 0.0, 0.345_731_37, 1.954_499_7];
    let tanh = [-0.003_637_39, -0.158_808_01, 0.0, 0.345_714_01, 1.954_597_7];
    for (form, want) in [(false, exact), (true, tanh)] {
        let mut y = [0.0f64; 5];
        cpu::forward(&x, &mut y, form);
        for (g, w) in y.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "tanh={form}: {y:?} vs {want:?}");
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    let x: Vec<f64> = rand_vec(64, 1).iter().map(|v| v * 4.0).collect();
    let r = rand_vec(64, 2);
    for tanh in [false, true] {
        let mut dx = vec![0.0; 64];
        cpu::backward(&x, &r, &mut dx, tanh);
        let f = |x: &[f64]| {
            let mut y = vec![0.0; x.len()];
            cpu::forward(x, &mut y, tanh);
            dot(&r, &y)
        };
        check_grad(&format!("gelu tanh={tanh}"), &x, &dx, f, 1e-6);
    }
}

#[test]
fn f16_is_computed_in_f32_and_rounded_once() {
    let xs: Vec<f32> = rand_vec(32, 3).iter().map(|v| (v * 3.0) as f32).collect();
    let x16 = Tensor::from_vec(&[32], xs.clone()).unwrap().into_dtype(crate::tensor::DType::F16);
    let y16 = super::forward(&x16, false).unwrap();
    let y32 = super::forward(&x16.to_dtype(crate::tensor::DType::F32), false).unwrap();
    assert_eq!(y16.dtype(), crate::tensor::DType::F16);
    assert_eq!(y16.to_f32_vec(), y32.into_dtype(crate::tensor::DType::F16).to_f32_vec());
}
