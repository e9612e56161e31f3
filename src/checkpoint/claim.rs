//! Claiming `run.out_dir` before a run writes anything. A run trained over
//! another one replaces its weights and summary, cuts its metrics and adds a
//! second TensorBoard history with the same steps, so rank 0 first checks that
//! the out_dir is a directory, that no run is using it (the lock), and that the
//! files of an earlier run in it are ones this run continues
//! (`checkpoint.resume`) or removes first (`run.overwrite = true`); the other
//! ranks learn the verdict (`share.rs`) and exit alike. A refusal the files
//! decide writes nothing, the lock file included; where `resume = "auto"`
//! must read the checkpoints to find that none fits this run, the refusal
//! comes from the resume, under the lock (its record is all that changed).
//!
//! Only ddptrain's own files count, and only they are removed: the names it
//! writes at the top of the out_dir, `tb/`'s event files and `ckpt/`'s
//! checkpoints, each looked at without following a symlink out of the
//! directory. A user's other files stay where they are.

use super::{parse_step_dir, Checkpointer, RunLock};
use crate::config::{Resume, CONFIG_FILE};
use crate::data::text::VOCAB_FILE;
use crate::dist::Communicator;
use crate::error::{Error, Result};
use std::fs::FileType;
use std::path::{Path, PathBuf};

/// What a run writes at the top of its out_dir; each may also have the
/// `.tmp` twin of a write killed before its rename (`write_atomic`, the
/// metrics cut of a resume).
const TOP_FILES: [&str; 6] =
    ["summary.json", "model.safetensors", "metrics.jsonl", "train.log", CONFIG_FILE, VOCAB_FILE];
/// What a checkpoint directory holds (`save.rs`).
const CKPT_FILES: [&str; 5] =
    ["model.safetensors", "optim.safetensors", "state.json", CONFIG_FILE, VOCAB_FILE];
/// TensorBoard's directory in the out_dir (`open_metrics`).
const TB_DIR: &str = "tb";

/// ddptrain's files in an out_dir.
#[derive(Debug, Default)]
struct Found {
    /// Run files at the top, by name, in [`TOP_FILES`] order.
    top: Vec<String>,
    /// TensorBoard event files in `tb/`, and probe files a writer left there.
    events: Vec<PathBuf>,
    probes: Vec<PathBuf>,
    /// Checkpoints (`step_XXXXXXXX`, oldest first) and saves cut short (`.tmp-step_*`).
    steps: Vec<PathBuf>,
    tmp_saves: Vec<PathBuf>,
    /// `ckpt/latest` and the temporary links of its replacement.
    links: Vec<PathBuf>,
}

/// The entries of `dir` with their own type (a symlink is a symlink, not its
/// target); none when `dir` is not a directory.
fn entries(dir: &Path) -> Vec<(String, PathBuf, FileType)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<_> = rd
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), e.path(), e.file_type().ok()?)))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Whether `path` is a directory itself, not a symlink to one.
fn real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

impl Found {
    fn inspect(out_dir: &Path, ckpt: &Path) -> Found {
        let mut f = Found::default();
        for name in TOP_FILES {
            for n in [name.to_string(), format!("{name}.tmp")] {
                if std::fs::symlink_metadata(out_dir.join(&n)).is_ok_and(|m| m.is_file()) {
                    f.top.push(n);
                }
            }
        }
        let tb = out_dir.join(TB_DIR);
        if real_dir(&tb) {
            for (name, path, ty) in entries(&tb) {
                if ty.is_file() && name.starts_with("events.out.tfevents.") {
                    f.events.push(path);
                } else if ty.is_file() && name.starts_with(".probe.") {
                    f.probes.push(path);
                }
            }
        }
        if real_dir(ckpt) {
            for (name, path, ty) in entries(ckpt) {
                if ty.is_dir() && parse_step_dir(&name).is_some() {
                    f.steps.push(path);
                } else if ty.is_dir() && name.starts_with(".tmp-step_") {
                    f.tmp_saves.push(path);
                } else if ty.is_symlink() && (name == "latest" || name.starts_with(".latest.")) {
                    f.links.push(path);
                }
            }
        }
        f
    }

