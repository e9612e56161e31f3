//! Checked kernel launches. A CUDA launch passes its arguments as an array of
//! untyped pointers, so a launcher that pushes them in the wrong order or with
//! the wrong width compiles, runs and silently reads garbage. Every launcher
//! goes through [`Launch`], which records the width of each argument it
//! pushes and, before launching, compares the list with the kernel's real
//! parameters as the driver reports them (`cuFuncGetParamInfo`, CUDA 12.4+):
//! a wrong count or width is an error naming the kernel and the argument.
//! (Two same-width arguments swapped still pass here; the emulated device
//! catches those, as a pointer argument that is not a device pointer.)

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg,
};

/// A kernel function with its parameter widths, queried once at load.
#[derive(Debug)]
pub struct Kernel {
    func: CudaFunction,
    name: String,
    /// Width in bytes of each parameter; `None` when the driver cannot say
    /// (older than CUDA 12.4), and then launches go unchecked.
    params: Option<Vec<usize>>,
}

impl Kernel {
    pub(crate) fn new(func: CudaFunction, name: &str) -> Kernel {
        let params = param_sizes(&func);
        Kernel { func, name: name.to_string(), params }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter widths the driver reports, if it can.
    pub fn params(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// Starts a launch of this kernel on `stream`.
    pub fn launch_on<'a>(&'a self, stream: &'a CudaStream) -> Launch<'a> {
        Launch { args: stream.launch_builder(&self.func), sizes: Vec::with_capacity(16), kernel: self }
    }
}

/// The widths of `func`'s parameters, or `None` when this driver has no
/// `cuFuncGetParamInfo` (cudarc would panic calling a missing symbol).
fn param_sizes(func: &CudaFunction) -> Option<Vec<usize>> {
    let has = |sym: &[u8]| {
        // SAFETY: looks a symbol up in the already loaded driver library.
        unsafe { sys::culib().get::<unsafe extern "C" fn()>(sym).is_ok() }
    };
    if !has(b"cuFuncGetParamInfo\0") {
        return None;
    }
    // With the count (CUDA 12.9+) no query runs past the last parameter:
    // each such probe is an API error that compute-sanitizer reports.
    // Looked up by hand: cudarc binds it only for CUDA 13.2+ headers, and
    // older drivers lack it (the H200's 580 driver, CUDA 13.0, did: there
    // each kernel's load still probes once past its last parameter).
    type ParamCount = unsafe extern "C" fn(sys::CUfunction, *mut usize) -> sys::CUresult;
    // SAFETY: the symbol, where present, has the driver API's signature above.
    let count = match unsafe { sys::culib().get::<ParamCount>(b"cuFuncGetParamCount\0") } {
        Ok(get_count) => {
            let mut n = 0usize;
            // SAFETY: a live function handle and an out-pointer to a live usize.
            match unsafe { get_count(func.cu_function(), &mut n) } {
                sys::CUresult::CUDA_SUCCESS => Some(n),
                _ => return None,
            }
        }
        Err(_) => None,
    };
    let mut sizes = Vec::new();
    // A kernel has at most a few dozen parameters; the bound keeps a driver
    // that never says "out of range" from looping forever.
    for i in 0..count.unwrap_or(256).min(256) {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a live function handle and two out-pointers to live usizes.
        let r = unsafe { sys::cuFuncGetParamInfo(func.cu_function(), i, &mut offset, &mut size) };
        match r {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            // Past the last parameter (probing, without the count).
            sys::CUresult::CUDA_ERROR_INVALID_VALUE if count.is_none() => return Some(sizes),
            _ => return None,
        }
    }
    count.map(|_| sizes)
}

/// Why a launch failed: its arguments do not match the kernel's signature, or
/// the driver refused it.
pub enum LaunchError {
    Signature(String),
    Driver(DriverError),
}

impl std::fmt::Debug for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Signature(m) => f.write_str(m),
            LaunchError::Driver(e) => write!(f, "{e:?}"),
        }
    }
}

/// One kernel launch being assembled: cudarc's builder plus the width of
/// every argument pushed.
pub struct Launch<'a> {
    args: LaunchArgs<'a>,
    sizes: Vec<usize>,
    kernel: &'a Kernel,
}

impl<'a> Launch<'a> {
    pub fn arg<A: ArgWidth>(&mut self, a: A) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<A>,
    {
        self.sizes.push(A::WIDTH);
        self.args.arg(a);
        self
    }

    /// Launches after checking the arguments against the kernel's parameters.
    ///
    /// # Safety
    /// As cudarc's `launch`: every pointer argument must be valid for what the
    /// kernel does with it over the whole grid.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), LaunchError> {
        if let Some(params) = &self.kernel.params {
            check_signature(&self.kernel.name, params, &self.sizes).map_err(LaunchError::Signature)?;
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.args.launch(cfg) }.map(|_| ()).map_err(LaunchError::Driver)
    }
}

/// `Err` naming the first difference between the kernel's parameter widths
/// and the pushed arguments' widths.
pub fn check_signature(kernel: &str, params: &[usize], pushed: &[usize]) -> Result<(), String> {
    if params.len() != pushed.len() {
        return Err(format!(
            "launch of kernel {kernel}: {} arguments pushed, but the kernel takes {} parameters",
            pushed.len(),
            params.len()
        ));
    }
    for (i, (&want, &got)) in params.iter().zip(pushed).enumerate() {
        if want != got {
            return Err(format!(
                "launch of kernel {kernel}: argument {i} is {got} bytes wide, but the kernel's parameter {i} \
                 is {want} bytes (arguments in the wrong order or of the wrong type)"
            ));
        }
    }
    Ok(())
}

/// The width in bytes a launch argument occupies in the kernel's parameter
/// block: the value's own size, or a device pointer's 8 for buffers.
pub trait ArgWidth {
    const WIDTH: usize;
}

macro_rules! value_width {
    ($($t:ty),*) => {$(
        impl ArgWidth for &$t {
            const WIDTH: usize = std::mem::size_of::<$t>();
        }
    )*};
}
value_width!(i32, u32, i64, u64, f32, f64, half::f16);

impl<T> ArgWidth for &CudaSlice<T> {
    const WIDTH: usize = std::mem::size_of::<sys::CUdeviceptr>();
}
impl<T> ArgWidth for &mut CudaSlice<T> {
    const WIDTH: usize = std::mem::size_of::<sys::CUdeviceptr>();
}
impl<T> ArgWidth for &CudaView<'_, T> {
    const WIDTH: usize = std::mem::size_of::<sys::CUdeviceptr>();
}
impl<T> ArgWidth for &mut CudaViewMut<'_, T> {
    const WIDTH: usize = std::mem::size_of::<sys::CUdeviceptr>();
}

#[cfg(test)]
mod tests {
    use super::check_signature;

    #[test]
    fn a_wrong_count_or_width_names_the_kernel_and_the_argument() {
        assert!(check_signature("k", &[8, 8, 4], &[8, 8, 4]).is_ok());
        let e = check_signature("amp_sumsq_partials", &[8, 8, 8], &[8, 8]).unwrap_err();
        assert!(e.contains("kernel amp_sumsq_partials: 2 arguments pushed, but the kernel takes 3"), "{e}");
        let e = check_signature("relu_forward_f32", &[8, 8, 8], &[8, 8, 4]).unwrap_err();
        assert!(e.contains("argument 2 is 4 bytes wide, but the kernel's parameter 2 is 8 bytes"), "{e}");
    }
}
