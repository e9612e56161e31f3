// The emulated cuBLAS's GEMMs against a double-precision reference: every
// transpose pair with padded leading dimensions, strided batches, f16 / bf16
// rounding (once, to nearest even), beta = 0 over NaN, k = 0, m = 0, device
// pointer mode, and each argument cuBLAS refuses. Memory comes from the
// emulated driver; the handle runs on the legacy default stream, so the
// synchronous copies order themselves after the GEMMs.
#include <math.h>
#include <string.h>

#include <vector>

#include "harness.h"

// ---- the driver API (libcuda.so) and cuBLAS API (libcublas.so) used here,
// declared from the CUDA 13 headers' signatures, enums as ints.
typedef unsigned long long CUdeviceptr;
extern "C" {
int cuInit(unsigned);
int cuDeviceGet(int*, int);
int cuDevicePrimaryCtxRetain(void**, int);
int cuCtxSetCurrent(void*);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
int cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);
typedef struct cublasContext* cublasHandle_t;
int cublasCreate_v2(cublasHandle_t*);
int cublasDestroy_v2(cublasHandle_t);
int cublasSetStream_v2(cublasHandle_t, void*);
int cublasSetMathMode(cublasHandle_t, int);
int cublasGetMathMode(cublasHandle_t, int*);
int cublasSetPointerMode_v2(cublasHandle_t, int);
int cublasGetPointerMode_v2(cublasHandle_t, int*);
int cublasGetVersion_v2(cublasHandle_t, int*);
const char* cublasGetStatusName(int);
const char* cublasGetStatusString(int);
int cublasGemmEx(cublasHandle_t, int, int, int, int, int, const void*, const void*, int, int, const void*, int,
                 int, const void*, void*, int, int, int, int);
int cublasGemmStridedBatchedEx(cublasHandle_t, int, int, int, int, int, const void*, const void*, int, int,
                               long long, const void*, int, int, long long, const void*, void*, int, int,
                               long long, int, int, int);
int cublasSgemm_v2(cublasHandle_t, int, int, int, int, int, const float*, const float*, int, const float*, int,
                   const float*, float*, int);
int cublasSgemmStridedBatched(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                              long long, const float*, int, long long, const float*, float*, int, long long, int);
int cublasDgemm_v2(cublasHandle_t, int, int, int, int, int, const double*, const double*, int, const double*,
                   int, const double*, double*, int);
}
enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, EXECUTION_FAILED = 13, NOT_SUPPORTED = 15 };
enum { OP_N = 0, OP_T = 1, OP_C = 2 };
enum { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };
enum { COMPUTE_16F = 64, COMPUTE_32F = 68, COMPUTE_32F_PEDANTIC = 69, COMPUTE_32F_FAST_TF32 = 77 };
enum { ALGO_DEFAULT = -1 };

// ---- setup and device buffers
static cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    void* ctx = nullptr;
    int dev = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
      throw harness::Failure{"driver initialization failed"};
    cublasHandle_t b = nullptr;
    if (cublasCreate_v2(&b) != OK) throw harness::Failure{"cublasCreate_v2 failed"};
    return b;
  }();
  return h;
}

struct Dev {
  CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) {
    blas();  // the context is made current there
    CHECK(cuMemAlloc_v2(&p, n ? n : 1) == 0);
  }
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    CHECK(cuMemcpyHtoD_v2(p, v.data(), bytes) == 0);
  }
  ~Dev() { cuMemFree_v2(p); }
  void* ptr() const { return (void*)p; }
  template <typename T>
  std::vector<T> get() const {
    std::vector<T> v(bytes / sizeof(T));
    if (cuMemcpyDtoH_v2(v.data(), p, bytes) != 0) throw harness::Failure{"cuMemcpyDtoH_v2 failed"};
    return v;
  }
};

