//! NVRTC compilation of `kernels/*.cu`. cudarc's safe `compile_ptx` cannot
//! pass headers, and a copied binary has no `kernels/` folder beside it, so
//! the program is created through the raw bindings with our own headers
//! (`kernels/*.cuh`, embedded in the binary) handed to NVRTC in memory. Only the
//! CUDA headers (`cuda_fp16.h`) come from disk: see [`cuda_include_dirs`].

use super::kernels;
use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// Folders that hold `cuda_fp16.h`, first match wins: `DDPTRAIN_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, the `include` beside any
/// `LD_LIBRARY_PATH` entry that holds libnvrtc (the layout of the PyPI
/// `nvidia-cuda-nvrtc`/`nvidia-cuda-runtime` wheels and of the toolkit), and
/// `/usr/local/cuda/include`.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("DDPTRAIN_CUDA_INCLUDE") {
        candidates.extend(std::env::split_paths(&d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            candidates.push(Path::new(&d).join("include"));
        }
    }
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        for lib in std::env::split_paths(&paths) {
            let has_nvrtc = std::fs::read_dir(&lib)
                .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libnvrtc.so")))
                .unwrap_or(false);
            if has_nvrtc {
                if let Some(parent) = lib.parent() {
                    candidates.push(parent.join("include"));
                }
            }
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.into_iter().filter(|d| d.join("cuda_fp16.h").is_file()).take(1).collect()
}

/// What NVRTC produces: PTX for a virtual arch (`compute_90`, what the runtime
/// loads and the driver JITs), a cubin for a real one (`sm_90`).
pub enum Output {
    Ptx(String),
    Cubin(Vec<u8>),
}

/// The NVRTC version, e.g. (13, 0).
pub fn version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live ints.
    check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

fn check(op: &str, r: sys::nvrtcResult) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(op, r))
    }
}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::cuda(what, "contains a NUL byte"))
}

/// Frees the program on every path out of [`compile`].
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// Compiles one kernel file (a name from [`kernels::SOURCES`]) for `arch`
/// (`compute_XY` gives PTX, `sm_XY` a cubin).
pub fn compile(file: &str, arch: &str) -> Result<Output> {
    let source = kernels::source(file)
        .ok_or_else(|| Error::cuda("nvrtc", format!("no kernel file kernels/{file} in this build")))?;
    compile_source(file, source, arch)
}

/// Compiles `source` as if it were `kernels/<file>` (tests use it to see the
/// error a broken kernel gives).
pub fn compile_source(file: &str, source: &str, arch: &str) -> Result<Output> {
    let src = cstring(file, source)?;
    let name = cstring(file, file)?;
    let headers: Vec<(CString, CString)> =
        kernels::HEADERS.iter().map(|(n, s)| Ok((cstring(n, s)?, cstring(n, n)?))).collect::<Result<_>>()?;
    let header_src: Vec<*const c_char> = headers.iter().map(|(s, _)| s.as_ptr()).collect();
    let header_names: Vec<*const c_char> = headers.iter().map(|(_, n)| n.as_ptr()).collect();

    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        // Fast math would change rounding against the CPU twins.
        "--fmad=true".to_string(),
    ];
    let includes = cuda_include_dirs();
    for d in &includes {
        opts.push(format!("--include-path={}", d.display()));
    }
    let opts_c: Vec<CString> = opts.iter().map(|o| cstring("nvrtc option", o)).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts_c.iter().map(|o| o.as_ptr()).collect();

    let mut raw = std::ptr::null_mut();
    // SAFETY: every pointer is to a live NUL-terminated CString held above.
    check("nvrtcCreateProgram", unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as i32,
            header_src.as_ptr(),
            header_names.as_ptr(),
        )
    })?;
    let prog = Program(raw);
    // SAFETY: as above; the option strings outlive the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let mut log = program_log(&prog).unwrap_or_else(|e| format!("(no log: {e})"));
        if includes.is_empty() && log.contains("cuda_fp16.h") {
            log.push_str(
                "\nhint: no folder with cuda_fp16.h was found; set DDPTRAIN_CUDA_INCLUDE or CUDA_HOME, or put \
                 the nvidia-cuda-runtime wheel's lib folder on LD_LIBRARY_PATH",
            );
        }
        return Err(Error::Nvrtc { file: file.to_string(), arch: arch.to_string(), log });
    }
    if arch.starts_with("sm_") {
        let mut size = 0usize;
        // SAFETY: out-pointer to a live usize.
        check("nvrtcGetCUBINSize", unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) })?;
        let mut buf = vec![0u8; size];
        // SAFETY: buf holds exactly the size NVRTC reported.
        check("nvrtcGetCUBIN", unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char) })?;
        Ok(Output::Cubin(buf))
    } else {
        let mut size = 0usize;
        // SAFETY: out-pointer to a live usize.
        check("nvrtcGetPTXSize", unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) })?;
        let mut buf = vec![0u8; size];
        // SAFETY: buf holds exactly the size NVRTC reported.
        check("nvrtcGetPTX", unsafe { sys::nvrtcGetPTX(prog.0, buf.as_mut_ptr() as *mut c_char) })?;
        let ptx = CStr::from_bytes_until_nul(&buf)
            .map_err(|_| Error::cuda("nvrtcGetPTX", "PTX without a terminating NUL"))?;
        Ok(Output::Ptx(ptx.to_string_lossy().into_owned()))
    }
}

fn program_log(prog: &Program) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: out-pointer to a live usize.
    check("nvrtcGetProgramLogSize", unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) })?;
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: buf holds at least the size NVRTC reported.
    check("nvrtcGetProgramLog", unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) })?;
    Ok(CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default())
}
