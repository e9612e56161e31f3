//! Shape inference, module names and model errors.

use super::tests_load::{config_err, load_text, mnist_path, MINIMAL};
use super::*;
use crate::nn::layers::{BatchNorm2d, Conv2d, Linear, MaxPool2d};

fn mnist() -> Config {
    load_with_env(&mnist_path(), &[], &[]).unwrap()
}

/// MINIMAL with its layer list replaced by `layers` (inline-table TOML).
fn with_layers(layers: &str) -> String {
    MINIMAL.replace(r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#, layers)
}

#[test]
fn mnist_config_values() {
    let c = mnist();
    assert_eq!(c.run.seed, 42);
    assert_eq!(c.model.input_shape, [1, 28, 28]);
    assert_eq!((c.data.batch_size, c.data.eval_batch_size), (100, 100));
    let o = &c.optimizer;
    assert_eq!((o.name, o.lr, o.momentum, o.weight_decay), (OptimizerName::Sgd, 0.05, 0.9, 5e-4));
    assert_eq!((c.scheduler.name, c.scheduler.warmup_steps), (SchedulerName::Cosine, 100));
    assert_eq!((c.train.epochs, c.train.max_steps), (Some(5), None));
    assert_eq!(c.expect.min_test_accuracy, Some(0.97));
}

#[test]
fn mnist_resolves_to_pytorch_names_and_shapes() {
    let layers = resolve(&mnist().model).unwrap();
    let got: Vec<(&str, Vec<usize>)> =
        layers.iter().map(|l| (l.name.as_str(), l.out_shape.clone())).collect();
    let want: Vec<(&str, Vec<usize>)> = vec![
        ("layer1.0", vec![16, 28, 28]),
        ("layer1.1", vec![16, 28, 28]),
        ("layer1.2", vec![16, 28, 28]),
        ("layer1.3", vec![16, 14, 14]),
        ("layer2.0", vec![32, 14, 14]),
        ("layer2.1", vec![32, 14, 14]),
        ("layer2.2", vec![32, 14, 14]),
        ("layer2.3", vec![32, 7, 7]),
        ("2", vec![1568]),
        ("fc", vec![10]),
    ];
    assert_eq!(got, want);
    assert_eq!(
        layers[9].kind,
        LayerKind::Linear(Linear {
            in_features: 1568,
            out_features: 10,
            bias: true,
            positions: None,
            init_std: None
        })
    );
    assert_eq!(layers[9].in_shape, vec![1568]);
    assert_eq!(layers[9].key, "model.layers[3]");
    assert_eq!(layers[4].key, "model.layers[1].layers[0]");
    assert_eq!(
        layers[4].kind,
        LayerKind::Conv2d(Conv2d {
            in_channels: 16,
            out_channels: 32,
            kernel_size: 5,
            stride: 1,
            padding: 2,
            bias: true
        })
    );
    assert_eq!(
        layers[1].kind,
        LayerKind::BatchNorm2d(BatchNorm2d { num_features: 16, eps: 1e-5, momentum: 0.1 })
    );
    assert_eq!(layers[7].kind, LayerKind::MaxPool2d(MaxPool2d { kernel_size: 2, stride: 2 }));

    let mut state: Vec<(String, Vec<usize>)> = Vec::new();
    for l in &layers {
        for (p, shape) in l.kind.params().into_iter().chain(l.kind.buffers()) {
            state.push((format!("{}.{p}", l.name), shape));
        }
    }
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "layer1.0.weight",
            "layer1.0.bias",
            "layer1.1.weight",
            "layer1.1.bias",
            "layer1.1.running_mean",
            "layer1.1.running_var",
            "layer1.1.num_batches_tracked",
            "layer2.0.weight",
            "layer2.0.bias",
            "layer2.1.weight",
            "layer2.1.bias",
            "layer2.1.running_mean",
            "layer2.1.running_var",
            "layer2.1.num_batches_tracked",
            "fc.weight",
            "fc.bias",
        ]
    );
    assert_eq!(state[0].1, vec![16, 1, 5, 5]);
    assert_eq!(state[6].1, Vec::<usize>::new());
    assert_eq!(state[7].1, vec![32, 16, 5, 5]);
    assert_eq!(state[14].1, vec![10, 1568]);
}

