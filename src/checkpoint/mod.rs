//! Checkpoints: rank 0 writes `<out_dir>/ckpt/step_XXXXXXXX/` with
//! `model.safetensors` (PyTorch `state_dict()` names, f32), `optim.safetensors`
//! (optimizer state as `<param>.<state name>`, e.g. `layer1.0.weight.momentum_buffer`,
//! fp32 master weights as `master.<param>` when the run keeps them, and the
//! gradients of pending accumulated micro-batches, every rank's: see `pending.rs`) and
//! `state.json` (see [`CheckpointState`], including the dynamic loss scaler); a
//! run resumes from one exactly. With several ranks only rank 0 reads the
//! files and sends them to the others.
//!
//! A save goes to a temporary directory, every file and the directory are
//! fsynced, the directory is renamed into place, and only then is the
//! `ckpt/latest` symlink replaced (a new symlink renamed over the old one, which
//! is atomic), so a process killed at any point leaves `latest` naming a
//! complete checkpoint. `state.json` is written last and records the size and
//! SHA-256 of the other two files, so a truncated or corrupted checkpoint is
//! detected on load.

mod claim;
mod compat;
mod disk;
mod io;
mod load;
mod locate;
mod lock;
mod pending;
mod publish;
mod save;
mod share;
mod state;
#[cfg(test)]
mod tests_share;
mod timed;

pub use claim::check_out_dir;
pub use compat::Reshard;
pub(crate) use io::ckpt_err;
pub use io::{entries_to_bytes, load_safetensors, save_safetensors, write_atomic};
pub use load::{
    load_eval_weights, load_for_eval, parse_checkpoint, read_checkpoint, read_raw, EvalSource,
    LoadedCheckpoint, RawCheckpoint,
};
pub use locate::{beside, config_for, locate_weights};
pub use lock::{read_holder, LockHolder, RunLock, LOCK_FILE};
pub use save::{open_metrics, Checkpointer, RankStates, RunShape};
pub use share::{decode_message, encode_message, ResumeMessage};
pub use state::{
    CheckpointState, EvalState, FileDigest, RankLosses, ScalerRecord, TrainProgress, FORMAT_VERSION,
};

/// Prefix of the fp32 master weights' names in `optim.safetensors`: `master.<param>`.
pub const MASTER_PREFIX: &str = "master.";

/// Directory name of the checkpoint taken after optimizer step `step`.
pub fn step_dir_name(step: u64) -> String {
    format!("step_{step:08}")
}

/// The step of a `step_XXXXXXXX` directory name.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    name.strip_prefix("step_").filter(|s| s.len() >= 8).and_then(|s| s.parse().ok())
}

/// The first `skip` batches of an epoch's sample order removed: what a run
/// resumed mid-epoch still has to consume, in the same order.
pub fn skip_batches(mut indices: Vec<usize>, skip: usize, batch_size: usize) -> Vec<usize> {
    let n = skip.saturating_mul(batch_size).min(indices.len());
    indices.drain(..n);
    indices
}
