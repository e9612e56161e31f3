//! The dynamic scaler: growth, backoff and skip (inf and NaN), min-scale
//! error, max cap, static-scale errors, and the fused unscale pass.

use super::*;
use crate::tensor::{DType, Tensor};

fn cfg(init: f32, interval: u64) -> ScalerConfig {
    ScalerConfig { init_scale: init, growth_interval: interval, ..ScalerConfig::default() }
}

fn clean() -> Overflow {
    Overflow::default()
}

fn bad(names: &[&str]) -> Overflow {
    Overflow { params: names.iter().map(|s| s.to_string()).collect() }
}

#[test]
fn scale_grows_after_the_interval_of_clean_steps() {
    let mut s = LossScaler::dynamic(cfg(1024.0, 3));
    for step in 1..=2 {
        assert!(!s.update(&clean(), step).unwrap());
        assert_eq!(s.scale(), 1024.0);
    }
    assert!(!s.update(&clean(), 3).unwrap());
    assert_eq!(s.scale(), 2048.0);
    assert_eq!(s.state().growth_tracker, 0);
    // An overflow resets the count of clean steps.
    s.update(&clean(), 4).unwrap();
    assert!(s.update(&bad(&["fc.weight"]), 5).unwrap());
    assert_eq!(s.scale(), 1024.0);
    for step in 6..=7 {
        s.update(&clean(), step).unwrap();
    }
    assert_eq!(s.scale(), 1024.0);
    s.update(&clean(), 8).unwrap();
    assert_eq!(s.scale(), 2048.0);
    assert_eq!(s.state().overflow_steps, 1);
}

#[test]
fn injected_inf_and_nan_are_both_detected_backed_off_and_skipped() {
    for poison in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let mut s = LossScaler::dynamic(ScalerConfig::default());
        let w = Tensor::from_vec(&[3], vec![1.0, poison, 2.0]).unwrap();
        let b = Tensor::from_vec(&[1], vec![4.0]).unwrap();
        let mut out = Vec::new();
        let o = s.unscale(&[("layer1.0.weight", &w), ("layer1.0.bias", &b)], &mut out);
        assert_eq!(o.params, vec!["layer1.0.weight".to_string()], "{poison}");
        assert!(s.update(&o, 1).unwrap(), "{poison}: the step must be skipped");
        assert_eq!(s.scale(), 32768.0);
        assert_eq!(s.state().overflow_steps, 1);
    }
}

#[test]
fn unscale_is_one_pass_over_f32_and_f16_grads_and_names_overflow_last_layer_first() {
    let s = LossScaler::dynamic(cfg(1024.0, 10));
    let a = Tensor::from_vec(&[2], vec![1024.0, -2048.0]).unwrap();
    let h = Tensor::from_f32_as(&[2], vec![512.0, 1e-3], DType::F16).unwrap();
    let mut out = vec![vec![9.0; 7]];
    let o = s.unscale(&[("a", &a), ("h", &h)], &mut out);
    assert!(!o.found());
    assert_eq!(out[0], vec![1.0, -2.0]);
    assert_eq!(out[1], vec![0.5, half::f16::from_f32(1e-3).to_f32() / 1024.0]);
    // f16 grads that overflowed during backward arrive as inf.
    let hi = Tensor::from_f32_as(&[1], vec![1e6], DType::F16).unwrap();
    let o = s.unscale(&[("layer1.0.weight", &hi), ("x", &a), ("fc.weight", &hi)], &mut out);
    assert_eq!(o.params, vec!["fc.weight".to_string(), "layer1.0.weight".to_string()]);
    assert_eq!(o.describe(1), "fc.weight and 1 more");
}

#[test]
fn falling_below_min_scale_is_an_error_naming_the_step_and_params() {
    let mut s =
        LossScaler::dynamic(ScalerConfig { init_scale: 4.0, min_loss_scale: 1.0, ..ScalerConfig::default() });
    assert!(s.update(&bad(&["fc.weight"]), 1).unwrap());
    assert!(s.update(&bad(&["fc.weight"]), 2).unwrap());
    assert_eq!(s.scale(), 1.0);
    let before = s.state();
    let e = s.update(&bad(&["fc.weight", "fc.bias"]), 3).unwrap_err().to_string();
    assert!(e.contains("step 3") && e.contains("fc.weight, fc.bias"), "{e}");
    assert!(e.contains("minimum loss scale 1 (amp.min_loss_scale)"), "{e}");
    assert_eq!(s.state(), before, "the scale never decays below the minimum");
}

#[test]
fn growth_is_capped_at_max_scale() {
    let mut s = LossScaler::dynamic(ScalerConfig {
        init_scale: 3.0e6,
        growth_interval: 1,
        max_loss_scale: 16_777_216.0,
        ..ScalerConfig::default()
    });
    let mut seen = Vec::new();
    for step in 1..=5 {
        s.update(&clean(), step).unwrap();
        seen.push(s.scale());
    }
    assert_eq!(seen, vec![6.0e6, 1.2e7, 16_777_216.0, 16_777_216.0, 16_777_216.0]);
}

#[test]
fn a_static_scale_never_moves_and_overflow_under_it_is_an_error() {
    let mut s = LossScaler::fixed(128.0);
    assert!(!s.is_dynamic());
    for step in 1..=5000 {
        s.update(&clean(), step).unwrap();
    }
    assert_eq!(s.scale(), 128.0);
    let e = s.update(&bad(&["layer2.0.weight"]), 5001).unwrap_err().to_string();
    assert!(
        e.contains("step 5001") && e.contains("layer2.0.weight") && e.contains("static loss scale 128"),
        "{e}"
    );
}

#[test]
fn state_round_trips_for_checkpoints() {
    let mut s = LossScaler::dynamic(cfg(1024.0, 2));
    s.update(&bad(&["a"]), 1).unwrap();
    s.update(&clean(), 2).unwrap();
    let st = s.state();
    let json = serde_json::to_string(&st).unwrap();
    let mut t = LossScaler::dynamic(cfg(1024.0, 2));
    t.load_state(serde_json::from_str(&json).unwrap());
    assert_eq!(t, s);
}

#[test]
fn restore_accepts_reachable_states_and_says_why_it_refuses_others() {
    let cfg = ScalerConfig {
        growth_interval: 4,
        min_loss_scale: 2.0,
        max_loss_scale: 1024.0,
        ..Default::default()
    };
    let mut s = LossScaler::dynamic(ScalerConfig { init_scale: 512.0, ..cfg });
    let good = ScalerState { scale: 32.0, growth_tracker: 3, overflow_steps: 7 };
    s.restore(good).unwrap();
    assert_eq!(s.state(), good);
    let bad_scale = ScalerState { scale: 4096.0, ..good };
    let err = s.restore(bad_scale).unwrap_err();
    assert!(err.contains("loss scale 4096 lies outside") && err.contains("[2, 1024]"), "{err}");
    let err = s.restore(ScalerState { growth_tracker: 4, ..good }).unwrap_err();
    assert!(err.contains("counted 4 clean steps") && err.contains("amp.growth_interval is 4"), "{err}");
    assert_eq!(s.state(), good, "a refused state changes nothing");
    let err = LossScaler::fixed(128.0).restore(good).unwrap_err();
    assert!(err.contains("this run's loss scale is static (128)"), "{err}");
}
