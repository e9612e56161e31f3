// The arithmetic of a GEMM, run on the stream worker after gemm.cpp validated
// and enqueued it. Products go through OpenBLAS (cblas_sgemm / cblas_dgemm,
// single-threaded, so results are deterministic); this file only widens,
// rounds and handles the cases BLAS leaves loose:
//   - beta == 0 never reads C: the m x n block is zeroed first, so NaN or
//     garbage in C cannot leak into the result (cuBLAS's contract);
//   - k == 0 or alpha == 0 is C = beta * C, without touching A or B;
//   - f16 / bf16 inputs are widened into dense f32 scratch, the product and
//     the epilogue `alpha * AB + beta * C` are computed in f32 by one sgemm,
//     and a 16-bit C is rounded from that f32 result ONCE, to nearest even,
//     as cuBLAS does with COMPUTE_32F (accumulate and scale in f32, convert
//     on store). Rounding each step would lose the low bits that rounding
//     once keeps; tests/cublas_gemm.cpp shows a case where they differ.
//   - unless the handle's math mode has CUBLAS_MATH_DISALLOW_REDUCED_
//     PRECISION_REDUCTION, a 16-bit C with a long k is computed as the
//     hardware's split-K may: k cut into slices, each slice's product
//     rounded to 16 bits, the slices summed in 16 bits. cuBLAS picks split-K
//     by shape and GPU; doing it whenever it is allowed makes the emulator
//     at least as far from the one-rounding result as any GPU (an H200 put
//     an O1 weight gradient 46 f16 ulps away under the default mode).
#include <stdio.h>
#include <string.h>

#include <cblas.h>

#include <new>
#include <vector>

#include <cuemu/internal.h>

#include "gemm_op.h"

