//! Loading: layering, override parsing, defaults and error attribution.

use std::path::PathBuf;

use super::*;
use crate::error::Error;
use crate::nn::layers::LayerSpec;

pub(crate) const MINIMAL: &str = r#"
[model]
input_shape = [1, 4, 4]
layers = [{ type = "flatten" }, { type = "linear", out_features = 10 }]

[data]
batch_size = 8

[optimizer]
lr = 0.1

[train]
max_steps = 10
"#;

pub(crate) fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub(crate) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub(crate) fn sets(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// Loads `text` written to `<tmp>/exp.toml`; returns the result and the path.
pub(crate) fn load_text(text: &str, set: &[&str], vars: &[(&str, &str)]) -> (crate::Result<Config>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "exp.toml", text);
    let r = load_with_env(&path, &sets(set), &env(vars));
    (r, path)
}

/// The (file, key, msg) of a config error; panics on success or another error.
pub(crate) fn config_err(r: crate::Result<Config>) -> (String, String, String) {
    match r {
        Err(Error::Config { file, key, msg }) => (file, key, msg),
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("expected a config error, got a config"),
    }
}

pub(crate) fn mnist_path() -> PathBuf {
    crate::testing::repo_root().join("configs/mnist_o0.toml")
}

#[test]
fn defaults_are_pytorch_defaults() {
    let (r, path) = load_text(MINIMAL, &[], &[]);
    let c = r.unwrap();
    assert_eq!(c.config_path, path);
    assert_eq!(c.run.name, "exp");
    assert_eq!(c.run.out_dir, PathBuf::from("runs/exp"));
    assert_eq!((c.run.seed, c.run.device), (0, Device::Auto));
    assert_eq!(c.data.dataset, DatasetKind::Mnist);
    assert_eq!(c.data.path, PathBuf::from("data/mnist"));
    assert_eq!(c.data.eval_batch_size, 8);
    assert!(c.data.shuffle && !c.data.drop_last);
    assert_eq!((c.data.mean.clone(), c.data.std.clone()), (vec![0.1307], vec![0.3081]));
    assert_eq!((c.data.prefetch, c.data.num_classes), (4, 10));
    assert_eq!((c.data.synthetic_train_size, c.data.synthetic_test_size), (8000, 2000));
    let o = &c.optimizer;
    assert_eq!(o.name, OptimizerName::Sgd);
    assert_eq!((o.momentum, o.dampening, o.nesterov, o.weight_decay), (0.0, 0.0, false, 0.0));
    assert_eq!((o.betas, o.eps), ([0.9, 0.999], 1e-8));
    let s = &c.scheduler;
    assert_eq!(
        (s.name, s.warmup_steps, s.step_size, s.gamma, s.eta_min),
        (SchedulerName::Constant, 0, None, 0.1, 0.0)
    );
    assert_eq!((c.train.epochs, c.train.max_steps, c.train.grad_clip_norm), (None, Some(10), None));
    assert_eq!(c.train.grad_accum_steps, 1);
    assert_eq!(c.amp.opt_level, OptLevel::O0);
    let p = &c.parallel;
    assert_eq!(
        (p.backend, p.master_addr.clone(), p.master_port, p.timeout_s),
        (Backend::Auto, None, None, 300)
    );
    assert_eq!((p.bucket_cap_mb, p.first_bucket_mb, p.gradient_predivide_factor), (25.0, 1.0, 1.0));
    assert!(!p.sync_batchnorm && p.broadcast_buffers && !p.allreduce_fp32);
    let k = &c.checkpoint;
    assert_eq!((k.every_steps, k.every_epochs, k.keep_last, k.resume.clone()), (0, 0, 3, Resume::Auto));
    assert_eq!(k.every_minutes, 10.0);
    assert_eq!(
        (c.logging.every_steps, c.logging.progress, c.logging.tensorboard),
        (50, ProgressSetting::Auto, true)
    );
    assert_eq!(c.expect, Expect::default());
}

