// Elementwise add (CPU twin: src/ops/add/cpu.rs): the residual connection's
// y = a + b (`=`: every y element overwritten) and gradient accumulation
// dst += src (`+=`: dst read, then overwritten, by the same thread). One
// f32 addition per element, f16 widened on load and rounded once on store,
// so results are the CPU's bits in both dtypes.
#include "common.cuh"

template <typename T>
__device__ void add_forward_impl(const T* a, const T* b, T* y, long long n) {
  DDP_FOR_EACH(i, n) { y[i] = ddp::from_f32<T>(ddp::to_f32(a[i]) + ddp::to_f32(b[i])); }
}
DDP_INSTANTIATE(add_forward, (const T* a, const T* b, T* y, long long n), (a, b, y, n))

template <typename T>
__device__ void add_accumulate_impl(T* dst, const T* src, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = ddp::from_f32<T>(ddp::to_f32(dst[i]) + ddp::to_f32(src[i])); }
}
DDP_INSTANTIATE(add_accumulate, (T* dst, const T* src, long long n), (dst, src, n))
