//! ddptrain: a mixed-precision data-parallel trainer for networks described in TOML.
//!
//! Data flows top to bottom: `config` -> `nn` (model from `[model]`) -> `train`
//! (the step loop) -> `ops` (per-op CPU/CUDA kernels over `tensor`), with `data`,
//! `optim`, `metrics` and `checkpoint` beside the loop.

pub mod amp;
pub mod checkpoint;
pub mod config;
pub mod cuda;
pub mod data;
pub mod dist;
pub mod error;
pub mod generate;
pub mod launch;
pub mod metrics;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod rng;
pub mod tensor;
#[cfg(test)]
pub(crate) mod testing;
pub mod train;

pub use error::{Error, Result};