#[test]
fn adamw_defaults_weight_decay_to_001_and_explicit_values_win() {
    let c = load_text(MINIMAL, &["optimizer.name=adamw"], &[]).0.unwrap();
    assert_eq!(c.optimizer.weight_decay, 0.01);
    let c = load_text(MINIMAL, &["optimizer.name=adam"], &[]).0.unwrap();
    assert_eq!(c.optimizer.weight_decay, 0.0);
    let c = load_text(MINIMAL, &["optimizer.name=adamw", "optimizer.weight_decay=0.2"], &[]).0.unwrap();
    assert_eq!(c.optimizer.weight_decay, 0.2);
}

#[test]
fn derived_defaults_follow_overrides() {
    let c = load_text(MINIMAL, &["run.name=abc", "data.batch_size=32"], &[]).0.unwrap();
    assert_eq!(c.run.out_dir, PathBuf::from("runs/abc"));
    assert_eq!(c.data.eval_batch_size, 32);
    let c = load_text(MINIMAL, &["data.eval_batch_size=500"], &[]).0.unwrap();
    assert_eq!((c.data.batch_size, c.data.eval_batch_size), (8, 500));
}

#[test]
fn env_overrides_file_and_set_overrides_env() {
    let vars = [("DDPTRAIN_TRAIN__MAX_STEPS", "3"), ("DDPTRAIN_DATA__BATCH_SIZE", "16")];
    let c = load_text(MINIMAL, &[], &vars).0.unwrap();
    assert_eq!((c.train.max_steps, c.data.batch_size), (Some(3), 16));
    let c = load_text(MINIMAL, &["train.max_steps=7"], &vars).0.unwrap();
    assert_eq!((c.train.max_steps, c.data.batch_size), (Some(7), 16));
    // Later --set wins over earlier --set.
    let c = load_text(MINIMAL, &["train.max_steps=7", "train.max_steps=9"], &vars).0.unwrap();
    assert_eq!(c.train.max_steps, Some(9));
}

#[test]
fn env_keys_are_lowercased_and_split_on_double_underscore() {
    let vars = [("DDPTRAIN_PARALLEL__SYNC_BATCHNORM", "true"), ("DDPTRAIN_RUN__OUT_DIR", "/tmp/out")];
    let c = load_text(MINIMAL, &[], &vars).0.unwrap();
    assert!(c.parallel.sync_batchnorm);
    assert_eq!(c.run.out_dir, PathBuf::from("/tmp/out"));
}

#[test]
fn non_config_ddptrain_variables_are_ignored() {
    let vars = [("DDPTRAIN_JOB_TOKEN", "secret"), ("DDPTRAIN_RANK", "1"), ("TRAIN__EPOCHS", "x")];
    let c = load_text(MINIMAL, &[], &vars).0.unwrap();
    assert_eq!(c.train.max_steps, Some(10));
}

#[test]
fn set_values_parse_as_toml_else_plain_string() {
    let set = [
        "run.out_dir=runs/x",
        "train.epochs=1",
        "run.name=\"quoted\"",
        "data.mean=[0.5]",
        "data.shuffle=false",
        "optimizer.lr=1e-3",
        "run.device=cpu",
        "checkpoint.resume=runs/x/ckpt/step_00000100",
    ];
    let c = load_text(MINIMAL, &set, &[]).0.unwrap();
    assert_eq!(c.run.out_dir, PathBuf::from("runs/x"));
    assert_eq!(c.train.epochs, Some(1));
    assert_eq!(c.run.name, "quoted");
    assert_eq!(c.data.mean, vec![0.5]);
    assert!(!c.data.shuffle);
    assert_eq!(c.optimizer.lr, 1e-3);
    assert_eq!(c.run.device, Device::Cpu);
    assert_eq!(c.checkpoint.resume, Resume::Path(PathBuf::from("runs/x/ckpt/step_00000100")));
    // A whole layer list can be replaced from the command line.
    let c = load_text(
        MINIMAL,
        &["model.layers=[{type=\"flatten\"}, {type=\"linear\", out_features=10, bias=false}]"],
        &[],
    )
    .0
    .unwrap();
    assert!(matches!(
        c.model.layers[1],
        LayerConfig::Layer {
            spec: LayerSpec::Linear(crate::nn::layers::linear::Config { bias: false, .. }),
            ..
        }
    ));
}