    /// Whether a run left files here (an empty `tb/` or a bare `latest` is no run).
    fn holds_run(&self) -> bool {
        !(self.top.is_empty() && self.events.is_empty() && self.steps.is_empty() && self.tmp_saves.is_empty())
    }

    /// The files, as a user would list them: `a, b, tb/ (1 events file), ckpt/ (3 checkpoints)`.
    fn list(&self) -> String {
        let mut parts = self.top.clone();
        let n = |k: usize, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
        if !self.events.is_empty() {
            parts.push(format!("{TB_DIR}/ ({})", n(self.events.len(), "events file", "events files")));
        }
        if !self.steps.is_empty() || !self.tmp_saves.is_empty() {
            let mut what = vec![n(self.steps.len(), "checkpoint", "checkpoints")];
            if !self.tmp_saves.is_empty() {
                what.push(n(self.tmp_saves.len(), "unfinished save", "unfinished saves"));
            }
            parts.push(format!("ckpt/ ({})", what.join(", ")));
        }
        parts.join(", ")
    }

    /// Removes these files (never following a symlink), then `tb/` and
    /// `ckpt/` where nothing else is left in them; returns the checkpoint
    /// directories kept because they hold files ddptrain does not write.
    fn remove(&self, out_dir: &Path, ckpt: &Path) -> Result<Vec<PathBuf>> {
        let rm = |p: &Path| {
            std::fs::remove_file(p).map_err(|e| Error::io(format!("cannot remove {}", p.display()), e))
        };
        for name in &self.top {
            rm(&out_dir.join(name))?;
        }
        for p in self.events.iter().chain(&self.probes).chain(&self.links) {
            rm(p)?;
        }
        let mut kept = Vec::new();
        for dir in self.steps.iter().chain(&self.tmp_saves) {
            for (name, path, ty) in entries(dir) {
                let ours = CKPT_FILES.iter().any(|f| name == *f || name == format!("{f}.tmp"));
                if ty.is_file() && ours {
                    rm(&path)?;
                }
            }
            if std::fs::remove_dir(dir).is_err() {
                kept.push(dir.clone());
            }
        }
        // Left in place while a user's file is in them.
        let _ = std::fs::remove_dir(out_dir.join(TB_DIR));
        let _ = std::fs::remove_dir(ckpt);
        Ok(kept)
    }
}

/// Why this run would not continue the run an out_dir holds.
enum Why {
    Never,
    NoCheckpoint,
    Elsewhere(PathBuf),
    Unresumable(String),
}

/// Whether `ddptrain launch --max-restarts` started this rank again after a
/// failure of the job (torchrun's `TORCHELASTIC_RESTART_COUNT`, 0 at first).
fn restarted() -> bool {
    std::env::var("TORCHELASTIC_RESTART_COUNT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// `path` is `dir` or inside it; both resolved where they exist, so a
/// symlink or `..` does not hide it.
fn inside(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| {
        std::fs::canonicalize(p).or_else(|_| std::path::absolute(p)).unwrap_or_else(|_| p.to_path_buf())
    };
    resolve(path).starts_with(resolve(dir))
}

/// `dir` is a directory or can be made one: a file in its place (or in
/// place of a folder above it) is refused naming both, before `create_dir_all`
/// reports it as "File exists".
fn check_directory(dir: &Path) -> Result<()> {
    for at in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if at == dir => return Err(Error::OutDir {
                dir: dir.to_path_buf(),
                msg: "is a file, not a directory: set run.out_dir to a new or empty directory (or move the \
                          file away)"
                    .into(),
            }),
            Ok(_) => {
                return Err(Error::OutDir {
                    dir: dir.to_path_buf(),
                    msg: format!(
                        "cannot be created: {} is a file, not a directory; set run.out_dir to a path whose \
                         folders are directories",
                        at.display()
                    ),
                })
            }
            // Missing, or under a file: the next folder up says which.
            Err(_) => continue,
        }
    }
    Ok(())
}

/// The error [`RunLock::acquire`] would meet where this process may not
/// write `dir` (or, when it does not exist yet, the folder it would be made in).
fn check_writable(dir: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let Some(at) = dir.ancestors().find(|a| a.as_os_str().is_empty() || a.exists()) else { return Ok(()) };
    let at = if at.as_os_str().is_empty() { Path::new(".") } else { at };
    let Ok(c) = std::ffi::CString::new(at.as_os_str().as_bytes()) else { return Ok(()) };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(if at == dir {
        Error::io(format!("cannot open the run lock {}", dir.join(super::LOCK_FILE).display()), e)
    } else {
        Error::io(format!("cannot create {}", dir.display()), e)
    })
}