// ---- numbers
static uint64_t rng = 88172645463325252ull;
static float rnd() {  // in [-1, 1), 24 bits
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}
static uint16_t h16(float f) { _Float16 h = (_Float16)f; uint16_t b; memcpy(&b, &h, 2); return b; }
static float f16(uint16_t b) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
static float round16(double x) { return (float)(_Float16)x; }  // GCC's conversion: the independent reference
static uint16_t bf16(float f) { uint32_t x; memcpy(&x, &f, 4); return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16); }
static float fbf16(uint16_t b) { uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }

// Column-major C = alpha op(A) op(B) + beta C in double (C read only if beta != 0).
static void reference(int ta, int tb, int m, int n, int k, double alpha, const std::vector<double>& A, int lda,
                      const std::vector<double>& B, int ldb, double beta, std::vector<double>& C, int ldc) {
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double acc = 0;
      for (int p = 0; p < k; p++)
        acc += (ta == OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda]) *
               (tb == OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb]);
      double& c = C[i + (size_t)j * ldc];
      c = alpha * acc + (beta == 0 ? 0.0 : beta * c);
    }
}

// The spacing of a format with `bits` fraction bits around w (at least 2^min_exp).
static double ulp_of(double w, int bits, int min_exp) {
  return w == 0 ? ldexp(1.0, min_exp) : fmax(ldexp(1.0, ilogb(w) - bits), ldexp(1.0, min_exp));
}

struct Shape {
  int ta, tb, m, n, k, lda, ldb, ldc;
  size_t a_elems() const { return (size_t)lda * (ta == OP_N ? k : m); }
  size_t b_elems() const { return (size_t)ldb * (tb == OP_N ? n : k); }
  size_t c_elems() const { return (size_t)ldc * n; }
};
static Shape shape(int ta, int tb, int m, int n, int k, int pad) {
  return Shape{ta, tb, m, n, k, (ta == OP_N ? m : k) + pad, (tb == OP_N ? k : n) + pad, m + pad};
}

// One GemmEx of the given types against the reference. `round_c` rounds the
// reference output like C's type; the tolerance is in units of |result| scale.
static void check_gemm(const Shape& s, int type, int ctype, float beta, double tol) {
  float alpha = 1.25f;
  auto q = [&](int t, float x) -> double { return t == R_16F ? f16(h16(x)) : t == R_16BF ? fbf16(bf16(x)) : x; };
  std::vector<double> a(s.a_elems()), b(s.b_elems()), c(s.c_elems());
  for (auto& x : a) x = q(type, rnd());
  for (auto& x : b) x = q(type, rnd());
  for (auto& x : c) x = beta == 0 ? NAN : q(ctype, rnd());  // beta == 0: C must not be read
  auto pack = [&](int t, const std::vector<double>& v) {
    std::vector<uint8_t> out(v.size() * (t == R_32F ? 4 : 2));
    for (size_t i = 0; i < v.size(); i++) {
      if (t == R_32F) { float f = (float)v[i]; memcpy(&out[4 * i], &f, 4); }
      else { uint16_t u = t == R_16F ? h16((float)v[i]) : bf16((float)v[i]); memcpy(&out[2 * i], &u, 2); }
    }
    return out;
  };
  Dev da(pack(type, a)), db(pack(type, b)), dc(pack(ctype, c));
  int st = cublasGemmEx(blas(), s.ta, s.tb, s.m, s.n, s.k, &alpha, da.ptr(), type, s.lda, db.ptr(), type, s.ldb,
                        &beta, dc.ptr(), ctype, s.ldc, COMPUTE_32F, ALGO_DEFAULT);
  CHECK_MSG(st == OK, "cublasGemmEx returned %d", st);
  std::vector<uint8_t> raw = dc.get<uint8_t>();
  std::vector<double> want = c;
  reference(s.ta, s.tb, s.m, s.n, s.k, alpha, a, s.lda, b, s.ldb, beta, want, s.ldc);
  double scale = 1e-30;
  for (int j = 0; j < s.n; j++)
    for (int i = 0; i < s.m; i++) scale = fmax(scale, fabs(want[i + (size_t)j * s.ldc]));
  for (int j = 0; j < s.n; j++)
    for (int i = 0; i < s.ldc; i++) {
      size_t at = i + (size_t)j * s.ldc;
      double got;
      if (ctype == R_32F) { float f; memcpy(&f, &raw[4 * at], 4); got = f; }
      else { uint16_t u; memcpy(&u, &raw[2 * at], 2); got = ctype == R_16F ? f16(u) : fbf16(u); }
      if (i >= s.m) {  // padding rows between columns are not part of C
        CHECK_MSG(isnan(got) == isnan(c[at]) && (isnan(got) || got == q(ctype, (float)c[at])),
                  "padding of C written at row %d col %d", i, j);
        continue;
      }
      CHECK_MSG(!isnan(got), "NaN at (%d, %d): C was read with beta = 0, or not written", i, j);
      // 16-bit outputs: within half an output ulp of the exact value (plus
      // the f32 accumulation's error), which rounding once guarantees.
      double w = want[at], ulp = ctype == R_16F ? ulp_of(w, 10, -24) : ctype == R_16BF ? ulp_of(w, 7, -133) : 0;
      CHECK_MSG(fabs(got - w) <= 0.5 * ulp + tol * scale, "(%d, %d) ta=%d tb=%d m=%d n=%d k=%d: got %.9g want %.9g",
                i, j, s.ta, s.tb, s.m, s.n, s.k, got, w);
    }
}

