// Modules and kernel launches through the emulated driver: kernels compiled
// by the emulated NVRTC load and run; launch limits, swapped arguments, reads
// past an allocation and races between kernels on two streams are caught.
#include <string.h>

#include <cmath>
#include <string>
#include <vector>

#include "../src/driver/api_decls.h"
#include "cuemu/internal.h"
#include "driver_util.h"
#include "harness.h"

extern "C" {
typedef struct _nvrtcProgram* nvrtcProgram;
int nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
int nvrtcCompileProgram(nvrtcProgram, int, const char* const*);
int nvrtcGetPTXSize(nvrtcProgram, size_t*);
int nvrtcGetPTX(nvrtcProgram, char*);
int nvrtcGetProgramLogSize(nvrtcProgram, size_t*);
int nvrtcGetProgramLog(nvrtcProgram, char*);
int nvrtcDestroyProgram(nvrtcProgram*);
}

namespace {

using drv::contains;
using drv::ctx;

const char* kSource = R"(
extern "C" __global__ void fill(float* out, long long n, float v) {
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = v;
}
extern "C" __global__ void shift_copy(const float* x, float* y, long long n) {
  long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i + 1];  // reads one past the end at i = n-1
}
extern "C" __global__ void amp_sumsq_partials(const float* g, long long n, float* partials) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    float s = 0;
    for (long long i = 0; i < n; i++) s += g[i] * g[i];
    partials[0] = s;
  }
}
)";


std::string compile_ptx() {
  static std::string ptx = [] {
    nvrtcProgram p;
    CHECK(nvrtcCreateProgram(&p, kSource, "driver_launch.cu", 0, nullptr, nullptr) == 0);
    const char* opts[] = {"--gpu-architecture=compute_90"};
    int r = nvrtcCompileProgram(p, 1, opts);
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    std::vector<char> log(n + 1);
    nvrtcGetProgramLog(p, log.data());
    CHECK_MSG(r == 0, "nvrtc: %d: %s", r, log.data());
    nvrtcGetPTXSize(p, &n);
    std::vector<char> b(n + 1);
    nvrtcGetPTX(p, b.data());
    nvrtcDestroyProgram(&p);
    return std::string(b.data());
  }();
  return ptx;
}


CUfunction func(const char* name) {
  ctx();
  CUmodule m;
  CHECK(cuModuleLoadData(&m, compile_ptx().c_str()) == 0);
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, m, name) == 0);
  return f;
}

CUdeviceptr dalloc(size_t n) {
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, n) == 0);
  return p;
}

}  // namespace

TEST_CASE(module_errors) {
  ctx();
  CUmodule m;
  CHECK(cuModuleLoadData(&m, ".version 8.0\n.target sm_90\n.address_size 64\n") == CUDA_ERROR_INVALID_PTX);
  CHECK(contains(cuemuLastErrorMessage(), "emulated NVRTC"));
  CHECK(cuModuleLoadData(&m, "\x7f" "ELF\x02\x01") == CUDA_ERROR_INVALID_IMAGE);
  CHECK(cuModuleLoadData(&m, compile_ptx().c_str()) == 0);
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, m, "nope") == CUDA_ERROR_NOT_FOUND);
  std::string msg = cuemuLastErrorMessage();
  CHECK_MSG(contains(msg, "fill") && contains(msg, "shift_copy"), "%s", msg.c_str());
  CHECK(cuModuleUnload(m) == 0);
  CHECK(cuModuleUnload(m) == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE(param_info) {
  CUfunction f = func("fill");
  size_t off, size;
  const size_t want[3][2] = {{0, 8}, {8, 8}, {16, 4}};
  for (int i = 0; i < 3; i++) {
    CHECK(cuFuncGetParamInfo(f, i, &off, &size) == 0);
    CHECK_MSG(off == want[i][0] && size == want[i][1], "param %d: %zu/%zu", i, off, size);
  }
  CHECK(cuFuncGetParamInfo(f, 3, &off, &size) == CUDA_ERROR_INVALID_VALUE);
  size_t count = 0;
  CHECK(cuFuncGetParamCount(f, &count) == 0 && count == 3);
  CHECK(cuFuncGetParamCount(f, nullptr) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE(launch_runs) {
  CUfunction f = func("fill");
  CUstream s;
  CHECK(cuStreamCreate(&s, 1) == 0);
  long long n = 1000;
  CUdeviceptr p = dalloc(n * 4);
  float v = 2.5f;
  void* args[] = {&p, &n, &v};
  cuemuResetCounters();
  CHECK(cuLaunchKernel(f, 4, 1, 1, 128, 1, 1, 0, s, args, nullptr) == 0);
  v = 9.0f;  // arguments were copied at the launch
  CHECK(cuStreamSynchronize(s) == 0);
  std::vector<float> h(n);
  CHECK(cuMemcpyDtoH_v2(h.data(), p, n * 4) == 0);
  for (float x : h) CHECK_MSG(x == 2.5f, "got %f", x);
  CHECK(cuemuGetCounter("launches") == 1);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

TEST_CASE(launch_limits) {
  CUfunction f = func("fill");
  long long n = 4;
  CUdeviceptr p = dalloc(16);
  float v = 0;
  void* args[] = {&p, &n, &v};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 32, 2, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 65, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 49 * 1024, nullptr, args, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 * 1024) == 0);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 49 * 1024, nullptr, args, nullptr) == 0);
  CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 228 * 1024) == CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {nullptr};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, extra) != 0);
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1024, 1, 1, 0, nullptr, args, nullptr) == 0);
  CHECK(cuCtxSynchronize() == 0);
  CHECK(cuMemFree_v2(p) == 0);
}