/// `ddptrain check`: what claiming `cfg`'s `run.out_dir` would refuse,
/// without locking it or writing anything.
pub fn check_out_dir(cfg: &crate::config::Config) -> Result<()> {
    // A check never saves, and the shape only shapes saves.
    let shape = super::RunShape {
        world_size: 1,
        rank: 0,
        steps_per_epoch: 0,
        total_steps: 0,
        train_samples: 0,
        schedule: crate::optim::LrSchedule {
            base_lr: 0.0,
            kind: crate::optim::ScheduleKind::Constant,
            warmup_steps: 0,
            total_steps: 0,
        },
    };
    Checkpointer::new(cfg, shape).check_claim()
}

impl Checkpointer {
    /// Claims `run.out_dir` for this run before anything writes there (see
    /// the module's doc): rank 0 looks and locks, and every rank returns its
    /// verdict, a refusal as the same error. Before [`Checkpointer::resume`].
    pub fn claim(&mut self, comm: &dyn Communicator) -> Result<()> {
        if comm.world_size() == 1 {
            return self.claim_local();
        }
        super::share::claim_distributed(self, comm)
    }

    /// Rank 0's claim on `run.out_dir` (see the module's doc): on success the
    /// lock is held and the out_dir holds no run this one would not continue.
    pub(super) fn claim_local(&mut self) -> Result<()> {
        let dir = self.out_dir.clone();
        check_directory(&dir)?;
        if self.overwrite {
            self.lock = Some(RunLock::acquire(&dir)?);
            // Looked at under the lock, so no run writes while its files go.
            return self.overwrite(Found::inspect(&dir, &self.root));
        }
        let found = Found::inspect(&dir, &self.root);
        if let Some(why) = self.why_not_continued(&found) {
            // A run still writing there is the truer reason.
            RunLock::probe(&dir)?;
            return Err(self.refusal(&found, why));
        }
        self.lock = Some(RunLock::acquire(&dir)?);
        Ok(())
    }

    /// The refusal of a run whose `checkpoint.resume = "auto"` found only
    /// checkpoints it cannot resume (`reasons`: why, the newest's first).
    pub(super) fn unresumable(&self, reasons: String) -> Error {
        self.refusal(&Found::inspect(&self.out_dir, &self.root), Why::Unresumable(reasons))
    }

    /// `None` when the out_dir holds no run, or one `checkpoint.resume` may
    /// continue (the resume then checks its checkpoints against this run).
    fn why_not_continued(&self, found: &Found) -> Option<Why> {
        if !found.holds_run() {
            return None;
        }
        // What an earlier attempt of this job left unfinished is its own: the
        // restart goes on as that attempt did (resuming its checkpoint, or
        // from step 0 where it wrote none). That attempt claimed the out_dir.
        if restarted() && !found.top.iter().any(|n| n == "summary.json") {
            return None;
        }
        match &self.resume {
            Resume::Path(p) if !inside(p, &self.out_dir) => Some(Why::Elsewhere(p.clone())),
            _ if found.steps.is_empty() => Some(Why::NoCheckpoint),
            Resume::Never => Some(Why::Never),
            Resume::Auto | Resume::Path(_) => None,
        }
    }

    /// What [`Checkpointer::claim_local`] would refuse, looked at without
    /// locking or writing anything (`ddptrain check`).
    pub(super) fn check_claim(&self) -> Result<()> {
        let dir = &self.out_dir;
        check_directory(dir)?;
        check_writable(dir)?;
        RunLock::probe(dir)?;
        if self.overwrite {
            return self.overwrite_conflict();
        }
        let found = Found::inspect(dir, &self.root);
        match self.why_not_continued(&found) {
            Some(why) => Err(self.refusal(&found, why)),
            None => Ok(()),
        }
    }

