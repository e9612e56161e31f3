// The GEMM entry points of the emulated cuBLAS: cublasGemmEx,
// cublasGemmStridedBatchedEx, cublasSgemm_v2 / cublasSgemmStridedBatched
// (cudarc's safe Gemm<f32>) and cublasDgemm_v2 / cublasDgemmStridedBatched
// (Gemm<f64>). All of them funnel into `gemm_call`, which
//   1. validates the arguments on the host, in cuBLAS's order and with its
//      statuses (see `validate`),
//   2. checks every operand's byte range against the driver's allocations,
//   3. enqueues one stream operation on the handle's stream declaring what
//      it reads and writes (the driver's race checker sees it), and
//   4. returns; the arithmetic runs later on the stream worker (gemm_exec.cpp).
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>
#include <new>

#include <cuemu/internal.h>

#include "cublas_internal.h"
#include "gemm_op.h"

namespace cuemu_blas {
namespace {

const char* op_name(int t) { return t == CUBLAS_OP_N ? "N" : t == CUBLAS_OP_T ? "T" : "C"; }

bool known_compute_type(int c) {
  return (c >= CUBLAS_COMPUTE_16F && c <= CUBLAS_COMPUTE_32F_FAST_16BF && c != 66 && c != 67) ||
         c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_EMULATED_16BFX9 ||
         c == CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT;
}

bool valid_algo(int a) {
  return (a >= CUBLAS_GEMM_DEFAULT && a <= CUBLAS_GEMM_ALGO23) ||
         (a >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP) || a == CUBLAS_GEMM_AUTOTUNE;
}

// Which arithmetic (Atype, Btype, Ctype, computeType) selects, following
// cuBLAS's cublasGemmEx table for the real types:
//   COMPUTE_32F / _PEDANTIC: 32F/32F/32F, 16F/16F/16F, 16F/16F/32F,
//                            16BF/16BF/16BF, 16BF/16BF/32F (float scalars)
//   COMPUTE_32F_FAST_TF32 / _FAST_16F / _FAST_16BF / _EMULATED_16BFX9:
//                            32F/32F/32F only (float scalars)
//   COMPUTE_64F / _PEDANTIC: 64F/64F/64F (double scalars)
// Returns false for a combination this emulator does not run. That includes
// some cuBLAS does run (COMPUTE_16F with __half scalars, the int8 and complex
// types): neither the project nor cudarc's safe API issues them, and
// NOT_SUPPORTED makes a new use fail loudly instead of computing unverified.
//
// The reduced-precision f32 modes compute in full f32 here: TF32 keeps 10
// mantissa bits of each operand on the GPU, so the emulator is at least as
// accurate as the hardware, and the project's TF32 tolerances are for the
// hardware's error, which the emulator does not reproduce.
bool select_kind(int at, int bt, int ct, int compute, Kind* kind) {
  if (at != bt) return false;
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      if (at == CUDA_R_32F && ct == CUDA_R_32F) return *kind = Kind::F32, true;
      if (at == CUDA_R_16F && ct == CUDA_R_16F) return *kind = Kind::F16_F16, true;
      if (at == CUDA_R_16F && ct == CUDA_R_32F) return *kind = Kind::F16_F32, true;
      if (at == CUDA_R_16BF && ct == CUDA_R_16BF) return *kind = Kind::BF16_BF16, true;
      if (at == CUDA_R_16BF && ct == CUDA_R_32F) return *kind = Kind::BF16_F32, true;
      return false;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
      if (at == CUDA_R_32F && ct == CUDA_R_32F) return *kind = Kind::F32, true;
      return false;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      if (at == CUDA_R_64F && ct == CUDA_R_64F) return *kind = Kind::F64, true;
      return false;
    default:
      return false;
  }
}

// cuBLAS's documented INVALID_VALUE conditions, in its order: operations
// other than N / T / C; m, n, k < 0; lda < max(1, m) for op(A) = N and
// < max(1, k) otherwise; ldb < max(1, k) for N and < max(1, n) otherwise;
// ldc < max(1, m); batchCount < 0; NULL alpha or beta; a computeType that is
// not a cublasComputeType_t. Then NOT_SUPPORTED for a type combination or an
// algo it does not provide. The leading dimensions are checked even when m or
// n is 0 (cuBLAS does too); only then is an empty product a successful no-op.
cublasStatus_t validate(const GemmCall& c, const char* fn, Kind* kind) {
  for (int t : {c.transa, c.transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transa/transb = %d is not CUBLAS_OP_N, _T or _C", t);
  if (c.m < 0 || c.n < 0 || c.k < 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "negative size: m = %d, n = %d, k = %d", c.m, c.n, c.k);
  int a_rows = c.transa == CUBLAS_OP_N ? c.m : c.k, b_rows = c.transb == CUBLAS_OP_N ? c.k : c.n;
  if (c.lda < (a_rows > 1 ? a_rows : 1))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "lda = %d < max(1, %s = %d) with transa = %s", c.lda,
                c.transa == CUBLAS_OP_N ? "m" : "k", a_rows, op_name(c.transa));
  if (c.ldb < (b_rows > 1 ? b_rows : 1))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "ldb = %d < max(1, %s = %d) with transb = %s", c.ldb,
                c.transb == CUBLAS_OP_N ? "k" : "n", b_rows, op_name(c.transb));
  if (c.ldc < (c.m > 1 ? c.m : 1))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "ldc = %d < max(1, m = %d)", c.ldc, c.m);
  if (c.batch < 0) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batchCount = %d < 0", c.batch);
  if (c.alpha == nullptr || c.beta == nullptr)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha (%p) or beta (%p) is NULL", c.alpha, c.beta);
  if (!known_compute_type(c.compute))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "computeType = %d is not a cublasComputeType_t", c.compute);
  if (!select_kind(c.atype, c.btype, c.ctype, c.compute, kind))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                "Atype = %d, Btype = %d, Ctype = %d with computeType = %d is not supported (the emulator "
                "runs 32F/32F/32F, 16F or 16BF inputs with 16F/16BF or 32F output under COMPUTE_32F*, "
                "and 64F under COMPUTE_64F)",
                c.atype, c.btype, c.ctype, c.compute);
  if (!valid_algo(c.algo)) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "algo = %d is not a cublasGemmAlgo_t", c.algo);
  return CUBLAS_STATUS_SUCCESS;
}

