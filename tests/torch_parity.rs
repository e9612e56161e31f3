//! ddptrain against PyTorch itself (scripts/torch_parity.py): the model of
//! every config in `configs/` that takes MNIST's 1x28x28 digits into 10
//! classes, rebuilt in PyTorch from `ddptrain check --json`
//! (scripts/torch_model.py), from the same init, on the same digits in
//! ddptrain's shuffled order, for 20 SGD and 20 AdamW steps on the CPU, and
//! the seed config's for 20 SGD steps on the GPU; every step checked from
//! ddptrain's previous checkpoint, the free-running end state, and the final
//! checkpoint scored in PyTorch after `load_state_dict(strict=True)` (the
//! script says why each tolerance is what it is). Needs a python with
//! torch, numpy and safetensors: `DDPTRAIN_TORCH_PYTHON` (scripts/test.sh
//! installs them into .venv/ and sets it), else `python3`. Without one the
//! tests print why they were skipped, except under CI=true, where they fail.
//! The description itself (`check --json`) is checked here without PyTorch.

mod common;
use common::*;
use ddptrain::data::{idx, DistributedSampler};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SEED_CONFIG: &str = "configs/mnist_o0.toml";

/// The configs whose models the oracle checks: those of `configs/` and the
/// layer folders' own ([`layer_configs`]) with MNIST's input shape and classes (the digits torch_parity.py feeds them),
/// relative to the repository root, in file name order, one per distinct
/// run of the oracle (torch_parity.py takes only the model, the seed and
/// `grad_clip_norm` from a config, so mnist_o0..o3 are one run). Configs
/// that augment their training images are left out: torch_parity.py feeds
/// both trainers the same unaugmented digits, which such a config's
/// ddptrain run would crop and flip.
fn mnist_configs() -> Vec<String> {
    let root = repo_root();
    let mut paths = tomls_in(&root.join("configs"));
    paths.extend(layer_configs().iter().map(|c| root.join(c)));
    let mut seen = std::collections::HashSet::new();
    let configs: Vec<String> = paths
        .iter()
        .filter(|p| {
            let cfg = ddptrain::config::load(p, &[]).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let run = serde_json::to_string(&(&cfg.model, cfg.run.seed, cfg.train.grad_clip_norm))
                .expect("the model section serializes");
            cfg.model.input_shape == [1, 28, 28]
                && cfg.data.num_classes == 10
                && !cfg.data.augments()
                && seen.insert(run)
        })
        .map(|p| p.strip_prefix(&root).expect("a config in the checkout").to_string_lossy().into_owned())
        .collect();
    assert!(configs.iter().any(|c| c == SEED_CONFIG), "{SEED_CONFIG} is not among {configs:?}");
    configs
}

/// The `.toml` files of `dir`, sorted.
fn tomls_in(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("list a folder").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    paths
}

/// The models layer folders hold for the oracle (`src/nn/layers/<type>/*.toml`,
/// relative to the checkout): a layer's own model on the digits, trained
/// against PyTorch on both devices.
fn layer_configs() -> Vec<String> {
    let root = repo_root();
    let layers = root.join("src/nn/layers");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&layers)
        .expect("read src/nn/layers")
        .map(|e| e.expect("list src/nn/layers").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .flat_map(|d| tomls_in(d))
        .map(|p| p.strip_prefix(&root).expect("a config in the checkout").to_string_lossy().into_owned())
        .collect()
}

/// The training-set indices ddptrain visits in its first epoch, as its
/// trainer builds the sampler for `config` at world size 1, written as JSON
/// into `dir`.
fn first_epoch_order(dir: &Path, config: &str) -> std::path::PathBuf {
    let cfg = ddptrain::config::load(&repo_root().join(config), &[]).expect("load the config");
    let labels = idx::find(&mnist_dir(), "train-labels-idx1-ubyte").expect("MNIST train labels");
    let len = idx::read_labels(&labels).expect("read MNIST train labels").labels.len();
    let sampler = DistributedSampler {
        len,
        num_replicas: 1,
        rank: 0,
        shuffle: true,
        seed: cfg.run.seed,
        drop_last: cfg.data.drop_last,
    };
    let path = dir.join("order.json");
    std::fs::write(&path, serde_json::to_string(&sampler.indices(0)).expect("indices as JSON"))
        .expect("write the order file");
    path
}