static const int kShapes[][4] = {{3, 5, 7, 0}, {13, 7, 33, 2}, {1, 1, 1, 0}, {10, 4, 2, 1}, {70, 37, 129, 3}};

TEST_CASE(f32_every_transpose_with_padded_leading_dimensions) {
  for (int ta : {OP_N, OP_T, OP_C})
    for (int tb : {OP_N, OP_T})
      for (auto& d : kShapes)
        for (float beta : {0.0f, 0.75f}) check_gemm(shape(ta, tb, d[0], d[1], d[2], d[3]), R_32F, R_32F, beta, 1e-5);
}

TEST_CASE(f16_every_transpose_rounds_once) {
  for (int ta : {OP_N, OP_T})
    for (int tb : {OP_N, OP_T})
      for (auto& d : kShapes)
        for (float beta : {0.0f, 0.75f}) {
          check_gemm(shape(ta, tb, d[0], d[1], d[2], d[3]), R_16F, R_16F, beta, 1e-5);
          check_gemm(shape(ta, tb, d[0], d[1], d[2], d[3]), R_16F, R_32F, beta, 1e-5);
        }
}

TEST_CASE(bf16_inputs) {
  for (int ta : {OP_N, OP_T})
    for (float beta : {0.0f, 0.5f}) {
      check_gemm(shape(ta, OP_T, 9, 6, 21, 1), R_16BF, R_16BF, beta, 1e-5);
      check_gemm(shape(ta, OP_N, 9, 6, 21, 1), R_16BF, R_32F, beta, 1e-5);
    }
}

// 1 x 1 f16 GEMMs: out = round(alpha * sum_p a_p b_p + beta * c).
static float gemm_1x1_f16(const std::vector<float>& a, const std::vector<float>& b, float alpha, float beta, float c) {
  std::vector<uint16_t> ha, hb, hc{h16(c)};
  for (float x : a) ha.push_back(h16(x));
  for (float x : b) hb.push_back(h16(x));
  Dev da(ha), db(hb), dc(hc);
  int k = (int)a.size();
  CHECK(cublasGemmEx(blas(), OP_N, OP_N, 1, 1, k, &alpha, da.ptr(), R_16F, 1, db.ptr(), R_16F, k, &beta,
                     dc.ptr(), R_16F, 1, COMPUTE_32F, ALGO_DEFAULT) == OK);
  return f16(dc.get<uint16_t>()[0]);
}

