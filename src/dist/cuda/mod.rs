//! DDP on the GPU: the gradient reducer over device buckets ([`DeviceReducer`])
//! and the collectives the GPU trainer needs beside it (SyncBatchNorm
//! statistics, evaluation totals, the initial broadcast), over NCCL or, for
//! `parallel.backend = "tcp"`, through host memory and the TCP communicator.

mod ready;
mod reducer;
pub mod scale;

#[cfg(test)]
mod tests_cuda;
#[cfg(test)]
mod tests_race;

pub use ready::ReadyTracker;
pub use reducer::DeviceReducer;

use super::reducer::ReducerOptions;
use super::{Buffer, Communicator};
use crate::cuda::nccl::{NcclComm, NcclElem};
use crate::error::{Error, Result};
use crate::nn::cuda::params::DevElem;
use cudarc::driver::PinnedHostSlice;
use half::f16;
use std::sync::Arc;

/// How a rank's device buffers reach the other ranks.
pub enum DeviceComm {
    /// NCCL on the communication stream.
    Nccl(NcclComm),
    /// parallel.backend = "tcp" on a GPU: stage through pinned host memory and
    /// the TCP communicator (lets several ranks share one GPU in tests).
    /// Host-synchronous, which is acceptable for this backend.
    Tcp(Arc<dyn Communicator>),
}

impl DeviceComm {
    pub fn rank(&self) -> usize {
        match self {
            DeviceComm::Nccl(c) => c.rank(),
            DeviceComm::Tcp(c) => c.rank(),
        }
    }

    pub fn world_size(&self) -> usize {
        match self {
            DeviceComm::Nccl(c) => c.world_size(),
            DeviceComm::Tcp(c) => c.world_size(),
        }
    }
}

/// `(first_bucket_bytes, bucket_cap_bytes)` of `opts`, converted as the CPU
/// reducer converts them: what `DeviceParams::new` must be given for its
/// buckets to be the ones [`DeviceReducer::new`] expects.
pub fn bucket_bytes(opts: &ReducerOptions) -> (usize, usize) {
    let mb = |m: f64| (m * 1024.0 * 1024.0) as usize;
    (mb(opts.first_bucket_mb), mb(opts.bucket_cap_mb))
}

/// A bucket's host copy for the TCP path, in the dtype it is reduced in.
pub(crate) enum Staging {
    F32(PinnedHostSlice<f32>),
    F16(PinnedHostSlice<f16>),
}

/// An element type buckets are reduced in: what NCCL, the TCP [`Buffer`]
/// and the pinned staging need of it.
pub(crate) trait ReduceElem: DevElem + NcclElem {
    fn into_buffer(v: Vec<Self>) -> Buffer;
    fn from_buffer(b: Buffer) -> Result<Vec<Self>>;
    fn staging(s: &mut Staging) -> Option<&mut PinnedHostSlice<Self>>;
}

impl ReduceElem for f32 {
    fn into_buffer(v: Vec<f32>) -> Buffer {
        Buffer::F32(v)
    }
    fn from_buffer(b: Buffer) -> Result<Vec<f32>> {
        b.into_f32()
    }
    fn staging(s: &mut Staging) -> Option<&mut PinnedHostSlice<f32>> {
        match s {
            Staging::F32(p) => Some(p),
            Staging::F16(_) => None,
        }
    }
}

impl ReduceElem for f16 {
    fn into_buffer(v: Vec<f16>) -> Buffer {
        Buffer::F16(v)
    }
    fn from_buffer(b: Buffer) -> Result<Vec<f16>> {
        b.into_f16()
    }
    fn staging(s: &mut Staging) -> Option<&mut PinnedHostSlice<f16>> {
        match s {
            Staging::F16(p) => Some(p),
            Staging::F32(_) => None,
        }
    }
}

/// The share of all-reduce time that ran before backward ended. `spans` are
/// each bucket's (start, end) in milliseconds relative to the end of backward
/// (negative: before it), the device twin of `StepOverlap::hidden_fraction`.
pub fn hidden_fraction(spans: &[(f64, f64)]) -> f64 {
    let (mut hidden, mut total) = (0.0, 0.0);
    for &(s, e) in spans {
        total += (e - s).max(0.0);
        hidden += (e.min(0.0) - s).max(0.0);
    }
    if total > 0.0 {
        hidden / total
    } else {
        0.0
    }
}

fn internal(msg: impl std::fmt::Display) -> Error {
    Error::internal(format!("DDP: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_fraction_counts_the_part_of_each_span_before_backward_ended() {
        // Wholly before (2 ms hidden of 2), straddling (1 of 3), wholly after (0 of 5).
        let f = hidden_fraction(&[(-5.0, -3.0), (-1.0, 2.0), (1.0, 6.0)]);
        assert!((f - 3.0 / 10.0).abs() < 1e-12, "{f}");
        assert_eq!(hidden_fraction(&[(-4.0, -1.0)]), 1.0);
        assert_eq!(hidden_fraction(&[(0.5, 2.0)]), 0.0);
        assert_eq!(hidden_fraction(&[]), 0.0);
    }

    #[test]
    fn bucket_bytes_match_the_cpu_reducer() {
        let o = ReducerOptions {
            first_bucket_mb: 1.0,
            bucket_cap_mb: 25.0,
            gradient_predivide_factor: 1.0,
            allreduce_fp32: false,
        };
        assert_eq!(bucket_bytes(&o), (1 << 20, 25 << 20));
    }
}
