//! The fused end of a residual block (fuse.rs: BatchNorm + add + ReLU in
//! one pass) against the layers one by one, through ResNet-20 as
//! configs/resnet20_fashion_o2.toml builds it: the same logits, `.grad`s
//! and running statistics, bit for bit, at O2 and O3 (f16 activations,
//! where it applies) and O0 (where it does not).

use super::fuse::{ADD_RELU_FUSED, FUSE_ADD_RELU};
use super::state::StateValue;
use super::Model;
use crate::amp::{cast_model, Policy};
use crate::config::tests_load::load_text;
use crate::config::{model, OptLevel};
use crate::tensor::Tensor;

/// Logits, every parameter's gradient, and every buffer after one forward
/// and backward of a batch of 4.
fn run(level: OptLevel, fused: bool) -> (Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let (cfg, _) = load_text(include_str!("../../configs/resnet20_fashion_o2.toml"), &[], &[]);
    let layers = model::resolve(&cfg.unwrap().model).unwrap();
    let mut m = Model::new(&layers, 5).unwrap();
    cast_model(&mut m, &Policy::for_level(level));
    let n = 4 * 28 * 28;
    let x: Vec<f32> = (0..n).map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0).collect();
    FUSE_ADD_RELU.with(|f| f.set(fused));
    let before = ADD_RELU_FUSED.with(|c| c.get());
    let (y, saved) = m.forward_train(Tensor::from_vec(&[4, 1, 28, 28], x).unwrap()).unwrap();
    FUSE_ADD_RELU.with(|f| f.set(true));
    // Every block's end at f16 (9 blocks), none in f32 or when turned off.
    let f16 = !matches!(level, OptLevel::O0);
    assert_eq!(ADD_RELU_FUSED.with(|c| c.get()) - before, if fused && f16 { 9 } else { 0 }, "{level:?}");
    let dy: Vec<f32> = (0..y.numel()).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
    let dy = Tensor::from_vec(y.shape(), dy).unwrap().into_dtype(y.dtype());
    let logits = y.to_f32_vec();
    m.backward_hooked(saved, dy, &mut |_, _| Ok(())).unwrap();
    let grads = m.params().iter().map(|p| p.grad.to_f32_vec()).collect();
    let buffers = m
        .state_dict()
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.value {
            StateValue::F32(v) if e.name.contains("running") => Some(v),
            _ => None,
        })
        .collect();
    (logits, grads, buffers)
}

#[test]
fn fused_block_ends_train_as_the_layers_one_by_one() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for level in [OptLevel::O2, OptLevel::O3, OptLevel::O0] {
        let (one_by_one, fused) = (run(level, false), run(level, true));
        assert_eq!(bits(&fused.0), bits(&one_by_one.0), "{level:?}: logits");
        assert_eq!(fused.1.len(), one_by_one.1.len());
        for (i, (a, b)) in fused.1.iter().zip(&one_by_one.1).enumerate() {
            assert_eq!(bits(a), bits(b), "{level:?}: gradient of parameter {i}");
        }
        assert_eq!(fused.2.len(), 42, "{level:?}: ResNet-20's 21 BatchNorms' running statistics");
        for (i, (a, b)) in fused.2.iter().zip(&one_by_one.2).enumerate() {
            assert_eq!(bits(a), bits(b), "{level:?}: running statistic {i}");
        }
    }
}
