//! `model.init_from`: a safetensors file with exactly PyTorch's `state_dict()`
//! names and shapes for the seed ConvNet loads by name; a missing or misshapen
//! tensor is a clear error.

mod common;
use common::*;
use ddptrain::nn::{Model, StateValue};
use safetensors::{tensor::TensorView, Dtype};
use std::path::Path;

/// `state_dict()` of the PyTorch seed ConvNet: (name, shape), in PyTorch's order.
const TORCH_STATE_DICT: &[(&str, &[usize])] = &[
    ("layer1.0.weight", &[16, 1, 5, 5]),
    ("layer1.0.bias", &[16]),
    ("layer1.1.weight", &[16]),
    ("layer1.1.bias", &[16]),
    ("layer1.1.running_mean", &[16]),
    ("layer1.1.running_var", &[16]),
    ("layer1.1.num_batches_tracked", &[]),
    ("layer2.0.weight", &[32, 16, 5, 5]),
    ("layer2.0.bias", &[32]),
    ("layer2.1.weight", &[32]),
    ("layer2.1.bias", &[32]),
    ("layer2.1.running_mean", &[32]),
    ("layer2.1.running_var", &[32]),
    ("layer2.1.num_batches_tracked", &[]),
    ("fc.weight", &[10, 1568]),
    ("fc.bias", &[10]),
];

fn value_of(name_idx: usize, i: usize) -> f32 {
    (name_idx * 1000 + i) as f32 * 1e-4
}

/// Writes a safetensors file the way `safetensors.torch.save_file(model.state_dict())`
/// does: f32 tensors, i64 scalars for num_batches_tracked. `edit` may drop or reshape entries.
fn write_torch_like(path: &Path, edit: impl Fn(&str, &[usize]) -> Option<Vec<usize>>) {
    let mut owned: Vec<(String, Vec<u8>, Dtype, Vec<usize>)> = Vec::new();
    for (k, (name, shape)) in TORCH_STATE_DICT.iter().enumerate() {
        let Some(shape) = edit(name, shape) else { continue };
        if name.ends_with("num_batches_tracked") {
            owned.push((name.to_string(), 7i64.to_le_bytes().to_vec(), Dtype::I64, shape));
        } else {
            let n: usize = shape.iter().product();
            let bytes = (0..n).flat_map(|i| value_of(k, i).to_le_bytes()).collect();
            owned.push((name.to_string(), bytes, Dtype::F32, shape));
        }
    }
    let views: Vec<(String, TensorView)> =
        owned.iter().map(|(n, b, d, s)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn seed_config(sets: &[String]) -> ddptrain::config::Config {
    ddptrain::config::load(&repo_root().join("configs/mnist_o0.toml"), sets).unwrap()
}

#[test]
fn state_dict_names_and_shapes_are_pytorchs() {
    let cfg = seed_config(&[]);
    let model = Model::new(&cfg.resolve_model().unwrap(), 0).unwrap();
    let got: Vec<(String, Vec<usize>)> =
        model.state_dict().unwrap().into_iter().map(|e| (e.name, e.shape)).collect();
    let want: Vec<(String, Vec<usize>)> =
        TORCH_STATE_DICT.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect();
    assert_eq!(got, want);
}

#[test]
fn init_from_loads_every_tensor_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("torch.safetensors");
    write_torch_like(&path, |_, s| Some(s.to_vec()));
    let cfg = seed_config(&[format!("model.init_from={}", path.display()), "data.dataset=synthetic".into()]);
    let prepared = ddptrain::train::prepare(&cfg).unwrap();
    let sd = prepared.model.state_dict().unwrap();
    for (k, (name, _)) in TORCH_STATE_DICT.iter().enumerate() {
        let e = sd.iter().find(|e| e.name == *name).unwrap();
        match &e.value {
            StateValue::F32(v) => {
                assert!(v.iter().enumerate().all(|(i, x)| *x == value_of(k, i)), "{name} not loaded")
            }
            StateValue::I64(v) => assert_eq!(*v, 7, "{name}"),
        }
    }
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("partial.safetensors");
    write_torch_like(&path, |n, s| (n != "layer2.1.running_var").then(|| s.to_vec()));
    let cfg = seed_config(&[format!("model.init_from={}", path.display())]);
    let err = ddptrain::train::prepare(&cfg).err().expect("must fail").to_string();
    assert!(
        err.contains("partial.safetensors") && err.contains("missing tensors: layer2.1.running_var"),
        "{err}"
    );
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.safetensors");
    write_torch_like(&path, |n, s| Some(if n == "fc.weight" { vec![10, 1600] } else { s.to_vec() }));
    let init = format!("model.init_from={}", path.display());
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let o = ddptrain(&["--config", cfg.to_str().unwrap(), "--set", &init, "--set", &out_set], dir.path());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("wide.safetensors")
            && t.contains("fc.weight")
            && t.contains("[10, 1600]")
            && t.contains("[10, 1568]"),
        "{t}"
    );
    assert!(!out.exists());
}

#[test]
fn a_runs_final_weights_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out_set = format!("run.out_dir={}", out.display());
    let cfg = repo_root().join("configs/mnist_o0.toml");
    let mut args =
        vec!["--config", cfg.to_str().unwrap(), "--set", &out_set, "--set", "expect.min_test_accuracy=0.0"];
    args.extend_from_slice(SYNTH);
    let o = ddptrain(&args, dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let weights = out.join("model.safetensors");
    let entries = ddptrain::checkpoint::load_safetensors(&weights).unwrap();
    let cfg = seed_config(&[]);
    let mut model = Model::new(&cfg.resolve_model().unwrap(), 99).unwrap();
    model.load_state_dict(entries.clone(), &weights).unwrap();
    assert_eq!(model.state_dict().unwrap(), {
        let mut e = entries;
        let order: Vec<&str> = TORCH_STATE_DICT.iter().map(|(n, _)| *n).collect();
        e.sort_by_key(|x| order.iter().position(|n| *n == x.name));
        e
    });
    let bn =
        model.state_dict().unwrap().into_iter().find(|e| e.name == "layer1.1.num_batches_tracked").unwrap();
    assert_eq!(bn.value, StateValue::I64(4), "4 training steps ran");
}
