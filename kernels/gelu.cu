// GELU, exact (erf) and tanh forms, forward and backward (CPU twin:
// src/ops/gelu/cpu.rs). Elementwise: each output element is written (`=`)
// by one thread; dx is written, never accumulated.
//
// Numerics: the CPU's f32 formulas, operation for operation: Φ(x) as a
// mirrored erfc(|x|/√2)/2 with erfc's Chebyshev fit, the tanh form as
// x σ(2u), every exp the CPU's own (range reduction and a degree-7
// polynomial), and e^(-x²/2) split as e^-h e^-d with h exact. Each
// operation is an _rn intrinsic, the polynomials' steps __fmaf_rn as the
// CPU fuses them (NVRTC would otherwise contract a*b+c as it likes), with
// no library function in between, so the results are the CPU's bits.
#include "common.cuh"

namespace {

constexpr float kK = 0.7978846f;
constexpr float kC = 0.044715f;
constexpr float kFrac1Sqrt2 = 0.70710678118654752440f;
constexpr float kFrac1Sqrt2Pi = 0.3989423f;
// erfc's coefficients, constant term first.
__device__ const float kErfc[10] = {-1.2655122f,  1.0000237f, 0.37409196f, 0.09678418f, -0.18628806f,
                                    0.27886807f, -1.135204f, 1.4885159f, -0.82215223f, 0.17087277f};

// x²/2 as h + d, h exact.
__device__ __forceinline__ void half_square(float x, float* h, float* d) {
  const float xh = __uint_as_float(__float_as_uint(x) & 0xFFFFF000u);
  *h = __fmul_rn(0.5f, __fmul_rn(xh, xh));
  const float dd = __fmul_rn(0.5f, __fmul_rn(__fsub_rn(x, xh), __fadd_rn(x, xh)));
  // ±∞ (and NaN) leave ∞ - ∞ in d: h alone then says what exp(-h) is.
  *d = dd != dd ? 0.0f : dd;
}

__device__ __forceinline__ float cdf(float x, float d, float exp_h) {
  const float z = __fmul_rn(fabsf(x), kFrac1Sqrt2);
  const float t = __fdiv_rn(1.0f, __fadd_rn(1.0f, __fmul_rn(0.5f, z)));
  float p = kErfc[9];
  for (int i = 8; i >= 0; --i) p = __fmaf_rn(p, t, kErfc[i]);
  const float half_erfc = __fmul_rn(0.5f, __fmul_rn(t, __fmul_rn(exp_h, ddp::exp_rn(__fsub_rn(p, d)))));
  return x <= 0.0f ? half_erfc : __fsub_rn(1.0f, half_erfc);
}

// σ(2u) and σ(-2u), u = K (x + C x³).
__device__ __forceinline__ void tanh_sigmoid(float x, float* s, float* rest) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kC, x), x), x);
  const float u = __fmul_rn(kK, __fadd_rn(x, cube));
  const float e = ddp::exp_rn(__fmul_rn(-2.0f, u));
  *s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  *rest = __fdiv_rn(1.0f, __fadd_rn(1.0f, __fdiv_rn(1.0f, e)));
}

__device__ __forceinline__ float gelu_value(float x, bool tanh_form) {
  if (tanh_form) {
    float s, rest;
    tanh_sigmoid(x, &s, &rest);
    return __fmul_rn(x, s);
  }
  float h, d;
  half_square(x, &h, &d);
  return __fmul_rn(x, cdf(x, d, ddp::exp_rn(-h)));
}

// d gelu / dx.
__device__ __forceinline__ float gelu_slope(float x, bool tanh_form) {
  if (tanh_form) {
    float s, rest;
    tanh_sigmoid(x, &s, &rest);
    // s + 2 x s rest K (1 + 3 C x x), left to right as the CPU.
    const float a = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(2.0f, x), s), rest), kK);
    const float poly = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kC, x), x));
    return __fadd_rn(s, __fmul_rn(a, poly));
  }
  float h, d;
  half_square(x, &h, &d);
  const float exp_h = ddp::exp_rn(-h);
  const float pdf = __fmul_rn(kFrac1Sqrt2Pi, __fmul_rn(exp_h, ddp::exp_rn(-d)));
  return __fadd_rn(cdf(x, d, exp_h), __fmul_rn(x, pdf));
}

}  // namespace

template <typename T>
__device__ void gelu_forward_impl(const T* x, T* y, long long n, int tanh_form) {
  DDP_FOR_EACH(i, n) { y[i] = ddp::from_f32<T>(gelu_value(ddp::to_f32(x[i]), tanh_form != 0)); }
}
DDP_INSTANTIATE(gelu_forward, (const T* x, T* y, long long n, int tanh_form), (x, y, n, tanh_form))

template <typename T>
__device__ void gelu_backward_impl(const T* x, const T* dy, T* dx, long long n, int tanh_form) {
  DDP_FOR_EACH(i, n) {
    const float slope = gelu_slope(ddp::to_f32(x[i]), tanh_form != 0);
    dx[i] = ddp::from_f32<T>(__fmul_rn(ddp::to_f32(dy[i]), slope));
  }
}
DDP_INSTANTIATE(gelu_backward, (const T* x, const T* dy, T* dx, long long n, int tanh_form),
                (x, dy, dx, n, tanh_form))
