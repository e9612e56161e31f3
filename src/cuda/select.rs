//! Which device a rank trains on (`run.device`): the one binary runs on
//! machines with and without CUDA, so "auto" falls back to the CPU with one
//! warning, while an explicit "cuda" without a GPU is an error.

use super::{device_count, Gpu};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where a rank's tensors live.
#[derive(Debug, Clone)]
pub enum Device {
    Cpu,
    Cuda(Arc<Gpu>),
}

impl Device {
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

/// The decision before any device is opened (kept apart so it is testable
/// with any device count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Cpu {
        warning: Option<String>,
    },
    /// Ordinal among the visible devices (`CUDA_VISIBLE_DEVICES` is applied
    /// by the driver, so ordinal 0 is the first visible GPU).
    Cuda(usize),
}

/// `cfg_device` is `run.device` ("auto", "cpu" or "cuda"); `visible` the
/// number of CUDA devices. Ranks on one node share the visible GPUs round
/// robin: `LOCAL_RANK % visible`, so more ranks than GPUs still run (the
/// tcp backend lets several ranks share one GPU).
pub fn choose(cfg_device: &str, local_rank: usize, visible: usize) -> Result<Choice> {
    match cfg_device {
        "cpu" => Ok(Choice::Cpu { warning: None }),
        "auto" if visible == 0 => Ok(Choice::Cpu {
            warning: Some(
                "warning: run.device = \"auto\" found no CUDA device (no libcuda or no visible GPU); \
                 training on the CPU"
                    .to_string(),
            ),
        }),
        "auto" | "cuda" if visible > 0 => Ok(Choice::Cuda(local_rank % visible)),
        "cuda" => Err(Error::Unsupported(
            "run.device = \"cuda\" but no CUDA device is visible: libcuda could not be loaded or \
             reports no device (check the NVIDIA driver, LD_LIBRARY_PATH and CUDA_VISIBLE_DEVICES); \
             set run.device = \"cpu\" or \"auto\" to train on the CPU"
                .to_string(),
        )),
        other => Err(Error::config(
            "the run config",
            "run.device",
            format!("unknown device {other:?}; expected \"auto\", \"cpu\" or \"cuda\""),
        )),
    }
}

/// Opens the device this rank trains on. The second value is the one line
/// to print when "auto" falls back to the CPU.
pub fn select_device(cfg_device: &str, local_rank: usize) -> Result<(Device, Option<String>)> {
    // "cpu" must not even try to load libcuda.
    let visible = if cfg_device == "cpu" { 0 } else { device_count() };
    match choose(cfg_device, local_rank, visible)? {
        Choice::Cpu { warning } => Ok((Device::Cpu, warning)),
        Choice::Cuda(ordinal) => Ok((Device::Cuda(Gpu::new(ordinal)?), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_without_a_gpu_is_the_cpu_with_one_warning_line() {
        let Choice::Cpu { warning: Some(w) } = choose("auto", 0, 0).unwrap() else {
            panic!("expected the CPU")
        };
        assert!(w.starts_with("warning: run.device = \"auto\" found no CUDA device"), "{w}");
        assert!(w.contains("training on the CPU") && !w.contains('\n'), "{w}");
    }

    #[test]
    fn cuda_without_a_gpu_is_a_clear_error() {
        let e = choose("cuda", 0, 0).unwrap_err().to_string();
        assert!(e.contains("run.device = \"cuda\" but no CUDA device is visible"), "{e}");
        assert!(e.contains("set run.device = \"cpu\" or \"auto\""), "{e}");
    }

    #[test]
    fn ranks_take_gpus_round_robin_by_local_rank() {
        assert_eq!(choose("auto", 0, 2).unwrap(), Choice::Cuda(0));
        assert_eq!(choose("auto", 3, 2).unwrap(), Choice::Cuda(1));
        assert_eq!(choose("cuda", 5, 8).unwrap(), Choice::Cuda(5));
        assert_eq!(choose("cpu", 1, 4).unwrap(), Choice::Cpu { warning: None });
    }

    #[test]
    fn an_unknown_device_name_is_refused() {
        let e = choose("gpu", 0, 1).unwrap_err().to_string();
        assert!(e.contains("unknown device \"gpu\"; expected \"auto\", \"cpu\" or \"cuda\""), "{e}");
    }

    #[test]
    fn select_device_follows_what_this_machine_has() {
        let (d, w) = select_device("cpu", 0).unwrap();
        assert!(!d.is_cuda() && w.is_none());
        let (d, w) = select_device("auto", 0).unwrap();
        if device_count() == 0 {
            assert!(!d.is_cuda() && w.is_some());
            let e = select_device("cuda", 0).unwrap_err().to_string();
            assert!(e.contains("no CUDA device is visible"), "{e}");
        } else {
            assert!(d.is_cuda() && w.is_none());
        }
    }
}
