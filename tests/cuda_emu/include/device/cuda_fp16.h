// The emulated device's cuda_fp16.h: __half / __half2 as host C++ types with
// bit-exact conversions (software, no dependence on F16C or the host's
// rounding mode). Arithmetic is computed in f32 and rounded once to binary16,
// as the GPU's half instructions do.
//
// NaN rules (documented choices, matching CUDA's own host code path):
//  * float -> half (every rounding mode): a NaN becomes the canonical 0x7fff.
//  * half -> float: exact; a NaN keeps sign and payload, with the quiet bit set.
#pragma once
#ifndef CUEMU_CUDA_FP16_H
#define CUEMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>
#ifdef CUEMU_PROFILE_BLOCKS
#include "cuemu/internal.h"
#endif

#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

namespace cuemu_fp16 {

inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// mode: 0 nearest-even, 1 toward zero, 2 down (-inf), 3 up (+inf).
inline uint16_t float_to_half_bits(float f, int mode) {
  const uint32_t u = f2u(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const bool neg = sign != 0;
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return 0x7fffu;  // NaN -> canonical
  if (au == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  const int exp = (int)(au >> 23);      // biased f32 exponent
  uint32_t mant = au & 0x7fffffu;
  // Value = 1.mant * 2^(exp-127) (normal) or 0.mant * 2^-126 (subnormal).
  int e = exp - 127 + 15;                // biased half exponent if normal
  uint32_t sig;                          // significand with implicit bit, 24 bits
  int shift;                             // bits to drop from sig
  if (exp == 0) {
    if (mant == 0) return sign;          // +-0
    sig = mant;                          // f32 subnormal: far below half's range
    shift = 24 + 1;                      // anything nonzero rounds to 0 or min subnormal
    e = 0;
    // Represent as "drop everything": handled by generic path below with sticky.
  } else {
    sig = mant | 0x800000u;
    if (e >= 1) {
      shift = 13;                        // 24-bit sig -> 11-bit sig
    } else {
      shift = 13 + (1 - e);              // subnormal half
      e = 0;
    }
  }
  uint32_t q, rem, halfway;
  if (shift >= 32) {
    q = 0; rem = sig; halfway = 0xffffffffu;  // rem < halfway always; nonzero rem
    // rem != 0 here; rounding to nearest gives 0 (value < half of min subnormal)
    bool up = false;
    if (mode == 1) up = false;
    else if (mode == 2) up = neg;
    else if (mode == 3) up = !neg;
    else up = false;
    return (uint16_t)(sign | (up ? 1u : 0u));
  }
  q = sig >> shift;
  rem = sig & ((1u << shift) - 1u);
  halfway = 1u << (shift - 1);
  bool up = false;
  if (rem != 0) {
    switch (mode) {
      case 0: up = rem > halfway || (rem == halfway && (q & 1u)); break;
      case 1: up = false; break;
      case 2: up = neg; break;
      default: up = !neg; break;
    }
  }
  q += up ? 1u : 0u;
  // q is the half significand incl. implicit bit when e >= 1 (in [0x400, 0x800]),
  // or the subnormal mantissa when e == 0 (may carry into 0x400 = min normal).
  uint32_t bits;
  if (e == 0) {
    bits = q;  // 0x400 carry becomes exponent 1, mantissa 0: correct encoding
  } else {
    if (q == 0x800u) { q = 0x400u; e += 1; }
    if (e >= 31) {
      // Overflow: nearest/away modes go to inf, others to max finite.
      bool to_inf = mode == 0 || (mode == 2 && neg) || (mode == 3 && !neg);
      return (uint16_t)(sign | (to_inf ? 0x7c00u : 0x7bffu));
    }
    bits = ((uint32_t)e << 10) | (q & 0x3ffu);
  }
  return (uint16_t)(sign | bits);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (mant ? (0x400000u | (mant << 13)) : 0u));
  if (exp == 0) {
    if (mant == 0) return u2f(sign);
    int e = -1;
    do { mant <<= 1; e++; } while (!(mant & 0x400u));
    return u2f(sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13));
  }
  return u2f(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// The conversions a kernel asks for carry a marker in profiled kernels: the
// profiler counts each as one f16_cvt (one GPU instruction). The half
// arithmetic below converts too, but the GPU computes it natively: it uses
// the unmarked __cuemu_h2f, __cuemu_f2h and __cuemu_d2h.
#ifdef CUEMU_PROFILE_BLOCKS
template <class T> __forceinline__ T counted(T bits) {
  __asm__("nopl %c1(%%rax)" : "+r"(bits) : "i"(CUEMU_PROF_MARK_BASE + CUEMU_PROF_MARK_F16_CVT));
  return bits;
}
#define CUEMU_F16_CVT(bits) cuemu_fp16::counted(bits)
#else
#define CUEMU_F16_CVT(bits) (bits)
#endif

}  // namespace cuemu_fp16

struct __half_raw { unsigned short x; };
struct __half2_raw { unsigned short x, y; };

struct alignas(2) __half {
  unsigned short __x;
  __half() = default;
  __host__ __device__ __half(const __half_raw& r) : __x(r.x) {}
  __host__ __device__ __half(float f) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 0))) {}
  __host__ __device__ __half(double d) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)d, 0))) {}
  __host__ __device__ __half(int i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half(unsigned int i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half(long long i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half(unsigned long long i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half(short i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half(unsigned short i) : __x(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)i, 0))) {}
  __host__ __device__ __half& operator=(const __half_raw& r) { __x = r.x; return *this; }
  __host__ __device__ __half& operator=(float f) { __x = CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 0)); return *this; }
  __host__ __device__ __half& operator=(double d) { __x = CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits((float)d, 0)); return *this; }
  __host__ __device__ operator float() const { return cuemu_fp16::half_bits_to_float(CUEMU_F16_CVT(__x)); }
  __host__ __device__ operator __half_raw() const { return __half_raw{__x}; }
  __host__ __device__ __half& operator+=(const __half& o);
  __host__ __device__ __half& operator-=(const __half& o);
  __host__ __device__ __half& operator*=(const __half& o);
  __host__ __device__ __half& operator/=(const __half& o);
};
static_assert(sizeof(__half) == 2, "__half is 16 bits");
typedef __half half;

struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  __host__ __device__ __half2(const __half& a, const __half& b) : x(a), y(b) {}
  __host__ __device__ __half2(const __half2_raw& r) { x.__x = r.x; y.__x = r.y; }
  __host__ __device__ operator __half2_raw() const { return __half2_raw{x.__x, y.__x}; }
};
typedef __half2 half2;

#define CUEMU_HBITS(h) (h).__x
static __forceinline__ __half cuemu_mk_half(unsigned short b) { __half h; h.__x = b; return h; }

static __forceinline__ __half __float2half(float f) { return cuemu_mk_half(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 0))); }
static __forceinline__ __half __float2half_rn(float f) { return cuemu_mk_half(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 0))); }
static __forceinline__ __half __float2half_rz(float f) { return cuemu_mk_half(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 1))); }
static __forceinline__ __half __float2half_rd(float f) { return cuemu_mk_half(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 2))); }
static __forceinline__ __half __float2half_ru(float f) { return cuemu_mk_half(CUEMU_F16_CVT(cuemu_fp16::float_to_half_bits(f, 3))); }
static __forceinline__ float __half2float(__half h) { return cuemu_fp16::half_bits_to_float(CUEMU_F16_CVT(h.__x)); }
static __forceinline__ __half __cuemu_d2h(double d) {
  // Rounded once from double: first to f32 with round-to-odd (truncate, then
  // set the last bit if inexact), which makes the second rounding exact.
  float f = (float)d;
  if (f == f && (cuemu_fp16::f2u(f) & 0x7fffffffu) != 0x7f800000u && (double)f != d) {
    uint32_t u = cuemu_fp16::f2u(f);
    if (__builtin_fabs((double)f) > __builtin_fabs(d)) u -= 1;
    u |= 1u;
    f = cuemu_fp16::u2f(u);
  }
  return cuemu_mk_half(cuemu_fp16::float_to_half_bits(f, 0));
}
static __forceinline__ __half __double2half(double d) { return cuemu_mk_half(CUEMU_F16_CVT(__cuemu_d2h(d).__x)); }
static __forceinline__ __half2 __float2half2_rn(float f) { __half h = __float2half_rn(f); return __half2(h, h); }
static __forceinline__ __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half_rn(a), __float2half_rn(b)); }
static __forceinline__ __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
static __forceinline__ __half2 __half2half2(__half a) { return __half2(a, a); }
static __forceinline__ __half __low2half(__half2 a) { return a.x; }
static __forceinline__ __half __high2half(__half2 a) { return a.y; }
static __forceinline__ float __low2float(__half2 a) { return __half2float(a.x); }
static __forceinline__ float __high2float(__half2 a) { return __half2float(a.y); }

static __forceinline__ unsigned short __half_as_ushort(__half h) { return h.__x; }
static __forceinline__ short __half_as_short(__half h) { return (short)h.__x; }
static __forceinline__ __half __ushort_as_half(unsigned short b) { return cuemu_mk_half(b); }
static __forceinline__ __half __short_as_half(short b) { return cuemu_mk_half((unsigned short)b); }

