//! One folder per op family: `mod.rs` dispatches on the tensor's storage,
//! `cpu.rs` holds the CPU kernels (generic over [`Elem`] so the tests can run
//! them in f64), and the CUDA twin will sit beside it as `cuda.rs`.

pub mod elem;
pub use elem::Elem;

pub mod batch_norm;
pub mod conv2d;
pub mod cross_entropy;
pub mod gemm;
pub(crate) mod half_emu;
pub mod linear;
pub mod max_pool2d;
pub mod relu;

#[cfg(test)]
pub mod testing;
