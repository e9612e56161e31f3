// Force-included (-include cuemu_device.h) before every .cu file the emulated
// NVRTC compiles: CUDA's execution-space keywords, built-in variables,
// barriers, warp shuffles, rounding intrinsics, math and atomics as host C++.
// A __global__ function becomes an ordinary host function that runs ONE CUDA
// thread; the block executor (libcuda.so, src/exec) runs it once per thread
// as a fiber and provides the thread's coordinates through cuemu_thread().
//
// Not emulated (documented limits): `extern __shared__` (dynamic shared
// memory), __syncthreads_count/_and/_or, __activemask, textures/surfaces,
// inline PTX, cooperative groups. Kernels using them fail to compile.
#pragma once
#ifndef CUEMU_DEVICE_H
#define CUEMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <stddef.h>
#include <assert.h>
#include <fenv.h>
#include "cuemu/internal.h"

#define __CUEMU__ 1
#ifndef __CUDACC__
#define __CUDACC__ 1
#endif
#ifndef __CUDACC_RTC__
#define __CUDACC_RTC__ 1
#endif

// ------------------------------------------------------ execution spaces ---
#ifdef CUEMU_DISCOVER
#define __global__ __cuemu_global__
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __constant__
#define __managed__
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
// Static shared memory: one copy per module (the .so), in a section the
// executor fills with 0xFF (NaN for floats) at the start of every block; one
// block of a module runs at a time. `retain` marks the variable in the
// assembly, where the emulated NVRTC moves those of templates into the
// section (GCC leaves them in COMDAT sections of their own).
#define __shared__ static __attribute__((section("cuemu_shared"), retain))

#include "cuda_fp16.h"

// Re-declarations with attributes the kernels' optimizer may rely on: the
// context pointer is fixed for the whole life of a CUDA thread (one call of a
// kernel entry), and a trap never returns.
extern "C" const cuemu_thread_ctx* cuemu_thread(void) __attribute__((const));
extern "C" void cuemu_trap(const char* what, const char* file, int line) __attribute__((noreturn));

// ----------------------------------------------------- built-in variables ---
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(const cuemu_dim3& d) : x(d.x), y(d.y), z(d.z) {}
};
#define threadIdx (cuemu_thread()->thread_idx)
#define blockIdx (cuemu_thread()->block_idx)
#define blockDim (cuemu_thread()->block_dim)
#define gridDim (cuemu_thread()->grid_dim)
static constexpr int warpSize = 32;

// ---------------------------------------------------------- vector types ---
#define CUEMU_VEC2(T, N, A) \
  struct __attribute__((aligned(A))) N##2 { T x, y; }; \
  static __forceinline__ N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define CUEMU_VEC3(T, N) \
  struct N##3 { T x, y, z; }; \
  static __forceinline__ N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define CUEMU_VEC4(T, N, A) \
  struct __attribute__((aligned(A))) N##4 { T x, y, z, w; }; \
  static __forceinline__ N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
CUEMU_VEC2(float, float, 8) CUEMU_VEC3(float, float) CUEMU_VEC4(float, float, 16)
CUEMU_VEC2(double, double, 16) CUEMU_VEC3(double, double) CUEMU_VEC4(double, double, 16)
CUEMU_VEC2(int, int, 8) CUEMU_VEC3(int, int) CUEMU_VEC4(int, int, 16)
CUEMU_VEC2(unsigned int, uint, 8) CUEMU_VEC4(unsigned int, uint, 16)
CUEMU_VEC2(long long, longlong, 16) CUEMU_VEC2(unsigned long long, ulonglong, 16)
CUEMU_VEC2(short, short, 4) CUEMU_VEC2(unsigned short, ushort, 4)
CUEMU_VEC4(char, char, 4) CUEMU_VEC4(unsigned char, uchar, 4)
static __forceinline__ uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
#undef CUEMU_VEC2
#undef CUEMU_VEC3
#undef CUEMU_VEC4

// -------------------------------------------------------------- barriers ---
static __forceinline__ void __syncthreads(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
  cuemu_syncthreads(f, l);
}
static __forceinline__ void __syncwarp(unsigned mask = 0xffffffffu, const char* f = __builtin_FILE(),
                                       int l = __builtin_LINE()) {
  cuemu_syncwarp(mask, f, l);
}
static __forceinline__ void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static __forceinline__ void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static __forceinline__ void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] static __forceinline__ void __trap(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
  cuemu_trap("__trap()", f, l);
}
[[noreturn]] static __forceinline__ void __brkpt(const char* f = __builtin_FILE(), int l = __builtin_LINE()) {
  cuemu_trap("__brkpt()", f, l);
}
// assert -> cuemu_trap (the generated module also defines __assert_fail for
// code that re-includes <assert.h>).
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
#define assert(e) ((e) ? (void)0 : cuemu_trap("assertion `" #e "' failed", __FILE__, __LINE__))
#endif