/// Runs scripts/torch_parity.py on a config it should refuse before any
/// training (so without the data order [`parity`] gives it).
fn refused_by_parity(python: &str, config: &Path) -> Output {
    Command::new(python)
        .arg("scripts/torch_parity.py")
        .arg("--bin")
        .arg(ddptrain_bin())
        .arg("--config")
        .arg(config)
        .arg("--data")
        .arg(mnist_dir())
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .current_dir(repo_root())
        .output()
        .expect("run scripts/torch_parity.py")
}

/// Runs scripts/torch_parity.py on `config` with `args` after the binary,
/// data and order. ddptrain trains on the CPU unless `args` say `--device
/// cuda`; the script keeps PyTorch on the CPU either way.
fn parity(python: &str, config: &str, args: &[&str]) -> Output {
    let tmp = tempfile::tempdir().expect("temp dir");
    let order = first_epoch_order(tmp.path(), config);
    let mut cmd = Command::new(python);
    cmd.arg("scripts/torch_parity.py")
        .arg("--bin")
        .arg(ddptrain_bin())
        .args(["--config", config])
        .arg("--data")
        .arg(mnist_dir())
        .arg("--order")
        .arg(&order)
        .args(args)
        .current_dir(repo_root());
    if !args.contains(&"cuda") {
        cmd.env(HIDE_GPUS.0, HIDE_GPUS.1);
    }
    cmd.output().expect("run scripts/torch_parity.py")
}

