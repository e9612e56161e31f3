// The slice of the cuBLAS v2 API the emulated libcublas.so implements, declared
// here (not taken from NVIDIA's headers, which this machine does not have) with
// the enum values of cudarc 0.19.10's bindings for CUDA 13.0
// (cudarc/src/cublas/sys/mod.rs, feature cuda-13000). Enums are passed as
// plain ints across the ABI, so every entry point takes `int` where cuBLAS
// takes an enum and checks the value itself: an out-of-range value from a
// caller must be reported, not be undefined behaviour here.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CUBLASAPI extern "C" __attribute__((visibility("default")))

// cublasStatus_t
enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};
typedef int cublasStatus_t;

// cublasOperation_t. OP_C on real data is OP_T; OP_CONJG is not a valid
// GEMM operation (cuBLAS only accepts N, T, C there).
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2, CUBLAS_OP_CONJG = 3 };

// cublasPointerMode_t
enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 };

// cublasAtomicsMode_t
enum { CUBLAS_ATOMICS_NOT_ALLOWED = 0, CUBLAS_ATOMICS_ALLOWED = 1 };

// cublasMath_t: one base mode, optionally OR-ed with the DISALLOW bit.
enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,  // deprecated, still accepted by cuBLAS 13
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_FP32_EMULATED_BF16X9_MATH = 4,
  CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH = 8,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};

// cudaDataType_t (the ones GEMM can be asked about; any other value is
// "a type cuBLAS knows but this combination does not support").
enum {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_C_32F = 4,
  CUDA_C_64F = 5,
  CUDA_C_16F = 6,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
  CUDA_C_16BF = 15,
};

// cublasComputeType_t
enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78,
  CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
};

// cublasGemmAlgo_t: DEFAULT (-1), ALGO0..23, DEFAULT_TENSOR_OP (99),
// ALGO0..15_TENSOR_OP (100..115), AUTOTUNE (999, CUDA 13).
enum {
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_ALGO23 = 23,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
  CUBLAS_GEMM_ALGO15_TENSOR_OP = 115,
  CUBLAS_GEMM_AUTOTUNE = 999,
};

// libraryPropertyType_t
enum { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 };

// The cuBLAS that ships with CUDA 13.0 is 13.0.0 (CUBLAS_VERSION = major *
// 10000 + minor * 100 + patch).
#define CUEMU_CUBLAS_VER_MAJOR 13
#define CUEMU_CUBLAS_VER_MINOR 0
#define CUEMU_CUBLAS_VER_PATCH 0

struct cublasContext;
typedef struct cublasContext* cublasHandle_t;
typedef struct CUstream_st* cudaStream_t;