TEST_CASE(f16_rounding_once_differs_from_rounding_each_step) {
  const double u = ldexp(1.0, -11);  // half an ulp of 1.0 in f16
  // Accumulation: 1 + u + u = 1 + 2^-10 exactly (an f16 value). Rounding the
  // running sum to f16 at each step ties 1 + u back to 1 (even) twice.
  float once = gemm_1x1_f16({1.0f, (float)u, (float)u}, {1, 1, 1}, 1.0f, 0.0f, 0.0f);
  float stepwise = round16(round16(1.0 + u) + u);
  CHECK_MSG(once == (float)(1.0 + 2 * u), "got %.10g", once);
  CHECK(stepwise == 1.0f && stepwise != once);
  // Epilogue: alpha*AB = 1 + u (not an f16 value), beta*C = u. Once: 1 + 2u;
  // rounding alpha*AB to f16 before adding beta*C gives 1.
  once = gemm_1x1_f16({1.0f, (float)u}, {1, 1}, 1.0f, 1.0f, (float)u);
  stepwise = round16(round16(1.0 + u) + u);
  CHECK_MSG(once == (float)(1.0 + 2 * u), "got %.10g", once);
  CHECK(stepwise != once);
  // Ties go to even: 1 + u -> 1, 1 + 3u -> 1 + 4u.
  CHECK(gemm_1x1_f16({1.0f, (float)u}, {1, 1}, 1.0f, 0.0f, 0.0f) == 1.0f);
  CHECK(gemm_1x1_f16({1.0f + 2 * (float)u, (float)u}, {1, 1}, 1.0f, 0.0f, 0.0f) == (float)(1.0 + 4 * u));
}

// A long k into an f16 C: under the default math mode split-K may reduce in
// f16, so the emulator does (32 slices of 128 here, each rounded to f16 and
// summed in f16); CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (16)
// brings back the one rounding of the f32 sum.
TEST_CASE(f16_long_k_is_reduced_in_f16_unless_the_math_mode_forbids_it) {
  const int k = 4096, slices = 32;
  std::vector<float> a(k), b(k, 1.0f);
  double exact = 0;
  for (int i = 0; i < k; i++) {
    a[i] = (float)((i * 37) % 97 + 1) / 1024.0f;  // f16 values; every slice sum is exact in f32
    exact += a[i];
  }
  double sliced = 0;
  for (int s = 0; s < slices; s++) {
    double part = 0;
    for (int i = k * s / slices; i < k * (s + 1) / slices; i++) part += a[i];
    sliced = round16(sliced + round16(part));
  }
  CHECK(cublasSetMathMode(blas(), 16) == OK);
  float once = gemm_1x1_f16(a, b, 1.0f, 0.0f, 0.0f);
  CHECK(cublasSetMathMode(blas(), 0) == OK);
  float reduced = gemm_1x1_f16(a, b, 1.0f, 0.0f, 0.0f);
  CHECK_MSG(once == round16(exact), "once %.10g, exact %.10g", once, exact);
  CHECK_MSG(reduced == (float)sliced, "reduced %.10g, want %.10g", reduced, sliced);
  CHECK_MSG(reduced != once, "both %.10g: the data does not tell the two apart", once);
}

// Every f16 bit pattern through the GEMM: x * 1 must round-trip bit for bit
// (NaN stays NaN), and alpha * x must round like GCC's _Float16 conversion of
// the f32 product (subnormals, overflow to inf and ties included).
TEST_CASE(f16_conversion_matches_gcc_for_every_value) {
  const int m = 65536;
  std::vector<uint16_t> all(m);
  for (int i = 0; i < m; i++) all[i] = (uint16_t)i;
  Dev da(all), db(std::vector<uint16_t>{h16(1.0f)}), dc((size_t)m * 2);
  for (float alpha : {1.0f, 1.0009765f, 0.3333333f, 3.0517578e-05f, 7777.7f, -2.5f, 1e-8f}) {
    float beta = 0;
    CHECK(cublasGemmEx(blas(), OP_N, OP_N, m, 1, 1, &alpha, da.ptr(), R_16F, m, db.ptr(), R_16F, 1, &beta, dc.ptr(),
                       R_16F, m, COMPUTE_32F, ALGO_DEFAULT) == OK);
    std::vector<uint16_t> got = dc.get<uint16_t>();
    for (int i = 0; i < m; i++) {
      // The accumulator starts at +0 (as on the GPU), so x = -0 gives +0. The
      // sign of an exactly-zero alpha * sum may differ from cuBLAS (OpenBLAS
      // adds alpha * sum to the zeroed C), so zeros compare by value.
      float prod = alpha * (0.0f + f16(all[i]));
      uint16_t want = h16(prod);
      bool nan = isnan(prod);
      CHECK_MSG(nan ? isnan(f16(got[i])) : prod == 0 ? f16(got[i]) == 0 : got[i] == want, "alpha %g, x = 0x%04x: got 0x%04x want 0x%04x", alpha,
                i, got[i], want);
      if (alpha == 1.0f && !nan && prod != 0) CHECK(got[i] == all[i]);
    }
  }
}

