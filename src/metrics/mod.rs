//! What a run reports: `metrics.jsonl` (one JSON object per logged step and per
//! evaluation), `summary.json` at the end, and human-readable progress (an
//! indicatif bar on a terminal, plain lines otherwise); TensorBoard event files
//! mirror the metrics records when enabled.

pub mod console;
pub mod tensorboard;

use crate::error::{Error, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

pub struct MetricsWriter {
    path: PathBuf,
    /// None on ranks other than 0: only rank 0 writes a run's files.
    out: Option<BufWriter<File>>,
    tb: Option<tensorboard::TensorBoard>,
}

impl MetricsWriter {
    pub fn create(out_dir: &Path) -> Result<Self> {
        let path = out_dir.join("metrics.jsonl");
        let f = File::create(&path).map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        Ok(MetricsWriter { path, out: Some(BufWriter::new(f)), tb: None })
    }

    /// Opens an existing `metrics.jsonl` for appending (a resumed run).
    pub fn append(out_dir: &Path) -> Result<Self> {
        let path = out_dir.join("metrics.jsonl");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        Ok(MetricsWriter { path, out: Some(BufWriter::new(f)), tb: None })
    }

    /// A writer that writes nothing (ranks other than 0).
    pub fn disabled() -> Self {
        MetricsWriter { path: PathBuf::new(), out: None, tb: None }
    }

    /// Also writes every record's scalars as TensorBoard events in `dir`.
    pub fn with_tensorboard(mut self, dir: &Path) -> Result<Self> {
        self.tb = Some(tensorboard::TensorBoard::create(dir)?);
        Ok(self)
    }

    /// One line per record, flushed at once so a crashed run keeps what it logged.
    pub fn write(&mut self, record: &serde_json::Value) -> Result<()> {
        let Some(out) = &mut self.out else { return Ok(()) };
        let io = |e| Error::io(format!("cannot write {}", self.path.display()), e);
        serde_json::to_writer(&mut *out, record).map_err(|e| io(std::io::Error::other(e)))?;
        out.write_all(b"\n").map_err(io)?;
        out.flush().map_err(io)?;
        if let Some(tb) = &mut self.tb {
            tb.record(record);
        }
        Ok(())
    }
}

pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::io("cannot encode JSON", std::io::Error::other(e)))?;
    // Through a rename, so a full disk leaves no half summary behind.
    crate::checkpoint::write_atomic(path, (text + "\n").as_bytes())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    Auto,
    Always,
    Never,
}

/// `line` appended to the log at `path`; a line the log cannot take is lost,
/// not worth failing a finished run for.
pub fn append_log(path: &Path, line: &str) {
    if let Ok(mut f) = open_log(path) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

fn open_log(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// The run's lines: on stdout, wherever it goes, and appended to the run's
/// `train.log`; a bar drawn on a terminal (stderr) below them, with the
/// lines printed around it so they do not tear it.
pub struct Progress {
    bar: Option<ProgressBar>,
    log: Option<std::sync::Mutex<File>>,
    silent: bool,
}

impl Progress {
    /// `log`: the file the lines are appended to (`<out_dir>/train.log`).
    pub fn new(mode: ProgressMode, total_steps: u64, log: Option<&Path>) -> Result<Self> {
        let show = match mode {
            ProgressMode::Always => true,
            ProgressMode::Never => false,
            ProgressMode::Auto => std::io::stderr().is_terminal(),
        };
        // indicatif draws to stderr only when it is a terminal.
        let bar = show.then(|| {
            let bar = ProgressBar::new(total_steps);
            let template = "{elapsed_precise} [{bar:30}] {pos}/{len} steps, {per_sec}, eta {eta} {msg}";
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        let log = match log {
            Some(path) => {
                let f =
                    open_log(path).map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
                Some(std::sync::Mutex::new(f))
            }
            None => None,
        };
        Ok(Progress { bar, log, silent: false })
    }

    /// Prints nothing (ranks other than 0: one rank reports for the job).
    pub fn silent() -> Self {
        Progress { bar: None, log: None, silent: true }
    }

    pub fn set_step(&self, step: u64, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(step);
            bar.set_message(msg.to_string());
        }
    }

    /// `line` on stdout and in `train.log`. A line the log cannot take is
    /// not worth stopping the run for: the metrics and checkpoints are.
    pub fn println(&self, line: &str) {
        if self.silent {
            return;
        }
        match &self.bar {
            Some(bar) => bar.suspend(|| console::out(line)),
            None => console::out(line),
        }
        if let Some(Ok(mut log)) = self.log.as_ref().map(|l| l.lock()) {
            let _ = log.write_all(format!("{line}\n").as_bytes());
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