// ---------------------------------------------------------- warp shuffles ---
namespace cuemu_detail {
template <class T> __forceinline__ uint64_t to_bits(T v) {
  uint64_t u = 0;
  __builtin_memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T> __forceinline__ T from_bits(uint64_t u) {
  T v;
  __builtin_memcpy(&v, &u, sizeof(T));
  return v;
}
template <class T> __forceinline__ T shfl(int kind, unsigned mask, T v, int lane, int width, const char* f, int l) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  const int bytes = sizeof(T) <= 4 ? 4 : 8;
  return from_bits<T>(cuemu_shfl(kind, mask, to_bits(v), lane, width, bytes, f, l));
}
}  // namespace cuemu_detail

#define CUEMU_SHFL_FOR(T)                                                                                   \
  static __forceinline__ T __shfl_sync(unsigned mask, T var, int src, int width = warpSize,                 \
                                       const char* f = __builtin_FILE(), int l = __builtin_LINE()) {        \
    return cuemu_detail::shfl<T>(0, mask, var, src, width, f, l);                                           \
  }                                                                                                         \
  static __forceinline__ T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,       \
                                          const char* f = __builtin_FILE(), int l = __builtin_LINE()) {     \
    return cuemu_detail::shfl<T>(1, mask, var, (int)delta, width, f, l);                                    \
  }                                                                                                         \
  static __forceinline__ T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,     \
                                            const char* f = __builtin_FILE(), int l = __builtin_LINE()) {   \
    return cuemu_detail::shfl<T>(2, mask, var, (int)delta, width, f, l);                                    \
  }                                                                                                         \
  static __forceinline__ T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,       \
                                           const char* f = __builtin_FILE(), int l = __builtin_LINE()) {    \
    return cuemu_detail::shfl<T>(3, mask, var, lane_mask, width, f, l);                                     \
  }
CUEMU_SHFL_FOR(int)
CUEMU_SHFL_FOR(unsigned int)
CUEMU_SHFL_FOR(long)
CUEMU_SHFL_FOR(unsigned long)
CUEMU_SHFL_FOR(long long)
CUEMU_SHFL_FOR(unsigned long long)
CUEMU_SHFL_FOR(float)
CUEMU_SHFL_FOR(double)
CUEMU_SHFL_FOR(__half)
CUEMU_SHFL_FOR(__half2)
#undef CUEMU_SHFL_FOR

// Votes, built from shuffles (every lane of `mask` must take part, as for a
// shuffle): lane j's predicate is fetched from each lane of the mask.
static __forceinline__ unsigned __ballot_sync(unsigned mask, int pred, const char* f = __builtin_FILE(),
                                              int l = __builtin_LINE()) {
  unsigned r = 0;
  for (int j = 0; j < 32; j++)
    if (mask & (1u << j)) r |= (cuemu_detail::shfl<int>(0, mask, pred ? 1 : 0, j, 32, f, l) ? 1u : 0u) << j;
  return r;
}
static __forceinline__ int __any_sync(unsigned mask, int pred, const char* f = __builtin_FILE(),
                                      int l = __builtin_LINE()) {
  return __ballot_sync(mask, pred, f, l) != 0;
}
static __forceinline__ int __all_sync(unsigned mask, int pred, const char* f = __builtin_FILE(),
                                      int l = __builtin_LINE()) {
  return __ballot_sync(mask, pred, f, l) == mask;
}

// ---------------------------------------------------- rounding intrinsics ---
// The result (and the operands) pass through an empty asm, so the host
// compiler can neither contract them into an FMA nor reassociate: each one is
// rounded once, as the _rn intrinsics are never fused on the GPU.
static __forceinline__ float cuemu_opaque(float x) { __asm__("" : "+x"(x)); return x; }
static __forceinline__ double cuemu_opaque(double x) { __asm__("" : "+x"(x)); return x; }

#define CUEMU_RN_BINOP(name, T, op) \
  static __forceinline__ T name(T a, T b) { return cuemu_opaque(cuemu_opaque(a) op cuemu_opaque(b)); }
