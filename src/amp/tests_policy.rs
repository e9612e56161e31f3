//! The opt-level table (every property of every level), each override, and
//! the config errors for overrides that make no sense.

use super::*;
use crate::config::{AmpConfig, LossScale, OptLevel};
use crate::error::Error;
use crate::tensor::DType;

type Row = (OptLevel, Option<DType>, bool, Option<bool>, Option<bool>, LossScale);

/// apex/amp/frontend.py: O0..O3 (cast_model_type, patch_torch_functions,
/// keep_batchnorm_fp32, master_weights, loss_scale).
const TABLE: [Row; 4] = [
    (OptLevel::O0, Some(DType::F32), false, None, Some(false), LossScale::Static(1.0)),
    (OptLevel::O1, None, true, None, None, LossScale::Dynamic),
    (OptLevel::O2, Some(DType::F16), false, Some(true), Some(true), LossScale::Dynamic),
    (OptLevel::O3, Some(DType::F16), false, Some(false), Some(false), LossScale::Static(1.0)),
];

fn amp(level: OptLevel) -> AmpConfig {
    AmpConfig { opt_level: level, ..Default::default() }
}

#[test]
fn every_property_of_every_level_matches_apex() {
    for (level, cast, patch, keep_bn, master, scale) in TABLE {
        let p = Policy::resolve(&amp(level)).unwrap();
        assert_eq!(p, Policy::for_level(level));
        assert_eq!(
            (
                p.opt_level,
                p.cast_model_type,
                p.patch_torch_functions,
                p.keep_batchnorm_fp32,
                p.master_weights,
                p.loss_scale
            ),
            (level, cast, patch, keep_bn, master, scale),
            "{level}"
        );
    }
}

#[test]
fn derived_dtypes_follow_the_table() {
    // (level, conv/linear param dtype, batchnorm param dtype, input dtype, masters)
    let expect = [
        (OptLevel::O0, DType::F32, DType::F32, DType::F32, false),
        (OptLevel::O1, DType::F32, DType::F32, DType::F32, false),
        (OptLevel::O2, DType::F16, DType::F32, DType::F16, true),
        (OptLevel::O3, DType::F16, DType::F16, DType::F16, false),
    ];
    for (level, w, bn, input, masters) in expect {
        let p = Policy::for_level(level);
        assert_eq!(
            (p.param_dtype(false), p.param_dtype(true), p.input_dtype(), p.uses_master_weights()),
            (w, bn, input, masters),
            "{level}"
        );
    }
}

#[test]
fn valid_overrides_replace_the_table_value() {
    let o2_no_bn =
        Policy::resolve(&AmpConfig { keep_batchnorm_fp32: Some(false), ..amp(OptLevel::O2) }).unwrap();
    assert_eq!(o2_no_bn.keep_batchnorm_fp32, Some(false));
    assert_eq!(o2_no_bn.param_dtype(true), DType::F16);
    let o3_bn = Policy::resolve(&AmpConfig { keep_batchnorm_fp32: Some(true), ..amp(OptLevel::O3) }).unwrap();
    assert_eq!((o3_bn.keep_batchnorm_fp32, o3_bn.param_dtype(true)), (Some(true), DType::F32));
    let o2_no_master =
        Policy::resolve(&AmpConfig { master_weights: Some(false), ..amp(OptLevel::O2) }).unwrap();
    assert!(!o2_no_master.uses_master_weights());
    let o3_master = Policy::resolve(&AmpConfig { master_weights: Some(true), ..amp(OptLevel::O3) }).unwrap();
    assert!(o3_master.uses_master_weights());
    let o0_false = Policy::resolve(&AmpConfig { master_weights: Some(false), ..amp(OptLevel::O0) }).unwrap();
    assert_eq!(o0_false, Policy::for_level(OptLevel::O0));
    for level in [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3] {
        let fixed =
            Policy::resolve(&AmpConfig { loss_scale: Some(LossScale::Static(128.0)), ..amp(level) }).unwrap();
        assert_eq!(fixed.loss_scale, LossScale::Static(128.0));
        let dynamic =
            Policy::resolve(&AmpConfig { loss_scale: Some(LossScale::Dynamic), ..amp(level) }).unwrap();
        assert_eq!(dynamic.loss_scale, LossScale::Dynamic);
    }
}

fn key_and_msg(e: Error) -> (String, String) {
    match e {
        Error::Config { key, msg, .. } => (key, msg),
        other => panic!("expected a config error, got {other}"),
    }
}

