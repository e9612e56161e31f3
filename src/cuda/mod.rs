//! The CUDA runtime layer: one [`Gpu`] per process (context, compute stream,
//! kernel modules compiled by NVRTC once and cached). Everything is loaded at
//! run time (cudarc `dynamic-loading`), so this compiles and the binary runs on
//! machines without CUDA; [`device_count`] is the gate.
//!
//! Kernel launchers live beside their CPU twins in `ops/<family>/cuda.rs` and
//! take `CudaSlice`s plus sizes; they get their functions from [`Gpu::function`].

pub mod blas;
pub mod cast;
mod elem;
pub mod kernels;
pub mod launch;
pub mod nccl;
pub mod nvrtc;
pub mod select;
#[cfg(test)]
pub(crate) mod testing;

pub use elem::{as_i64, check_len, entry, DeviceFloat};

use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaModule, CudaStream, LaunchConfig};
pub use launch::Kernel;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Threads per block for the elementwise kernels.
pub const BLOCK: u32 = 256;

/// Number of visible CUDA devices; 0 when libcuda is absent or has none (so a
/// machine without a GPU never reaches a cudarc call that would panic).
pub fn device_count() -> usize {
    // SAFETY: only tries to dlopen libcuda by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// A grid-stride launch over `n` elements: enough blocks to fill the device,
/// capped because the kernels loop (`DDP_FOR_EACH`).
pub fn launch_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `compute_XY` of this device: kernels are compiled to PTX for it and the
    /// driver JITs them, so one NVRTC covers every architecture it knows.
    arch: String,
    name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Loaded kernels by entry-point name (names are unique across files).
    functions: Mutex<HashMap<String, Arc<Kernel>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({} #{}, {})", self.name, self.ctx.ordinal(), self.arch)
    }
}

impl Gpu {
    /// Opens device `ordinal` (an index among `CUDA_VISIBLE_DEVICES`).
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>> {
        let n = device_count();
        if ordinal >= n {
            return Err(Error::Unsupported(format!(
                "CUDA device {ordinal} requested but {n} visible (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)"
            )));
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| Error::cuda(format!("opening device {ordinal}"), e))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| Error::cuda("compute capability", e))?;
        let name = ctx.name().map_err(|e| Error::cuda("device name", e))?;
        // Not the legacy default stream: that one waits for every other
        // stream, so the communication stream could never overlap backward.
        let stream = ctx.new_stream().map_err(|e| Error::cuda("creating the compute stream", e))?;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            arch: format!("compute_{major}{minor}"),
            name,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }))
    }

    pub fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The compute stream every kernel of a training step is launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Kernel `name` of `kernels/<file>`, compiling and loading the file on
    /// first use (once per process; later calls are a map lookup).
    pub fn function(&self, file: &'static str, name: &str) -> Result<Arc<Kernel>> {
        let mut functions =
            self.functions.lock().map_err(|_| Error::cuda("kernel cache", "poisoned by a panic"))?;
        if let Some(k) = functions.get(name) {
            return Ok(k.clone());
        }
        let module = {
            let mut modules =
                self.modules.lock().map_err(|_| Error::cuda("kernel cache", "poisoned by a panic"))?;
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let ptx = match nvrtc::compile(file, &self.arch)? {
                        nvrtc::Output::Ptx(p) => cudarc::nvrtc::Ptx::from_src(p),
                        nvrtc::Output::Cubin(b) => cudarc::nvrtc::Ptx::from_binary(b),
                    };
                    let m = self
                        .ctx
                        .load_module(ptx)
                        .map_err(|e| Error::cuda(format!("loading kernels/{file}"), e))?;
                    modules.insert(file, m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| Error::cuda(format!("kernel {name} in kernels/{file}"), e))?;
        let k = Arc::new(Kernel::new(f, name));
        functions.insert(name.to_string(), k.clone());
        Ok(k)
    }

    /// Blocks the host until the compute stream is idle (tests, logging steps).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| Error::cuda("stream synchronize", e))
    }
}

/// For GPU tests: the first device, or `None` after printing the skip line
/// that `scripts/gpu-check.sh` looks for. Under `CI=true` a missing device is
/// a failure, not a skip: CI runs every GPU test on the emulated device
/// (`scripts/emulated-gpu.sh`), so a skip there would hide untested code.
pub fn test_gpu(test: &str) -> Option<Arc<Gpu>> {
    if device_count() == 0 {
        skip_or_fail(test, "no CUDA device");
        return None;
    }
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => panic!("{test}: a CUDA device is visible but cannot be opened: {e}"),
    }
}

/// Prints "<test>: skipped: <why>", or panics under `CI=true`, where every
/// GPU test must run (on the emulated device when there is no GPU).
pub fn skip_or_fail(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "{test}: {why}, and CI=true forbids skipping a GPU test: run it through scripts/emulated-gpu.sh \
             (scripts/test.sh does)"
        );
    }
    println!("{test}: skipped: {why}");
}
