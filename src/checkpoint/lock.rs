//! One run per `run.out_dir`. Two runs writing into one directory race: the
//! second "resumes" from the first's checkpoint in flight and both write the
//! same files. So rank 0 holds an exclusive `flock(2)` on `out_dir/.lock` for
//! the whole run. The kernel drops a flock when its process dies, however it
//! dies, so a crash or a SIGKILL never leaves a stale lock behind, which a PID
//! file would. The holder writes its PID and host into the file, so a refused
//! run can say who holds the directory.
//!
//! The file is never removed: unlinking a locked file lets a third run lock a
//! fresh inode while a second still waits on the old one.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file's name inside `run.out_dir`.
pub const LOCK_FILE: &str = ".lock";

/// Who holds an out_dir, as its lock file records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockHolder {
    pub pid: u32,
    pub host: String,
}

impl LockHolder {
    /// This process.
    pub fn current() -> LockHolder {
        LockHolder { pid: std::process::id(), host: hostname() }
    }
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on host {}", self.pid, self.host)
    }
}

/// The machine's name as `hostname` prints it; "unknown" when it cannot be read.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// An exclusive hold on a run's out_dir, released when dropped or when the process ends.
#[derive(Debug)]
pub struct RunLock {
    // Never read: the open file description is what holds the flock.
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Locks `out_dir` (created if missing) for this process, or refuses with
    /// [`Error::OutDirInUse`] naming the holder when another run has it.
    pub fn acquire(out_dir: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(out_dir)
            .map_err(|e| Error::io(format!("cannot create {}", out_dir.display()), e))?;
        let path = out_dir.join(LOCK_FILE);
        let io_err = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        // No truncation on open: while another run holds the lock, its record must survive.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err("cannot open the run lock", e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(in_use(out_dir, &path)),
            Err(TryLockError::Error(e)) => return Err(io_err("cannot lock", e)),
        }
        let record = serde_json::to_string(&LockHolder::current())
            .map_err(|e| io_err("cannot record the holder in", std::io::Error::other(e)))?;
        file.set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{record}\n").as_bytes()))
            .and_then(|_| file.sync_data())
            .map_err(|e| io_err("cannot record the holder in", e))?;
        Ok(RunLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Refuses with [`Error::OutDirInUse`] when another run holds `out_dir`,
    /// without taking the lock or writing anything: a run about to be refused
    /// for what the directory holds says first that a run is still writing it.
    pub fn probe(out_dir: &Path) -> Result<()> {
        let path = out_dir.join(LOCK_FILE);
        // flock needs no write access; a lock file that cannot be opened is no holder.
        let Ok(file) = File::open(&path) else { return Ok(()) };
        match file.try_lock() {
            Err(TryLockError::WouldBlock) => Err(in_use(out_dir, &path)),
            // Dropping the file releases the probe's own hold.
            Ok(()) | Err(TryLockError::Error(_)) => Ok(()),
        }
    }
}

/// The refusal of a run into `out_dir`, whose lock file `path` another run holds.
fn in_use(out_dir: &Path, path: &Path) -> Error {
    let holder = read_holder(path)
        .map_or_else(|| "its PID and host are not recorded yet".to_string(), |h| h.to_string());
    Error::OutDirInUse { dir: out_dir.to_path_buf(), holder }
}

/// The holder a lock file records. The holder writes it just after locking,
/// so a run refused in that instant may find it empty: it looks a few times.
pub fn read_holder(path: &Path) -> Option<LockHolder> {
    for attempt in 0..10 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut text = String::new();
        // A record is a line; anything longer is not one of ours.
        let read = File::open(path).and_then(|f| f.take(4096).read_to_string(&mut text));
        if read.is_ok() {
            if let Ok(h) = serde_json::from_str::<LockHolder>(text.trim()) {
                return Some(h);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_an_out_dir_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("runs/x");
        let first = RunLock::acquire(&out).unwrap();
        assert_eq!(first.path(), out.join(LOCK_FILE));
        // A second open file description conflicts even within one process.
        let err = RunLock::acquire(&out).unwrap_err();
        let me = LockHolder::current();
        assert!(matches!(&err, Error::OutDirInUse { dir, .. } if dir == &out), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "{} is in use by another ddptrain run (pid {} on host {})",
                out.display(),
                me.pid,
                me.host
            )),
            "{msg}"
        );
        assert!(msg.contains("run.out_dir"), "{msg}");
        // The refused attempt left the holder's record intact.
        assert_eq!(read_holder(&out.join(LOCK_FILE)), Some(me));
        drop(first);
        let again = RunLock::acquire(&out).unwrap();
        drop(again);
    }

    #[test]
    fn a_probe_refuses_a_held_out_dir_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        RunLock::probe(&dir.path().join("missing")).unwrap();
        assert!(!dir.path().join("missing").exists(), "a probe creates nothing");
        let held = RunLock::acquire(dir.path()).unwrap();
        let before = std::fs::read(held.path()).unwrap();
        let err = RunLock::probe(dir.path()).unwrap_err();
        assert!(matches!(&err, Error::OutDirInUse { .. }), "{err:?}");
        assert!(err.to_string().contains(&LockHolder::current().to_string()), "{err}");
        drop(held);
        RunLock::probe(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(LOCK_FILE)).unwrap(),
            before,
            "the record is left as it was"
        );
        // The probe's own hold ended with it.
        drop(RunLock::acquire(dir.path()).unwrap());
    }

    #[test]
    fn a_stale_lock_file_from_a_dead_run_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        // What a crashed run leaves: the file with its record, but no flock.
        let dead = LockHolder { pid: 999_999, host: "elsewhere".into() };
        std::fs::write(dir.path().join(LOCK_FILE), serde_json::to_string(&dead).unwrap()).unwrap();
        let _held = RunLock::acquire(dir.path()).unwrap();
        assert_eq!(read_holder(&dir.path().join(LOCK_FILE)), Some(LockHolder::current()));
    }

    #[test]
    fn an_unrecorded_holder_is_said_to_be_unrecorded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        let f = File::create(&path).unwrap();
        f.try_lock().unwrap();
        let msg = RunLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("(its PID and host are not recorded yet)"), "{msg}");
    }

    #[test]
    fn an_out_dir_that_cannot_be_created_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"not a directory").unwrap();
        let msg = RunLock::acquire(&file.join("out")).unwrap_err().to_string();
        assert!(msg.contains("cannot create") && msg.contains("plain/out"), "{msg}");
    }

    #[test]
    fn the_hostname_is_the_machines() {
        let h = hostname();
        assert!(!h.is_empty() && h != "unknown");
        if let Ok(etc) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            assert_eq!(h, etc.trim());
        }
    }
}