    /// run.overwrite = true would remove the checkpoint the resume names.
    fn overwrite_conflict(&self) -> Result<()> {
        match &self.resume {
            Resume::Path(p) if inside(p, &self.out_dir) => Err(Error::OutDir {
                dir: self.out_dir.clone(),
                msg: format!(
                    "cannot be overwritten and resumed from at once: run.overwrite = true would remove the \
                     checkpoint checkpoint.resume names ({}); leave out one of them",
                    p.display()
                ),
            }),
            _ => Ok(()),
        }
    }

    fn overwrite(&mut self, found: Found) -> Result<()> {
        self.overwrite_conflict()?;
        if !found.holds_run() && found.links.is_empty() && found.probes.is_empty() {
            return Ok(());
        }
        let listed = found.list();
        let kept = found.remove(&self.out_dir, &self.root)?;
        let mut line = format!(
            "run.overwrite = true: removed the previous run's files from {}: {listed}",
            self.out_dir.display()
        );
        if !kept.is_empty() {
            let kept: Vec<String> = kept.iter().map(|p| p.display().to_string()).collect();
            line.push_str(&format!("; kept {}, which hold files ddptrain did not write", kept.join(", ")));
        }
        crate::errln!("{line}");
        // The first line of the new run's log.
        crate::metrics::append_log(&self.out_dir.join("train.log"), &line);
        Ok(())
    }