/// 20 steps of `optimizer` on `device` for each of `configs`; all of them
/// run before the verdict, so one report names every config that disagrees.
fn matches_pytorch(test: &str, configs: &[String], optimizer: &str, device: &str) {
    let Some(python) = torch_python(test) else { return };
    let mut failed = Vec::new();
    for config in configs {
        let start = std::time::Instant::now();
        let o = parity(&python, config, &["--optimizer", optimizer, "--steps", "20", "--device", device]);
        let t = text(&o);
        println!("== {config} ({:.0}s)\n{t}", start.elapsed().as_secs_f64());
        if !o.status.success() || !t.contains("check 3: test set: ddptrain") {
            failed.push(format!("{config}: ddptrain and PyTorch disagree (or no accuracy comparison):\n{t}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn twenty_sgd_steps_match_pytorch() {
    matches_pytorch("twenty_sgd_steps_match_pytorch", &mnist_configs(), "sgd", "cpu");
}

#[test]
fn twenty_adamw_steps_match_pytorch() {
    matches_pytorch("twenty_adamw_steps_match_pytorch", &mnist_configs(), "adamw", "cpu");
}

/// The GPU path (on the emulated device in CI) against PyTorch on the CPU,
/// held to the same tolerances as the CPU path.
#[test]
fn twenty_sgd_steps_on_the_gpu_match_pytorch() {
    let test = "twenty_sgd_steps_on_the_gpu_match_pytorch";
    if ddptrain::cuda::test_gpu(test).is_none() {
        return;
    }
    let configs: Vec<String> = std::iter::once(SEED_CONFIG.to_owned()).chain(layer_configs()).collect();
    matches_pytorch(test, &configs, "sgd", "cuda");
}

/// The oracle is sharp enough to see a 1% learning-rate difference in one
/// step under `optimizer`: PyTorch's updates then differ by 1e-2 of their
/// size, ten times the tolerance (under AdamW, whose updates are held to
/// PyTorch's AdamW step on ddptrain's own gradients, every element's).
fn a_one_percent_learning_rate_difference_fails(test: &str, optimizer: &str) {
    let Some(python) = torch_python(test) else { return };
    let o = parity(&python, SEED_CONFIG, &["--optimizer", optimizer, "--steps", "2", "--lr-scale", "1.01"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "the perturbed run passed:\n{t}");
    assert!(
        t.contains("MISMATCH step 1: fc.weight differs by 9.9"),
        "expected step 1's fc.weight update to differ by ~1e-2:\n{t}"
    );
}

#[test]
fn a_one_percent_learning_rate_difference_fails_the_oracle() {
    a_one_percent_learning_rate_difference_fails(
        "a_one_percent_learning_rate_difference_fails_the_oracle",
        "sgd",
    );
}

#[test]
fn a_one_percent_learning_rate_difference_fails_the_adamw_oracle() {
    a_one_percent_learning_rate_difference_fails(
        "a_one_percent_learning_rate_difference_fails_the_adamw_oracle",
        "adamw",
    );
}

/// `ddptrain check --config configs/mnist_o2.toml --json`, parsed.
fn describe(sets: &[&str]) -> Value {
    let mut args = vec!["check", "--config", "configs/mnist_o2.toml", "--json"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = ddptrain(&args, &repo_root());
    assert!(o.status.success(), "check --json failed:\n{}", text(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", text(&o)))
}

/// What scripts/torch_model.py builds the seed ConvNet from: PyTorch's module
/// names, types and constructor arguments, values numbered from the input,
/// and the state_dict in PyTorch's order with O2's dtypes (f16 conv and
/// linear, BatchNorm kept f32, num_batches_tracked an integer).
#[test]
fn check_json_describes_the_o2_convnet() {
    let d = describe(&[]);
    assert_eq!(d["input_shape"], json!([1, 28, 28]));
    assert_eq!(d["opt_level"], "O2");
    let nodes = d["nodes"].as_array().expect("nodes is a list");
    let seen: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| (n["name"].as_str().expect("a name"), n["type"].as_str().expect("a type")))
        .collect();
    let block = |b: &'static str| {
        [("conv2d", 0), ("batchnorm2d", 1), ("relu", 2), ("maxpool2d", 3)]
            .map(|(t, i)| (format!("{b}.{i}"), t))
    };
    let mut expected: Vec<(String, &str)> = block("layer1").into_iter().chain(block("layer2")).collect();
    expected.extend([("2".to_owned(), "flatten"), ("fc".to_owned(), "linear")]);
    assert_eq!(seen, expected.iter().map(|(n, t)| (n.as_str(), *t)).collect::<Vec<_>>());
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["inputs"], json!([i]), "node {i} of a chain reads the value before it");
    }
    assert_eq!(d["output"], json!(nodes.len()));
    let node = |i: usize| (&nodes[i]["in_shapes"], &nodes[i]["out_shape"], &nodes[i]["args"]);
    assert_eq!(
        node(0),
        (
            &json!([[1, 28, 28]]),
            &json!([16, 28, 28]),
            &json!({"in_channels": 1, "out_channels": 16, "kernel_size": 5, "stride": 1, "padding": 2, "bias": true})
        )
    );
    assert_eq!(node(1).2, &json!({"num_features": 16, "eps": 1e-5, "momentum": 0.1}));
    assert_eq!(node(2).2, &json!({}));
    assert_eq!(
        node(7),
        (&json!([[32, 14, 14]]), &json!([32, 7, 7]), &json!({"kernel_size": 2, "stride": 2}))
    );
    assert_eq!(node(8), (&json!([[32, 7, 7]]), &json!([1568]), &json!({})));
    assert_eq!(
        node(9),
        (&json!([[1568]]), &json!([10]), &json!({"in_features": 1568, "out_features": 10, "bias": true}))
    );

    let entry = |name: &str, shape: Value, dtype: &str| json!({"name": name, "shape": shape, "dtype": dtype});
    let mut want = Vec::new();
    for (block, cin, c) in [("layer1", 1, 16), ("layer2", 16, 32)] {
        want.push(entry(&format!("{block}.0.weight"), json!([c, cin, 5, 5]), "float16"));
        want.push(entry(&format!("{block}.0.bias"), json!([c]), "float16"));
        for suffix in ["weight", "bias", "running_mean", "running_var"] {
            want.push(entry(&format!("{block}.1.{suffix}"), json!([c]), "float32"));
        }
        want.push(entry(&format!("{block}.1.num_batches_tracked"), json!([]), "int64"));
    }
    want.push(entry("fc.weight", json!([10, 1568]), "float16"));
    want.push(entry("fc.bias", json!([10]), "float16"));
    assert_eq!(d["state_dict"], Value::Array(want));
    assert_eq!(d["num_params"], json!(16 * 25 + 16 + 2 * 16 + 32 * 16 * 25 + 32 + 2 * 32 + 1568 * 10 + 10));
}

/// The dtypes follow the opt level as the AMP cast leaves the model: fp32
/// throughout at O0 and O1, f16 BatchNorm where keep_batchnorm_fp32 is off.
#[test]
fn check_json_gives_each_opt_levels_dtypes() {
    let dtypes = |sets: &[&str]| {
        let d = describe(sets);
        let by_name = |name: &str| {
            let keys = d["state_dict"].as_array().expect("state_dict is a list");
            let k =
                keys.iter().find(|k| k["name"] == name).unwrap_or_else(|| panic!("no {name} in {keys:?}"));
            k["dtype"].as_str().expect("a dtype").to_owned()
        };
        ["fc.weight", "layer1.1.weight", "layer1.1.running_var", "layer1.1.num_batches_tracked"].map(by_name)
    };
    let all_f32 = ["float32", "float32", "float32", "int64"];
    assert_eq!(dtypes(&["amp.opt_level=\"O0\""]), all_f32);
    assert_eq!(dtypes(&["amp.opt_level=\"O1\""]), all_f32);
    assert_eq!(dtypes(&["amp.opt_level=\"O3\""]), ["float16", "float16", "float16", "int64"]);
    assert_eq!(dtypes(&["amp.keep_batchnorm_fp32=false"]), ["float16", "float16", "float16", "int64"]);
}

/// A config `check --json` cannot describe is refused as `check` refuses
/// it: exit 2, the message on stderr, and nothing on stdout for a tool to
/// mistake for a description.
#[test]
fn check_json_refuses_a_bad_config_with_the_usual_message() {
    let o = ddptrain(
        &["check", "--config", "configs/mnist_o2.toml", "--json", "--set", "model.input_shape=[1, 1, 1]"],
        &repo_root(),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(o.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&o.stdout));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("model.layers[0].layers[3].kernel_size")
            && err.contains("kernel_size 2 is larger than the input 1x1"),
        "{err}"
    );
}

/// A graph of the kind configs will describe next, written by hand: a
/// residual block (named children) whose projection shortcut (a numbered
/// block) runs before its branch but comes after it in the state_dict, as in
/// torchvision's BasicBlock; average and global average pooling.
fn residual_description() -> Value {
    let conv = |name: &str, inp: usize, shapes: ([usize; 3], [usize; 3]), k: usize, s: usize, p: usize| {
        json!({"name": name, "type": "conv2d", "inputs": [inp], "in_shapes": [shapes.0], "out_shape": shapes.1,
               "args": {"in_channels": shapes.0[0], "out_channels": shapes.1[0], "kernel_size": k, "stride": s,
                        "padding": p, "bias": false}})
    };
    let unary = |name: &str, ty: &str, inp: usize, shape: Value, out: Value, args: Value| json!({"name": name, "type": ty, "inputs": [inp], "in_shapes": [shape], "out_shape": out, "args": args});
    let bn = |name: &str, inp: usize, shape: [usize; 3]| {
        unary(
            name,
            "batchnorm2d",
            inp,
            json!(shape),
            json!(shape),
            json!({"num_features": shape[0], "eps": 1e-5, "momentum": 0.1}),
        )
    };
    let (s8, s4, s2) = ([4, 8, 8], [8, 4, 4], [8, 2, 2]);
    let nodes = vec![
        conv("stem.0", 0, ([1, 8, 8], s8), 3, 1, 1),
        bn("stem.1", 1, s8),
        unary("stem.2", "relu", 2, json!(s8), json!(s8), json!({})),
        conv("block.down.0", 3, (s8, s4), 1, 2, 0),
        bn("block.down.1", 4, s4),
        conv("block.conv1", 3, (s8, s4), 3, 2, 1),
        bn("block.bn1", 6, s4),
        json!({"name": "block.add", "type": "add", "inputs": [7, 5], "in_shapes": [s4, s4], "out_shape": s4, "args": {}}),
        unary(
            "pool",
            "avgpool2d",
            8,
            json!(s4),
            json!(s2),
            json!({"kernel_size": 2, "stride": 2, "padding": 0}),
        ),
        unary("gap", "adaptive_avgpool2d", 9, json!(s2), json!([8, 1, 1]), json!({"output_size": 1})),
        unary("flat", "flatten", 10, json!([8, 1, 1]), json!([8]), json!({})),
        unary(
            "fc",
            "linear",
            11,
            json!([8]),
            json!([3]),
            json!({"in_features": 8, "out_features": 3, "bias": true}),
        ),
    ];
    let mut state = Vec::new();
    let mut key = |name: String, shape: Value| {
        let dtype = if name.ends_with("num_batches_tracked") { "int64" } else { "float32" };
        state.push(json!({"name": name, "shape": shape, "dtype": dtype}));
    };
    for (conv, bn, cin, c, k) in [
        ("stem.0", "stem.1", 1, 4, 3),
        ("block.conv1", "block.bn1", 4, 8, 3),
        ("block.down.0", "block.down.1", 4, 8, 1),
    ] {
        key(format!("{conv}.weight"), json!([c, cin, k, k]));
        for suffix in ["weight", "bias", "running_mean", "running_var"] {
            key(format!("{bn}.{suffix}"), json!([c]));
        }
        key(format!("{bn}.num_batches_tracked"), json!([]));
    }
    key("fc.weight".into(), json!([3, 8]));
    key("fc.bias".into(), json!([3]));
    json!({"input_shape": [1, 8, 8], "opt_level": "O0", "nodes": nodes, "output": 12, "state_dict": state,
           "num_params": 4 * 9 + 8 + 8 * 4 * 9 + 16 + 32 + 16 + 24 + 3})
}

/// Runs `python` with `args`, then the path of a file holding `desc`, from
/// the repository root with scripts/ on the module path.
fn python_on_description(python: &str, args: &[&str], desc: &Value) -> Output {
    let tmp = tempfile::tempdir().expect("temp dir");
    let path = tmp.path().join("model.json");
    std::fs::write(&path, desc.to_string()).expect("write the description");
    Command::new(python)
        .args(args)
        .arg(&path)
        .env("PYTHONPATH", repo_root().join("scripts"))
        .env(HIDE_GPUS.0, HIDE_GPUS.1)
        .current_dir(repo_root())
        .output()
        .expect("run python")
}

/// scripts/torch_model.py builds what a graph describes: blocks as modules
/// (numbered ones as nn.Sequential), the state_dict in the description's
/// order, an `add` node summing the values it reads, and PyTorch's pooling.
#[test]
fn torch_model_builds_a_residual_graph() {
    let test = "torch_model_builds_a_residual_graph";
    let Some(python) = torch_python(test) else { return };
    let code = r#"
import sys, torch, torch.nn as nn, torch_model
desc = torch_model.read_description(sys.argv[1])
m = torch_model.build(desc)
assert type(m.stem) is nn.Sequential and type(m.block) is nn.Module, m
assert type(m.block.down) is nn.Sequential and type(m.block.down[0]) is nn.Conv2d, m
assert [n for n, _ in m.named_children()] == ["stem", "block", "pool", "gap", "flat", "fc"], m
assert [n for n, _ in m.block.named_children()] == ["conv1", "bn1", "down"], m
assert list(m.state_dict()) == [k["name"] for k in desc["state_dict"]]
m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()}, strict=True)
torch.manual_seed(0)
v = m.values(torch.randn(2, 1, 8, 8))
assert torch.equal(v[5], m.block.down(v[3])), "the shortcut reads the stem"
assert torch.equal(v[8], v[7] + v[5]), "add"
assert torch.equal(v[9], nn.functional.avg_pool2d(v[8], 2)), "avgpool2d"
assert torch.allclose(v[10], v[9].mean((2, 3), keepdim=True)), "adaptive_avgpool2d"
assert torch.equal(m(torch.zeros(2, 1, 8, 8)), m.values(torch.zeros(2, 1, 8, 8))[12])
print("built", sum(p.numel() for p in m.parameters()), "parameters")
"#;
    let desc = residual_description();
    let o = python_on_description(&python, &["-c", code], &desc);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains(&format!("built {} parameters", desc["num_params"])), "{t}");
}

