//! Every `kernels/*.cu` and `*.cuh` file, embedded in the binary so a copied
//! `ddptrain` needs no source tree. A kernel file compiles on its own with
//! only these headers and the CUDA headers. build.rs lists the folder, so a
//! new kernel file is embedded by being there; the compile test checks that
//! the table and the folder agree.

// SOURCES: (file name, source) of each kernel file, compiled one module per
// file, in file name order. HEADERS: (include name, source) of the headers
// the kernel files `#include "..."`. Both written by build.rs from kernels/.
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

pub fn source(file: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == file).map(|(_, s)| *s)
}
