// A GEMM between its validation (gemm.cpp, on the calling thread) and its
// execution (gemm_exec.cpp, on the stream worker).
#pragma once
#include "cublas_internal.h"

namespace cuemu_blas {

// The arguments of any of the GEMM entry points, as given (a plain GEMM is a
// batch of 1 with zero strides). Element strides, leading dimensions and
// sizes are in elements of the operand's type, column-major, as in cuBLAS.
struct GemmCall {
  cublasHandle_t handle;
  int transa, transb, m, n, k;
  const void* alpha;
  const void* A;
  int atype, lda;
  long long stride_a;
  const void* B;
  int btype, ldb;
  long long stride_b;
  const void* beta;
  void* C;
  int ctype, ldc;
  long long stride_c;
  int batch, compute, algo;
};

// The arithmetic a (types, compute type) combination selects: inputs / output.
enum class Kind { F32, F64, F16_F16, F16_F32, BF16_BF16, BF16_F32 };

struct Range {
  const void* ptr;
  size_t bytes;
};

// What the stream operation owns: a copy of the call, plus the host-mode
// scalars read at call time (exact as double for f32 and f64 alike).
struct GemmOp {
  const char* fn;
  Kind kind;
  GemmCall call;
  bool device_scalars;
  double alpha, beta;
  // The handle's math mode lacked CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_
  // REDUCTION when the call was made: a 16-bit C may be reduced in 16 bits.
  bool reduced_reduction;
  unsigned long long ticket;  // the profiler's host-order number (0 when off)
};

cublasStatus_t gemm_call(const GemmCall& c, const char* fn);

// cuemu_op_fn / destroy for a GemmOp.
int gemm_run(void* user, char* err, size_t err_len);
void gemm_destroy(void* user);

}  // namespace cuemu_blas