/// A description scripts/torch_model.py cannot honour stops it with what
/// differs, instead of a model that would load or train differently.
#[test]
fn torch_model_refuses_a_description_it_cannot_build() {
    let test = "torch_model_refuses_a_description_it_cannot_build";
    let Some(python) = torch_python(test) else { return };
    let run = |desc: &Value| {
        let o = python_on_description(&python, &["scripts/torch_model.py", "--json"], desc);
        (o.status.code(), text(&o))
    };
    let (code, t) = run(&residual_description());
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("block.down.1.num_batches_tracked"), "{t}");

    let mut unknown = residual_description();
    unknown["nodes"][2]["type"] = json!("gelu");
    let (code, t) = run(&unknown);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("node stem.2: no PyTorch module for type 'gelu'"), "{t}");

    let mut renamed = residual_description();
    renamed["state_dict"][0]["name"] = json!("stem.0.kernel");
    let (code, t) = run(&renamed);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("the PyTorch model differs from ddptrain's description"), "{t}");
    assert!(
        t.contains("state_dict keys ['stem.0.weight',") && t.contains("ddptrain ['stem.0.kernel',"),
        "{t}"
    );

    let mut reshaped = residual_description();
    reshaped["nodes"][8]["out_shape"] = json!([8, 3, 3]);
    let (code, t) = run(&reshaped);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("node pool outputs [8, 2, 2], ddptrain [8, 3, 3]"), "{t}");
}

