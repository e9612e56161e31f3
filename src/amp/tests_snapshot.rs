//! The one-step-late loss scaler read waits for its copy. The emulated
//! device's CUEMU_STREAM_LAG_US holds every stream operation back, so a read
//! that does not wait for the copy's event sees the pinned buffer before the
//! copy lands. The lag is read when libcuda starts, so the check runs in a
//! child process (this test binary, running the ignored `child`).

use super::{DeviceScaler, ScalerSnapshot};
use std::process::Command;

const CHILD: &str = "DDPTRAIN_TEST_SNAPSHOT_CHILD";

#[test]
#[ignore = "run in its own process by the_scaler_snapshot_read_waits_for_its_copy"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let gpu = crate::cuda::test_gpu("tests_snapshot::child").expect("a CUDA device");
    let mut snap = ScalerSnapshot::new(&gpu).unwrap();
    for (step, scale) in [(1u64, 1234.5f32), (2, 0.25), (3, 65536.0)] {
        let scaler = DeviceScaler::fixed(&gpu, scale).unwrap();
        scaler.snapshot(&gpu, snap.at_step(step)).unwrap();
        let v = snap.read().unwrap();
        assert_eq!((v.step, v.state.scale), (step, scale));
    }
    println!("snapshots read after their copies");
}

#[test]
fn the_scaler_snapshot_read_waits_for_its_copy() {
    if crate::cuda::test_gpu("the_scaler_snapshot_read_waits_for_its_copy").is_none() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "amp::cuda::tests_snapshot::child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .env("CUEMU_STREAM_LAG_US", "50000")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("snapshots read after their copies"), "{text}");
}
