//! What a user sees after a sticky device fault: the error of the first call
//! that reports it, and then a clean unwind. Every handle (cuBLAS, NCCL,
//! buffers, modules, streams) is dropped on a context whose every call now
//! fails, and none of their destructors may panic over the real error. The
//! fault poisons the shared primary context, so it runs in a child process
//! (this test binary, running the ignored `child`).

use super::blas::Blas;
use super::{launch_1d, KernelFn};
use std::process::Command;

static RELU_F32: KernelFn = KernelFn::new("relu.cu", "relu_forward_f32");

const CHILD: &str = "DDPTRAIN_TEST_FAULT_CHILD";

#[test]
#[ignore = "run in its own process by a_device_fault_is_reported_once_and_unwinds_without_a_panic"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let gpu = super::test_gpu("tests_fault::child").expect("a CUDA device");
    let blas = Blas::new(&gpu, false).unwrap();
    let nccl = super::nccl::is_available().then(|| {
        super::nccl::NcclComm::new(
            &gpu,
            0,
            1,
            &crate::dist::LocalCommunicator,
            std::time::Duration::from_secs(60),
        )
        .unwrap()
    });
    let s = gpu.stream();
    let x = s.alloc_zeros::<f32>(1000).unwrap();
    let f = gpu.kernel(&RELU_F32).unwrap();
    let n = 1000i64;
    // The launcher bypassed. The emulator faults inside the kernel on a write
    // past a 10-element buffer (it refuses a bad address at launch, which is
    // not a fault); a GPU may not notice that write within its page, but
    // faults on an address no allocation holds (CUDA_ERROR_ILLEGAL_ADDRESS).
    let mut short = s.alloc_zeros::<f32>(10).unwrap();
    let mut launch = f.launch_on(s);
    launch.arg(&x);
    let bad = 0x10u64;
    if super::emu::counter("errors").is_some() {
        launch.arg(&mut short);
    } else {
        launch.arg(&bad);
    }
    launch.arg(&n);
    // SAFETY: deliberately not: the fault is the point.
    let launched = unsafe { launch.launch(launch_1d(1000)) };
    let first = match launched {
        Err(e) => format!("launch: {e:?}"),
        Ok(()) => match gpu.synchronize() {
            Err(e) => e.to_string(),
            Ok(()) => panic!("an out-of-bounds write went unnoticed"),
        },
    };
    println!("first error: {first}");
    // Sticky: the context is unusable from here on, every call says so.
    let later = gpu.synchronize().err().map(|e| e.to_string());
    println!("a later call: {later:?}");
    // Every handle goes on a faulted context.
    drop((x, short, nccl, blas, gpu));
    println!("unwound");
}

#[test]
fn a_device_fault_is_reported_once_and_unwinds_without_a_panic() {
    if super::test_gpu("a_device_fault_is_reported_once_and_unwinds_without_a_panic").is_none() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cuda::tests_fault::child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("first error: ") && text.contains("unwound"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    if super::emu::counter("errors").is_some() {
        // The emulator names the faulting kernel on stderr, as compute-sanitizer would.
        assert!(text.contains("cuemu: error") && text.contains("relu_forward_f32"), "{text}");
        assert!(text.contains("a later call: Some("), "the fault must be sticky:\n{text}");
        // And every later error carries the first cause, not only its code.
        let later = text.lines().find(|l| l.starts_with("a later call: ")).unwrap_or_default();
        assert!(
            later.contains("first cause, sticky: invalid global write") && later.contains("relu_forward_f32"),
            "{text}"
        );
    }
}
