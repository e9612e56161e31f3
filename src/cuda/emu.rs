//! The emulated CUDA device's counters (tests/cuda_emu): how many host
//! synchronizations, launches and copies the process has made. They are C
//! functions exported by the emulated libcuda, so on a real driver the lookup
//! fails and callers skip their counter assertions (never the test).

use std::ffi::{c_char, CStr};

/// Counter `name` ("host_syncs", "launches", "bytes_htod", "bytes_dtoh",
/// "bytes_dtod", "allocations", "frees", "races", "errors", and the checks
/// performed: "bounds_checks", "init_checks", "shared_checks",
/// "host_guards"), or `None` when libcuda is not the emulator.
pub fn counter(name: &str) -> Option<i64> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: looks a symbol up in the loaded driver library and calls it
    // with its C signature and a NUL-terminated string.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return None;
        }
        let f = cudarc::driver::sys::culib()
            .get::<unsafe extern "C" fn(*const c_char) -> i64>(b"cuemuGetCounter\0")
            .ok()?;
        Some(f(name.as_ptr()))
    }
}

/// Every counter, as named in [`counter`], or `None` off the emulator.
pub fn counters() -> Option<Vec<(&'static str, i64)>> {
    const NAMES: [&str; 13] = [
        "host_syncs",
        "launches",
        "bytes_htod",
        "bytes_dtoh",
        "bytes_dtod",
        "allocations",
        "frees",
        "races",
        "errors",
        "bounds_checks",
        "init_checks",
        "shared_checks",
        "host_guards",
    ];
    NAMES.iter().map(|&n| counter(n).map(|v| (n, v))).collect()
}

/// The emulator's first error message since start, if any.
pub fn last_error() -> Option<String> {
    // SAFETY: as in `counter`; the emulator returns a static string or null.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return None;
        }
        let f = cudarc::driver::sys::culib()
            .get::<unsafe extern "C" fn() -> *const c_char>(b"cuemuLastErrorMessage\0")
            .ok()?;
        let p = f();
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}
