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

/// 10 MB of one letter: what a pasted file or a runaway script gives.
fn huge() -> String {
    "x".repeat(10 << 20)
}

/// Asserts `s` holds at most a short prefix of [`huge`] and says how long
/// it was (the value, or the key or line that holds it: 10 MiB and a few bytes).
fn assert_cut(s: &str) {
    assert!(s.len() < 1000, "{} bytes came back: {}...", s.len(), &s[..200.min(s.len())]);
    assert!(s.contains("xxxx... (104857"), "{s}");
}

#[test]
fn a_huge_string_value_is_cut_in_the_message() {
    let big = huge();
    for (text, set) in [
        // Wrong type, from the file and from --set.
        (MINIMAL.replace("batch_size = 8", &format!("batch_size = \"{big}\"")), None),
        (MINIMAL.to_owned(), Some(format!("data.batch_size=\"{big}\""))),
        // An unknown enum value, an unknown key, a bad module name.
        (MINIMAL.replace("[data]", &format!("[data]\ndataset = \"{big}\"")), None),
        (MINIMAL.replace("[data]", &format!("[data]\n{big} = 1")), None),
        (
            MINIMAL
                .replace(r#"{ type = "flatten" }"#, &format!(r#"{{ type = "flatten", name = "-{big}" }}"#)),
            None,
        ),
        // A syntax error on a 10 MB line.
        (MINIMAL.replace("[data]", &format!("[data]\nbad = {big}")), None),
        // Strings that become paths or names are held to the system's limits.
        (MINIMAL.replace("[data]", &format!("[run]\nname = \"{big}\"\n[data]")), None),
        (MINIMAL.replace("[data]", &format!("[data]\npath = \"{big}\"")), None),
        (MINIMAL.to_owned(), Some(format!("run.out_dir={big}"))),
        (MINIMAL.to_owned(), Some(format!("checkpoint.resume={big}"))),
        (MINIMAL.to_owned(), Some(format!("{big}=1"))),
    ] {
        let set: Vec<&str> = set.iter().map(String::as_str).collect();
        let e = load_text(&text, &set, &[]).0.expect_err("a huge value must be refused");
        assert_cut(&e.to_string());
    }
}

#[test]
fn long_names_and_paths_are_refused_by_their_key() {
    let long = "a".repeat(300);
    let (_, key, msg) = config_err(load_text(MINIMAL, &[&format!("run.name={long}")], &[]).0);
    assert_eq!(key, "run.name");
    assert!(
        msg.starts_with("is 300 bytes long, more than 255 (it names the run's directory): \"aaa"),
        "{msg}"
    );
    assert!(msg.ends_with("... (300 bytes)\""), "{msg}");
    let (_, key, _) = config_err(load_text(MINIMAL, &[&format!("parallel.master_addr={long}")], &[]).0);
    assert_eq!(key, "parallel.master_addr");
    let deep = "d/".repeat(2100);
    let (_, key, msg) = config_err(load_text(MINIMAL, &[&format!("model.init_from={deep}")], &[]).0);
    assert_eq!(key, "model.init_from");
    assert!(msg.contains("is 4200 bytes long, more than 4096 (a path)"), "{msg}");
}

#[test]
fn cut_keeps_short_text_and_counts_the_bytes_of_long_text() {
    use crate::error::{cut, cut_message};
    assert_eq!(cut("short", 80), "short");
    assert_eq!(cut("héllo wörld", 5), "héllo... (13 bytes)");
    let msg = format!("first\n{}\nthird", "y".repeat(500));
    assert_eq!(cut_message(&msg, 10, 2), format!("first\nyyyyyyyyyy... (500 bytes)\n... (1 more lines)"));
}

#[test]
fn a_single_underscore_config_variable_suggests_the_double_underscore() {
    for (var, key, want) in [
        ("DDPTRAIN_TRAIN_EPOCHS", "train.epochs", "DDPTRAIN_TRAIN__EPOCHS"),
        ("DDPTRAIN_DATA_BATCH_SIZE", "data.batch_size", "DDPTRAIN_DATA__BATCH_SIZE"),
        ("ddptrain_x", "", ""),
    ] {
        let r = load_text(MINIMAL, &[], &[(var, "1")]).0;
        if key.is_empty() {
            assert!(r.is_ok(), "{var} is not ours: {:?}", r.err());
            continue;
        }
        let (file, got, msg) = config_err(r);
        assert_eq!(file, format!("environment variable {var}"));
        assert_eq!(got, key);
        assert!(msg.contains("names no config key"), "{msg}");
        assert!(msg.contains(&format!("did you mean `{want}`?")), "{msg}");
    }
}

#[test]
fn unknown_sections_and_keys_from_the_environment_are_errors() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &[], &[("DDPTRAIN_TRIAN__EPOCHS", "1")]).0);
    assert_eq!((file.as_str(), key.as_str()), ("environment variable DDPTRAIN_TRIAN__EPOCHS", "trian"));
    assert!(msg.contains("unknown key") && msg.contains("did you mean `train`?"), "{msg}");
    // The repo's own variables, and others that start with no section name, stay allowed.
    let ours =
        ["JOB_TOKEN", "TB_PYTHON", "BIN", "REPO", "MNIST", "INJECT_GRAD_INF", "TORCH_PYTHON", "CUDA_INCLUDE"];
    let mut vars: Vec<(String, &str)> = ours.iter().map(|v| (format!("DDPTRAIN_{v}"), "1")).collect();
    vars.extend(
        ["BUNDLE", "CUDA_LIBS", "TEST_HAND_OFF", "RANK", "UNUSED"].map(|v| (format!("DDPTRAIN_{v}"), "1")),
    );
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert!(load_text(MINIMAL, &[], &vars).0.is_ok());
}

#[test]
fn sections_list_every_table_of_the_config() {
    let c = load_text(MINIMAL, &[], &[]).0.unwrap();
    let v = serde_json::to_value(&c).unwrap();
    let mut got: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = super::schema::SECTIONS.to_vec();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
}