/// Where scripts/torch_model.py gets its description from: a binary that
/// cannot run, a config ddptrain refuses (its message passed on) and a
/// missing source are each named.
#[test]
fn torch_model_names_what_keeps_it_from_a_description() {
    let test = "torch_model_names_what_keeps_it_from_a_description";
    let Some(python) = torch_python(test) else { return };
    let run = |args: &[&str]| {
        let o = Command::new(&python)
            .arg("scripts/torch_model.py")
            .args(args)
            .env(HIDE_GPUS.0, HIDE_GPUS.1)
            .current_dir(repo_root())
            .output()
            .expect("run scripts/torch_model.py");
        (o.status.code(), text(&o))
    };
    let bin = ddptrain_bin();
    let bin = bin.to_str().expect("a UTF-8 path");

    let (code, t) = run(&["--bin", bin, "--config", SEED_CONFIG]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("(layer1): Sequential(") && t.contains("fc.bias"), "{t}");

    let (code, t) = run(&["--bin", "/nonexistent/ddptrain", "--config", SEED_CONFIG]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("cannot run /nonexistent/ddptrain: No such file or directory"), "{t}");

    let (code, t) = run(&["--bin", bin, "--config", SEED_CONFIG, "--set", "model.input_shape=[1, 1, 1]"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("failed (2):") && t.contains("kernel_size 2 is larger than the input 1x1"), "{t}");

    let (code, t) = run(&["--config", SEED_CONFIG]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("give --json FILE, or --bin and --config"), "{t}");
}

/// The oracle feeds MNIST digits and scores 10 classes: a config whose
/// model takes other inputs or gives other outputs is named as such rather
/// than trained.
#[test]
fn the_oracle_refuses_a_model_it_cannot_feed() {
    let test = "the_oracle_refuses_a_model_it_cannot_feed";
    let Some(python) = torch_python(test) else { return };
    let seed = std::fs::read_to_string(repo_root().join(SEED_CONFIG)).expect("read the seed config");
    let tmp = tempfile::tempdir().expect("temp dir");
    for (from, to, why) in [
        (
            "input_shape = [1, 28, 28]",
            "input_shape = [1, 32, 32]",
            "takes [1, 32, 32] inputs; this check feeds it 1x28x28 digits",
        ),
        ("out_features = 10", "out_features = 5", "outputs [5]; this check scores 10 digit classes"),
    ] {
        assert!(seed.contains(from), "{SEED_CONFIG} has no `{from}`");
        let config = tmp.path().join("other.toml");
        // ddptrain itself refuses a model whose logits are not data.num_classes.
        let classes = if to.starts_with("out_features") { "[data]\nnum_classes = 5\n" } else { "[data]\n" };
        std::fs::write(&config, seed.replace(from, to).replace("[data]\n", classes))
            .expect("write the config");
        let o = refused_by_parity(&python, &config);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(t.contains(&format!("other.toml: the model {why}")), "{t}");
    }
}

/// The seed config with `{ type = "dropout", name = "drop", p = <p> }` after
/// its flatten, written into `dir` (configs/ stays without dropout: the
/// oracle trains every config there, and dropout's masks are not PyTorch's).
fn dropout_fixture(dir: &Path, p: &str) -> PathBuf {
    let seed = std::fs::read_to_string(repo_root().join(SEED_CONFIG)).expect("read the seed config");
    let flatten = "[[model.layers]]\ntype = \"flatten\"";
    assert!(seed.contains(flatten), "{SEED_CONFIG} has no flatten table");
    let text = seed.replacen(
        flatten,
        &format!("{flatten}\n\n[[model.layers]]\ntype = \"dropout\"\nname = \"drop\"\np = {p}\n"),
        1,
    );
    let path = dir.join(format!("dropout_{}.toml", p.replace('.', "_")));
    std::fs::write(&path, text).expect("write the fixture config");
    path
}

/// A dropout layer in `check --json`: nn.Dropout's argument, the shape
/// kept, nothing in the state_dict; torch_model.py builds it as nn.Dropout
/// (the identity in evaluation) and torch_parity.py refuses to compare
/// training steps while it drops anything.
#[test]
fn dropout_is_described_and_built_as_nn_dropout() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let config = dropout_fixture(tmp.path(), "0.3");
    let o = ddptrain(&["check", "--config", config.to_str().expect("a UTF-8 path"), "--json"], &repo_root());
    assert!(o.status.success(), "check --json failed:\n{}", text(&o));
    let d: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let drop =
        d["nodes"].as_array().expect("nodes").iter().find(|n| n["name"] == "drop").expect("a drop node");
    assert_eq!(drop["type"], "dropout");
    assert_eq!(drop["args"], json!({"p": 0.3}));
    assert_eq!(drop["in_shapes"], json!([[1568]]));
    assert_eq!(drop["out_shape"], json!([1568]));
    assert!(d["state_dict"]
        .as_array()
        .expect("state_dict")
        .iter()
        .all(|k| !k["name"].as_str().unwrap().starts_with("drop")));
    let o = ddptrain(&["check", "--config", config.to_str().expect("a UTF-8 path")], &repo_root());
    assert!(text(&o).contains("Dropout(p=0.3, inplace=False)"), "{}", text(&o));

    let test = "dropout_is_described_and_built_as_nn_dropout";
    let Some(python) = torch_python(test) else { return };
    let code = r#"
import sys, torch, torch.nn as nn, torch_model
desc = torch_model.read_description(sys.argv[1])
m = torch_model.build(desc)
assert type(m.drop) is nn.Dropout and m.drop.p == 0.3, m
assert torch_model.dropout_masks(desc) == ["drop"]
m.eval()
v = m.values(torch.randn(2, 1, 28, 28))
i = [n["name"] for n in desc["nodes"]].index("drop")
assert torch.equal(v[i + 1], v[i]), "dropout in eval is the identity"
print("built with", m.drop)
"#;
    let o = python_on_description(&python, &["-c", code], &d);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("built with Dropout(p=0.3, inplace=False)"), "{}", text(&o));

    let o = refused_by_parity(&python, &config);
    assert!(!o.status.success(), "torch_parity.py compared dropout's masks:\n{}", text(&o));
    assert!(text(&o).contains("dropout with p > 0 at drop"), "{}", text(&o));
}

