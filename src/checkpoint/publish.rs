//! The atomic directory write of a checkpoint: its files go to a temporary
//! directory, are fsynced with it, the directory is renamed into place, and
//! only then is `ckpt/latest` replaced. A save that fails midway (a full
//! disk) removes its temporary directory and link, so the disk is no fuller
//! than before and `latest` still names the previous complete checkpoint;
//! the error says what it needed and what is free.

use super::disk;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What failed inside a save: the step and its OS error.
struct Failed {
    what: String,
    err: std::io::Error,
}

fn at(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Failed {
    let what = what.into();
    move |err| Failed { what, err }
}

/// Writes `files` (name, contents) as checkpoint `name` under `root` and
/// points `latest` at it. `pause`: the test hook that sleeps before the
/// second file, so a test can kill a run mid-save.
pub(super) fn write_checkpoint(
    root: &Path,
    name: &str,
    files: &[(&str, &[u8])],
    pause: Option<Duration>,
) -> Result<PathBuf> {
    let final_dir = root.join(name);
    let tmp = root.join(format!(".tmp-{name}.{}", std::process::id()));
    let link = root.join(format!(".latest.{}", std::process::id()));
    let previous = std::fs::read_link(root.join("latest")).ok();
    let mut fresh = false;
    let result = write_all(root, &tmp, files, pause)
        .and_then(|()| publish_dir(&tmp, &final_dir, &mut fresh))
        .and_then(|()| sync_dir(root))
        .and_then(|()| point_latest(root, name, &link));
    let Err(failed) = result else { return Ok(final_dir) };

    // Nothing half-written stays: the temporary directory and link go, and
    // a checkpoint published but not made `latest` too (auto resume would
    // never read it). One that replaced the same step's stays: `latest`
    // already names it.
    let mut left = Vec::new();
    let mut remove = |p: &Path, dir: bool| {
        let r = if dir { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
        if let Err(e) = r.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
        {
            left.push(format!("{} could not be removed ({e}): remove it by hand", p.display()));
        }
    };
    remove(&tmp, true);
    remove(&link, false);
    if fresh {
        remove(&final_dir, true);
    }
    let needed = files.iter().map(|(_, b)| b.len() as u64).fold(0u64, u64::saturating_add);
    let cleaned =
        if left.is_empty() { "The unfinished save was removed".to_string() } else { left.join("; ") };
    let latest = match &previous {
        Some(p) => format!("ckpt/latest still names {}, which is complete", p.display()),
        None => "no earlier checkpoint of this run is kept".to_string(),
    };
    Err(Error::Write {
        path: final_dir,
        msg: format!(
            "{} failed: {}; {}. {cleaned}; {latest}. Free space there, or set run.out_dir to a disk with room, \
             then resume with checkpoint.resume = \"auto\"",
            failed.what,
            failed.err,
            disk::needs("the checkpoint", needed, root),
        ),
    })
}

/// The files into the fresh temporary directory `tmp`, each and the
/// directory fsynced.
fn write_all(
    root: &Path,
    tmp: &Path,
    files: &[(&str, &[u8])],
    pause: Option<Duration>,
) -> std::result::Result<(), Failed> {
    std::fs::create_dir_all(root).map_err(at(format!("creating {}", root.display())))?;
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(at(format!("removing {}", tmp.display())))?;
    }
    std::fs::create_dir(tmp).map_err(at(format!("creating {}", tmp.display())))?;
    for (i, (file, bytes)) in files.iter().enumerate() {
        if let (1, Some(d)) = (i, pause) {
            std::thread::sleep(d);
        }
        disk::put(&tmp.join(file), file, bytes, true).map_err(at(format!("writing {file}")))?;
    }
    sync_dir(tmp)
}

/// fsyncs a directory, making the renames and creations inside it durable.
fn sync_dir(dir: &Path) -> std::result::Result<(), Failed> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at(format!("fsyncing directory {}", dir.display())))
}

/// Moves the finished temporary directory to its final name (`fresh`: the
/// name was free). A checkpoint of the same step already there (the step's
/// mid-run save, replaced by its end-of-epoch save) is swapped out
/// atomically where the OS can, so the name never stops naming a complete
/// checkpoint.
fn publish_dir(tmp: &Path, final_dir: &Path, fresh: &mut bool) -> std::result::Result<(), Failed> {
    let what = || format!("renaming {} to {}", tmp.display(), final_dir.display());
    if !final_dir.exists() {
        std::fs::rename(tmp, final_dir).map_err(at(what()))?;
        *fresh = true;
        return Ok(());
    }
    if !exchange(tmp, final_dir) {
        std::fs::remove_dir_all(final_dir).map_err(at(format!("removing {}", final_dir.display())))?;
        return std::fs::rename(tmp, final_dir).map_err(at(what()));
    }
    std::fs::remove_dir_all(tmp).map_err(at(format!("removing {}", tmp.display())))
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(ca), Ok(cb)) =
        (std::ffi::CString::new(a.as_os_str().as_bytes()), std::ffi::CString::new(b.as_os_str().as_bytes()))
    else {
        return false;
    };
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> bool {
    false
}

/// `latest` is a relative symlink to the newest checkpoint directory, so
/// `ckpt/latest/model.safetensors` opens the weights directly. It is replaced
/// by renaming a new symlink (`link`) over it: readers see the old or the new target.
fn point_latest(root: &Path, name: &str, link: &Path) -> std::result::Result<(), Failed> {
    let _ = std::fs::remove_file(link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(name, link).map_err(at(format!("creating symlink {}", link.display())))?;
    #[cfg(not(unix))]
    disk::put(link, "latest", name.as_bytes(), true).map_err(at(format!("writing {}", link.display())))?;
    let latest = root.join("latest");
    std::fs::rename(link, &latest).map_err(at(format!(
        "renaming {} to {}",
        link.display(),
        latest.display()
    )))?;
    sync_dir(root)
}