CUEMU_RN_BINOP(__fadd_rn, float, +)
CUEMU_RN_BINOP(__fsub_rn, float, -)
CUEMU_RN_BINOP(__fmul_rn, float, *)
CUEMU_RN_BINOP(__fdiv_rn, float, /)
CUEMU_RN_BINOP(__dadd_rn, double, +)
CUEMU_RN_BINOP(__dsub_rn, double, -)
CUEMU_RN_BINOP(__dmul_rn, double, *)
CUEMU_RN_BINOP(__ddiv_rn, double, /)
#undef CUEMU_RN_BINOP
static __forceinline__ float __fmaf_rn(float a, float b, float c) { return cuemu_opaque(__builtin_fmaf(a, b, c)); }
static __forceinline__ double __fma_rn(double a, double b, double c) { return cuemu_opaque(__builtin_fma(a, b, c)); }
static __forceinline__ float __fsqrt_rn(float a) { return cuemu_opaque(__builtin_sqrtf(cuemu_opaque(a))); }
static __forceinline__ double __dsqrt_rn(double a) { return cuemu_opaque(__builtin_sqrt(cuemu_opaque(a))); }
static __forceinline__ float __frcp_rn(float a) { return cuemu_opaque(1.0f / cuemu_opaque(a)); }
static __forceinline__ double __drcp_rn(double a) { return cuemu_opaque(1.0 / cuemu_opaque(a)); }
static __forceinline__ float __frsqrt_rn(float a) { return cuemu_opaque(1.0f / __builtin_sqrtf(cuemu_opaque(a))); }

// Directed rounding: the operation runs with MXCSR's rounding mode switched
// (MXCSR is saved per fiber, so this is thread-safe).
namespace cuemu_detail {
__attribute__((noinline)) inline double directed(int op, double a, double b, double c, int mode, bool dbl) {
  const int old = fegetround();
  fesetround(mode);
  double r;
  if (dbl) {
    double x = cuemu_opaque(a), y = cuemu_opaque(b), z = cuemu_opaque(c);
    switch (op) {
      case 0: r = cuemu_opaque(x + y); break;
      case 1: r = cuemu_opaque(x - y); break;
      case 2: r = cuemu_opaque(x * y); break;
      case 3: r = cuemu_opaque(x / y); break;
      case 4: r = cuemu_opaque(__builtin_fma(x, y, z)); break;
      default: r = cuemu_opaque(__builtin_sqrt(x)); break;
    }
  } else {
    float x = cuemu_opaque((float)a), y = cuemu_opaque((float)b), z = cuemu_opaque((float)c);
    float q;
    switch (op) {
      case 0: q = cuemu_opaque(x + y); break;
      case 1: q = cuemu_opaque(x - y); break;
      case 2: q = cuemu_opaque(x * y); break;
      case 3: q = cuemu_opaque(x / y); break;
      case 4: q = cuemu_opaque(__builtin_fmaf(x, y, z)); break;
      default: q = cuemu_opaque(__builtin_sqrtf(x)); break;
    }
    r = q;
  }
  fesetround(old);
  return r;
}
}  // namespace cuemu_detail
#define CUEMU_DIRECTED(sfx, mode)                                                                              \
  static __forceinline__ float __fadd_##sfx(float a, float b) { return (float)cuemu_detail::directed(0, a, b, 0, mode, false); } \
  static __forceinline__ float __fsub_##sfx(float a, float b) { return (float)cuemu_detail::directed(1, a, b, 0, mode, false); } \
  static __forceinline__ float __fmul_##sfx(float a, float b) { return (float)cuemu_detail::directed(2, a, b, 0, mode, false); } \
  static __forceinline__ float __fdiv_##sfx(float a, float b) { return (float)cuemu_detail::directed(3, a, b, 0, mode, false); } \
  static __forceinline__ float __fmaf_##sfx(float a, float b, float c) { return (float)cuemu_detail::directed(4, a, b, c, mode, false); } \
  static __forceinline__ float __fsqrt_##sfx(float a) { return (float)cuemu_detail::directed(5, a, 0, 0, mode, false); } \
  static __forceinline__ double __dadd_##sfx(double a, double b) { return cuemu_detail::directed(0, a, b, 0, mode, true); } \
  static __forceinline__ double __dsub_##sfx(double a, double b) { return cuemu_detail::directed(1, a, b, 0, mode, true); } \
  static __forceinline__ double __dmul_##sfx(double a, double b) { return cuemu_detail::directed(2, a, b, 0, mode, true); } \
  static __forceinline__ double __ddiv_##sfx(double a, double b) { return cuemu_detail::directed(3, a, b, 0, mode, true); } \
  static __forceinline__ double __fma_##sfx(double a, double b, double c) { return cuemu_detail::directed(4, a, b, c, mode, true); }