/// configs/resnet18_cifar10_o2.toml is torchvision's `resnet18(num_classes=10)`
/// with the CIFAR stem (3x3 stride-1 `conv1`, no max-pool): the same
/// state_dict keys and shapes in the same order, and torchvision's weights
/// loaded with `strict=True` into the module built from the TOML give
/// torchvision's outputs.
#[test]
fn the_resnet18_config_is_torchvisions_resnet18() {
    let test = "the_resnet18_config_is_torchvisions_resnet18";
    let Some(python) = torch_python(test) else { return };
    let o = ddptrain(&["check", "--config", "configs/resnet18_cifar10_o2.toml", "--json"], &repo_root());
    assert!(o.status.success(), "check --json failed:\n{}", text(&o));
    let desc: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let code = r#"
import sys, torch, torch.nn as nn, torch_model, torchvision
desc = torch_model.read_description(sys.argv[1])
tv = torchvision.models.resnet18(num_classes=10)
tv.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
tv.maxpool = nn.Identity()
want = [(k, list(v.shape)) for k, v in tv.state_dict().items()]
got = [(k["name"], k["shape"]) for k in desc["state_dict"]]
assert got == want, next((g, w) for g, w in zip(got + [None] * len(want), want + [None] * len(got)) if g != w)
m = torch_model.build(desc)
m.load_state_dict(tv.state_dict(), strict=True)
m.eval(); tv.eval()
torch.manual_seed(0)
x = torch.randn(2, 3, 32, 32)
with torch.no_grad():
    assert torch.allclose(m(x), tv(x), rtol=1e-5, atol=1e-5), (m(x), tv(x))
print("torchvision resnet18:", len(want), "keys,", sum(p.numel() for p in tv.parameters()), "parameters")
"#;
    let o = python_on_description(&python, &["-c", code], &desc);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains(&format!("122 keys, {} parameters", desc["num_params"])), "{t}");
}