// The bytes a (possibly batched) column-major rows x cols operand spans: from
// the lowest batch member's start to the highest one's last element. Strides
// may be 0 (one matrix shared by the batch) or negative. False if it does not
// fit in the address space.
bool operand_range(const void* base, int rows, int cols, int ld, long long stride, int batch, size_t esize,
                   Range* r) {
  r->ptr = base;
  r->bytes = 0;
  if (rows == 0 || cols == 0 || batch == 0) return true;
  __int128 span = (__int128)(cols - 1) * ld + rows;
  __int128 last = (__int128)(batch - 1) * stride;
  __int128 lo = last < 0 ? last : 0, hi = (last > 0 ? last : 0) + span;
  __int128 bytes = (hi - lo) * (__int128)esize, off = lo * (__int128)esize;
  if (bytes > (__int128)(SIZE_MAX / 2) || off < -(__int128)(uintptr_t)base) return false;
  r->ptr = (const char*)base + (ptrdiff_t)off;
  r->bytes = (size_t)bytes;
  return true;
}

// Whether two members of a batch write the same element of C: members i and
// i + d collide iff d * strideC = q * ldc + t with |q| < n and |t| < m. A
// C stride smaller than one matrix is legal (interleaved outputs, e.g.
// strideC = m inside a 2m-row ldc), so the test is on elements, not bytes.
// Real cuBLAS would race silently; the emulator refuses (stricter).
bool outputs_overlap(int m, int n, int ldc, long long stride_c, int batch) {
  if (batch < 2 || m == 0 || n == 0) return false;
  __int128 span = (__int128)(n - 1) * ldc + m;
  if (stride_c == 0) return true;
  if (stride_c == LLONG_MIN || (__int128)(stride_c < 0 ? -stride_c : stride_c) >= span) return false;
  long long s = stride_c < 0 ? -stride_c : stride_c;
  for (long long d = 1; d < batch && (__int128)d * s < span; d++) {
    long long off = d * s, q = off / ldc, t = off % ldc;  // 0 <= t < ldc
    if (q < n && t < m) return true;                      // same column block, rows overlap
    if (q + 1 < n && ldc - t < m) return true;            // next column, t - ldc > -m
  }
  return false;
}

}  // namespace