#[test]
fn set_without_equals_is_an_error() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &["train.epochs"], &[]).0);
    assert_eq!((file.as_str(), key.as_str()), ("--set", "train.epochs"));
    assert!(msg.contains("key=value"), "{msg}");
}

#[test]
fn set_with_bad_key_is_an_error() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &["train..epochs=1"], &[]).0);
    assert_eq!((file.as_str(), key.as_str()), ("--set", "train..epochs"));
    assert!(msg.contains("empty key segment"), "{msg}");
    let (_, key, msg) = config_err(load_text(MINIMAL, &["model.layers[1].out_features=3"], &[]).0);
    assert_eq!(key, "model.layers[1].out_features");
    assert!(msg.contains("whole array"), "{msg}");
}

#[test]
fn unknown_key_from_env_names_the_variable_and_lists_valid_keys() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &[], &[("DDPTRAIN_TRAIN__EPOCHZ", "1")]).0);
    assert_eq!(file, "environment variable DDPTRAIN_TRAIN__EPOCHZ");
    assert_eq!(key, "train.epochz");
    assert!(msg.contains("epochs, max_steps, grad_clip_norm, grad_accum_steps"), "{msg}");
    assert!(msg.contains("did you mean `epochs`"), "{msg}");
}

#[test]
fn wrong_type_from_env_names_the_variable() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &[], &[("DDPTRAIN_DATA__BATCH_SIZE", "many")]).0);
    assert_eq!(
        (file.as_str(), key.as_str()),
        ("environment variable DDPTRAIN_DATA__BATCH_SIZE", "data.batch_size")
    );
    assert!(msg.contains("integer") && msg.contains("\"many\""), "{msg}");
}

#[test]
fn number_for_a_string_from_set_suggests_quoting() {
    let (file, key, msg) = config_err(load_text(MINIMAL, &["run.name=1"], &[]).0);
    assert_eq!((file.as_str(), key.as_str()), ("--set", "run.name"));
    assert!(msg.contains("expected a string") && msg.contains("quote"), "{msg}");
}

#[test]
fn invalid_value_from_set_names_file_and_set() {
    // Validation errors name the file and, when the value was overridden, where from.
    let (r, path) = load_text(MINIMAL, &["data.batch_size=0"], &[]);
    let (file, key, msg) = config_err(r);
    assert_eq!(file, format!("{} (value from --set)", path.display()));
    assert_eq!(key, "data.batch_size");
    assert!(msg.contains("at least 1"), "{msg}");
    let (r, path) = load_text(MINIMAL, &[], &[("DDPTRAIN_OPTIMIZER__LR", "-1")]);
    let (file, key, _) = config_err(r);
    assert_eq!(file, format!("{} (value from environment variable DDPTRAIN_OPTIMIZER__LR)", path.display()));
    assert_eq!(key, "optimizer.lr");
}

#[test]
fn unknown_key_in_file_names_file_key_and_valid_keys() {
    let text = format!("{MINIMAL}\n[logging]\nevery_step = 5\n");
    let (r, path) = load_text(&text, &[], &[]);
    let (file, key, msg) = config_err(r);
    assert_eq!(file, path.display().to_string());
    assert_eq!(key, "logging.every_step");
    assert!(msg.contains("valid keys in `logging`: every_steps, progress, tensorboard"), "{msg}");
    assert!(msg.contains("did you mean `every_steps`"), "{msg}");
}