static __forceinline__ float __cuemu_hopaque(float x) { __asm__("" : "+x"(x)); return x; }
static __forceinline__ float __cuemu_h2f(__half h) { return cuemu_fp16::half_bits_to_float(h.__x); }
static __forceinline__ __half __cuemu_f2h(float f) { return cuemu_mk_half(cuemu_fp16::float_to_half_bits(f, 0)); }
static __forceinline__ __half __hadd(__half a, __half b) { return __cuemu_f2h(__cuemu_hopaque(__cuemu_h2f(a) + __cuemu_h2f(b))); }
static __forceinline__ __half __hsub(__half a, __half b) { return __cuemu_f2h(__cuemu_hopaque(__cuemu_h2f(a) - __cuemu_h2f(b))); }
static __forceinline__ __half __hmul(__half a, __half b) { return __cuemu_f2h(__cuemu_hopaque(__cuemu_h2f(a) * __cuemu_h2f(b))); }
static __forceinline__ __half __hdiv(__half a, __half b) { return __cuemu_f2h(__cuemu_hopaque(__cuemu_h2f(a) / __cuemu_h2f(b))); }
static __forceinline__ __half __hneg(__half a) { return cuemu_mk_half((unsigned short)(a.__x ^ 0x8000u)); }
static __forceinline__ __half __habs(__half a) { return cuemu_mk_half((unsigned short)(a.__x & 0x7fffu)); }
static __forceinline__ __half __hfma(__half a, __half b, __half c) {
  // The exact product of two halves fits in f32 and the f64 sum of it and c
  // is exact too, so one rounding to half.
  return __cuemu_d2h((double)__cuemu_h2f(a) * (double)__cuemu_h2f(b) + (double)__cuemu_h2f(c));
}
static __forceinline__ bool __hisnan(__half a) { return (a.__x & 0x7c00u) == 0x7c00u && (a.__x & 0x3ffu) != 0; }
static __forceinline__ int __hisinf(__half a) {
  return (a.__x & 0x7fffu) == 0x7c00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0;
}
static __forceinline__ bool __heq(__half a, __half b) { return __cuemu_h2f(a) == __cuemu_h2f(b); }
static __forceinline__ bool __hne(__half a, __half b) { return __cuemu_h2f(a) != __cuemu_h2f(b) && !__hisnan(a) && !__hisnan(b); }
static __forceinline__ bool __hlt(__half a, __half b) { return __cuemu_h2f(a) < __cuemu_h2f(b); }
static __forceinline__ bool __hle(__half a, __half b) { return __cuemu_h2f(a) <= __cuemu_h2f(b); }
static __forceinline__ bool __hgt(__half a, __half b) { return __cuemu_h2f(a) > __cuemu_h2f(b); }
static __forceinline__ bool __hge(__half a, __half b) { return __cuemu_h2f(a) >= __cuemu_h2f(b); }
static __forceinline__ __half __hmax(__half a, __half b) {
  if (__hisnan(a)) return __hisnan(b) ? cuemu_mk_half(0x7fffu) : b;
  if (__hisnan(b)) return a;
  return __cuemu_h2f(a) >= __cuemu_h2f(b) ? a : b;
}
static __forceinline__ __half __hmin(__half a, __half b) {
  if (__hisnan(a)) return __hisnan(b) ? cuemu_mk_half(0x7fffu) : b;
  if (__hisnan(b)) return a;
  return __cuemu_h2f(a) <= __cuemu_h2f(b) ? a : b;
}
static __forceinline__ __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
static __forceinline__ __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }

inline __half& __half::operator+=(const __half& o) { *this = __hadd(*this, o); return *this; }
inline __half& __half::operator-=(const __half& o) { *this = __hsub(*this, o); return *this; }
inline __half& __half::operator*=(const __half& o) { *this = __hmul(*this, o); return *this; }
inline __half& __half::operator/=(const __half& o) { *this = __hdiv(*this, o); return *this; }
static __forceinline__ __half operator+(const __half& a, const __half& b) { return __hadd(a, b); }
static __forceinline__ __half operator-(const __half& a, const __half& b) { return __hsub(a, b); }
static __forceinline__ __half operator*(const __half& a, const __half& b) { return __hmul(a, b); }
static __forceinline__ __half operator/(const __half& a, const __half& b) { return __hdiv(a, b); }
static __forceinline__ __half operator-(const __half& a) { return __hneg(a); }
static __forceinline__ __half operator+(const __half& a) { return a; }
static __forceinline__ bool operator==(const __half& a, const __half& b) { return __heq(a, b); }
static __forceinline__ bool operator!=(const __half& a, const __half& b) { return __hne(a, b); }
static __forceinline__ bool operator<(const __half& a, const __half& b) { return __hlt(a, b); }
static __forceinline__ bool operator<=(const __half& a, const __half& b) { return __hle(a, b); }
static __forceinline__ bool operator>(const __half& a, const __half& b) { return __hgt(a, b); }
static __forceinline__ bool operator>=(const __half& a, const __half& b) { return __hge(a, b); }

#endif  // CUEMU_CUDA_FP16_H
