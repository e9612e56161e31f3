// Shared by every kernel file: the element types and their f32 conversions.
// Kernels are templates over `float` and `__half`; all arithmetic runs in
// f32 (load -> to_f32 -> compute -> from_f32 -> store), which is the CPU
// twins' "widen, f32 kernel, round" contract.
#pragma once
#include <cuda_fp16.h>

namespace ddp {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
// Round to nearest even, as half::f16::from_f32 does on the CPU.
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// Grid-stride loop index: one launch covers any n with a capped grid.
#define DDP_FOR_EACH(i, n) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)(n); \
       i += (long long)blockDim.x * gridDim.x)

// Row kernels that reduce a row with one warp (layer_norm.cu, attention.cu):
// a launch of 32 threads a row in blocks of whole warps. The row loop is the
// same for all of a warp's lanes, so every shuffle has all 32.
#define DDP_FOR_EACH_ROW(r, lane, rows)                                                         \
  for (long long r = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5),            \
                 lane = threadIdx.x & 31;                                                       \
       r < (long long)(rows); r += (long long)gridDim.x * (blockDim.x >> 5))

// A row's sum over one warp: lane l has summed the columns l, l + 32, ... in
// order, and the lanes' sums are added in a butterfly (i with i ^ 16, then
// ^ 8, ..., ^ 1), after which every lane holds the same bits (a + b ==
// b + a). The CPU twins sum in this order (src/ops/warp_order.rs).
__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The row's max, every lane holding it (fmaxf is exact in any order).
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// e^x as the CPU kernels compute it (src/ops/exp.rs): 2^k e^r with
// k = floor(x log2 e + 1/2), r = x - k ln 2 in two exact steps, e^r by its
// Taylor polynomial of degree 7 in fused multiply-adds; 0 below -87,
// infinity above 88. Each operation is an _rn intrinsic (NVRTC would
// otherwise contract some a*b+c into FMAs the CPU does not do, or not
// contract the ones it does), so the results are the CPU's bits.
__device__ __forceinline__ float exp_rn(float x) {
  constexpr float kLog2E = 1.44269504088896340736f;
  constexpr float kLn2Hi = 0.69314575f;
  constexpr float kLn2Lo = 1.4286068e-6f;
  // Clamped as Rust's f32::clamp: a NaN stays NaN.
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float k = floorf(__fadd_rn(__fmul_rn(xc, kLog2E), 0.5f));
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(k, kLn2Hi)), __fmul_rn(k, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = __fmaf_rn(p, r, 1.0f / 720.0f);
  p = __fmaf_rn(p, r, 1.0f / 120.0f);
  p = __fmaf_rn(p, r, 1.0f / 24.0f);
  p = __fmaf_rn(p, r, 1.0f / 6.0f);
  p = __fmaf_rn(p, r, 0.5f);
  p = __fmaf_rn(p, r, 1.0f);
  p = __fmaf_rn(p, r, 1.0f);
  // NaN's k converts to some integer; p is NaN then, and so the product.
  const float v = __fmul_rn(p, __int_as_float(((int)k + 127) << 23));
  return x < -87.0f ? 0.0f : (x > 88.0f ? __int_as_float(0x7f800000) : v);
}

}  // namespace ddp

// One extern "C" entry point per element type, named <name>_f32 / <name>_f16,
// so Rust looks functions up by a plain string. `params` may use `T` for the
// element type; `args` forwards them to the template `<name>_impl<T>`.
#define DDP_INSTANTIATE(name, params, args)                                   \
  namespace ddp_inst_f32 {                                                    \
  using T = float;                                                            \
  extern "C" __global__ void name##_f32 params { name##_impl<T> args; }       \
  }                                                                           \
  namespace ddp_inst_f16 {                                                    \
  using T = __half;                                                           \
  extern "C" __global__ void name##_f16 params { name##_impl<T> args; }       \
  }