namespace cuemu_blas {
namespace {

CBLAS_TRANSPOSE tr(int op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }  // OP_C == OP_T on reals

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// C = alpha op(A) op(B) + beta C on one column-major m x n block of C.
template <typename T>
void gemm_block(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, T alpha, const T* A, int lda,
                const T* B, int ldb, T beta, T* C, int ldc) {
  if (beta == T(0)) {
    for (int j = 0; j < n; j++) memset(C + (size_t)j * ldc, 0, sizeof(T) * m);
  }
  if (k == 0 || alpha == T(0)) {
    if (beta != T(0) && beta != T(1))
      for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) C[(size_t)j * ldc + i] *= beta;
    return;
  }
  blas(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A 16-bit rows x cols column-major matrix (leading dimension ld) into dense
// f32 (leading dimension rows).
void widen(const uint16_t* src, int rows, int cols, int ld, bool bf16, float* dst) {
  for (int j = 0; j < cols; j++) {
    const uint16_t* s = src + (size_t)j * ld;
    float* d = dst + (size_t)j * rows;
    if (bf16)
      for (int i = 0; i < rows; i++) d[i] = bf16_to_f32(s[i]);
    else
      for (int i = 0; i < rows; i++) d[i] = f16_to_f32(s[i]);
  }
}

uint16_t to16(float v, bool bf16) { return bf16 ? f32_to_bf16(v) : f32_to_f16(v); }
float from16(uint16_t v, bool bf16) { return bf16 ? bf16_to_f32(v) : f16_to_f32(v); }

// Slices of k that split-K reduces in 16 bits: none below 256, then one per
// 128 values of k, at most 64.
int reduced_slices(int k) { return k < 256 ? 1 : (k / 128 < 64 ? k / 128 : 64); }

// dst = alpha * op(A) op(B) (+ beta * C when beta != 0, C already widened
// into dst) with the product summed over `slices` slices of k, each rounded
// to 16 bits and added in 16 bits: split-K's reduced-precision reduction.
void gemm_sliced(const GemmCall& c, int slices, bool bf16, float alpha, const float* a, int lda, const float* b,
                 int ldb, float beta, float* dst) {
  size_t mn = (size_t)c.m * c.n;
  std::vector<float> part(mn);
  std::vector<uint16_t> sum(mn, to16(0.0f, bf16));
  for (int s = 0; s < slices; s++) {
    int k0 = (int)((long long)c.k * s / slices), k1 = (int)((long long)c.k * (s + 1) / slices);
    // The slice's columns of op(A) and rows of op(B), in their storage.
    const float* as = c.transa == CUBLAS_OP_N ? a + (size_t)k0 * lda : a + k0;
    const float* bs = c.transb == CUBLAS_OP_N ? b + k0 : b + (size_t)k0 * ldb;
    gemm_block(tr(c.transa), tr(c.transb), c.m, c.n, k1 - k0, 1.0f, as, lda, bs, ldb, 0.0f, part.data(), c.m);
    for (size_t i = 0; i < mn; i++) sum[i] = to16(from16(sum[i], bf16) + from16(to16(part[i], bf16), bf16), bf16);
  }
  for (size_t i = 0; i < mn; i++) {
    float v = alpha * from16(sum[i], bf16);
    dst[i] = beta != 0.0f ? v + beta * dst[i] : v;
  }
}

// f16 / bf16 inputs. `out16`: C is 16-bit (round once on store), else f32.
// `reduced`: a 16-bit C may be reduced in 16 bits (see the top of the file).
void run_half(const GemmCall& c, bool bf16, bool out16, bool reduced, float alpha, float beta) {
  int a_rows = c.transa == CUBLAS_OP_N ? c.m : c.k, a_cols = c.transa == CUBLAS_OP_N ? c.k : c.m;
  int b_rows = c.transb == CUBLAS_OP_N ? c.k : c.n, b_cols = c.transb == CUBLAS_OP_N ? c.n : c.k;
  std::vector<float> a((size_t)a_rows * a_cols), b((size_t)b_rows * b_cols), cf;
  if (out16) cf.resize((size_t)c.m * c.n);
  for (int i = 0; i < c.batch; i++) {
    const uint16_t* A = (const uint16_t*)c.A + i * c.stride_a;
    const uint16_t* B = (const uint16_t*)c.B + i * c.stride_b;
    // A stride-0 operand is the same matrix for the whole batch: widen once.
    if (c.k > 0 && (i == 0 || c.stride_a != 0)) widen(A, a_rows, a_cols, c.lda, bf16, a.data());
    if (c.k > 0 && (i == 0 || c.stride_b != 0)) widen(B, b_rows, b_cols, c.ldb, bf16, b.data());
    int lda = a_rows > 1 ? a_rows : 1, ldb = b_rows > 1 ? b_rows : 1;
    if (!out16) {
      float* C = (float*)c.C + i * c.stride_c;
      gemm_block(tr(c.transa), tr(c.transb), c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, C, c.ldc);
      continue;
    }
    uint16_t* C = (uint16_t*)c.C + i * c.stride_c;
    if (beta != 0.0f) widen(C, c.m, c.n, c.ldc, bf16, cf.data());  // beta == 0: C is never read
    int slices = reduced && alpha != 0.0f ? reduced_slices(c.k) : 1;
    if (slices > 1)
      gemm_sliced(c, slices, bf16, alpha, a.data(), lda, b.data(), ldb, beta, cf.data());
    else
      gemm_block(tr(c.transa), tr(c.transb), c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, cf.data(),
                 c.m);
    for (int j = 0; j < c.n; j++) {
      uint16_t* d = C + (size_t)j * c.ldc;
      const float* s = cf.data() + (size_t)j * c.m;
      if (bf16)
        for (int r = 0; r < c.m; r++) d[r] = f32_to_bf16(s[r]);
      else
        for (int r = 0; r < c.m; r++) d[r] = f32_to_f16(s[r]);
    }
  }
}

template <typename T>
void run_plain(const GemmCall& c, T alpha, T beta) {
  for (int i = 0; i < c.batch; i++)
    gemm_block(tr(c.transa), tr(c.transb), c.m, c.n, c.k, alpha, (const T*)c.A + i * c.stride_a, c.lda,
               (const T*)c.B + i * c.stride_b, c.ldb, beta, (T*)c.C + i * c.stride_c, c.ldc);
}

}  // namespace

namespace {

size_t type_bytes(int t) {
  return t == CUDA_R_64F ? 8 : (t == CUDA_R_16F || t == CUDA_R_16BF) ? 2 : 4;
}

// The GEMM's record: its shape, types and FLOPs, and the columns of A, B and
// C it read and wrote (C is read too unless beta is 0), for the L2 model.
void profile(const GemmOp& op, bool reads_c) {
  const GemmCall& c = op.call;
  const int a_rows = c.transa == CUBLAS_OP_N ? c.m : c.k, a_cols = c.transa == CUBLAS_OP_N ? c.k : c.m;
  const int b_rows = c.transb == CUBLAS_OP_N ? c.k : c.n, b_cols = c.transb == CUBLAS_OP_N ? c.n : c.k;
  const size_t ae = type_bytes(c.atype), be = type_bytes(c.btype), ce = type_bytes(c.ctype);
  std::vector<cuemu_prof_span> spans;
  for (int b = 0; b < c.batch; b++) {
    if (c.k > 0) {
      spans.push_back({(uintptr_t)c.A + (uintptr_t)(b * c.stride_a * (long long)ae), a_rows * ae, (size_t)a_cols,
                       (long long)c.lda * (long long)ae, 0});
      spans.push_back({(uintptr_t)c.B + (uintptr_t)(b * c.stride_b * (long long)be), b_rows * be, (size_t)b_cols,
                       (long long)c.ldb * (long long)be, 0});
    }
    const uintptr_t cp = (uintptr_t)c.C + (uintptr_t)(b * c.stride_c * (long long)ce);
    if (reads_c) spans.push_back({cp, c.m * ce, (size_t)c.n, (long long)c.ldc * (long long)ce, 0});
    spans.push_back({cp, c.m * ce, (size_t)c.n, (long long)c.ldc * (long long)ce, 1});
  }
  char fields[512];
  snprintf(fields, sizeof fields,
           "\"m\":%d,\"n\":%d,\"k\":%d,\"batch\":%d,\"transa\":\"%s\",\"transb\":\"%s\",\"atype\":%d,"
           "\"ctype\":%d,\"compute\":%d,\"beta_nonzero\":%s,\"flops\":%.0f",
           c.m, c.n, c.k, c.batch, c.transa == CUBLAS_OP_N ? "N" : "T", c.transb == CUBLAS_OP_N ? "N" : "T",
           c.atype, c.ctype, c.compute, reads_c ? "true" : "false", 2.0 * c.m * c.n * (double)c.k * c.batch);
  cuemu_profile_op(op.ticket, "gemm", op.fn, fields, spans.data(), (int)spans.size());
}

}  // namespace

int gemm_run(void* user, char* err, size_t err_len) {
  GemmOp* op = static_cast<GemmOp*>(user);
  const GemmCall& c = op->call;
  double alpha = op->alpha, beta = op->beta;
  if (op->device_scalars) {  // in stream order: the ranges were declared as reads
    alpha = op->kind == Kind::F64 ? *(const double*)c.alpha : *(const float*)c.alpha;
    beta = op->kind == Kind::F64 ? *(const double*)c.beta : *(const float*)c.beta;
  }
  try {
    switch (op->kind) {
      case Kind::F32: run_plain<float>(c, (float)alpha, (float)beta); break;
      case Kind::F64: run_plain<double>(c, alpha, beta); break;
      case Kind::F16_F16: run_half(c, false, true, op->reduced_reduction, (float)alpha, (float)beta); break;
      case Kind::F16_F32: run_half(c, false, false, false, (float)alpha, (float)beta); break;
      case Kind::BF16_BF16: run_half(c, true, true, op->reduced_reduction, (float)alpha, (float)beta); break;
      case Kind::BF16_F32: run_half(c, true, false, false, (float)alpha, (float)beta); break;
    }
  } catch (const std::bad_alloc&) {
    snprintf(err, err_len, "%s (m = %d, n = %d, k = %d): out of host memory for the f32 scratch", op->fn, c.m,
             c.n, c.k);
    return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  }
  if (cuemu_profile_enabled()) profile(*op, beta != 0.0);
  return 0;
}

void gemm_destroy(void* user) { delete static_cast<GemmOp*>(user); }

}  // namespace cuemu_blas
