//! Writes that can meet a full disk. A failed write removes what it left
//! half-written, so the disk is no fuller than before it, and its error
//! names the file, the bytes it needed and the bytes the filesystem has
//! free, which is what a user needs to make room.
//!
//! A full disk cannot be made on demand in a test (a small tmpfs needs
//! root), so the one test hook below stands in for one.

use crate::error::Error;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Test-only fault injection: `NAME:N` makes this process's N-th write of a
/// file named NAME (1-based; a `write_atomic` counts its destination's
/// name) fail with ENOSPC after writing half its bytes, as a disk that
/// fills up midway does. Read here and nowhere else; tests/disk_full.rs
/// sets it.
pub const FAULT_ENV: &str = "DDPTRAIN_TEST_FAULT_ENOSPC";

struct Fault {
    name: String,
    nth: u64,
    seen: AtomicU64,
}

fn fault() -> Option<&'static Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    FAULT
        .get_or_init(|| {
            let v = std::env::var(FAULT_ENV).ok()?;
            let (name, nth) = v.rsplit_once(':')?;
            Some(Fault { name: name.to_string(), nth: nth.parse().ok()?, seen: AtomicU64::new(0) })
        })
        .as_ref()
}

/// Whether the test hook fails this write of `name`.
fn injected(name: &str) -> bool {
    fault()
        .is_some_and(|f| f.name == name && f.seen.fetch_add(1, Ordering::SeqCst).saturating_add(1) == f.nth)
}

/// Writes `data` to `path` (created or truncated), fsynced when `sync`.
/// `name` is the file the hook counts. On failure the partial file is removed.
pub(super) fn put(path: &Path, name: &str, data: &[u8], sync: bool) -> std::io::Result<()> {
    let result = (|| {
        let mut f = std::fs::File::create(path)?;
        if injected(name) {
            f.write_all(&data[..data.len() / 2])?;
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        f.write_all(data)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// The bytes an unprivileged process may still write on the filesystem
/// holding `path` (its nearest existing folder), when the OS says.
pub(super) fn free_bytes(path: &Path) -> Option<u64> {
    let at = path.ancestors().find(|a| a.exists() && !a.as_os_str().is_empty()).unwrap_or(Path::new("."));
    statvfs_free(at)
}

#[cfg(unix)]
// The statvfs field types differ between platforms; on some they are u64 already.
#[allow(clippy::useless_conversion)]
fn statvfs_free(at: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(at.as_os_str().as_bytes()).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `s` room for one statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `s`.
    let s = unsafe { s.assume_init() };
    u64::try_from(s.f_bavail).ok()?.checked_mul(u64::try_from(s.f_frsize).ok()?)
}

#[cfg(not(unix))]
fn statvfs_free(_at: &Path) -> Option<u64> {
    None
}

/// "WHAT needs N bytes and the filesystem of DIR has M bytes free" (the
/// free part only where the OS says).
pub(super) fn needs(what: &str, needed: u64, dir: &Path) -> String {
    match free_bytes(dir) {
        Some(free) => format!(
            "{what} needs {needed} bytes and the filesystem of {} has {free} bytes free",
            dir.display()
        ),
        None => format!("{what} needs {needed} bytes"),
    }
}

/// The error of a file write that failed: what was asked, what is left.
pub(super) fn write_failed(path: &Path, needed: u64, e: &std::io::Error) -> Error {
    Error::Write {
        path: path.to_path_buf(),
        msg: format!(
            "{e}: {}; nothing of it was left behind (an earlier {} is unchanged). Free space there, or set \
             run.out_dir to a disk with room",
            needs("it", needed, path.parent().unwrap_or(path)),
            path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_names_the_path_and_the_bytes_needed_and_free() {
        let dir = tempfile::tempdir().unwrap();
        // A file in a folder that does not exist: the write fails before any byte, and is reported as any.
        let path = dir.path().join("missing/file");
        let e = put(&path, "file", b"abc", true).unwrap_err();
        let msg = write_failed(&path, 3, &e).to_string();
        assert!(msg.starts_with(&format!("cannot write {}: ", path.display())), "{msg}");
        assert!(
            msg.contains(&format!(
                "it needs 3 bytes and the filesystem of {} has ",
                dir.path().join("missing").display()
            )),
            "{msg}"
        );
        assert!(msg.contains(" bytes free; nothing of it was left behind"), "{msg}");
        put(&dir.path().join("ok"), "ok", b"abc", false).unwrap();
        assert_eq!(std::fs::read(dir.path().join("ok")).unwrap(), b"abc");
        assert!(free_bytes(&dir.path().join("not/yet")).is_some_and(|f| f > 0));
    }
}
