//! The run configuration: a TOML file, overridden by `DDPTRAIN_<SECTION>__<KEY>`
//! environment variables and then by `--set key=value`, checked by `validate`.
//!
//! Names and defaults follow PyTorch (torch.optim, nn modules, DDP) and apex,
//! so a PyTorch user can read a config without a manual.

pub(crate) mod blocks;
pub mod describe;
mod diff;
mod key_docs;
mod key_rows_layers;
pub mod keys;
pub(crate) mod layers;
mod load;
pub mod memory;
pub mod model;
mod preflight;
mod probe;
pub(crate) mod schema;
mod tie;
mod validate;

#[cfg(test)]
mod tests_blocks;
#[cfg(test)]
mod tests_graph;
#[cfg(test)]
mod tests_limits;
#[cfg(test)]
pub(crate) mod tests_load;
#[cfg(test)]
mod tests_memory;
#[cfg(test)]
mod tests_model;
#[cfg(test)]
mod tests_text;
#[cfg(test)]
pub(crate) mod tests_tie;
#[cfg(test)]
mod tests_validate;

use sha2::{Digest, Sha256};

/// The resolved config a run writes into its out_dir and every checkpoint,
/// so that what reads them later (`ddptrain sample`) needs no other file.
pub const CONFIG_FILE: &str = "config.toml";

pub use diff::{describe_diff, diff_keys};
pub use layers::LayerConfig;
pub use load::{load, load_with_env};
pub use model::{param_count, resolve, summary, LayerKind, ResolvedLayer, Tie};
pub use preflight::preflight;
pub use schema::{
    AmpConfig, Backend, CheckpointConfig, Config, DataConfig, DatasetKind, Device, Expect, Layout,
    LoggingConfig, LossScale, ModelConfig, OptLevel, OptimizerConfig, OptimizerName, ParallelConfig,
    ProgressSetting, RandomCrop, Resume, ResumeChanges, RunConfig, SchedulerConfig, SchedulerName,
    TrainConfig,
};

impl Config {
    /// The resolved config as TOML (every default filled in), as `ddptrain check` prints it.
    pub fn to_toml_string(&self) -> String {
        // Every field is representable in TOML, so failure would be a bug in the schema.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot serialize the config: {e}\n"))
    }

    /// Hex SHA-256 of the settings that must agree across ranks. Per-rank and
    /// cosmetic fields (run.name, run.out_dir, run.device, run.max_memory_gb, logging.*,
    /// parallel.master_addr/master_port) are left out.
    pub fn fingerprint(&self) -> String {
        // serde_json's map is sorted by key, which makes this serialization canonical.
        let digest = Sha256::digest(self.fingerprint_json().to_string().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The settings [`Config::fingerprint`] hashes, as JSON: what ranks compare
    /// key by key when their fingerprints differ.
    pub fn fingerprint_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(root) = v.as_object_mut() {
            root.remove("logging");
            if let Some(run) = root.get_mut("run").and_then(|r| r.as_object_mut()) {
                for k in ["name", "out_dir", "device", "max_memory_gb"] {
                    run.remove(k);
                }
            }
            if let Some(par) = root.get_mut("parallel").and_then(|p| p.as_object_mut()) {
                par.remove("master_addr");
                par.remove("master_port");
            }
        }
        v
    }

    /// The model's layers in execution order with shapes (see [`model::resolve`]).
    pub fn resolve_model(&self) -> crate::Result<Vec<ResolvedLayer>> {
        let file = self.config_path.display().to_string();
        resolve(&self.model).map_err(|e| match e {
            crate::Error::Config { key, msg, .. } => crate::Error::Config { file, key, msg },
            other => other,
        })
    }
}