TEST_CASE(k0_scales_c_by_beta_and_reads_no_operand) {
  std::vector<float> c0 = {1, 2, 3, 4, 5, 6};
  Dev dc(c0);
  float alpha = 3, beta = -0.5f;
  // k = 0: A (m x 0) and B (0 x n) are empty; NULL is fine, nothing is read.
  CHECK(cublasGemmEx(blas(), OP_N, OP_N, 2, 3, 0, &alpha, nullptr, R_32F, 2, nullptr, R_32F, 1, &beta, dc.ptr(),
                     R_32F, 2, COMPUTE_32F, ALGO_DEFAULT) == OK);
  std::vector<float> got = dc.get<float>();
  for (int i = 0; i < 6; i++) CHECK(got[i] == -0.5f * c0[i]);
  Dev dn(std::vector<float>(6, NAN));
  beta = 0;
  CHECK(cublasGemmEx(blas(), OP_N, OP_N, 2, 3, 0, &alpha, nullptr, R_32F, 2, nullptr, R_32F, 1, &beta, dn.ptr(),
                     R_32F, 2, COMPUTE_32F, ALGO_DEFAULT) == OK);
  for (float v : dn.get<float>()) CHECK(v == 0.0f);
}

TEST_CASE(m0_or_n0_is_a_noop_that_touches_nothing) {
  float alpha = 1, beta = 0;
  CHECK(cublasGemmEx(blas(), OP_N, OP_N, 0, 5, 3, &alpha, nullptr, R_32F, 1, nullptr, R_32F, 3, &beta, nullptr,
                     R_32F, 1, COMPUTE_32F, ALGO_DEFAULT) == OK);
  CHECK(cublasGemmEx(blas(), OP_N, OP_N, 4, 0, 3, &alpha, nullptr, R_32F, 4, nullptr, R_32F, 3, &beta, nullptr,
                     R_32F, 4, COMPUTE_32F, ALGO_DEFAULT) == OK);
  CHECK(cublasGemmStridedBatchedEx(blas(), OP_N, OP_N, 4, 4, 3, &alpha, nullptr, R_32F, 4, 12, nullptr, R_32F, 3,
                                   12, &beta, nullptr, R_32F, 4, 16, 0, COMPUTE_32F, ALGO_DEFAULT) == OK);
}