/// The seed config with its classifier as 1568 -> 64, then one 64 -> 64
/// linear applied twice (`fc2` ties to `fc1.weight`, biases its own), then
/// 64 -> 10, written into `dir`.
fn tied_fixture(dir: &Path) -> PathBuf {
    let seed = std::fs::read_to_string(repo_root().join(SEED_CONFIG)).expect("read the seed config");
    let fc = "[[model.layers]]\ntype = \"linear\"\nname = \"fc\"\nout_features = 10";
    assert!(seed.contains(fc), "{SEED_CONFIG} has no fc table");
    let linear = |name: &str, out: usize, extra: &str| {
        format!("[[model.layers]]\ntype = \"linear\"\nname = \"{name}\"\nout_features = {out}\n{extra}\n")
    };
    let relu = "[[model.layers]]\ntype = \"relu\"\n";
    let head = [
        linear("fc0", 64, ""),
        relu.to_owned(),
        linear("fc1", 64, ""),
        relu.to_owned(),
        linear("fc2", 64, "tie = \"fc1.weight\""),
        relu.to_owned(),
        linear("fc", 10, ""),
    ]
    .join("\n");
    let path = dir.join("tied.toml");
    std::fs::write(&path, seed.replacen(fc, &head, 1)).expect("write the fixture config");
    path
}

