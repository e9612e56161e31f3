// cuBLAS GEMMs are stream operations the driver's race checker sees: a GEMM
// on stream S2 reading what a GEMM on S1 wrote is ordered by an event, and
// reported as a race without one. A race poisons the context (sticky error),
// so it is the last case of its own program.
#include <math.h>
#include <string.h>

#include <vector>

#include "harness.h"

typedef unsigned long long CUdeviceptr;
extern "C" {
int cuInit(unsigned);
int cuDeviceGet(int*, int);
int cuDevicePrimaryCtxRetain(void**, int);
int cuCtxSetCurrent(void*);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
int cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);
int cuStreamCreate(void**, unsigned);
int cuStreamSynchronize(void*);
int cuEventCreate(void**, unsigned);
int cuEventRecord(void*, void*);
int cuStreamWaitEvent(void*, void*, unsigned);
long long cuemuGetCounter(const char*);
typedef struct cublasContext* cublasHandle_t;
int cublasCreate_v2(cublasHandle_t*);
int cublasSetStream_v2(cublasHandle_t, void*);
int cublasGetStream_v2(cublasHandle_t, void**);
int cublasGemmEx(cublasHandle_t, int, int, int, int, int, const void*, const void*, int, int, const void*, int,
                 int, const void*, void*, int, int, int, int);
}
enum { OK = 0, EXECUTION_FAILED = 13, R_32F = 0, COMPUTE_32F = 68, NON_BLOCKING = 1 };

struct Env {
  void* s1 = nullptr;
  void* s2 = nullptr;
  cublasHandle_t h1 = nullptr, h2 = nullptr;  // on s1 and s2
  CUdeviceptr a = 0, x = 0, y = 0;            // 4 x 4 f32 each
};
static Env& env() {
  static Env e = [] {
    Env e;
    void* ctx = nullptr;
    int dev = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(&e.s1, NON_BLOCKING) || cuStreamCreate(&e.s2, NON_BLOCKING) || cublasCreate_v2(&e.h1) ||
        cublasCreate_v2(&e.h2) || cublasSetStream_v2(e.h1, e.s1) || cublasSetStream_v2(e.h2, e.s2) ||
        cuMemAlloc_v2(&e.a, 64) || cuMemAlloc_v2(&e.x, 64) || cuMemAlloc_v2(&e.y, 64))
      throw harness::Failure{"setup failed"};
    std::vector<float> ident(16, 0.0f);
    for (int i = 0; i < 4; i++) ident[i * 5] = 2.0f;  // 2 I
    if (cuMemcpyHtoD_v2(e.a, ident.data(), 64)) throw harness::Failure{"upload failed"};
    return e;
  }();
  return e;
}

// out = in * a (4 x 4) on the handle's stream.
static int gemm(cublasHandle_t h, CUdeviceptr in, CUdeviceptr out) {
  float alpha = 1, beta = 0;
  return cublasGemmEx(h, 0, 0, 4, 4, 4, &alpha, (void*)in, R_32F, 4, (void*)env().a, R_32F, 4, &beta, (void*)out,
                      R_32F, 4, COMPUTE_32F, -1);
}

TEST_CASE(gemm_on_s2_after_an_event_from_s1_is_ordered) {
  Env& e = env();
  void* got_stream = nullptr;
  CHECK(cublasGetStream_v2(e.h2, &got_stream) == OK && got_stream == e.s2);
  long long races = cuemuGetCounter("races");
  CHECK(gemm(e.h1, e.a, e.x) == OK);  // x = 4 I on s1
  void* ev = nullptr;
  CHECK(cuEventCreate(&ev, 0) == 0 && cuEventRecord(ev, e.s1) == 0 && cuStreamWaitEvent(e.s2, ev, 0) == 0);
  CHECK(gemm(e.h2, e.x, e.y) == OK);  // y = 8 I on s2, after the event
  CHECK(cuStreamSynchronize(e.s2) == 0);
  std::vector<float> y(16);
  CHECK(cuMemcpyDtoH_v2(y.data(), e.y, 64) == 0);
  for (int i = 0; i < 16; i++) CHECK_MSG(y[i] == (i % 5 == 0 ? 8.0f : 0.0f), "y[%d] = %g", i, y[i]);
  CHECK(cuemuGetCounter("races") == races);
  CHECK(cuStreamSynchronize(e.s1) == 0);
}

TEST_CASE(gemm_on_s2_reading_s1s_output_without_an_event_is_a_race) {
  Env& e = env();
  long long races = cuemuGetCounter("races");
  CHECK(gemm(e.h1, e.a, e.x) == OK);                // s1 writes x
  CHECK(gemm(e.h2, e.x, e.y) == EXECUTION_FAILED);  // s2 reads x, unordered: refused by the driver
  CHECK_MSG(cuemuGetCounter("races") == races + 1, "races %lld -> %lld", races, cuemuGetCounter("races"));
}

TEST_MAIN
