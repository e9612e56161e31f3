// Element-wise arithmetic of the emulated NCCL reductions, on the host.
//
// Rounding follows what NCCL's kernels do per element: every pairwise
// operation is rounded to the element type. For f16/bf16 the operands are
// widened to double, where a sum or product of two such values is exact, and
// the result is rounded once to the 16-bit type (round to nearest even) - the
// same value as __hadd/__hmul. f32/f64 use native float/double arithmetic
// (SSE, no fused multiply-add, no -ffast-math). Integers wrap (computed as
// unsigned, so there is no undefined overflow).
//
// Max/min of floats propagate NaN (stricter than fmaxf: a NaN gradient on one
// rank must not disappear in the reduction).
#include <cmath>
#include <cstring>
#include <type_traits>

#include "nccl_internal.h"

namespace cuemu_nccl {

namespace {

// Rounds x to a binary format with `mant` stored mantissa bits and `expb`
// exponent bits (IEEE layout, no sign), round to nearest even, and returns its
// bit pattern with the sign at bit mant+expb.
uint32_t round_small(double x, int mant, int expb) {
  const uint32_t sign = std::signbit(x) ? (1u << (mant + expb)) : 0;
  const uint32_t exp_all = (1u << expb) - 1;
  if (std::isnan(x)) return sign | (exp_all << mant) | (1u << (mant - 1));  // quiet NaN
  double a = std::fabs(x);
  const int bias = (1 << (expb - 1)) - 1;
  const int emin = 1 - bias, emax = bias;
  if (std::isinf(a)) return sign | (exp_all << mant);
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);
  int E = e - 1;  // a = 1.f * 2^E
  if (E < emin) E = emin;  // subnormal range: fixed quantum
  double quantum = std::ldexp(1.0, E - mant);
  double r = std::nearbyint(a / quantum);  // exact scaling; RNE (default rounding mode)
  double v = r * quantum;
  if (v >= std::ldexp(1.0, emax + 1)) return sign | (exp_all << mant);  // overflow -> inf
  if (v < std::ldexp(1.0, emin)) return sign | static_cast<uint32_t>(r);  // subnormal (or 0)
  std::frexp(v, &e);
  int Ev = e - 1;
  uint32_t frac = static_cast<uint32_t>(std::ldexp(v, mant - Ev)) - (1u << mant);
  return sign | (static_cast<uint32_t>(Ev + bias) << mant) | frac;
}

double widen_small(uint32_t h, int mant, int expb) {
  const uint32_t exp_all = (1u << expb) - 1;
  const int bias = (1 << (expb - 1)) - 1;
  bool neg = (h >> (mant + expb)) & 1;
  uint32_t ex = (h >> mant) & exp_all;
  uint32_t fr = h & ((1u << mant) - 1);
  double v;
  if (ex == exp_all) v = fr ? NAN : INFINITY;
  else if (ex == 0) v = std::ldexp(static_cast<double>(fr), 1 - bias - mant);
  else v = std::ldexp(static_cast<double>(fr | (1u << mant)), static_cast<int>(ex) - bias - mant);
  return neg ? -v : v;
}

template <typename T> T op_float(int op, T a, T b) {
  switch (op) {
    case kRedProd: return a * b;
    case kRedMax: return (std::isnan(a) || std::isnan(b)) ? NAN : (a > b ? a : b);
    case kRedMin: return (std::isnan(a) || std::isnan(b)) ? NAN : (a < b ? a : b);
    default: return a + b;
  }
}

template <typename T> T op_int(int op, T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  switch (op) {
    case kRedProd: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case kRedMax: return a > b ? a : b;
    case kRedMin: return a < b ? a : b;
    default: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
}

template <typename T> void combine_int(int op, void* acc, const void* in, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; i++) a[i] = op_int<T>(op, a[i], b[i]);
}

template <typename T> void combine_flt(int op, void* acc, const void* in, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; i++) a[i] = op_float<T>(op, a[i], b[i]);
}

// f16/bf16: widen both, operate exactly in double, round once.
template <uint16_t (*Narrow)(double), double (*Widen)(uint16_t)>
void combine_16(int op, void* acc, const void* in, size_t n) {
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < n; i++) a[i] = Narrow(op_float<double>(op, Widen(a[i]), Widen(b[i])));
}

template <typename T> void premul_int(void* dst, const void* src, size_t n, uint64_t s) {
  T k;
  std::memcpy(&k, &s, sizeof k);
  using U = typename std::make_unsigned<T>::type;
  const T* x = static_cast<const T*>(src);
  T* y = static_cast<T*>(dst);
  for (size_t i = 0; i < n; i++) y[i] = static_cast<T>(static_cast<U>(x[i]) * static_cast<U>(k));
}