// Batched, f32 and f16: A shared (stride 0), B and C with gaps between
// members; the gaps of C stay NaN.
static void check_batched(int type) {
  const int m = 5, n = 7, k = 11, batch = 3, lda = m, ldb = n + 1, ldc = m + 2;  // B transposed
  const long long sb = (long long)ldb * k + 3, sc = (long long)ldc * n + 2;
  size_t es = type == R_32F ? 4 : 2;
  std::vector<double> a((size_t)lda * k), b(sb * batch), c(sc * batch, NAN);
  auto q = [&](float x) -> double { return type == R_16F ? f16(h16(x)) : x; };
  for (auto& x : a) x = q(rnd());
  for (auto& x : b) x = q(rnd());
  auto pack = [&](const std::vector<double>& v) {
    std::vector<uint8_t> out(v.size() * es);
    for (size_t i = 0; i < v.size(); i++) {
      if (type == R_32F) { float f = (float)v[i]; memcpy(&out[4 * i], &f, 4); }
      else { uint16_t u = h16((float)v[i]); memcpy(&out[2 * i], &u, 2); }
    }
    return out;
  };
  Dev da(pack(a)), db(pack(b)), dc(pack(c));
  float alpha = 1, beta = 0;
  CHECK(cublasGemmStridedBatchedEx(blas(), OP_N, OP_T, m, n, k, &alpha, da.ptr(), type, lda, 0, db.ptr(), type, ldb,
                                   sb, &beta, dc.ptr(), type, ldc, sc, batch, COMPUTE_32F, ALGO_DEFAULT) == OK);
  std::vector<uint8_t> raw = dc.get<uint8_t>();
  for (int i = 0; i < batch; i++) {
    std::vector<double> want(sc);
    std::vector<double> bi(b.begin() + i * sb, b.begin() + (i + 1) * sb);
    reference(OP_N, OP_T, m, n, k, 1.0, a, lda, bi, ldb, 0.0, want, ldc);
    for (long long e = 0; e < sc; e++) {
      size_t at = i * sc + e;
      double got;
      if (type == R_32F) { float f; memcpy(&f, &raw[4 * at], 4); got = f; }
      else { uint16_t u; memcpy(&u, &raw[2 * at], 2); got = f16(u); }
      bool inside = e < (long long)ldc * n && e % ldc < m;
      if (!inside) { CHECK_MSG(isnan(got), "batch %d: gap element %lld written", i, e); continue; }
      double w = want[e], tol = type == R_32F ? 1e-5 : ulp_of(w, 10, -24);
      CHECK_MSG(fabs(got - w) <= tol, "batch %d element %lld: got %g want %g", i, e, got, w);
    }
  }
}
TEST_CASE(strided_batched_f32_shared_a_and_gaps) { check_batched(R_32F); }
TEST_CASE(strided_batched_f16_shared_a_and_gaps) { check_batched(R_16F); }

TEST_CASE(sgemm_dgemm_and_sgemm_strided_batched) {
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};  // 2 x 2 column-major
  Dev da(a), db(b), dc(std::vector<float>(8, NAN));
  float alpha = 1, beta = 0;
  CHECK(cublasSgemm_v2(blas(), OP_N, OP_N, 2, 2, 2, &alpha, (float*)da.ptr(), 2, (float*)db.ptr(), 2, &beta,
                       (float*)dc.ptr(), 2) == OK);
  std::vector<float> got = dc.get<float>();
  CHECK(got[0] == 23 && got[1] == 34 && got[2] == 31 && got[3] == 46 && isnan(got[4]));
  // Two batch members, the second with B = the same matrix (stride 0) and A^T.
  CHECK(cublasSgemmStridedBatched(blas(), OP_T, OP_N, 2, 2, 2, &alpha, (float*)da.ptr(), 2, 0, (float*)db.ptr(), 2,
                                  0, &beta, (float*)dc.ptr(), 2, 4, 2) == OK);
  got = dc.get<float>();
  CHECK(got[0] == 17 && got[1] == 39 && got[2] == 23 && got[3] == 53 && got[4] == 17 && got[7] == 53);
  std::vector<double> ad = {1, 2, 3, 4}, bd = {5, 6, 7, 8};
  Dev dad(ad), dbd(bd), dcd(std::vector<double>(4, 1.0));
  double alphad = 2, betad = 1;
  CHECK(cublasDgemm_v2(blas(), OP_N, OP_N, 2, 2, 2, &alphad, (double*)dad.ptr(), 2, (double*)dbd.ptr(), 2, &betad,
                       (double*)dcd.ptr(), 2) == OK);
  std::vector<double> gd = dcd.get<double>();
  CHECK(gd[0] == 47 && gd[1] == 69 && gd[2] == 63 && gd[3] == 93);
}