cublasStatus_t gemm_call(const GemmCall& c, const char* fn) {
  Handle* h = lookup(c.handle, fn);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  cuemuAddCounter("blas_calls", 1);
  Kind kind = Kind::F32;
  cublasStatus_t st = validate(c, fn, &kind);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (c.m == 0 || c.n == 0 || c.batch == 0) return CUBLAS_STATUS_SUCCESS;

  size_t in_size = kind == Kind::F32 ? 4 : kind == Kind::F64 ? 8 : 2;
  size_t out_size = (kind == Kind::F16_F16 || kind == Kind::BF16_BF16) ? 2 : in_size == 2 ? 4 : in_size;
  size_t scalar_size = kind == Kind::F64 ? 8 : 4;
  int a_rows = c.transa == CUBLAS_OP_N ? c.m : c.k, a_cols = c.transa == CUBLAS_OP_N ? c.k : c.m;
  int b_rows = c.transb == CUBLAS_OP_N ? c.k : c.n, b_cols = c.transb == CUBLAS_OP_N ? c.n : c.k;

  if (c.batch > 1 && outputs_overlap(c.m, c.n, c.ldc, c.stride_c, c.batch))
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                "strideC = %lld makes the %d outputs of the batch (m = %d, n = %d, ldc = %d) overlap; "
                "their writes would race",
                c.stride_c, c.batch, c.m, c.n, c.ldc);

  // A and B are read (k == 0 reads neither), C is written and, when beta is
  // not known to be 0, read: the ABI's write access covers both.
  struct Named {
    const char* what;
    const void* ptr;
    int rows, cols, ld;
    long long stride;
    size_t esize;
    int write;
  } ops[5] = {
      {"A", c.A, a_rows, a_cols, c.lda, c.stride_a, in_size, 0},
      {"B", c.B, b_rows, b_cols, c.ldb, c.stride_b, in_size, 0},
      {"C", c.C, c.m, c.n, c.ldc, c.stride_c, out_size, 1},
      {"alpha", c.alpha, 1, 1, 1, 0, scalar_size, 0},
      {"beta", c.beta, 1, 1, 1, 0, scalar_size, 0},
  };
  bool device_scalars = h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
  cuemu_access acc[5];
  int nacc = 0;
  for (int i = 0; i < (device_scalars ? 5 : 3); i++) {
    const Named& o = ops[i];
    Range r;
    if (!operand_range(o.ptr, o.rows, o.cols, o.ld, o.stride, c.batch, o.esize, &r))
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix %s (%d x %d, ld %d, stride %lld, batch %d) spans more "
                  "than the address space", o.what, o.rows, o.cols, o.ld, o.stride, c.batch);
    if (r.bytes == 0) continue;
    char err[768] = "";
    if (cuemu_check_range(r.ptr, r.bytes, err, sizeof err) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                  "%s %s (%d x %d as stored, ld %d, stride %lld, batch %d: %zu bytes at %p) is not inside "
                  "one device allocation: %s",
                  i < 3 ? "matrix" : "device-mode scalar", o.what, o.rows, o.cols, o.ld, o.stride, c.batch,
                  r.bytes, r.ptr, err);
    acc[nacc++] = cuemu_access{r.ptr, r.bytes, o.write};
  }

  GemmOp* op = new (std::nothrow) GemmOp();
  if (op == nullptr) return fail(CUBLAS_STATUS_ALLOC_FAILED, fn, "out of host memory");
  op->fn = fn;
  op->kind = kind;
  op->call = c;
  op->device_scalars = device_scalars;
  op->reduced_reduction = (h->math_mode & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == 0;
  op->ticket = cuemu_profile_enabled() ? cuemu_profile_ticket() : 0;
  // Host-mode scalars are read now (the caller may reuse them at once, as
  // cuBLAS allows); device-mode ones when the op runs, in stream order.
  if (!device_scalars) {
    op->alpha = kind == Kind::F64 ? *(const double*)c.alpha : *(const float*)c.alpha;
    op->beta = kind == Kind::F64 ? *(const double*)c.beta : *(const float*)c.beta;
  }
  int rc = cuemu_enqueue(h->stream, fn, acc, nacc, gemm_run, op, gemm_destroy);
  if (rc != 0)
    return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, "the driver refused the operation (CUresult %d): %s", rc,
                cuemuLastErrorMessage());
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace cuemu_blas

