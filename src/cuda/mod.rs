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
pub mod emu;
pub mod kernels;
pub mod launch;
pub mod nccl;
pub mod nvrtc;
pub mod select;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests_fault;

pub use elem::{as_i64, check_len, DeviceFloat, Rows};
pub use launch::Kernel;

use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaModule, CudaStream, LaunchConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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

/// Total memory of visible device `ordinal`, in bytes, without opening a
/// context on it (the run's memory estimate is checked before that).
pub fn total_memory(ordinal: usize) -> Result<u64> {
    if ordinal >= device_count() {
        return Err(Error::Unsupported(format!("CUDA device {ordinal} is not visible")));
    }
    let ordinal = i32::try_from(ordinal).map_err(|_| Error::Unsupported(format!("CUDA device {ordinal}")))?;
    let dev = cudarc::driver::result::device::get(ordinal).map_err(|e| Error::cuda("cuDeviceGet", e))?;
    // SAFETY: `dev` comes from cuDeviceGet after device_count() initialized the driver.
    let bytes = unsafe { cudarc::driver::result::device::total_mem(dev) }
        .map_err(|e| Error::cuda("cuDeviceTotalMem", e))?;
    Ok(bytes as u64)
}

/// A grid-stride launch over `n` elements: enough blocks to fill the device,
/// capped because the kernels loop (`DDP_FOR_EACH`).
pub fn launch_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// A launch of one warp a row, for the kernels that reduce a row with one
/// warp (kernels/common.cuh: `DDP_FOR_EACH_ROW`); their row loop strides, so
/// the capped grid covers any row count.
pub fn launch_rows(rows: usize) -> LaunchConfig {
    launch_1d(rows.saturating_mul(32))
}

/// Kernel entry points one process can name: the length of every [`Gpu`]'s
/// handle table (the kernels/*.cu files declare about 60).
pub const MAX_KERNELS: usize = 256;

/// Slots handed out so far, one per [`KernelFn`] on its first use.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// One kernel entry point, declared once as a `static` beside its launcher.
/// Its first use takes a slot in every [`Gpu`]'s handle table, so a launch
/// finds its function with an atomic load and an index: no name is formatted
/// and no lock is taken per launch.
#[derive(Debug)]
pub struct KernelFn {
    file: &'static str,
    name: &'static str,
    slot: OnceLock<usize>,
}