#[test]
fn mnist_param_count_matches_pytorch() {
    let layers = mnist().resolve_model().unwrap();
    let want = (16 * 25 + 16) + (16 + 16) + (32 * 400 + 32) + (32 + 32) + (15680 + 10);
    assert_eq!(param_count(&layers), want);
}

#[test]
fn summary_lists_layers_shapes_and_total() {
    let layers = resolve(&mnist().model).unwrap();
    let s = summary(&layers);
    for needle in [
        "layer1.0",
        "Conv2d(1, 16, kernel_size=(5, 5), stride=(1, 1), padding=(2, 2))",
        "BatchNorm2d(16, eps=1e-5, momentum=0.1)",
        "ReLU()",
        "MaxPool2d(kernel_size=2, stride=2)",
        "Flatten()",
        "Linear(in_features=1568, out_features=10, bias=True)",
        "[32, 7, 7]",
        "[1, 28, 28]",
        "15690",
        "Total params: 29034",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in\n{s}");
    }
    assert_eq!(s.lines().filter(|l| l.starts_with("layer")).count(), 8);
}

#[test]
fn unnamed_and_named_entries_get_nn_sequential_names() {
    let text = with_layers(
        r#"[{ type = "conv2d", out_channels = 2, kernel_size = 3, bias = false },
            { type = "sequential", name = "block", layers = [{ type = "relu", name = "act" }, { type = "relu" }] },
            { type = "flatten", name = "flat" }, { type = "linear", out_features = 10 }]"#,
    );
    let c = load_text(&text, &[], &[]).0.unwrap();
    let layers = c.resolve_model().unwrap();
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["0", "block.act", "block.1", "flat", "3"]);
    assert_eq!(layers[0].kind.params(), vec![("weight", vec![2, 1, 3, 3])]);
    assert_eq!(layers[0].out_shape, vec![2, 2, 2]);
    assert_eq!(
        layers[4].kind,
        LayerKind::Linear(Linear {
            in_features: 8,
            out_features: 10,
            bias: true,
            positions: None,
            init_std: None
        })
    );
}

