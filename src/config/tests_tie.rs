//! `tie`: one parameter under two keys, counted once, and every mistake
//! at its key.

use super::tests_load::{config_err, load_text, MINIMAL};
use super::*;

/// A conv and a linear each applied twice with one weight (ALBERT-style),
/// their biases separate; fc2 ties to fc1 through nothing else.
pub(crate) const TIED: &str = r#"
[model]
input_shape = [2, 6, 6]
layers = [
  { type = "conv2d", name = "conv1", out_channels = 2, kernel_size = 3, padding = 1 },
  { type = "relu" },
  { type = "conv2d", name = "conv2", out_channels = 2, kernel_size = 3, padding = 1, tie = "conv1.weight" },
  { type = "flatten" },
  { type = "linear", name = "fc1", out_features = 72 },
  { type = "relu" },
  { type = "linear", name = "fc2", out_features = 72, bias = false, tie = "fc1.weight" },
  { type = "linear", name = "fc", out_features = 10 },
]
[data]
batch_size = 8
mean = [0.5, 0.5]
std = [0.25, 0.25]
[optimizer]
lr = 0.1
[train]
max_steps = 1
"#;

pub(crate) fn tied_layers() -> Vec<ResolvedLayer> {
    load_text(TIED, &[], &[]).0.unwrap().resolve_model().unwrap()
}

fn with_layers(layers: &str) -> String {
    MINIMAL.replace(
        r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#,
        &format!(r#"[{{ type = "flatten" }}, {layers}]"#),
    )
}

fn err_of(layers: &str) -> (String, String) {
    let (file, key, msg) = config_err(load_text(&with_layers(layers), &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    (key, msg)
}

#[test]
fn a_tied_weight_is_both_keys_and_one_parameter() {
    let layers = tied_layers();
    let at = |n: &str| layers.iter().position(|l| l.name == n).unwrap();
    assert_eq!(
        layers[at("conv2")].tie,
        Some(Tie { slot: 0, node: at("conv1"), param: 0, key: "conv1.weight".into() })
    );
    assert_eq!(
        layers[at("fc2")].tie,
        Some(Tie { slot: 0, node: at("fc1"), param: 0, key: "fc1.weight".into() })
    );
    // conv1 36 + 2, conv2's bias 2, fc1 5184 + 72, fc 720 + 10: each shared weight once.
    assert_eq!(param_count(&layers), 38 + 2 + 5256 + 730);
    let d = describe::describe(&[2, 6, 6], &layers, &crate::amp::Policy::for_level(OptLevel::O2));
    let keys: Vec<(&str, Option<&str>)> =
        d.state_dict.iter().map(|k| (k.name.as_str(), k.tied_to.as_deref())).collect();
    assert_eq!(
        keys,
        [
            ("conv1.weight", None),
            ("conv1.bias", None),
            ("conv2.weight", Some("conv1.weight")),
            ("conv2.bias", None),
            ("fc1.weight", None),
            ("fc1.bias", None),
            ("fc2.weight", Some("fc1.weight")),
            ("fc.weight", None),
            ("fc.bias", None),
        ]
    );
    assert!(
        d.state_dict_table().contains("fc2.weight    [72, 72]      float16  (= fc1.weight)"),
        "{}",
        d.state_dict_table()
    );
    let table = summary(&layers);
    assert!(table.contains("(weight = fc1.weight)"), "{table}");
}

#[test]
fn a_tie_to_a_tied_weight_is_a_tie_to_its_owner() {
    let (r, _) = load_text(
        &with_layers(
            r#"{ type = "linear", name = "a", out_features = 16 }, { type = "linear", name = "b", out_features = 16, tie = "a.weight" },
               { type = "linear", name = "c", out_features = 16, tie = "b.weight" }, { type = "linear", name = "fc", out_features = 10 }"#,
        ),
        &[],
        &[],
    );
    let layers = r.unwrap().resolve_model().unwrap();
    let c = layers.iter().find(|l| l.name == "c").unwrap();
    assert_eq!(c.tie.as_ref().map(|t| (t.node, t.key.as_str())), Some((1, "a.weight")));
}

#[test]
fn tie_mistakes_name_the_key_and_what_would_fit() {
    let fc = r#"{ type = "linear", name = "fc", out_features = 10 }"#;
    let (key, msg) = err_of(&format!(
        r#"{{ type = "linear", name = "a", out_features = 16 }}, {{ type = "linear", name = "b", out_features = 16, tie = "a.wieght" }}, {fc}"#
    ));
    assert_eq!(key, "model.layers[2].tie");
    assert!(msg.contains(r#"no module before this one has a parameter "a.wieght""#), "{msg}");
    assert!(msg.contains("nearest first: a.bias, a.weight"), "{msg}");
    // A later module's parameter is not there yet.
    let (key, msg) =
        err_of(&format!(r#"{{ type = "linear", name = "a", out_features = 16, tie = "fc.weight" }}, {fc}"#));
    assert_eq!(key, "model.layers[1].tie");
    assert!(msg.contains("no module before this one has a parameter \"fc.weight\""), "{msg}");
    assert!(msg.ends_with("; no module before it has parameters"), "{msg}");
    let (key, msg) = err_of(&format!(
        r#"{{ type = "linear", name = "a", out_features = 16 }}, {{ type = "linear", name = "b", out_features = 8, tie = "a.weight" }}, {fc}"#
    ));
    assert_eq!(key, "model.layers[2].tie");
    assert!(
        msg.contains(
            "this linear's weight is [8, 16] but `a.weight` is [16, 16]; tied parameters must have one shape"
        ),
        "{msg}"
    );
    let (key, msg) = err_of(&format!(
        r#"{{ type = "linear", name = "a", out_features = 16 }}, {{ type = "relu", tie = "a.weight" }}, {fc}"#
    ));
    assert_eq!(key, "model.layers[2].tie");
    assert!(msg.contains("a relu has no `weight` to tie"), "{msg}");
}

#[test]
fn a_buffer_or_a_batchnorm_weight_cannot_be_tied_to_a_linear() {
    let text = MINIMAL.replace(
        r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#,
        r#"[{ type = "conv2d", name = "c", out_channels = 4, kernel_size = 1 }, { type = "batchnorm2d", name = "bn" },
            { type = "conv2d", name = "d", out_channels = 4, kernel_size = 1, tie = "TARGET" },
            { type = "flatten" }, { type = "linear", out_features = 10 }]"#,
    );
    let err = |target: &str| {
        let (_, key, msg) = config_err(load_text(&text.replace("TARGET", target), &[], &[]).0);
        assert_eq!(key, "model.layers[2].tie");
        msg
    };
    let msg = err("bn.running_mean");
    assert!(msg.contains("`bn.running_mean` is a buffer, not a parameter"), "{msg}");
    let msg = err("bn.weight");
    assert!(msg.contains("this conv2d's weight is [4, 4, 1, 1] but `bn.weight` is [4]"), "{msg}");
}

#[test]
fn tie_is_a_key_of_every_layer_type() {
    let (key, msg) = err_of(r#"{ type = "linear", out_features = 10, tei = "x" }"#);
    assert_eq!(key, "model.layers[1].tei");
    assert!(msg.contains("`tie`"), "{msg}");
}