    /// What the out_dir holds, why this run would not continue it, and the choices.
    fn refusal(&self, found: &Found, why: Why) -> Error {
        let (saved, config) = self.saved_config(found);
        let name = saved.map_or_else(String::new, |n| format!(" \"{n}\""));
        let summary = std::fs::read_to_string(self.out_dir.join("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        let steps = summary.as_ref().and_then(|s| s["steps"].as_u64());
        let kind = match (&summary, steps) {
            (Some(s), Some(n)) if s["interrupted"].is_string() => {
                format!("an interrupted run{name} (stopped after step {n})")
            }
            (Some(_), Some(n)) => format!("a finished run{name} ({n} steps)"),
            _ => match found.steps.last().and_then(|p| p.file_name()) {
                Some(latest) => {
                    format!("an unfinished run{name} (its latest checkpoint {})", latest.to_string_lossy())
                }
                None => format!("an unfinished run{name}"),
            },
        };
        let why_text = match &why {
            Why::Never => "checkpoint.resume = \"never\"".to_string(),
            Why::NoCheckpoint => "it has no checkpoint (ckpt/) to resume".to_string(),
            Why::Elsewhere(p) => {
                format!("checkpoint.resume names {}, not one of its checkpoints", p.display())
            }
            Why::Unresumable(r) => format!("none of its checkpoints can be resumed: {r}"),
        };
        let continues = !found.steps.is_empty() && !matches!(why, Why::Unresumable(_)) && config.same;
        let resume = if continues { "continue it with checkpoint.resume = \"auto\", " } else { "" };
        Error::OutDir {
            dir: self.out_dir.clone(),
            msg: format!(
                "holds another run's files: {kind}{}: {}. This run would not continue it: {why_text}. \
                 Nothing was written. To keep it, {resume}train into another run.out_dir; to replace it, \
                 set run.overwrite = true (--set run.overwrite=true), which removes its files first \
                 (TensorBoard's too) and trains from step 0",
                config.text,
                found.list()
            ),
        }
    }

    /// The earlier run's name and how its config compares with this run's,
    /// from the `config.toml` it left (the out_dir's, else its latest
    /// checkpoint's), held to the settings a resume must share.
    fn saved_config(&self, found: &Found) -> (Option<String>, Compared) {
        let at_top = self.out_dir.join(CONFIG_FILE);
        let in_ckpt = found.steps.last().map(|d| d.join(CONFIG_FILE));
        let Some(path) = std::iter::once(at_top).chain(in_ckpt).find(|p| p.is_file()) else {
            return (None, Compared { same: true, text: " (no config.toml records its config)".into() });
        };
        // The file as written, without this process's DDPTRAIN_* variables.
        let saved = match crate::config::load_with_env(&path, &[], &[]) {
            Ok(c) => c,
            Err(e) => {
                let text = format!(" (its {} cannot be read: {e})", path.display());
                return (None, Compared { same: false, text });
            }
        };
        let (fingerprint, json) = super::save::resume_identity(&saved);
        let changes = super::compat::Changes::between(&json, &self.config_json);
        let compared = if fingerprint == self.fingerprint {
            Compared { same: true, text: ", trained with this run's config".into() }
        } else if changes.math.is_empty() {
            let text = format!(", trained with this run's config but for {}", changes.extends.join("; "));
            Compared { same: true, text }
        } else {
            let diff = crate::config::describe_diff(&json, &self.config_json, ("its config", "this run"))
                .unwrap_or_else(|| "its config.toml differs".into());
            let ours = &self.run_name;
            Compared {
                same: false,
                text: format!(", trained with another config than this run \"{ours}\" ({diff})"),
            }
        };
        (Some(saved.run.name), compared)
    }
}

/// How an earlier run's config compares with this run's, as the message says it.
struct Compared {
    same: bool,
    text: String,
}

#[cfg(test)]
mod tests {
    use super::super::step_dir_name;
    use super::*;

    #[test]
    fn only_ddptrains_own_files_count_and_symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let ckpt = out.join("ckpt");
        std::fs::create_dir_all(out.join(TB_DIR)).unwrap();
        std::fs::write(out.join("notes.txt"), b"mine").unwrap();
        std::fs::write(out.join(TB_DIR).join("mine.txt"), b"mine").unwrap();
        // A symlink named as a run file, and a symlinked checkpoint folder: not ours.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join(step_dir_name(2))).unwrap();
        std::fs::write(elsewhere.join("metrics.jsonl"), b"{}\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("metrics.jsonl"), out.join("metrics.jsonl")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &ckpt).unwrap();
        let f = Found::inspect(&out, &ckpt);
        assert!(!f.holds_run(), "{f:?}");

        std::fs::remove_file(&ckpt).unwrap();
        std::fs::create_dir_all(ckpt.join(step_dir_name(4))).unwrap();
        std::fs::create_dir_all(ckpt.join(step_dir_name(6))).unwrap();
        for f in ["model.safetensors", "state.json"] {
            std::fs::write(ckpt.join(step_dir_name(4)).join(f), b"x").unwrap();
        }
        std::fs::write(ckpt.join(step_dir_name(6)).join("mine.txt"), b"mine").unwrap();
        std::os::unix::fs::symlink(step_dir_name(6), ckpt.join("latest")).unwrap();
        std::fs::write(out.join("summary.json"), b"{}").unwrap();
        std::fs::write(out.join("model.safetensors.tmp"), b"x").unwrap();
        std::fs::write(out.join(TB_DIR).join("events.out.tfevents.1.h.2.0"), b"x").unwrap();
        let f = Found::inspect(&out, &ckpt);
        assert!(f.holds_run());
        assert_eq!(
            f.list(),
            "summary.json, model.safetensors.tmp, tb/ (1 events file), ckpt/ (2 checkpoints)"
        );

        let kept = f.remove(&out, &ckpt).unwrap();
        assert_eq!(kept, [ckpt.join(step_dir_name(6))]);
        for gone in ["summary.json", "model.safetensors.tmp", "ckpt/step_00000004", "ckpt/latest"] {
            assert!(std::fs::symlink_metadata(out.join(gone)).is_err(), "{gone} is still there");
        }
        for stays in ["notes.txt", "tb/mine.txt", "ckpt/step_00000006/mine.txt", "metrics.jsonl"] {
            assert!(std::fs::symlink_metadata(out.join(stays)).is_ok(), "{stays} was removed");
        }
        assert!(elsewhere.join("metrics.jsonl").is_file() && elsewhere.join(step_dir_name(2)).is_dir());
    }

    #[test]
    fn a_file_in_place_of_the_out_dir_or_a_folder_above_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let msg = check_directory(&file).unwrap_err().to_string();
        assert_eq!(
            msg,
            format!(
                "run.out_dir {} is a file, not a directory: set run.out_dir to a new or empty directory (or \
                 move the file away)",
                file.display()
            )
        );
        let msg = check_directory(&file.join("a/b")).unwrap_err().to_string();
        assert!(msg.contains(&format!("cannot be created: {} is a file, not a directory", file.display())));
        check_directory(&dir.path().join("new/deeper")).unwrap();
        check_directory(Path::new("relative/out")).unwrap();
    }
}
