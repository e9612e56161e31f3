//! Sizes a config makes that do not fit (overflowing shapes), and values too
//! long to repeat in an error message.

use super::tests_load::{config_err, load_text, MINIMAL};

/// MINIMAL with `input_shape` and `layers` replaced.
fn model(input: &str, layers: &str) -> String {
    MINIMAL
        .replace("[1, 4, 4]", input)
        .replace(r#"[{ type = "flatten" }, { type = "linear", out_features = 10 }]"#, layers)
}

fn err_of(text: &str) -> (String, String, String) {
    config_err(load_text(text, &[], &[]).0)
}

const TAIL: &str = r#"{ type = "flatten" }, { type = "linear", out_features = 10 }"#;

#[test]
fn conv_padding_that_overflows_names_the_padding() {
    let layers = format!(
        r#"[{{ type = "sequential", name = "layer1", layers = [
            {{ type = "conv2d", out_channels = 2, kernel_size = 5, padding = 9223372036854775807 }} ] }}, {TAIL}]"#
    );
    let (file, key, msg) = err_of(&model("[1, 28, 28]", &layers));
    assert!(file.ends_with("exp.toml"), "{file}");
    assert_eq!(key, "model.layers[0].layers[0].padding");
    assert!(msg.contains("padding 9223372036854775807 is too large"), "{msg}");
    // With a 1-pixel input the padded side still fits; the output's element count does not.
    let (_, key, msg) = err_of(&model("[1, 1, 1]", &layers));
    assert_eq!(key, "model.layers[0].layers[0].padding");
    assert!(msg.contains("has more elements than fit in 64 bits"), "{msg}");
}

#[test]
fn huge_channels_and_features_name_their_key() {
    let conv =
        format!(r#"[{{ type = "conv2d", out_channels = 9223372036854775807, kernel_size = 1 }}, {TAIL}]"#);
    let (_, key, msg) = err_of(&model("[4, 4, 4]", &conv));
    assert_eq!(key, "model.layers[0].out_channels");
    assert!(msg.contains("more elements than fit in 64 bits"), "{msg}");
    let wide = r#"[{ type = "flatten" }, { type = "linear", out_features = 9223372036854775807 },
                   { type = "linear", out_features = 10 }]"#;
    let (_, key, msg) = err_of(&model("[1, 4, 4]", wide));
    assert_eq!(key, "model.layers[1].out_features");
    assert!(msg.contains("[9223372036854775807, 16]"), "{msg}");
}

#[test]
fn an_input_shape_that_overflows_is_refused() {
    let (_, key, msg) = err_of(&model("[4294967296, 4294967296, 2]", &format!("[{TAIL}]")));
    assert_eq!(key, "model.input_shape");
    assert!(msg.contains("more elements than fit in 64 bits"), "{msg}");
}

#[test]
fn a_parameter_total_that_overflows_names_the_layer() {
    // Each weight fits alone ([2^62, 1] and [2, 2^62]); the model's total does not.
    let layers = r#"[{ type = "flatten" }, { type = "linear", out_features = 4611686018427387904 },
                     { type = "linear", out_features = 2 }]"#;
    let (_, key, msg) = err_of(&model("[1, 1, 1]", layers));
    assert_eq!(key, "model.layers[2]");
    assert!(msg.contains("parameter count does not fit"), "{msg}");
}