template <typename T> void premul_flt(void* dst, const void* src, size_t n, uint64_t s) {
  T k;
  std::memcpy(&k, &s, sizeof k);
  const T* x = static_cast<const T*>(src);
  T* y = static_cast<T*>(dst);
  for (size_t i = 0; i < n; i++) y[i] = x[i] * k;
}

template <uint16_t (*Narrow)(double), double (*Widen)(uint16_t)>
void premul_16(void* dst, const void* src, size_t n, uint64_t s) {
  double k = Widen(static_cast<uint16_t>(s));
  const uint16_t* x = static_cast<const uint16_t*>(src);
  uint16_t* y = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; i++) y[i] = Narrow(Widen(x[i]) * k);
}

template <typename T> void divide_int(void* acc, size_t n, int d) {
  T* a = static_cast<T*>(acc);
  for (size_t i = 0; i < n; i++) a[i] = static_cast<T>(a[i] / static_cast<T>(d));
}

}  // namespace

uint16_t f16_from_double(double x) { return static_cast<uint16_t>(round_small(x, 10, 5)); }
double f16_to_double(uint16_t h) { return widen_small(h, 10, 5); }
uint16_t bf16_from_double(double x) { return static_cast<uint16_t>(round_small(x, 7, 8)); }
double bf16_to_double(uint16_t h) { return widen_small(h, 7, 8); }

bool dtype_is_float(int dtype) {
  return dtype == ncclFloat16 || dtype == ncclFloat32 || dtype == ncclFloat64 || dtype == ncclBfloat16;
}

void combine(int dtype, int op, void* acc, const void* in, size_t n) {
  switch (dtype) {
    case ncclInt8: return combine_int<int8_t>(op, acc, in, n);
    case ncclUint8: return combine_int<uint8_t>(op, acc, in, n);
    case ncclInt32: return combine_int<int32_t>(op, acc, in, n);
    case ncclUint32: return combine_int<uint32_t>(op, acc, in, n);
    case ncclInt64: return combine_int<int64_t>(op, acc, in, n);
    case ncclUint64: return combine_int<uint64_t>(op, acc, in, n);
    case ncclFloat32: return combine_flt<float>(op, acc, in, n);
    case ncclFloat64: return combine_flt<double>(op, acc, in, n);
    case ncclFloat16: return combine_16<f16_from_double, f16_to_double>(op, acc, in, n);
    case ncclBfloat16: return combine_16<bf16_from_double, bf16_to_double>(op, acc, in, n);
  }
}

void premul(int dtype, void* dst, const void* src, size_t n, uint64_t s) {
  switch (dtype) {
    case ncclInt8: return premul_int<int8_t>(dst, src, n, s);
    case ncclUint8: return premul_int<uint8_t>(dst, src, n, s);
    case ncclInt32: return premul_int<int32_t>(dst, src, n, s);
    case ncclUint32: return premul_int<uint32_t>(dst, src, n, s);
    case ncclInt64: return premul_int<int64_t>(dst, src, n, s);
    case ncclUint64: return premul_int<uint64_t>(dst, src, n, s);
    case ncclFloat32: return premul_flt<float>(dst, src, n, s);
    case ncclFloat64: return premul_flt<double>(dst, src, n, s);
    case ncclFloat16: return premul_16<f16_from_double, f16_to_double>(dst, src, n, s);
    case ncclBfloat16: return premul_16<bf16_from_double, bf16_to_double>(dst, src, n, s);
  }
}

void divide(int dtype, void* acc, size_t n, int d) {
  switch (dtype) {
    case ncclInt8: return divide_int<int8_t>(acc, n, d);
    case ncclUint8: return divide_int<uint8_t>(acc, n, d);
    case ncclInt32: return divide_int<int32_t>(acc, n, d);
    case ncclUint32: return divide_int<uint32_t>(acc, n, d);
    case ncclInt64: return divide_int<int64_t>(acc, n, d);
    case ncclUint64: return divide_int<uint64_t>(acc, n, d);
  }
}

uint64_t avg_scalar(int dtype, int nranks) {
  uint64_t bits = 0;
  float f = static_cast<float>(1.0 / nranks);
  switch (dtype) {
    case ncclFloat32: std::memcpy(&bits, &f, 4); break;
    case ncclFloat64: {
      double d = 1.0 / nranks;
      std::memcpy(&bits, &d, 8);
      break;
    }
    case ncclFloat16: bits = f16_from_double(f); break;
    case ncclBfloat16: bits = bf16_from_double(f); break;
  }
  return bits;
}

}  // namespace cuemu_nccl
