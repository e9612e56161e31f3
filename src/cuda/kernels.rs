//! Every `kernels/*.cu` and `*.cuh` file, embedded in the binary so a copied
//! `ddptrain` needs no source tree. A kernel file compiles on its own with
//! only these headers and the CUDA headers; the compile test checks that this
//! table and the `kernels/` folder list the same files.

/// (file name, source) of each kernel file, compiled one module per file.
pub const SOURCES: &[(&str, &str)] = &[
    ("relu.cu", include_str!("../../kernels/relu.cu")),
    ("batch_norm.cu", include_str!("../../kernels/batch_norm.cu")),
    ("amp.cu", include_str!("../../kernels/amp.cu")),
    ("optim.cu", include_str!("../../kernels/optim.cu")),
    ("cast.cu", include_str!("../../kernels/cast.cu")),
    ("max_pool2d.cu", include_str!("../../kernels/max_pool2d.cu")),
    ("cross_entropy.cu", include_str!("../../kernels/cross_entropy.cu")),
    ("conv2d.cu", include_str!("../../kernels/conv2d.cu")),
    ("linear.cu", include_str!("../../kernels/linear.cu")),
    ("data.cu", include_str!("../../kernels/data.cu")),
    ("ddp.cu", include_str!("../../kernels/ddp.cu")),
    ("avg_pool2d.cu", include_str!("../../kernels/avg_pool2d.cu")),
    ("add.cu", include_str!("../../kernels/add.cu")),
    ("dropout.cu", include_str!("../../kernels/dropout.cu")),
    ("layer_norm.cu", include_str!("../../kernels/layer_norm.cu")),
    ("gelu.cu", include_str!("../../kernels/gelu.cu")),
    ("embedding.cu", include_str!("../../kernels/embedding.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
];

/// (include name, source) of the headers the kernel files `#include "..."`.
pub const HEADERS: &[(&str, &str)] = &[("common.cuh", include_str!("../../kernels/common.cuh"))];

pub fn source(file: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == file).map(|(_, s)| *s)
}