using namespace cuemu_blas;

CUBLASAPI cublasStatus_t cublasGemmEx(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                      const void* alpha, const void* A, int Atype, int lda, const void* B,
                                      int Btype, int ldb, const void* beta, void* C, int Ctype, int ldc,
                                      int computeType, int algo) {
  GemmCall c{handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
             beta, C, Ctype, ldc, 0, 1, computeType, algo};
  return gemm_call(c, "cublasGemmEx");
}

CUBLASAPI cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, int transa, int transb, int m, int n,
                                                    int k, const void* alpha, const void* A, int Atype, int lda,
                                                    long long strideA, const void* B, int Btype, int ldb,
                                                    long long strideB, const void* beta, void* C, int Ctype,
                                                    int ldc, long long strideC, int batchCount, int computeType,
                                                    int algo) {
  GemmCall c{handle, transa, transb, m,    n,      k,     alpha,   A,          Atype,       lda,  strideA, B,
             Btype,  ldb,    strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo};
  return gemm_call(c, "cublasGemmStridedBatchedEx");
}

// cublasSgemm honours the handle's math mode (TF32 tensor ops when enabled);
// the emulator computes f32 in full precision either way.
CUBLASAPI cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                        const float* alpha, const float* A, int lda, const float* B, int ldb,
                                        const float* beta, float* C, int ldc) {
  GemmCall c{handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0,
             beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT};
  return gemm_call(c, "cublasSgemm_v2");
}

CUBLASAPI cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, int transa, int transb, int m, int n,
                                                   int k, const float* alpha, const float* A, int lda,
                                                   long long strideA, const float* B, int ldb, long long strideB,
                                                   const float* beta, float* C, int ldc, long long strideC,
                                                   int batchCount) {
  GemmCall c{handle, transa,     transb, m,       n,    k, alpha,      A,   CUDA_R_32F, lda,
             strideA, B,         CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC,
             batchCount, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT};
  return gemm_call(c, "cublasSgemmStridedBatched");
}

CUBLASAPI cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                        const double* alpha, const double* A, int lda, const double* B, int ldb,
                                        const double* beta, double* C, int ldc) {
  GemmCall c{handle, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B, CUDA_R_64F, ldb, 0,
             beta, C, CUDA_R_64F, ldc, 0, 1, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT};
  return gemm_call(c, "cublasDgemm_v2");
}

CUBLASAPI cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, int transa, int transb, int m, int n,
                                                   int k, const double* alpha, const double* A, int lda,
                                                   long long strideA, const double* B, int ldb,
                                                   long long strideB, const double* beta, double* C, int ldc,
                                                   long long strideC, int batchCount) {
  GemmCall c{handle, transa,     transb, m,       n,    k, alpha,      A,   CUDA_R_64F, lda,
             strideA, B,         CUDA_R_64F, ldb, strideB, beta, C, CUDA_R_64F, ldc, strideC,
             batchCount, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT};
  return gemm_call(c, "cublasDgemmStridedBatched");
}
