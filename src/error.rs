//! The library's one error type. Every variant says what went wrong and, where a
//! user can fix it, where to look (the config key and file, the data file, ...).

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The process's exit codes (README, "What a run writes, and how it ends"):
/// any other failure, a config error, a gate that failed.
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_CONFIG: u8 = 2;
pub const EXIT_EXPECT: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config value is missing, mistyped or impossible. `file` is the config
    /// file (or the override source) and `key` the dotted key, e.g. `data.batch_size`.
    #[error("config error in {file}: `{key}`: {msg}")]
    Config { file: String, key: String, msg: String },

    /// A data file is missing, truncated or inconsistent.
    #[error("data error in {}: {msg}", path.display())]
    Data { path: PathBuf, msg: String },

    /// A checkpoint or weights file cannot be read or does not fit the model.
    #[error("checkpoint error in {}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },

    /// Tensor shapes that do not fit together (a bug in the caller, or a model
    /// that validation should have refused).
    #[error("shape error: {0}")]
    Shape(String),

    /// A feature that is accepted by the config but not implemented yet.
    #[error("not yet supported: {0}")]
    Unsupported(String),

    /// A command-line argument that cannot be used as given (a prompt with a
    /// character the model's vocabulary lacks, a temperature of 0, ...).
    #[error("{0}")]
    Usage(String),

    /// Training produced something that cannot go on (NaN loss, ...).
    #[error("training error: {0}")]
    Training(String),

    /// A CUDA driver, cuBLAS or NCCL call failed; `op` names what ddptrain was
    /// doing (the kernel launched, the copy, the collective).
    #[error("CUDA error in {op}: {msg}")]
    Cuda { op: String, msg: String },

    /// NVRTC refused a kernel file; the log is the compiler's own.
    #[error("NVRTC could not compile kernels/{file} for {arch}:\n{log}")]
    Nvrtc { file: String, arch: String, log: String },

    /// Another run holds `run.out_dir` (see `checkpoint::lock`); `holder` is
    /// its PID and host as its lock file records them.
    #[error("run.out_dir {} is in use by another ddptrain run ({holder}); wait for it to end, or set run.out_dir to another directory", dir.display())]
    OutDirInUse { dir: PathBuf, holder: String },

    /// `run.out_dir` cannot take this run as it is: it is a file, or it holds
    /// the files of a run this one would not continue (`checkpoint::claim`).
    /// `msg` says what is there and the choices; nothing was written.
    #[error("run.out_dir {} {msg}", dir.display())]
    OutDir { dir: PathBuf, msg: String },

    /// A file or checkpoint of the run could not be written (a full disk, a
    /// read-only filesystem): `msg` says why, the bytes it needed and those
    /// free, and what was left of it (nothing half-written).
    #[error("cannot write {}: {msg}", path.display())]
    Write { path: PathBuf, msg: String },

    /// A broken invariant inside ddptrain (a bug, not something a user did).
    #[error("internal error: {0}")]
    Internal(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
    pub fn data(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Data { path: path.into(), msg: msg.into() }
    }
    pub fn config(file: impl Into<String>, key: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config { file: file.into(), key: key.into(), msg: msg.into() }
    }
    pub fn cuda(op: impl Into<String>, err: impl std::fmt::Debug) -> Self {
        Error::Cuda { op: op.into(), msg: format!("{err:?}") }
    }
    pub fn shape(msg: impl Into<String>) -> Self {
        Error::Shape(msg.into())
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }
}

/// Most bytes of a value an error message repeats: enough to recognise it,
/// never the whole of a runaway value (a 10 MB string, a pasted file).
pub const VALUE_CHARS: usize = 80;

/// `s` itself when it is short, else its first `max` characters followed by
/// `... (N bytes)`, so a message stays readable whatever the input held.
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}... ({} bytes)", &s[..end], s.len()),
    }
}

/// [`cut`] applied to every line of an error message, and at most `max_lines`
/// lines kept: what the binary prints for any error.
pub fn cut_message(msg: &str, line_chars: usize, max_lines: usize) -> String {
    let lines: Vec<&str> = msg.lines().collect();
    let mut out: Vec<String> = lines.iter().take(max_lines).map(|l| cut(l, line_chars)).collect();
    if lines.len() > max_lines {
        out.push(format!("... ({} more lines)", lines.len() - max_lines));
    }
    out.join("\n")
}
