//! Helpers shared by the library's unit tests.

use std::path::PathBuf;

/// The repository root the tests read `configs/` and `data/` from:
/// `DDPTRAIN_REPO` when set (the test binary copied to a GPU machine by
/// scripts/gpu-bundle.sh, where the build folder does not exist), else the
/// folder the crate was built in.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("DDPTRAIN_REPO") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}
