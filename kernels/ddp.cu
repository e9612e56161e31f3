// DDP gradient-bucket arithmetic, run on the communication stream around the
// all-reduce (CPU twin: src/dist/reducer.rs, `scale_into` in Reducer::mark_ready
// and Reducer::finish): apex's predivision by gradient_predivide_factor before
// the sum and the predivide/world factor after it, each a product in f32
// rounded once into the buffer's dtype (__float2half_rn, as half::f16::from_f32).
// The multiplies are __fmul_rn so no contraction can change a rounding.
#include "common.cuh"

// x = x * s in place.
template <typename T>
__device__ void ddp_scale_impl(T* x, float s, long long n) {
  DDP_FOR_EACH(i, n) { x[i] = ddp::from_f32<T>(__fmul_rn(ddp::to_f32(x[i]), s)); }
}
DDP_INSTANTIATE(ddp_scale, (T* x, float s, long long n), (x, s, n))

// allreduce_fp32 of an f16 bucket, on the way in: dst = f32(src) * s, the
// f32 copy that is reduced (apex's allreduce_always_fp32 widens, then predivides).
extern "C" __global__ void ddp_widen_scale_f16(const __half* src, float* dst, float s, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = __fmul_rn(__half2float(src[i]), s); }
}

// allreduce_fp32 of an f16 bucket, on the way back: dst = f16(src * s),
// rounded once.
extern "C" __global__ void ddp_narrow_scale_f16(const float* src, __half* dst, float s, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = __float2half_rn(__fmul_rn(src[i], s)); }
}

// x[i] = v for every i (the testing hook that puts an inf into one rank's
// bucket, as if its backward had overflowed).
template <typename T>
__device__ void ddp_fill_impl(T* x, float v, long long n) {
  DDP_FOR_EACH(i, n) { x[i] = ddp::from_f32<T>(v); }
}
DDP_INSTANTIATE(ddp_fill, (T* x, float v, long long n), (x, v, n))
