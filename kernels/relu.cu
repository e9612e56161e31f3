// ReLU forward and backward (CPU twin: src/ops/relu/cpu.rs). The backward
// masks by the forward output, as PyTorch's threshold_backward does with
// the result tensor: y > 0 passes dy through.
#include "common.cuh"

template <typename T>
__device__ void relu_forward_impl(const T* x, T* y, long long n) {
  DDP_FOR_EACH(i, n) {
    float v = ddp::to_f32(x[i]);
    y[i] = ddp::from_f32<T>(v > 0.f ? v : 0.f);
  }
}
DDP_INSTANTIATE(relu_forward, (const T* x, T* y, long long n), (x, y, n))

template <typename T>
__device__ void relu_backward_impl(const T* y, const T* dy, T* dx, long long n) {
  DDP_FOR_EACH(i, n) {
    dx[i] = ddp::to_f32(y[i]) > 0.f ? dy[i] : ddp::from_f32<T>(0.f);
  }
}
DDP_INSTANTIATE(relu_backward, (const T* y, const T* dy, T* dx, long long n), (y, dy, dx, n))