/// Loads MINIMAL with `layers`; returns (file ends with exp.toml, key, msg).
fn model_err(layers: &str) -> (String, String) {
    let (file, key, msg) = config_err(load_text(&with_layers(layers), &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    (key, msg)
}

#[test]
fn kernel_larger_than_input() {
    let (key, msg) = model_err(
        r#"[{ type = "conv2d", out_channels = 2, kernel_size = 3 }, { type = "conv2d", out_channels = 2, kernel_size = 5 },
            { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[1].kernel_size");
    assert_eq!(msg, "kernel_size 5 is larger than the input 2x2 (+2*padding 0)");
    let (key, msg) = model_err(
        r#"[{ type = "maxpool2d", kernel_size = 8 }, { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[0].kernel_size");
    assert!(msg.contains("kernel_size 8 is larger than the input 4x4"), "{msg}");
}

#[test]
fn spatial_layers_need_chw_input() {
    for (ty, extra) in [
        ("conv2d", ", out_channels = 2, kernel_size = 1"),
        ("batchnorm2d", ""),
        ("maxpool2d", ", kernel_size = 1"),
    ] {
        let (key, msg) = model_err(&format!(
            r#"[{{ type = "flatten" }}, {{ type = "{ty}"{extra} }}, {{ type = "linear", out_features = 10 }}]"#
        ));
        assert_eq!(key, "model.layers[1]");
        assert!(msg.contains(&format!("{ty} needs a [C, H, W] input, but its input is [16]")), "{msg}");
    }
}

#[test]
fn linear_needs_flat_input() {
    let (key, msg) = model_err(r#"[{ type = "relu" }, { type = "linear", out_features = 10 }]"#);
    assert_eq!(key, "model.layers[1]");
    assert!(msg.contains("[1, 4, 4]") && msg.contains("add a flatten layer"), "{msg}");
}

#[test]
fn output_must_be_one_dimensional() {
    let (key, msg) = model_err(r#"[{ type = "relu" }]"#);
    assert_eq!(key, "model.layers");
    assert!(msg.contains("[1, 4, 4]") && msg.contains("1-D logits"), "{msg}");
}

#[test]
fn zero_sizes_are_refused() {
    let cases = [
        (r#"{ type = "conv2d", out_channels = 0, kernel_size = 1 }"#, "model.layers[0].out_channels"),
        (r#"{ type = "conv2d", out_channels = 1, kernel_size = 0 }"#, "model.layers[0].kernel_size"),
        (r#"{ type = "conv2d", out_channels = 1, kernel_size = 1, stride = 0 }"#, "model.layers[0].stride"),
        (r#"{ type = "maxpool2d", kernel_size = 2, stride = 0 }"#, "model.layers[0].stride"),
    ];
    for (layer, want) in cases {
        let (key, msg) = model_err(&format!(
            r#"[{layer}, {{ type = "flatten" }}, {{ type = "linear", out_features = 10 }}]"#
        ));
        assert_eq!(key, want);
        assert_eq!(msg, "must be at least 1");
    }
    let (key, msg) = model_err(r#"[{ type = "flatten" }, { type = "linear", out_features = 0 }]"#);
    assert_eq!((key.as_str(), msg.as_str()), ("model.layers[1].out_features", "must be at least 1"));
    let (file, key, msg) = config_err(load_text(MINIMAL, &["model.input_shape=[1, 0, 4]"], &[]).0);
    assert!(file.ends_with("exp.toml (value from --set)"), "{file}");
    assert_eq!(key, "model.input_shape");
    assert!(msg.contains("at least 1"), "{msg}");
    let (file, key, msg) = config_err(load_text(MINIMAL, &["model.input_shape=[16]"], &[]).0);
    // A shape of any rank parses (text takes [block_size]); validation refuses it for images.
    assert!(file.ends_with("exp.toml (value from --set)"), "{file}");
    assert_eq!(key, "model.input_shape");
    assert_eq!(msg, "expected [C, H, W] (3 numbers), found 1 element(s)");
}

#[test]
fn batchnorm_eps_and_momentum_ranges() {
    let (key, msg) = model_err(
        r#"[{ type = "batchnorm2d", eps = 0.0 }, { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[0].eps");
    assert!(msg.contains("positive"), "{msg}");
    let (key, msg) = model_err(
        r#"[{ type = "batchnorm2d", momentum = 1.5 }, { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[0].momentum");
    assert!(msg.contains("[0, 1]"), "{msg}");
}

#[test]
fn names_must_be_identifiers_and_unique() {
    let (key, msg) =
        model_err(r#"[{ type = "flatten", name = "my.flat" }, { type = "linear", out_features = 10 }]"#);
    assert_eq!(key, "model.layers[0].name");
    assert!(msg.contains("\"my.flat\" is not a valid module name"), "{msg}");
    let (key, msg) =
        model_err(r#"[{ type = "flatten", name = "1st" }, { type = "linear", out_features = 10 }]"#);
    assert_eq!(key, "model.layers[0].name");
    assert!(msg.contains("not a valid module name"), "{msg}");
    let (key, msg) = model_err(
        r#"[{ type = "sequential", name = "b", layers = [{ type = "batchnorm2d", name = "a" }, { type = "batchnorm2d", name = "a" }] },
            { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[0].layers[1].name");
    assert!(msg.contains("\"a\" is used twice") && msg.contains("cannot be used twice"), "{msg}");
}

#[test]
fn empty_layer_lists_are_refused() {
    let (key, msg) = model_err("[]");
    assert_eq!((key.as_str(), msg.as_str()), ("model.layers", "must not be empty"));
    let (key, msg) = model_err(
        r#"[{ type = "sequential", name = "b", layers = [] }, { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    assert_eq!(key, "model.layers[0].layers");
    assert!(msg.contains("at least one layer"), "{msg}");
}

#[test]
fn final_features_must_match_num_classes() {
    let (key, msg) = model_err(r#"[{ type = "flatten" }, { type = "linear", out_features = 5 }]"#);
    assert_eq!(key, "model.layers[1].out_features");
    assert_eq!(msg, "the model outputs 5 logits but data.num_classes is 10");
    let c = load_text(
        &with_layers(r#"[{ type = "flatten" }, { type = "linear", out_features = 5 }]"#),
        &["data.num_classes=5"],
        &[],
    )
    .0;
    assert_eq!(c.unwrap().data.num_classes, 5);
}