TEST_CASE(device_pointer_mode_reads_scalars_from_device_memory) {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1}, c = {10, 20, 30, 40}, s = {2.0f, 0.5f};
  Dev da(a), db(b), dc(c), ds(s);
  int mode = -1;
  CHECK(cublasGetPointerMode_v2(blas(), &mode) == OK && mode == 0);
  CHECK(cublasSetPointerMode_v2(blas(), 1) == OK);
  int st = cublasGemmEx(blas(), OP_N, OP_N, 2, 2, 2, (float*)ds.ptr(), da.ptr(), R_32F, 2, db.ptr(), R_32F, 2,
                        (float*)ds.ptr() + 1, dc.ptr(), R_32F, 2, COMPUTE_32F, ALGO_DEFAULT);
  // Host scalars in device mode are not device memory: refused, not dereferenced wrongly.
  float host_alpha = 1;
  int st2 = cublasGemmEx(blas(), OP_N, OP_N, 2, 2, 2, &host_alpha, da.ptr(), R_32F, 2, db.ptr(), R_32F, 2,
                         &host_alpha, dc.ptr(), R_32F, 2, COMPUTE_32F, ALGO_DEFAULT);
  CHECK(cublasSetPointerMode_v2(blas(), 0) == OK);
  CHECK(st == OK && st2 == INVALID_VALUE);
  std::vector<float> got = dc.get<float>();
  for (int i = 0; i < 4; i++) CHECK_MSG(got[i] == 2 * a[i] + 0.5f * c[i], "%d: %g", i, got[i]);
  CHECK(cublasSetPointerMode_v2(blas(), 2) == INVALID_VALUE);
}

TEST_CASE(math_modes_and_compute_types_accepted) {
  for (int mode : {0, 1, 2, 3, 16, 3 | 16, 2 | 16}) {
    CHECK(cublasSetMathMode(blas(), mode) == OK);
    int got = -1;
    CHECK(cublasGetMathMode(blas(), &got) == OK && got == mode);
  }
  CHECK(cublasSetMathMode(blas(), 5) == INVALID_VALUE && cublasSetMathMode(blas(), 32) == INVALID_VALUE);
  CHECK(cublasSetMathMode(blas(), 0) == OK);
  // TF32 and PEDANTIC compute in full f32 here: exact on small integers.
  std::vector<float> a = {1, 2, 3, 4};
  Dev da(a), dc(std::vector<float>(4));
  float alpha = 1, beta = 0;
  for (int ct : {COMPUTE_32F_FAST_TF32, COMPUTE_32F_PEDANTIC}) {
    CHECK(cublasGemmEx(blas(), OP_N, OP_N, 2, 2, 2, &alpha, da.ptr(), R_32F, 2, da.ptr(), R_32F, 2, &beta, dc.ptr(),
                       R_32F, 2, ct, 99) == OK);
    std::vector<float> got = dc.get<float>();
    CHECK(got[0] == 7 && got[1] == 10 && got[2] == 15 && got[3] == 22);
  }
  int v = 0;
  CHECK(cublasGetVersion_v2(blas(), &v) == OK && v >= 130000);
  CHECK(strcmp(cublasGetStatusName(7), "CUBLAS_STATUS_INVALID_VALUE") == 0);
  CHECK(strlen(cublasGetStatusString(15)) > 0);
}

