//! Every `kernels/*.cu` and `*.cuh` file, embedded in the binary so a copied
//! `ddptrain` needs no source tree. A kernel file compiles on its own with
//! only these headers and the CUDA headers; the compile test checks that this
//! table and the `kernels/` folder list the same files.

/// (file name, source) of each kernel file, compiled one module per file.
pub const SOURCES: &[(&str, &str)] = &[
    ("linear.cu", include_str!("../../kernels/linear.cu")),
    ("relu.cu", include_str!("../../kernels/relu.cu")),
];

/// (include name, source) of the headers the kernel files `#include "..."`.
pub const HEADERS: &[(&str, &str)] = &[("common.cuh", include_str!("../../kernels/common.cuh"))];

pub fn source(file: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == file).map(|(_, s)| *s)
}
