//! Tied weights on the CPU: one tensor, both uses' gradients summed into
//! it, both keys saved, the later key loaded.

use std::path::Path;

use super::{Model, StateValue};
use crate::config::tests_tie::tied_layers;
use crate::config::ResolvedLayer;
use crate::tensor::Tensor;

fn untied(layers: &[ResolvedLayer]) -> Vec<ResolvedLayer> {
    layers.iter().cloned().map(|l| ResolvedLayer { tie: None, ..l }).collect()
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
}

fn grad(m: &Model, name: &str) -> Vec<f32> {
    m.params().into_iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no {name}")).grad.to_f32_vec()
}

/// The tied model, and an untied one holding the same values under every key.
fn pair() -> (Model, Model) {
    let layers = tied_layers();
    let tied = Model::new(&layers, 3).unwrap();
    let mut free = Model::new(&untied(&layers), 3).unwrap();
    free.load_state_dict(tied.state_dict().unwrap(), Path::new("tied")).unwrap();
    (tied, free)
}

#[test]
fn both_uses_gradients_are_summed_into_the_one_parameter() {
    let (mut tied, mut free) = pair();
    let names = |m: &Model| m.params().iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&tied),
        ["conv1.weight", "conv1.bias", "conv2.bias", "fc1.weight", "fc1.bias", "fc.weight", "fc.bias"]
    );
    assert_eq!(free.params().len(), 9);
    let x = Tensor::from_vec(&[4, 2, 6, 6], values(288, 7)).unwrap();
    let (yt, st) = tied.forward_train(x.clone()).unwrap();
    let (yf, sf) = free.forward_train(x.clone()).unwrap();
    assert_eq!(yt.to_f32_vec(), yf.to_f32_vec());
    assert_eq!(tied.forward_eval(x).unwrap().to_f32_vec(), yt.to_f32_vec());
    let dy = Tensor::from_vec(&[4, 10], values(40, 9)).unwrap();
    let mut ready = Vec::new();
    tied.backward_hooked(st, dy.clone(), &mut |i, g| {
        ready.push((i, g.to_f32_vec()));
        Ok(())
    })
    .unwrap();
    free.backward(sf, dy).unwrap();
    // Backward reaches the tying layer first: its share is in the gradient
    // before the owner's kernel accumulates its own (autograd's order), so
    // the sum is the kernels' own rounding of it.
    for (owner, user) in [("conv1.weight", "conv2.weight"), ("fc1.weight", "fc2.weight")] {
        let (g1, g2) = (grad(&free, owner), grad(&free, user));
        let sum: Vec<f32> = g2.iter().zip(&g1).map(|(a, b)| a + b).collect();
        let scale = sum.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = grad(&tied, owner).iter().zip(&sum).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(scale > 0.0 && worst <= 1e-6 * scale, "{owner}: {worst} of {scale}");
    }
    for name in ["conv1.bias", "conv2.bias", "fc1.bias", "fc.weight", "fc.bias"] {
        assert_eq!(grad(&tied, name), grad(&free, name), "{name}");
    }
    // Each parameter is reported once, complete, in backward's order.
    let order: Vec<usize> = ready.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [5, 6, 3, 4, 2, 0, 1]);
    let conv1 = ready.iter().find(|(i, _)| *i == 0).map(|(_, g)| g.clone());
    assert_eq!(conv1, Some(grad(&tied, "conv1.weight")));
}

#[test]
fn both_keys_are_saved_and_the_later_one_loads() {
    let (mut tied, _) = pair();
    let sd = tied.state_dict().unwrap();
    let value = |sd: &[super::StateEntry], n: &str| match &sd.iter().find(|e| e.name == n).unwrap().value {
        StateValue::F32(v) => v.clone(),
        StateValue::I64(_) => panic!("{n}"),
    };
    assert_eq!(value(&sd, "fc2.weight"), value(&sd, "fc1.weight"));
    assert_eq!(value(&sd, "conv2.weight"), value(&sd, "conv1.weight"));
    // Two different tensors under the tied keys: PyTorch copies both into
    // the one tensor in order, so the later key's values stay.
    let mut edited = sd.clone();
    let later: Vec<f32> = value(&sd, "fc2.weight").iter().map(|v| v * 0.5 + 1.0).collect();
    for e in edited.iter_mut().filter(|e| e.name == "fc2.weight") {
        e.value = StateValue::F32(later.clone());
    }
    tied.load_state_dict(edited, Path::new("edited")).unwrap();
    let sd = tied.state_dict().unwrap();
    assert_eq!(value(&sd, "fc1.weight"), later);
    assert_eq!(value(&sd, "fc2.weight"), later);
    // A file without the tied key is missing a tensor, as strict loading says.
    let short: Vec<_> = sd.into_iter().filter(|e| e.name != "fc2.weight").collect();
    let e = tied.load_state_dict(short, Path::new("short.safetensors")).unwrap_err().to_string();
    assert!(e.contains("missing tensors: fc2.weight"), "{e}");
}
