//! What `ddptrain eval` and `ddptrain sample` take as `--checkpoint`: a
//! checkpoint directory (`ckpt/step_XXXXXXXX`, `ckpt/latest`), a run's `ckpt`
//! folder (its latest), a run's out_dir (its latest checkpoint, else its
//! final `model.safetensors`), or a model file; and the run's config saved
//! with them. A run dir's latest checkpoint is its newest state: a finished
//! run's is the step its `model.safetensors` holds (with the fp32 masters
//! an O2 run keeps), and an extended run stopped early has no newer model
//! file.

use super::ckpt_err;
use crate::config::CONFIG_FILE;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// The checkpoint directory or model file `path` names (a `ckpt` folder's
/// `latest`, so that what was saved with it is found beside it).
pub fn locate_weights(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        return Err(ckpt_err(
            path,
            "no such checkpoint directory, run directory or model file (.safetensors)",
        ));
    }
    if !path.is_dir() || path.join("state.json").exists() {
        return Ok(path.to_path_buf());
    }
    for latest in [path.join("latest"), path.join("ckpt").join("latest")] {
        if latest.exists() {
            return Ok(latest);
        }
    }
    let final_weights = path.join("model.safetensors");
    if final_weights.is_file() {
        return Ok(final_weights);
    }
    Err(ckpt_err(
        path,
        "holds no checkpoint (state.json), no ckpt/latest and no model.safetensors: pass a checkpoint \
         directory, a run's out_dir or a model file",
    ))
}

/// `name` saved with the weights at `path`: in the folder of `path` (the
/// folder itself when `path` is one) or in the two above it: a
/// checkpoint's own copy (`out_dir/ckpt/step_N/`) first, then
/// `out_dir/ckpt/`, then the run's `out_dir`.
pub fn beside(path: &Path, name: &str) -> Option<PathBuf> {
    let start = if path.is_dir() { Some(path) } else { path.parent() };
    start?.ancestors().take(3).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The config to score or sample `path` with: `config` when given, else
/// the `config.toml` the run saved with its weights.
pub fn config_for(path: &Path, config: Option<&Path>) -> Result<PathBuf> {
    match config {
        Some(c) => Ok(c.to_path_buf()),
        None => beside(path, CONFIG_FILE).ok_or_else(|| {
            ckpt_err(
                path,
                format!(
                    "no {CONFIG_FILE} in it or in the two folders above (a run writes one into its out_dir \
                     and every checkpoint): pass the run's config with --config"
                ),
            )
        }),
    }
}
