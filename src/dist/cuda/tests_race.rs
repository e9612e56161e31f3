//! The emulated device's stream-order race checker against the reducer's
//! hand-off event: with the event, a bucket's all-reduce on the communication
//! stream is ordered after the kernels that wrote its gradients on the
//! compute stream; without it (the test-only `omit_hand_off`), the checker
//! must report the race. A race is a sticky error of the shared primary
//! context, so the racy step runs in a child process (this test binary,
//! running the ignored `child` test), never beside the other tests.

use super::{scale, DeviceComm, DeviceReducer};
use crate::dist::reducer::ReducerOptions;
use crate::dist::LocalCommunicator;
use crate::nn::cuda::params::{DevBuf, DeviceParams};
use crate::nn::Model;
use std::process::Command;
use std::sync::Arc;

/// Set in the child's environment: "keep" or "omit" the hand-off event.
const MODE: &str = "DDPTRAIN_TEST_HAND_OFF";

#[test]
#[ignore = "run in its own process by the_missing_hand_off_event_is_a_race_the_checker_reports"]
fn child() {
    let Ok(mode) = std::env::var(MODE) else { return };
    let gpu = crate::cuda::test_gpu("tests_race::child").expect("a CUDA device");
    let cfg = crate::config::load(&crate::testing::repo_root().join("configs/mnist_o0.toml"), &[]).unwrap();
    let model = Model::new(&cfg.resolve_model().unwrap(), 1).unwrap();
    // A predivide factor makes the all-reduce start with a scaling kernel on
    // the communication stream; small caps give several buckets.
    let o = ReducerOptions {
        first_bucket_mb: 0.01,
        bucket_cap_mb: 0.02,
        gradient_predivide_factor: 2.0,
        allreduce_fp32: false,
    };
    let (first, cap) = super::bucket_bytes(&o);
    let mut params = DeviceParams::new(&gpu, &model, first, cap).unwrap();
    let mut r = DeviceReducer::new(&gpu, DeviceComm::Tcp(Arc::new(LocalCommunicator)), &params, &o).unwrap();
    gpu.synchronize().unwrap();
    r.omit_hand_off = mode == "omit";
    // Backward's gradient kernels: writes on the compute stream the host does
    // not wait for, then the buckets they complete go to the reducer.
    for b in &mut params.buckets {
        let n = b.layout.numel;
        match &mut b.grads {
            DevBuf::F32(g) => scale::fill(&gpu, gpu.stream(), &mut g.slice_mut(0..n), 0.5).unwrap(),
            DevBuf::F16(g) => scale::fill(&gpu, gpu.stream(), &mut g.slice_mut(0..n), 0.5).unwrap(),
        }
    }
    let all: Vec<usize> = (0..params.slots.len()).collect();
    r.mark_ready(&gpu, &mut params, &all).unwrap();
    r.finish(&gpu, &mut params).unwrap();
    gpu.synchronize().unwrap();
    println!("races: {:?}", crate::cuda::emu::counter("races"));
}

fn run_child(mode: &str) -> (bool, String) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "dist::cuda::tests_race::child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(MODE, mode)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn the_missing_hand_off_event_is_a_race_the_checker_reports() {
    let Some(_gpu) = crate::cuda::test_gpu("the_missing_hand_off_event_is_a_race_the_checker_reports") else {
        return;
    };
    let (ok, text) = run_child("keep");
    assert!(ok, "with the hand-off event:\n{text}");
    let emulated = crate::cuda::emu::counter("races").is_some();
    if !emulated {
        // A real GPU has no race checker: without the event the step would just race.
        return;
    }
    assert!(text.contains("races: Some(0)"), "with the hand-off event:\n{text}");
    assert!(!text.contains("cuemu: error"), "with the hand-off event:\n{text}");
    let (ok, text) = run_child("omit");
    assert!(!ok, "without the hand-off event the step must fail:\n{text}");
    assert!(text.contains("stream-order race"), "without the hand-off event:\n{text}");
}