CUEMU_DIRECTED(rz, FE_TOWARDZERO)
CUEMU_DIRECTED(rd, FE_DOWNWARD)
CUEMU_DIRECTED(ru, FE_UPWARD)
#undef CUEMU_DIRECTED

// ------------------------------------------------------------ bit casts ---
static __forceinline__ int __float_as_int(float x) { return cuemu_detail::from_bits<int>(cuemu_detail::to_bits(x)); }
static __forceinline__ unsigned int __float_as_uint(float x) { return cuemu_detail::from_bits<unsigned>(cuemu_detail::to_bits(x)); }
static __forceinline__ float __int_as_float(int x) { return cuemu_detail::from_bits<float>(cuemu_detail::to_bits(x)); }
static __forceinline__ float __uint_as_float(unsigned int x) { return cuemu_detail::from_bits<float>(cuemu_detail::to_bits(x)); }
static __forceinline__ long long __double_as_longlong(double x) { return cuemu_detail::from_bits<long long>(cuemu_detail::to_bits(x)); }
static __forceinline__ double __longlong_as_double(long long x) { return cuemu_detail::from_bits<double>(cuemu_detail::to_bits(x)); }

// ----------------------------------------------------------- conversions ---
static __forceinline__ int __float2int_rn(float x) { return (int)__builtin_nearbyintf(x); }
static __forceinline__ int __float2int_rz(float x) { return (int)x; }
static __forceinline__ int __float2int_rd(float x) { return (int)__builtin_floorf(x); }
static __forceinline__ int __float2int_ru(float x) { return (int)__builtin_ceilf(x); }
static __forceinline__ unsigned __float2uint_rn(float x) { return (unsigned)__builtin_nearbyintf(x); }
static __forceinline__ unsigned __float2uint_rz(float x) { return (unsigned)x; }
static __forceinline__ long long __float2ll_rn(float x) { return (long long)__builtin_nearbyintf(x); }
static __forceinline__ long long __float2ll_rz(float x) { return (long long)x; }
static __forceinline__ float __int2float_rn(int x) { return (float)x; }
static __forceinline__ float __uint2float_rn(unsigned x) { return (float)x; }
static __forceinline__ float __ll2float_rn(long long x) { return (float)x; }
static __forceinline__ float __ull2float_rn(unsigned long long x) { return (float)x; }
static __forceinline__ float __double2float_rn(double x) { return (float)x; }
static __forceinline__ int __double2int_rn(double x) { return (int)__builtin_nearbyint(x); }
static __forceinline__ int __double2int_rz(double x) { return (int)x; }
static __forceinline__ double __int2double_rn(int x) { return (double)x; }

// ------------------------------------------------------------------ math ---
// <math.h> provides the C99 functions and the C++ overloads (sqrt(float), ...).
#ifdef CUEMU_PROFILE_BLOCKS
// One MUFU.RSQ on the GPU: marked for the profiler, which counts it as one
// special op instead of the square root and the divide that compute it here
// (the opaque input keeps that square root apart from the kernel's own).
static __forceinline__ float rsqrtf(float x) {
  float r = 1.0f / sqrtf(cuemu_opaque(x));
  __asm__("nopl %c1(%%rax)" : "+x"(r) : "i"(CUEMU_PROF_MARK_BASE + CUEMU_PROF_MARK_RSQRT));
  return r;
}
#else
static __forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#endif
static __forceinline__ double rsqrt(double x) { return 1.0 / sqrt(x); }
// The GPU's fast approximations, computed as the precise functions: glibc
// declares these names but its libm exports none of them.
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __log10f(x) log10f(x)
#define __powf(x, y) powf(x, y)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __sincosf(x, s, c) sincosf(x, s, c)
static __forceinline__ float __fdividef(float a, float b) { return a / b; }
static __forceinline__ float __saturatef(float x) { return x != x ? 0.f : (x < 0.f ? 0.f : (x > 1.f ? 1.f : x)); }
static __forceinline__ float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }

#define CUEMU_MINMAX(T)                                                           \
  static __forceinline__ T min(T a, T b) { return a < b ? a : b; }               \
  static __forceinline__ T max(T a, T b) { return a > b ? a : b; }
