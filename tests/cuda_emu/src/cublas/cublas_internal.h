// What the emulated cuBLAS's files share: the handle, its validation, the
// error reporter, and the f16 / bf16 conversions the GEMM epilogue uses.
#pragma once
#include <stdarg.h>
#include <string.h>

#include "cublas_api.h"

namespace cuemu_blas {

// A cuBLAS handle. It only records settings: every GEMM copies what it needs
// into its stream operation, so destroying a handle with work still queued on
// its stream is safe (as on real hardware, where the kernels own their args).
struct Handle {
  uint64_t magic;          // kMagic while alive: a freed or foreign pointer is caught
  void* ctx;               // the CUcontext current at cublasCreate
  cudaStream_t stream;     // NULL: the legacy default stream of the current context
  int math_mode;           // only its DISALLOW_REDUCED_PRECISION bit changes the arithmetic (gemm_exec.cpp)
  int pointer_mode;        // where alpha / beta live
  int atomics_mode;
  void* workspace;         // recorded from cublasSetWorkspace, never used
  size_t workspace_bytes;
};
constexpr uint64_t kMagic = 0x6375656d75626c61ull;  // "cuemubla"

// The live handle `h` is, or nullptr when it is NULL, destroyed or not a
// handle (after printing why, naming `fn`). Every entry point that takes a
// handle starts here and returns CUBLAS_STATUS_NOT_INITIALIZED on nullptr,
// which is what real cuBLAS returns for a NULL handle.
Handle* lookup(cublasHandle_t h, const char* fn);

// Prints "cuemu cublas: <fn>: <message>" to stderr and returns `status`, so a
// refused call always says why (real cuBLAS is silent unless its logger is on;
// an emulator that is meant to find bugs should not be).
cublasStatus_t fail(cublasStatus_t status, const char* fn, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

// ------------------------------------------------------------ conversions ---
// Software conversions (the library is built without -mf16c), rounding to
// nearest even like the hardware's cvt.rn. Tests check them against GCC's
// _Float16, an independent implementation.

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man * 2^-24, exact in f32
    float v = (float)man * (1.0f / 16777216.0f);
    memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffff;
  if (ax > 0x7f800000) return sign | 0x7e00 | ((ax >> 13) & 0x3ff);  // NaN stays NaN (quiet)
  uint32_t e = ax >> 23;
  if (e > 142) return sign | 0x7c00;  // >= 2^16: infinity (and inf itself)
  uint32_t mant = (ax & 0x7fffff) | (e ? 0x800000u : 0);
  if (e >= 113) {  // normal in f16: keep 10 of 23 mantissa bits
    uint32_t h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // a carry may reach inf: correct
    return sign | (uint16_t)h;
  }
  // Subnormal (or zero) in f16: the value in units of 2^-24 is mant * 2^(e - 126).
  uint32_t shift = 126 - (e ? e : 1);
  if (shift > 24) return sign;  // below half the smallest subnormal
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return sign | (uint16_t)q;
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace cuemu_blas
