// GELU, exact (erf) and tanh forms, forward and backward (CPU twin:
// src/ops/gelu/cpu.rs). Elementwise: each output element is written (`=`)
// by one thread; dx is written, never accumulated.
//
// Numerics: as the CPU, the function and its slope are evaluated in f64 and
// rounded once to f32 (then to T on store); backward is dx = dy * slope with
// the slope rounded to f32 first, one f32 multiply. Every f64 operation the
// CPU rounds on its own is an _rn intrinsic (NVRTC contracts a*b+c into an
// FMA otherwise). erf, exp and tanh are the device's f64 functions (CUDA's:
// within 2 ulp of f64; the emulated device: the host's libm) against Rust's
// (libm's erf, the host's exp and tanh), so the rounded f32 results agree
// except where an f64 result lies within a few f64 ulp of an f32 rounding
// boundary: the parity test holds f32 to 1 f32 ulp, f16 to its rounding.
#include "common.cuh"

namespace {

// The CPU's constants, to f64's precision: √(2/π), the cubic coefficient,
// 1/√2 and 2/√π.
constexpr double kK = 0.7978845608028654;
constexpr double kC = 0.044715;
constexpr double kFrac1Sqrt2 = 0.70710678118654752440;
constexpr double kFrac2SqrtPi = 1.12837916709551257390;

__device__ __forceinline__ double gelu_value(double x, bool tanh_form) {
  if (tanh_form) {
    // K * (x + C * x * x * x), left to right as the CPU.
    const double cube = __dmul_rn(__dmul_rn(__dmul_rn(kC, x), x), x);
    const double t = tanh(__dmul_rn(kK, __dadd_rn(x, cube)));
    return __dmul_rn(__dmul_rn(0.5, x), __dadd_rn(1.0, t));
  }
  return __dmul_rn(__dmul_rn(0.5, x), __dadd_rn(1.0, erf(__dmul_rn(x, kFrac1Sqrt2))));
}

// d gelu / dx.
__device__ __forceinline__ double gelu_slope(double x, bool tanh_form) {
  if (tanh_form) {
    const double cube = __dmul_rn(__dmul_rn(__dmul_rn(kC, x), x), x);
    const double t = tanh(__dmul_rn(kK, __dadd_rn(x, cube)));
    // 0.5 (1 + t) + 0.5 x (1 - t t) K (1 + 3 C x x)
    const double left = __dmul_rn(0.5, __dadd_rn(1.0, t));
    const double poly = __dadd_rn(1.0, __dmul_rn(__dmul_rn(__dmul_rn(3.0, kC), x), x));
    const double right =
        __dmul_rn(__dmul_rn(__dmul_rn(__dmul_rn(0.5, x), __dsub_rn(1.0, __dmul_rn(t, t))), kK), poly);
    return __dadd_rn(left, right);
  }
  // Φ(x) + x φ(x)
  const double cdf = __dmul_rn(0.5, __dadd_rn(1.0, erf(__dmul_rn(x, kFrac1Sqrt2))));
  const double e = exp(__dmul_rn(__dmul_rn(-0.5, x), x));
  const double pdf = __dmul_rn(__dmul_rn(__dmul_rn(e, 0.5), kFrac2SqrtPi), kFrac1Sqrt2);
  return __dadd_rn(cdf, __dmul_rn(x, pdf));
}

}  // namespace

template <typename T>
__device__ void gelu_forward_impl(const T* x, T* y, long long n, int tanh_form) {
  DDP_FOR_EACH(i, n) {
    const double v = (double)ddp::to_f32(x[i]);
    y[i] = ddp::from_f32<T>(__double2float_rn(gelu_value(v, tanh_form != 0)));
  }
}
DDP_INSTANTIATE(gelu_forward, (const T* x, T* y, long long n, int tanh_form), (x, y, n, tanh_form))

template <typename T>
__device__ void gelu_backward_impl(const T* x, const T* dy, T* dx, long long n, int tanh_form) {
  DDP_FOR_EACH(i, n) {
    const float slope = __double2float_rn(gelu_slope((double)ddp::to_f32(x[i]), tanh_form != 0));
    dx[i] = ddp::from_f32<T>(__fmul_rn(ddp::to_f32(dy[i]), slope));
  }
}
DDP_INSTANTIATE(gelu_backward, (const T* x, const T* dy, T* dx, long long n, int tanh_form),
                (x, dy, dx, n, tanh_form))