impl KernelFn {
    pub const fn new(file: &'static str, name: &'static str) -> KernelFn {
        KernelFn { file, name, slot: OnceLock::new() }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    fn slot(&self) -> usize {
        *self.slot.get_or_init(|| NEXT_SLOT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The `_f32` and `_f16` instantiations of one `DDP_INSTANTIATE`d kernel
/// (see [`typed_kernel!`]); [`DeviceFloat::pick`] chooses one.
#[derive(Debug)]
pub struct TypedKernelFn {
    pub f32: KernelFn,
    pub f16: KernelFn,
}

/// `typed_kernel!("relu.cu", "relu_forward")`: the pair of entry points
/// `relu_forward_f32` and `relu_forward_f16`, for a `static`.
#[macro_export]
macro_rules! typed_kernel {
    ($file:expr, $op:literal) => {
        $crate::cuda::TypedKernelFn {
            f32: $crate::cuda::KernelFn::new($file, concat!($op, "_f32")),
            f16: $crate::cuda::KernelFn::new($file, concat!($op, "_f16")),
        }
    };
}

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `sm_XY` of this device: kernels compile to a cubin for it (no JIT, and
    /// no PTX newer than the driver can read), or to `compute_XY` PTX when
    /// this NVRTC cannot build that cubin or the driver refuses it.
    arch: String,
    name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Loaded kernels by [`KernelFn`] slot, filled on first launch.
    kernels: Box<[OnceLock<Kernel>]>,
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
        // Cross-stream order is ours to state with events (the reducer's
        // hand-off to the communication stream and back), as in PyTorch.
        // cudarc's automatic tracking would record an event per buffer
        // argument of every launch and make streams wait on them: driver
        // calls per launch, and it would hide a missing hand-off event from
        // the emulated device's race checker.
        // SAFETY: before any allocation of this context; every buffer used
        // on two streams is ordered by the reducer's events (see
        // dist::cuda::reducer), which the emulated device checks.
        unsafe { ctx.disable_event_tracking() };
        // Not the legacy default stream: that one waits for every other
        // stream, so the communication stream could never overlap backward.
        let stream = ctx.new_stream().map_err(|e| Error::cuda("creating the compute stream", e))?;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            name,
            modules: Mutex::new(HashMap::new()),
            kernels: (0..MAX_KERNELS).map(|_| OnceLock::new()).collect(),
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

    /// Kernel `k`, compiling and loading its file on first use (once per
    /// process); later calls are an atomic load.
    pub fn kernel(&self, k: &'static KernelFn) -> Result<&Kernel> {
        let cell = self.kernels.get(k.slot()).ok_or_else(|| Error::Cuda {
            op: format!("kernel {}", k.name),
            msg: format!("more than {MAX_KERNELS} kernel entry points: raise cuda::MAX_KERNELS"),
        })?;
        if let Some(f) = cell.get() {
            return Ok(f);
        }
        let loaded = self.load_kernel(k.file, k.name)?;
        // Another thread may have loaded it meanwhile: either copy serves.
        let _ = cell.set(loaded);
        cell.get().ok_or_else(|| Error::Cuda {
            op: format!("kernel {}", k.name),
            msg: "handle table lost an entry".into(),
        })
    }

    /// `kernels/<file>` as a cubin for this device, else as PTX for its
    /// virtual architecture. A driver older than the NVRTC rejects the newer
    /// PTX (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) but still loads a cubin.
    fn load_module(&self, file: &'static str) -> Result<Arc<CudaModule>> {
        let cubin = nvrtc::compile(file, &self.arch).and_then(|out| {
            let image = match out {
                nvrtc::Output::Cubin(b) => cudarc::nvrtc::Ptx::from_binary(b),
                nvrtc::Output::Ptx(p) => cudarc::nvrtc::Ptx::from_src(p),
            };
            self.ctx
                .load_module(image)
                .map_err(|e| Error::cuda(format!("loading the kernels/{file} cubin"), e))
        });
        let cubin_err = match cubin {
            Ok(m) => return Ok(m),
            Err(e) => e,
        };
        let virt = self.arch.replacen("sm_", "compute_", 1);
        let ptx = match nvrtc::compile(file, &virt)? {
            nvrtc::Output::Ptx(p) => cudarc::nvrtc::Ptx::from_src(p),
            nvrtc::Output::Cubin(b) => cudarc::nvrtc::Ptx::from_binary(b),
        };
        self.ctx.load_module(ptx).map_err(|e| Error::Cuda {
            op: format!("loading kernels/{file}"),
            msg: format!("{e:?} as {virt} PTX; as an {} cubin: {cubin_err}", self.arch),
        })
    }

    fn load_kernel(&self, file: &'static str, name: &str) -> Result<Kernel> {
        let module = {
            let mut modules =
                self.modules.lock().map_err(|_| Error::cuda("kernel cache", "poisoned by a panic"))?;
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let m = self.load_module(file)?;
                    modules.insert(file, m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| Error::cuda(format!("kernel {name} in kernels/{file}"), e))?;
        Ok(Kernel::new(f, name))
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

#[cfg(test)]
mod tests {
    use super::KernelFn;

    static RELU_F32: KernelFn = KernelFn::new("relu.cu", "relu_forward_f32");
    static RELU_F16: KernelFn = KernelFn::new("relu.cu", "relu_forward_f16");

    /// Kernels load from a cubin for the device's own sm_XY (the emulated
    /// NVRTC returns the same bytes for it), and a second look-up of a
    /// kernel is the handle loaded by the first, in its own slot.
    #[test]
    fn kernels_load_for_the_devices_sm_and_are_looked_up_once() {
        let Some(gpu) = super::test_gpu("kernels_load_for_the_devices_sm_and_are_looked_up_once") else {
            return;
        };
        let (major, minor) = gpu.ctx().compute_capability().unwrap();
        assert_eq!(gpu.arch(), format!("sm_{major}{minor}"));
        let a = gpu.kernel(&RELU_F32).unwrap();
        assert_eq!(a.name(), "relu_forward_f32");
        assert!(std::ptr::eq(a, gpu.kernel(&RELU_F32).unwrap()));
        let b = gpu.kernel(&RELU_F16).unwrap();
        assert_eq!(b.name(), "relu_forward_f16");
        assert_ne!(RELU_F32.slot(), RELU_F16.slot());
    }
}