/// A tied weight in PyTorch is one Parameter of two modules: the module
/// built from the TOML has both keys and one parameter, and 20 SGD steps
/// (momentum and weight decay applying to it once) match ddptrain's.
#[test]
fn a_tied_weight_trains_as_one_pytorch_parameter() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let config = tied_fixture(tmp.path());
    let config = config.to_str().expect("a UTF-8 path");
    let o = ddptrain(&["check", "--config", config, "--json"], &repo_root());
    assert!(o.status.success(), "check --json failed:\n{}", text(&o));
    let d: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let fc2 = d["nodes"].as_array().expect("nodes").iter().find(|n| n["name"] == "fc2").expect("fc2");
    assert_eq!(fc2["tie"], "fc1.weight");
    let key = d["state_dict"].as_array().expect("keys").iter().find(|k| k["name"] == "fc2.weight");
    assert_eq!(key.map(|k| k["tied_to"].clone()), Some(json!("fc1.weight")));

    let test = "a_tied_weight_trains_as_one_pytorch_parameter";
    let Some(python) = torch_python(test) else { return };
    let code = r#"
import sys, torch_model
desc = torch_model.read_description(sys.argv[1])
m = torch_model.build(desc)
assert m.fc2.weight is m.fc1.weight
names = [n for n, _ in m.named_parameters()]
assert "fc2.weight" not in names and "fc2.bias" in names, names
print("parameters", sum(p.numel() for p in m.parameters()), "ddptrain", desc["num_params"])
"#;
    let o = python_on_description(&python, &["-c", code], &d);
    assert!(o.status.success(), "{}", text(&o));
    let n = d["num_params"].as_u64().expect("num_params");
    assert!(text(&o).contains(&format!("parameters {n} ddptrain {n}")), "{}", text(&o));

    let o = parity(&python, config, &["--optimizer", "sgd", "--steps", "20", "--device", "cpu"]);
    let t = text(&o);
    println!("{t}");
    assert!(o.status.success() && t.contains("check 3: test set: ddptrain"), "{t}");
}
