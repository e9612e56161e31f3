//! The model on the GPU: the same layers as [`crate::nn::Model`], with their
//! parameters, gradients and activations in device buffers allocated once
//! before the first step, and every op a launch of its `ops/<family>/cuda.rs`.

mod acts;
mod half;
mod layers;
pub mod model;
pub mod params;
pub mod plan;
mod transformer;
pub use model::{GpuModel, LocalHooks, TrainHooks};