#[test]
fn unknown_section_is_an_error() {
    let (file, key, msg) = config_err(load_text(&format!("{MINIMAL}\n[optimiser]\nlr = 1\n"), &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    assert_eq!(key, "optimiser");
    assert!(msg.contains("at the top level") && msg.contains("optimizer"), "{msg}");
}

#[test]
fn unknown_layer_key_lists_that_layer_types_keys() {
    let text = MINIMAL.replace(r#"{ type = "flatten" }"#, r#"{ type = "flatten", out_features = 3 }"#);
    let (file, key, msg) = config_err(load_text(&text, &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    assert_eq!(key, "model.layers[0].out_features");
    assert!(msg.contains("valid keys in `model.layers[0]`: type, name"), "{msg}");
}

#[test]
fn nested_layer_errors_have_the_full_key() {
    let text = MINIMAL.replace(
        r#"{ type = "flatten" }"#,
        r#"{ type = "sequential", name = "b", layers = [{ type = "relu" }, { type = "conv2d", out_channels = 2, kernel_size = "five" }] }, { type = "flatten" }"#,
    );
    let (file, key, msg) = config_err(load_text(&text, &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    assert_eq!(key, "model.layers[0].layers[1].kernel_size");
    assert!(msg.contains("integer") && msg.contains("\"five\""), "{msg}");

    let text = text.replace(r#"kernel_size = "five""#, "kernal = 3");
    let (_, key, msg) = config_err(load_text(&text, &[], &[]).0);
    assert_eq!(key, "model.layers[0].layers[1].kernal");
    assert!(msg.contains("did you mean `kernel`"), "{msg}");
}

#[test]
fn unknown_layer_type_lists_types() {
    let text = MINIMAL.replace(r#"type = "flatten""#, r#"type = "silu""#);
    let (_, key, msg) = config_err(load_text(&text, &[], &[]).0);
    assert_eq!(key, "model.layers[0].type");
    assert!(msg.contains("\"silu\"") && msg.contains("conv2d, batchnorm2d, relu, maxpool2d"), "{msg}");
    assert!(msg.contains("dropout"), "{msg}");
}

#[test]
fn missing_required_keys_are_named() {
    let cases = [
        ("lr = 0.1", "", "optimizer.lr", "missing required key"),
        ("batch_size = 8", "", "data.batch_size", "missing required key"),
        ("input_shape = [1, 4, 4]", "", "model.input_shape", "missing required key"),
        (
            r#"{ type = "linear", out_features = 10 }"#,
            r#"{ type = "linear" }"#,
            "model.layers[1].out_features",
            "missing",
        ),
        (r#"{ type = "flatten" }"#, r#"{ name = "f" }"#, "model.layers[0].type", "needs a type: conv2d,"),
    ];
    for (from, to, want_key, want_msg) in cases {
        let (file, key, msg) = config_err(load_text(&MINIMAL.replace(from, to), &[], &[]).0);
        assert!(file.ends_with("exp.toml"), "{file}");
        assert_eq!(key, want_key);
        assert!(msg.contains(want_msg), "{key}: {msg}");
    }
    let no_model = MINIMAL.replace("[model]", "[unused]").replace("input_shape = [1, 4, 4]\n", "");
    let no_model = no_model.split("[data]").nth(1).map(|s| format!("[data]{s}")).unwrap();
    let (file, key, msg) = config_err(load_text(&no_model, &[], &[]).0);
    assert!(file.ends_with("exp.toml"), "{file}");
    assert_eq!(key, "model");
    assert!(msg.contains("missing required section [model]"), "{msg}");
}

#[test]
fn wrong_types_and_enum_values_are_named() {
    let (_, key, msg) =
        config_err(load_text(&MINIMAL.replace("max_steps = 10", "max_steps = \"ten\""), &[], &[]).0);
    assert_eq!(key, "train.max_steps");
    assert!(msg.contains("expected a non-negative integer") && msg.contains("\"ten\""), "{msg}");
    // In a config author's words, not Rust's.
    assert!(!["usize", "u64", "u32", "i64"].iter().any(|t| msg.contains(t)), "{msg}");
    let (file, key, msg) = config_err(load_text(MINIMAL, &["run.device=gpu"], &[]).0);
    assert_eq!((file.as_str(), key.as_str()), ("--set", "run.device"));
    assert!(msg.contains("\"gpu\"") && msg.contains("auto, cpu, cuda"), "{msg}");
    let (file, key, msg) = config_err(load_text(MINIMAL, &["amp.loss_scale=dymanic"], &[]).0);
    assert_eq!((file.as_str(), key.as_str()), ("--set", "amp.loss_scale"));
    assert!(
        msg.contains("\"dymanic\"") && msg.contains("expected \"dynamic\" or a positive number"),
        "{msg}"
    );
    let (_, key, msg) = config_err(load_text(MINIMAL, &["amp.opt_level=O4"], &[]).0);
    assert_eq!(key, "amp.opt_level");
    assert!(msg.contains("O0, O1, O2, O3"), "{msg}");
    let (_, key, msg) = config_err(load_text(MINIMAL, &["optimizer.betas=[0.9]"], &[]).0);
    assert_eq!(key, "optimizer.betas");
    assert!(msg.contains("length 2"), "{msg}");
    let (_, key, msg) = config_err(load_text(MINIMAL, &["parallel.master_port=70000"], &[]).0);
    assert_eq!(key, "parallel.master_port");
    assert!(msg.contains("70000"), "{msg}");
}

#[test]
fn kernel_is_an_alias_of_kernel_size_but_not_both() {
    let text = MINIMAL.replace(
        r#"{ type = "flatten" }"#,
        r#"{ type = "conv2d", out_channels = 2, kernel = 3 }, { type = "maxpool2d", kernel = 2 }, { type = "flatten" }"#,
    );
    let c = load_text(&text, &[], &[]).0.unwrap();
    let conv = crate::nn::layers::conv2d::Config {
        out_channels: 2,
        kernel_size: 3,
        stride: 1,
        padding: 0,
        bias: true,
    };
    assert_eq!(
        c.model.layers[0],
        LayerConfig::Layer { name: None, spec: LayerSpec::Conv2d(conv), tie: None }
    );
    let pool = crate::nn::layers::maxpool2d::Config { kernel_size: 2, stride: 2 };
    assert_eq!(
        c.model.layers[1],
        LayerConfig::Layer { name: None, spec: LayerSpec::MaxPool2d(pool), tie: None }
    );
    let text = text.replace("kernel = 3", "kernel = 3, kernel_size = 3");
    let (_, key, msg) = config_err(load_text(&text, &[], &[]).0);
    assert_eq!(key, "model.layers[0].kernel_size");
    assert!(msg.contains("more than once"), "{msg}");
}

#[test]
fn missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.toml");
    let (file, key, msg) = config_err(load_with_env(&path, &[], &[]));
    assert_eq!((file, key.as_str()), (path.display().to_string(), "<file>"));
    assert!(msg.contains("cannot read the config file"), "{msg}");
}

#[test]
fn syntax_error_names_the_line() {
    let text = MINIMAL.replace("lr = 0.1", "lr = = 0.1");
    let (r, path) = load_text(&text, &[], &[]);
    let (file, key, msg) = config_err(r);
    assert_eq!((file, key.as_str()), (path.display().to_string(), "<syntax>"));
    let line = text.lines().position(|l| l.contains("lr = =")).unwrap() + 1;
    assert!(msg.contains(&format!("line {line}")) && msg.contains("lr = = 0.1"), "{msg}");
}

#[test]
fn toml_output_round_trips() {
    let c = load_with_env(&mnist_path(), &[], &[]).unwrap();
    let text = c.to_toml_string();
    assert!(text.contains("weight_decay = 0.0005") && text.contains("type = \"conv2d\""), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let again = load_with_env(&write(&dir, "mnist_o0.toml", &text), &[], &[]).unwrap();
    assert_eq!(Config { config_path: c.config_path.clone(), ..again.clone() }, c);
    assert_eq!(again.fingerprint(), c.fingerprint());
}

#[test]
fn fingerprint_ignores_per_rank_fields_only() {
    let fp = |set: &[&str]| load_text(MINIMAL, set, &[]).0.unwrap().fingerprint();
    let base = fp(&[]);
    assert_eq!(base.len(), 64);
    assert!(base.chars().all(|c| c.is_ascii_hexdigit()));
    let cosmetic = [
        "run.name=x",
        "run.out_dir=/o",
        "run.device=cpu",
        "logging.every_steps=1",
        "parallel.master_port=1234",
    ];
    assert_eq!(fp(&cosmetic), base);
    assert_eq!(fp(&["parallel.master_addr=10.0.0.1", "logging.progress=never"]), base);
    assert_ne!(fp(&["optimizer.lr=0.2"]), base);
    assert_ne!(fp(&["run.seed=1"]), base);
    assert_ne!(fp(&["parallel.bucket_cap_mb=1.0"]), base);
}

#[test]
fn process_environment_load_reads_the_mnist_config() {
    let c = load(&mnist_path(), &sets(&["train.epochs=1"])).unwrap();
    assert_eq!(c.run.name, "mnist_o0");
    assert_eq!(c.train.epochs, Some(1));
}
