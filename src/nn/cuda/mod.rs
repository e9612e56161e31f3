//! The model on the GPU: the same layers as [`crate::nn::Model`], with their
//! parameters, gradients and activations in device buffers allocated once
//! before the first step, and every op a launch of its `ops/<family>/cuda.rs`.

mod acts;
pub mod fused;
pub mod layer;
pub mod model;
mod o1;
pub mod params;
pub mod plan;
mod step;
pub mod workspace;
pub use model::{GpuModel, LocalHooks, TrainHooks};