// A launcher that pushed its arguments in the wrong order is caught at the launch.
TEST_CASE(swapped_arguments) {
  CUfunction f = func("amp_sumsq_partials");
  long long n = 1000;
  CUdeviceptr g = dalloc(n * 4), partials = dalloc(4);
  void* wrong[] = {&g, &partials, &n};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, wrong, nullptr) == CUDA_ERROR_INVALID_VALUE);
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "cuLaunchKernel(amp_sumsq_partials): argument 2") && contains(m, "is 0x3e8, not a device pointer"),
            "%s", m.c_str());
  // A pointer into freed memory is refused too.
  CUdeviceptr dead = dalloc(4);
  CHECK(cuMemFree_v2(dead) == 0);
  void* freed[] = {&g, &n, &dead};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, freed, nullptr) == CUDA_ERROR_INVALID_VALUE);
  CHECK(contains(cuemuLastErrorMessage(), "use after free"));
  // The right order runs, and its read of memory nobody wrote is the
  // initcheck's error, naming the kernel, the thread and the allocation.
  void* right[] = {&g, &n, &partials};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, right, nullptr) == 0);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_LAUNCH_FAILED);
  m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "uninitialized global read of 4 bytes") && contains(m, "kernel amp_sumsq_partials") &&
                contains(m, "thread (0,0,0)") && contains(m, "byte offset 0 of allocation #") &&
                contains(m, "(4000 bytes, cuMemAlloc_v2): never written by a copy, memset or kernel"),
            "%s", m.c_str());
  CHECK(cuDevicePrimaryCtxReset_v2(0) == 0);
}

TEST_CASE(kernel_races_between_streams) {
  CUfunction fill = func("fill"), copy = func("shift_copy");
  CUstream s1, s2;
  CHECK(cuStreamCreate(&s1, 1) == 0 && cuStreamCreate(&s2, 1) == 0);
  long long n = 64, m = 63;
  CUdeviceptr x = dalloc(n * 4), y = dalloc(n * 4);
  float v = 1;
  void* fa[] = {&x, &n, &v};
  void* ca[] = {&x, &y, &m};
  CUevent e;
  CHECK(cuEventCreate(&e, 2) == 0);
  CHECK(cuCtxSynchronize() == 0);
  cuemuResetCounters();
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s1, fa, nullptr) == 0);
  CHECK(cuEventRecord(e, s1) == 0);
  CHECK(cuStreamWaitEvent(s2, e, 0) == 0);
  CHECK(cuLaunchKernel(copy, 1, 1, 1, 64, 1, 1, 0, s2, ca, nullptr) == 0);  // ordered: fine
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s1, fa, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  std::string msg = cuemuLastErrorMessage();
  CHECK_MSG(contains(msg, "kernel fill on stream") && contains(msg, "writes it while kernel shift_copy on stream") &&
                contains(msg, "reads it"),
            "%s", msg.c_str());
  CHECK(cuemuGetCounter("races") == 1);
  CHECK(cuDevicePrimaryCtxReset_v2(0) == 0);
}

// Reading one element past the end is reported before the read: a sticky
// CUDA_ERROR_ILLEGAL_ADDRESS naming the thread, the allocation and the offset.
TEST_CASE(kernel_out_of_bounds_read) {
  CUfunction copy = func("shift_copy");
  long long n = 1024;  // 4096 bytes: x[n] is the first byte after the allocation
  CUdeviceptr x = dalloc(n * 4), y = dalloc(n * 4);
  CHECK(cuMemsetD8_v2(x, 0, n * 4) == 0);
  void* ca[] = {&x, &y, &n};
  CHECK(cuLaunchKernel(copy, 8, 1, 1, 128, 1, 1, 0, nullptr, ca, nullptr) == 0);
  CHECK(cuCtxSynchronize() == CUDA_ERROR_ILLEGAL_ADDRESS);
  std::string msg = cuemuLastErrorMessage();
  CHECK_MSG(contains(msg, "invalid global read of 4 bytes") && contains(msg, "block (7,0,0), thread (127,0,0)") &&
                contains(msg, "byte offset 4096 of allocation") && contains(msg, "(4096 bytes, cuMemAlloc_v2): 0 bytes past its end"),
            "%s", msg.c_str());
  CHECK(cuMemsetD8_v2(y, 0, 4) == CUDA_ERROR_ILLEGAL_ADDRESS);  // sticky
  // The sticky error keeps its first cause: as the last error, and in the
  // code's description (all a program printing a DriverError shows).
  CHECK_MSG(std::string(cuemuLastErrorMessage()) == msg, "last error now: %s", cuemuLastErrorMessage());
  const char* desc = nullptr;
  CHECK(cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &desc) == 0);
  CHECK_MSG(contains(desc, "an illegal memory access was encountered (first cause, sticky: invalid global read of 4 "
                           "bytes") && contains(desc, "thread (127,0,0)"),
            "%s", desc);
  CHECK(cuDevicePrimaryCtxReset_v2(0) == 0);
  CHECK(cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &desc) == 0);
  CHECK_MSG(!strcmp(desc, "an illegal memory access was encountered"), "after the reset: %s", desc);
}

TEST_MAIN
