// f32 <-> f16 casts (CPU twin: half::f16::from_f32 / f16::to_f32, which the
// CPU tensors use in `into_dtype`). Finite values and infinities go through
// the hardware's round-to-nearest-even conversions, which agree with half's
// bit for bit (overflow past 65519.99 gives inf, subnormals round to even).
// NaN is the one place the two differ: the hardware returns a canonical NaN,
// half keeps the sign and the top payload bits, so NaNs are converted by
// hand to stay bit-identical with the CPU path.
#include "common.cuh"

__device__ __forceinline__ __half f32_to_f16_bits(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u) {
    unsigned short h = (unsigned short)(((u >> 16) & 0x8000u) | 0x7c00u | 0x0200u | ((u & 0x007fffffu) >> 13));
    return __ushort_as_half(h);
  }
  return __float2half_rn(x);
}

__device__ __forceinline__ float f16_to_f32_bits(__half h) {
  unsigned short b = __half_as_ushort(h);
  if ((b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0u) {
    unsigned int u = ((unsigned int)(b & 0x8000u) << 16) | 0x7fc00000u | ((unsigned int)(b & 0x03ffu) << 13);
    return __uint_as_float(u);
  }
  return __half2float(h);
}

extern "C" __global__ void cast_f32_to_f16(const float* src, __half* dst, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = f32_to_f16_bits(src[i]); }
}

extern "C" __global__ void cast_f16_to_f32(const __half* src, float* dst, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = f16_to_f32_bits(src[i]); }
}

// dst += f32(src): an f16 gradient accumulated into an f32 `.grad` (apex O1:
// conv and linear compute their gradients in f16, the fp32 weights' .grad
// sums them in f32). CPU twin: `accumulate_grad` in src/nn/mod.rs.
extern "C" __global__ void cast_f16_add_to_f32(const __half* src, float* dst, long long n) {
  DDP_FOR_EACH(i, n) { dst[i] = dst[i] + f16_to_f32_bits(src[i]); }
}

// dst[B, A, C] = src[A, B, C]: the two outer dimensions swapped, the inner
// one kept contiguous (a layout change, values copied bit for bit). The
// device conv2d uses it to view dy [N, O, HW] as one [O, N*HW] matrix.
// One thread per dst element, so the writes are coalesced.
template <typename T>
__device__ void swap_outer_impl(const T* src, T* dst, long long a, long long b, long long c) {
  DDP_FOR_EACH(i, a * b * c) {
    long long k = i % c;
    long long r = i / c;
    long long ai = r % a;
    long long bi = r / a;
    dst[i] = src[(ai * b + bi) * c + k];
  }
}
DDP_INSTANTIATE(swap_outer, (const T* src, T* dst, long long a, long long b, long long c), (src, dst, a, b, c))