CUEMU_MINMAX(int)
CUEMU_MINMAX(unsigned int)
CUEMU_MINMAX(long)
CUEMU_MINMAX(unsigned long)
CUEMU_MINMAX(long long)
CUEMU_MINMAX(unsigned long long)
#undef CUEMU_MINMAX
static __forceinline__ unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static __forceinline__ unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static __forceinline__ unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static __forceinline__ unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static __forceinline__ unsigned long long min(long long a, unsigned long long b) { return min((unsigned long long)a, b); }
static __forceinline__ unsigned long long min(unsigned long long a, long long b) { return min(a, (unsigned long long)b); }
static __forceinline__ unsigned long long max(long long a, unsigned long long b) { return max((unsigned long long)a, b); }
static __forceinline__ unsigned long long max(unsigned long long a, long long b) { return max(a, (unsigned long long)b); }
static __forceinline__ float min(float a, float b) { return fminf(a, b); }
static __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
static __forceinline__ double min(double a, double b) { return fmin(a, b); }
static __forceinline__ double max(double a, double b) { return fmax(a, b); }
static __forceinline__ double min(float a, double b) { return fmin(a, b); }
static __forceinline__ double min(double a, float b) { return fmin(a, b); }
static __forceinline__ double max(float a, double b) { return fmax(a, b); }
static __forceinline__ double max(double a, float b) { return fmax(a, b); }

// ---------------------------------------------------------- integer bits ---
static __forceinline__ int __popc(unsigned x) { return __builtin_popcount(x); }
static __forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static __forceinline__ int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static __forceinline__ int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static __forceinline__ int __ffs(int x) { return __builtin_ffs(x); }
static __forceinline__ int __ffsll(long long x) { return __builtin_ffsll(x); }
static __forceinline__ unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
static __forceinline__ int __mul24(int a, int b) { return (int)((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static __forceinline__ int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static __forceinline__ unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T> static __forceinline__ T __ldg(const T* p) { return *p; }

// --------------------------------------------------------------- atomics ---
// Blocks of one grid run one after another on one OS thread, but grids on
// different streams run on different OS threads: real atomics.
#define CUEMU_ATOMIC_INT(T)                                                                                  \
  static __forceinline__ T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }    \
  static __forceinline__ T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }    \
  static __forceinline__ T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }  \
  static __forceinline__ T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }    \
  static __forceinline__ T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }      \
  static __forceinline__ T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }    \
  static __forceinline__ T atomicCAS(T* p, T cmp, T v) {                                                   \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                    \
    return cmp;                                                                                            \
  }                                                                                                        \
  static __forceinline__ T atomicMin(T* p, T v) {                                                          \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                          \
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
    }                                                                                                      \
    return old;                                                                                            \
  }                                                                                                        \
  static __forceinline__ T atomicMax(T* p, T v) {                                                          \
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                          \
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
    }                                                                                                      \
    return old;                                                                                            \
  }
CUEMU_ATOMIC_INT(int)
CUEMU_ATOMIC_INT(unsigned int)
CUEMU_ATOMIC_INT(long long)
CUEMU_ATOMIC_INT(unsigned long long)
#undef CUEMU_ATOMIC_INT
static __forceinline__ unsigned atomicInc(unsigned* p, unsigned limit) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
static __forceinline__ unsigned atomicDec(unsigned* p, unsigned limit) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(p, &old, (old == 0u || old > limit) ? limit : old - 1u, true,
                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
namespace cuemu_detail {
template <class F, class U, class Op> __forceinline__ F atomic_float(F* p, F v, Op op) {
  U* up = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(up, __ATOMIC_SEQ_CST);
  for (;;) {
    const F cur = from_bits<F>(old);
    const U next = (U)to_bits(op(cur, v));
    if (__atomic_compare_exchange_n(up, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return cur;
  }
}
}  // namespace cuemu_detail
static __forceinline__ float atomicAdd(float* p, float v) {
  return cuemu_detail::atomic_float<float, uint32_t>(p, v, [](float a, float b) { return cuemu_opaque(a + b); });
}
static __forceinline__ double atomicAdd(double* p, double v) {
  return cuemu_detail::atomic_float<double, uint64_t>(p, v, [](double a, double b) { return cuemu_opaque(a + b); });
}
static __forceinline__ float atomicExch(float* p, float v) {
  return cuemu_detail::atomic_float<float, uint32_t>(p, v, [](float, float b) { return b; });
}
static __forceinline__ float atomicMax(float* p, float v) {
  return cuemu_detail::atomic_float<float, uint32_t>(p, v, [](float a, float b) { return fmaxf(a, b); });
}
static __forceinline__ float atomicMin(float* p, float v) {
  return cuemu_detail::atomic_float<float, uint32_t>(p, v, [](float a, float b) { return fminf(a, b); });
}

#endif  // CUEMU_DEVICE_H
