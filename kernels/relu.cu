// ReLU forward and backward (CPU twin: src/ops/relu/cpu.rs). Both follow
// the CPU's comparisons exactly, so special values agree: the forward
// zeroes only `x < 0` (NaN and -0 pass through unchanged, as in torch.relu),
// and the backward masks by the forward output the way PyTorch's
// threshold_backward does with the result tensor: `y <= 0` drops the
// gradient, anything else (including a NaN output) passes dy through.
// In-place use (y == x, dx == dy) is allowed: each element is read before
// it is written, by the same thread.
#include "common.cuh"

template <typename T>
__device__ void relu_forward_impl(const T* x, T* y, long long n) {
  DDP_FOR_EACH(i, n) {
    T v = x[i];
    y[i] = ddp::to_f32(v) < 0.f ? ddp::from_f32<T>(0.f) : v;
  }
}
DDP_INSTANTIATE(relu_forward, (const T* x, T* y, long long n), (x, y, n))

template <typename T>
__device__ void relu_backward_impl(const T* y, const T* dy, T* dx, long long n) {
  DDP_FOR_EACH(i, n) {
    dx[i] = ddp::to_f32(y[i]) <= 0.f ? ddp::from_f32<T>(0.f) : dy[i];
  }
}
DDP_INSTANTIATE(relu_backward, (const T* y, const T* dy, T* dx, long long n), (y, dy, dx, n))