// Each argument real cuBLAS refuses, with the status it returns.
TEST_CASE(invalid_arguments_are_refused_with_cublas_statuses) {
  std::vector<float> buf(64, 1.0f);
  Dev d(buf), dc(buf);
  void* p = d.ptr();
  void* pc = dc.ptr();  // C apart from A and B: no operation writes what it reads
  float one = 1;
  auto ex = [&](cublasHandle_t h, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, int at, int ct,
                int comp, int algo, const void* alpha = nullptr, const void* A = nullptr) {
    return cublasGemmEx(h, ta, tb, m, n, k, alpha ? alpha : &one, A ? A : p, at, lda, p, at, ldb, &one, pc, ct, ldc,
                        comp, algo);
  };
  cublasHandle_t h = blas();
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == OK);
  CHECK(ex(nullptr, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == NOT_INITIALIZED);
  CHECK(ex(h, 3, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // OP_CONJG
  CHECK(ex(h, 0, 9, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);
  CHECK(ex(h, 0, 0, -1, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);
  CHECK(ex(h, 0, 0, 2, -1, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);
  CHECK(ex(h, 0, 0, 2, 2, -1, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);
  CHECK(ex(h, 0, 0, 3, 2, 2, 2, 2, 3, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // lda < m (N)
  CHECK(ex(h, 1, 0, 2, 2, 3, 2, 3, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // lda < k (T)
  CHECK(ex(h, 1, 0, 2, 2, 3, 3, 3, 2, R_32F, R_32F, COMPUTE_32F, -1) == OK);              // lda = k (T)
  CHECK(ex(h, 0, 0, 2, 2, 3, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // ldb < k (N)
  CHECK(ex(h, 0, 1, 2, 3, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // ldb < n (T)
  CHECK(ex(h, 0, 0, 3, 2, 2, 3, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // ldc < m
  CHECK(ex(h, 0, 0, 0, 2, 2, 0, 2, 1, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // lda < max(1, 0)
  CHECK(cublasGemmEx(h, 0, 0, 2, 2, 2, nullptr, p, R_32F, 2, p, R_32F, 2, &one, pc, R_32F, 2, COMPUTE_32F, -1) ==
        INVALID_VALUE);                                                                      // alpha NULL
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, 999, -1) == INVALID_VALUE);           // not a compute type
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_16F, COMPUTE_32F, -1) == NOT_SUPPORTED);   // 32F in, 16F out
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_16F, R_16F, COMPUTE_32F_FAST_TF32, -1) == NOT_SUPPORTED);
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_16F, R_16F, COMPUTE_16F, -1) == NOT_SUPPORTED);   // emulator limit
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, 50) == NOT_SUPPORTED);   // bad algo
  CHECK(cublasGemmStridedBatchedEx(h, 0, 0, 2, 2, 2, &one, p, R_32F, 2, 4, p, R_32F, 2, 4, &one, pc, R_32F, 2, 4, -1,
                                   COMPUTE_32F, -1) == INVALID_VALUE);                     // batchCount < 0
  // Out-of-range operands: INVALID_VALUE with a message naming the matrix.
  CHECK(ex(h, 0, 0, 8, 8, 8, 8, 8, 8, R_32F, R_32F, COMPUTE_32F, -1) == OK);              // exactly 64 floats
  CHECK(ex(h, 0, 0, 8, 8, 8, 9, 8, 8, R_32F, R_32F, COMPUTE_32F, -1) == INVALID_VALUE);   // A needs 71
  float host[4] = {1, 2, 3, 4};
  CHECK(ex(h, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1, nullptr, host) == INVALID_VALUE);
  CHECK(cublasGemmStridedBatchedEx(h, 0, 0, 2, 2, 2, &one, p, R_32F, 2, 0, p, R_32F, 2, 0, &one, pc, R_32F, 2, 31, 3,
                                   COMPUTE_32F, -1) == INVALID_VALUE);  // C member 2 ends past 64 floats
  CHECK(cublasGemmStridedBatchedEx(h, 0, 0, 2, 2, 2, &one, p, R_32F, 2, 0, p, R_32F, 2, 0, &one, pc, R_32F, 2, 3, 2,
                                   COMPUTE_32F, -1) == INVALID_VALUE);  // outputs overlap (stride 3 < 4)
  // Interleaved outputs (stride m inside ldc = 2m) do not overlap: accepted.
  CHECK(cublasGemmStridedBatchedEx(h, 0, 0, 2, 2, 2, &one, p, R_32F, 2, 0, p, R_32F, 2, 0, &one, pc, R_32F, 4, 2, 2,
                                   COMPUTE_32F, -1) == OK);
  // A destroyed handle is refused, not used.
  cublasHandle_t h2 = nullptr;
  CHECK(cublasCreate_v2(&h2) == OK);
  CHECK(cublasDestroy_v2(h2) == OK);
  CHECK(ex(h2, 0, 0, 2, 2, 2, 2, 2, 2, R_32F, R_32F, COMPUTE_32F, -1) == NOT_INITIALIZED);
  CHECK(cublasDestroy_v2(h2) == NOT_INITIALIZED);
  CHECK(cuCtxSynchronize() == 0);
}

TEST_MAIN