#[test]
fn overrides_that_make_no_sense_name_the_key() {
    let cases: [(AmpConfig, &str, &str); 5] = [
        (
            AmpConfig { master_weights: Some(true), ..amp(OptLevel::O0) },
            "amp.master_weights",
            "makes no sense with O0",
        ),
        (
            AmpConfig { master_weights: Some(false), ..amp(OptLevel::O1) },
            "amp.master_weights",
            "makes no sense with O1",
        ),
        (
            AmpConfig { keep_batchnorm_fp32: Some(true), ..amp(OptLevel::O0) },
            "amp.keep_batchnorm_fp32",
            "with O0",
        ),
        (
            AmpConfig { keep_batchnorm_fp32: Some(true), ..amp(OptLevel::O1) },
            "amp.keep_batchnorm_fp32",
            "BatchNorm already runs in fp32",
        ),
        (
            AmpConfig { growth_interval: Some(10), ..amp(OptLevel::O3) },
            "amp.growth_interval",
            "only applies to the dynamic loss scaler",
        ),
    ];
    for (cfg, key, frag) in cases {
        let e = Policy::resolve(&cfg).and_then(|_| ScalerConfig::resolve(&cfg)).unwrap_err();
        let (k, m) = key_and_msg(e);
        assert_eq!(k, key);
        assert!(m.contains(frag), "{key}: {m}");
    }
}

#[test]
fn scaler_keys_default_to_torch_and_are_range_checked() {
    let d = ScalerConfig::resolve(&amp(OptLevel::O2)).unwrap();
    assert_eq!(d, ScalerConfig::default());
    assert_eq!(
        (
            d.init_scale,
            d.growth_factor,
            d.backoff_factor,
            d.growth_interval,
            d.min_loss_scale,
            d.max_loss_scale
        ),
        (65536.0, 2.0, 0.5, 2000, 1.0, 16_777_216.0)
    );
    let set = ScalerConfig::resolve(&AmpConfig {
        init_scale: Some(1024.0),
        growth_factor: Some(4.0),
        backoff_factor: Some(0.25),
        growth_interval: Some(7),
        min_loss_scale: Some(2.0),
        max_loss_scale: Some(4096.0),
        ..amp(OptLevel::O1)
    })
    .unwrap();
    assert_eq!(
        (set.init_scale, set.growth_factor, set.backoff_factor, set.growth_interval),
        (1024.0, 4.0, 0.25, 7)
    );
    assert_eq!((set.min_loss_scale, set.max_loss_scale), (2.0, 4096.0));
    let bad: [(AmpConfig, &str, &str); 6] = [
        (AmpConfig { init_scale: Some(1e9), ..amp(OptLevel::O2) }, "amp.init_scale", "[1, 16777216]"),
        (AmpConfig { growth_factor: Some(1.0), ..amp(OptLevel::O2) }, "amp.growth_factor", "> 1"),
        (AmpConfig { backoff_factor: Some(1.0), ..amp(OptLevel::O2) }, "amp.backoff_factor", "(0, 1)"),
        (AmpConfig { growth_interval: Some(0), ..amp(OptLevel::O2) }, "amp.growth_interval", "at least 1"),
        (AmpConfig { min_loss_scale: Some(0.0), ..amp(OptLevel::O2) }, "amp.min_loss_scale", "positive"),
        (
            AmpConfig { max_loss_scale: Some(0.5), ..amp(OptLevel::O2) },
            "amp.max_loss_scale",
            ">= min_loss_scale",
        ),
    ];
    for (cfg, key, frag) in bad {
        let (k, m) = key_and_msg(ScalerConfig::resolve(&cfg).unwrap_err());
        assert_eq!(k, key);
        assert!(m.contains(frag), "{key}: {m}");
    }
}

#[test]
fn config_validation_rejects_a_nonsense_override_naming_file_and_key() {
    let path = crate::testing::repo_root().join("configs/mnist_o0.toml");
    let e = crate::config::load(&path, &["amp.master_weights=true".to_string()]).unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("amp.master_weights") && shown.contains("makes no sense with O0"), "{shown}");
    let sets = ["amp.opt_level=\"O2\"".to_string(), "amp.growth_interval=100".to_string()];
    let c = crate::config::load(&path, &sets).unwrap();
    assert_eq!(LossScaler::from_config(&c.amp).unwrap().scale(), 65536.0);
}
