//! Models as graphs: residual wiring, PyTorch's names through it, and every
//! mistake in it reported at its key.

use super::tests_load::{config_err, load_text, MINIMAL};
use super::*;

fn resnet() -> Vec<ResolvedLayer> {
    let path = crate::testing::repo_root().join("configs/resnet_mnist_o2.toml");
    load_with_env(&path, &[], &[]).unwrap().resolve_model().unwrap()
}

/// A 4x4 image through `layers` (inline-table TOML) then flatten and a linear layer.
fn graph(layers: &str) -> String {
    MINIMAL.replace(
        r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#,
        &format!(r#"[{layers}, {{ type = "flatten" }}, {{ type = "linear", out_features = 10 }}]"#),
    )
}

fn graph_err(layers: &str) -> (String, String) {
    let (file, key, msg) = config_err(load_text(&graph(layers), &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    (key, msg)
}

#[test]
fn the_resnet_config_has_torchvisions_names_and_wiring() {
    let layers = resnet();
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    let at = |n: &str| names.iter().position(|&m| m == n).unwrap_or_else(|| panic!("no {n} in {names:?}"));
    // The identity block: its add reads bn2 and the block's input (layer1's pool).
    let add2 = &layers[at("layer2.0.add")];
    assert_eq!(add2.inputs, vec![at("layer2.0.bn2") + 1, at("layer1.3") + 1]);
    assert_eq!(add2.out_shape, vec![16, 14, 14]);
    // The projection block: conv1 and the shortcut both read layer2's output.
    let block_in = at("layer2.0.add") + 2; // the relu after the add
    assert_eq!(names[block_in - 1], "layer2.0.relu");
    assert_eq!(layers[at("layer3.0.conv1")].inputs, vec![block_in]);
    assert_eq!(layers[at("layer3.0.downsample.0")].inputs, vec![block_in]);
    let add3 = &layers[at("layer3.0.add")];
    assert_eq!(add3.inputs, vec![at("layer3.0.bn2") + 1, at("layer3.0.downsample.1") + 1]);
    assert_eq!(add3.out_shape, vec![64, 7, 7]);
    assert_eq!(layers[at("avgpool")].out_shape, vec![64, 1, 1]);
    assert_eq!(layers.last().map(|l| l.out_shape.clone()), Some(vec![10]));

    let mut keys = Vec::new();
    for l in &layers {
        for (p, _) in l.kind.params().into_iter().chain(l.kind.buffers()) {
            keys.push(format!("{}.{p}", l.name));
        }
    }
    for k in [
        "layer2.0.conv1.weight",
        "layer2.0.bn2.running_var",
        "layer3.0.downsample.0.weight",
        "layer3.0.downsample.1.num_batches_tracked",
        "fc.bias",
    ] {
        assert!(keys.iter().any(|x| x == k), "no {k} in {keys:?}");
    }
    assert!(!keys.iter().any(|k| k.contains("bias") && k.contains("conv")), "bias = false: {keys:?}");

    let s = summary(&layers);
    assert!(s.contains("layer3.0.add") && s.contains("add <- layer3.0.bn2 + layer3.0.downsample.1"), "{s}");
    assert!(
        s.contains("Conv2d(16, 64, kernel_size=(1, 1), stride=(2, 2), bias=False) <- layer2.0.relu"),
        "{s}"
    );
}

#[test]
fn a_residual_without_a_shortcut_adds_its_input_and_names_its_adds_like_torch_fx() {
    let text = graph(
        r#"{ type = "residual", layers = [{ type = "relu" }] }, { type = "residual", layers = [{ type = "relu" }] }"#,
    );
    let layers = load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap();
    let got: Vec<(&str, &[usize])> = layers.iter().map(|l| (l.name.as_str(), l.inputs.as_slice())).collect();
    assert_eq!(got[..4], [("0", &[0][..]), ("add", &[1, 0][..]), ("1", &[2][..]), ("add_1", &[3, 2][..])]);
}

#[test]
fn a_shape_mismatch_at_a_sum_names_both_shapes_and_the_projection_that_fits() {
    let strided = r#"{ type = "conv2d", out_channels = 4, kernel_size = 3, stride = 2, padding = 1 }"#;
    let (key, msg) = graph_err(&format!(r#"{{ type = "residual", layers = [{strided}] }}"#));
    assert_eq!(key, "model.layers[0]");
    assert!(msg.contains("`layers` gives [4, 2, 2]") && msg.contains("gives [1, 4, 4]"), "{msg}");
    assert!(msg.contains("the identity"), "{msg}");
    assert!(msg.contains("out_channels = 4, kernel_size = 1, stride = 2"), "{msg}");

    let (key, msg) = graph_err(&format!(
        r#"{{ type = "residual", layers = [{strided}], shortcut = [{{ type = "maxpool2d", kernel_size = 3 }}] }}"#
    ));
    assert_eq!(key, "model.layers[0]");
    assert!(
        msg.contains("[4, 2, 2]") && msg.contains("[1, 1, 1]") && msg.contains("not the shortcut's 1x1"),
        "{msg}"
    );
}

#[test]
fn residual_mistakes_are_config_errors_at_their_key() {
    let (key, msg) = graph_err(r#"{ type = "residual", layers = [] }"#);
    assert_eq!(
        (key.as_str(), msg.as_str()),
        ("model.layers[0].layers", "a residual block must have at least one layer")
    );

    let (key, msg) = graph_err(r#"{ type = "residual", name = "r", layers = [{ type = "relu" }] }"#);
    assert_eq!(key, "model.layers[0].name");
    assert!(msg.contains("valid keys in `model.layers[0]`: type, layers, shortcut"), "{msg}");

    let (key, _) = graph_err(r#"{ type = "residual", shortcut = [] }"#);
    assert_eq!(key, "model.layers[0].layers");

    // The branch and the shortcut share the block's names.
    let bn = r#"{ type = "batchnorm2d", name = "bn" }"#;
    let (key, msg) = graph_err(&format!(r#"{{ type = "residual", layers = [{bn}], shortcut = [{bn}] }}"#));
    assert_eq!(key, "model.layers[0].shortcut[0].name");
    assert!(msg.contains("\"bn\" is used twice") && msg.contains("cannot be used twice"), "{msg}");
    // A child named like the block's add.
    let (key, msg) = graph_err(
        r#"{ type = "residual", layers = [{ type = "relu" }] }, { type = "batchnorm2d", name = "add" }"#,
    );
    assert_eq!(key, "model.layers[1].name");
    assert!(msg.contains("\"add\" is used twice"), "{msg}");
}

#[test]
fn a_module_without_state_may_be_used_twice() {
    let text = graph(r#"{ type = "relu", name = "act" }, { type = "relu", name = "act" }"#);
    let layers = load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap();
    assert_eq!(layers[0].name, "act");
    assert_eq!(layers[1].name, "act");
}

#[test]
fn an_unnamed_sequential_takes_its_position() {
    let text = graph(r#"{ type = "sequential", layers = [{ type = "batchnorm2d", name = "bn" }] }"#);
    let layers = load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap();
    assert_eq!(layers[0].name, "0.bn");
}

#[test]
fn pooling_layers_resolve_and_refuse_what_pytorch_refuses() {
    let text = graph(
        r#"{ type = "avgpool2d", kernel_size = 3, stride = 2, padding = 1 }, { type = "adaptive_avgpool2d", output_size = 1 }"#,
    );
    let layers = load_text(&text, &[], &[]).0.unwrap().resolve_model().unwrap();
    assert_eq!(layers[0].out_shape, vec![1, 2, 2]);
    assert_eq!(layers[1].out_shape, vec![1, 1, 1]);
    assert_eq!(layers[0].kind.to_string(), "AvgPool2d(kernel_size=3, stride=2, padding=1)");
    assert_eq!(layers[1].kind.to_string(), "AdaptiveAvgPool2d(output_size=1)");

    let (key, msg) = graph_err(r#"{ type = "avgpool2d", kernel_size = 2, padding = 2 }"#);
    assert_eq!(key, "model.layers[0].padding");
    assert!(msg.contains("at most half of kernel_size 2"), "{msg}");
    let (key, msg) = graph_err(r#"{ type = "avgpool2d", kernel_size = 5 }"#);
    assert_eq!(key, "model.layers[0].kernel_size");
    assert!(msg.contains("larger than the input 4x4"), "{msg}");
    let (key, msg) = graph_err(r#"{ type = "adaptive_avgpool2d", output_size = 2 }"#);
    assert_eq!(key, "model.layers[0].output_size");
    assert!(msg.contains("only output_size = 1"), "{msg}");
    let (key, _) = graph_err(r#"{ type = "adaptive_avgpool2d" }"#);
    assert_eq!(key, "model.layers[0].output_size");
}

#[test]
fn dropout_defaults_to_pytorchs_p_and_keeps_the_shape() {
    let text = graph(
        r#"{ type = "dropout" }, { type = "dropout", name = "drop", p = 0.1 }, { type = "dropout", p = 0 }"#,
    );
    let cfg = load_text(&text, &[], &[]).0.unwrap();
    let layers = cfg.resolve_model().unwrap();
    assert_eq!((layers[0].name.as_str(), layers[1].name.as_str()), ("0", "drop"));
    assert_eq!(layers[0].out_shape, vec![1, 4, 4]);
    assert_eq!(layers[0].kind.to_string(), "Dropout(p=0.5, inplace=False)");
    assert_eq!(layers[1].kind.to_string(), "Dropout(p=0.1, inplace=False)");
    // An integer p reads as a float, and prints as Python prints one.
    assert_eq!(layers[2].kind.to_string(), "Dropout(p=0.0, inplace=False)");
    assert_eq!(serde_json::to_value(&layers[1].kind).unwrap(), serde_json::json!({ "p": 0.1 }));
    assert_eq!(layers[0].kind.num_params(), 0);
    // The table as written back (and fingerprinted) carries the default.
    let back = toml::to_string(&cfg.model).unwrap();
    assert!(back.contains(r#"type = "dropout""#) && back.contains("p = 0.5"), "{back}");
}

#[test]
fn dropout_p_must_be_a_probability() {
    // p = 1 is allowed, as nn.Dropout allows it: everything dropped.
    let text = graph(r#"{ type = "dropout", p = 1.0 }"#);
    assert!(load_text(&text, &[], &[]).0.unwrap().resolve_model().is_ok());
    for bad in ["1.5", "-0.1", "nan", "inf"] {
        let (key, msg) = graph_err(&format!(r#"{{ type = "dropout", p = {bad} }}"#));
        assert_eq!(key, "model.layers[0].p", "p = {bad}");
        assert!(msg.contains("dropout probability has to be between 0 and 1, but got"), "{msg}");
    }
    let (key, msg) = graph_err(r#"{ type = "dropout", p = "half" }"#);
    assert_eq!(key, "model.layers[0].p");
    assert!(msg.contains("\"half\""), "{msg}");
    let (key, msg) = graph_err(r#"{ type = "dropout", rate = 0.1 }"#);
    assert_eq!(key, "model.layers[0].rate");
    assert!(msg.contains("valid keys in `model.layers[0]`: type, name, p"), "{msg}");
}
