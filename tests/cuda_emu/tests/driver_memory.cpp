// The emulated driver's memory checks: fresh memory is NaN-filled, copies out
// of bounds and double frees are refused with messages naming the call and
// the allocation, guard pages and quarantine make stray accesses fault, and
// the device/attribute/error-string queries answer what cudarc asks.
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "../src/driver/api_decls.h"
#include "cuemu/internal.h"
#include "driver_util.h"
#include "harness.h"

namespace {

using drv::contains;
using drv::ctx;



}  // namespace

TEST_CASE(device_queries) {
  ctx();
  int n = -1, v = 0;
  CHECK(cuDeviceGetCount(&n) == 0 && n == 1);
  char name[256];
  CHECK(cuDeviceGetName(name, sizeof name, 0) == 0);
  CHECK_MSG(strcmp(name, "cuemu emulated sm_90 (CPU)") == 0, "name %s", name);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0) == 0 && v == 9);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0) == 0 && v == 0);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0) == 0 && v == 1);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0) == 0 && v == 1024);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) == 0 && v == 132);
  CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0) == 0 && v == 227 * 1024);
  CHECK(cuDeviceGet(&v, 1) == CUDA_ERROR_INVALID_DEVICE);
  CHECK(cuDriverGetVersion(&v) == 0 && v == 13000);
  // The real NVRTC asks any driver it loads for its private tables: "none".
  const void* table = &v;
  CHECK(cuGetExportTable(&table, name) == CUDA_ERROR_NOT_SUPPORTED && table == nullptr);
}

// CUDA_VISIBLE_DEVICES is read once per process: check it in fresh children
// (this program re-executed with DRIVER_TEST_PRINT_COUNT set prints the count).
static int child_mode = [] {
  if (getenv("DRIVER_TEST_PRINT_COUNT")) {
    int n = -1;
    cuInit(0);
    cuDeviceGetCount(&n);
    printf("%d", n);
    fflush(stdout);
    _exit(0);
  }
  return 0;
}();

TEST_CASE(visible_devices) {
  (void)child_mode;
  const char* cases[][3] = {{"", "0", nullptr}, {"0", "1", nullptr}, {"1", "0", nullptr}, {"-1", "0", nullptr},
                            {"0,5", "1", nullptr}, {"0,1", "2", "2"}, {"1", "1", "2"}};
  for (auto& c : cases) {
    std::string cmd = std::string("DRIVER_TEST_PRINT_COUNT=1 CUDA_VISIBLE_DEVICES='") + c[0] + "' ";
    if (c[2]) cmd += std::string("CUEMU_DEVICE_COUNT=") + c[2] + " ";
    cmd += "/proc/" + std::to_string(getpid()) + "/exe";
    FILE* f = popen(cmd.c_str(), "r");
    CHECK(f);
    char buf[16] = {};
    CHECK(fgets(buf, sizeof buf, f) != nullptr);
    pclose(f);
    CHECK_MSG(strcmp(buf, c[1]) == 0, "CUDA_VISIBLE_DEVICES='%s': %s devices, want %s", c[0], buf, c[1]);
  }
}

TEST_CASE(fresh_memory_is_nan) {
  ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 1000) == 0);
  CHECK(p % 16 == 0);
  std::vector<float> h(250, 1.0f);
  CHECK(cuMemcpyDtoH_v2(h.data(), p, 1000) == 0);
  for (float x : h) CHECK(std::isnan(x));
  unsigned char b;
  CHECK(cuMemcpyDtoH_v2(&b, p + 999, 1) == 0 && b == 0xFF);
  CHECK(cuMemFree_v2(p) == 0);
}

TEST_CASE(roundtrip_and_memset) {
  ctx();
  CUdeviceptr p, q;
  CHECK(cuMemAlloc_v2(&p, 64) == 0 && cuMemAlloc_v2(&q, 64) == 0);
  std::vector<int> a(16), b(16, 0);
  for (int i = 0; i < 16; i++) a[i] = i * 7;
  CHECK(cuMemcpyHtoD_v2(p, a.data(), 64) == 0);
  CHECK(cuMemcpyDtoD_v2(q, p, 64) == 0);
  CHECK(cuMemcpyDtoH_v2(b.data(), q, 64) == 0);
  CHECK(a == b);
  CHECK(cuMemsetD8_v2(q, 0, 64) == 0);
  CHECK(cuMemcpyDtoH_v2(b.data(), q, 64) == 0);
  for (int x : b) CHECK(x == 0);
  CHECK(cuMemFree_v2(p) == 0 && cuMemFree_v2(q) == 0);
}

TEST_CASE(copy_out_of_bounds) {
  ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 100) == 0);
  std::vector<char> h(200);
  long long errs = cuemuGetCounter("errors");
  CHECK(cuMemcpyHtoD_v2(p, h.data(), 101) == CUDA_ERROR_INVALID_VALUE);
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "cuMemcpyHtoD_v2") && contains(m, "1 bytes past the end") && contains(m, "(100 bytes)"),
            "message: %s", m.c_str());
  CHECK(cuMemcpyDtoH_v2(h.data(), p + 50, 51) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemsetD8_v2(p - 16, 0, 4) == CUDA_ERROR_INVALID_VALUE);
  m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "before the start"), "message: %s", m.c_str());
  CHECK(cuMemcpyHtoD_v2(0x3e8, h.data(), 4) == CUDA_ERROR_INVALID_VALUE);
  m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "not a device pointer"), "message: %s", m.c_str());
  // A device pointer where the host one belongs (arguments swapped).
  CHECK(cuMemcpyDtoH_v2((void*)p, p, 4) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuemuGetCounter("errors") == errs + 5);
  // The context is still fine (these errors are not sticky).
  CHECK(cuMemcpyHtoD_v2(p, h.data(), 100) == 0);
  CHECK(cuMemFree_v2(p) == 0);
}

TEST_CASE(double_free_and_use_after_free) {
  ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 32) == 0);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "double free") && contains(m, "cuMemFree_v2"), "message: %s", m.c_str());
  char h[32];
  CHECK(cuMemcpyDtoH_v2(h, p, 32) == CUDA_ERROR_INVALID_VALUE);
  m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "freed by cuMemFree_v2"), "message: %s", m.c_str());
  // Not the start of an allocation.
  CHECK(cuMemAlloc_v2(&p, 32) == 0);
  CHECK(cuMemFree_v2(p + 16) == CUDA_ERROR_INVALID_VALUE);
  // Stream-ordered free, then a second one.
  CUstream s;
  CHECK(cuStreamCreate(&s, 1) == 0);
  CHECK(cuMemFreeAsync(p, s) == 0);
  CHECK(cuMemFreeAsync(p, s) == CUDA_ERROR_INVALID_VALUE);
  m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "double free") && contains(m, "cuMemFreeAsync on stream"), "message: %s", m.c_str());
  CHECK(cuStreamSynchronize(s) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

// The guard page and the quarantine: touching memory past the end, or after
// the free, faults (outside a kernel the fault is not handled: the child dies).
TEST_CASE(guard_pages_fault) {
  ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 4096) == 0);
  for (int which = 0; which < 3; which++) {
    pid_t pid = fork();
    if (pid == 0) {
      volatile char* c = (volatile char*)p;
      if (which == 0) c[4095] = 1;  // in bounds: survives
      if (which == 1) (void)c[4096];
      if (which == 2) {
        cuMemFree_v2(p);
        (void)c[0];
      }
      _exit(7);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (which == 0)
      CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 7, "in-bounds access died (%d)", st);
    else
      CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "case %d: status %d, want SIGSEGV", which, st);
  }
  CHECK(cuMemFree_v2(p) == 0);
}

TEST_CASE(check_range_api) {
  ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 256) == 0);
  char err[512];
  CHECK(cuemu_check_range((void*)p, 256, err, sizeof err) == 0);
  CHECK(cuemu_check_range((void*)(p + 128), 128, err, sizeof err) == 0);
  CHECK(cuemu_check_range((void*)(p + 128), 129, err, sizeof err) == CUDA_ERROR_INVALID_VALUE);
  CHECK_MSG(contains(err, "past the end"), "%s", err);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuemu_check_range((void*)p, 4, err, sizeof err) == CUDA_ERROR_INVALID_VALUE);
  CHECK_MSG(contains(err, "freed by"), "%s", err);
}

TEST_CASE(counters) {
  ctx();
  cuemuResetCounters();
  CUdeviceptr p, q;
  CHECK(cuMemAlloc_v2(&p, 100) == 0 && cuMemAlloc_v2(&q, 100) == 0);
  char h[100] = {};
  CHECK(cuMemcpyHtoD_v2(p, h, 100) == 0);
  CHECK(cuMemcpyDtoD_v2(q, p, 60) == 0);
  CHECK(cuMemcpyDtoH_v2(h, q, 30) == 0);
  CHECK(cuMemFree_v2(p) == 0 && cuMemFree_v2(q) == 0);
  CHECK(cuemuGetCounter("allocations") == 2);
  CHECK(cuemuGetCounter("frees") == 2);
  CHECK(cuemuGetCounter("bytes_htod") == 100);
  CHECK(cuemuGetCounter("bytes_dtod") == 60);
  CHECK(cuemuGetCounter("bytes_dtoh") == 30);
  CHECK(cuemuGetCounter("launches") == 0);
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuemuGetCounter("errors") == 0);
  // HtoD and DtoH synchronous copies wait (2), each cuMemFree syncs the context (2).
  CHECK_MSG(cuemuGetCounter("host_syncs") == 4, "host_syncs %lld", cuemuGetCounter("host_syncs"));
}

TEST_CASE(error_strings) {
  const int codes[] = {0, 1, 2, 3, 100, 101, 200, 201, 215, 218, 301, 303, 400, 401, 500, 600, 700, 701, 709, 710, 719, 801, 999};
  for (int c : codes) {
    const char *n = nullptr, *s = nullptr;
    CHECK_MSG(cuGetErrorName(c, &n) == 0 && n && strncmp(n, "CUDA_", 5) == 0, "name of %d", c);
    CHECK_MSG(cuGetErrorString(c, &s) == 0 && s && *s, "string of %d", c);
  }
  const char* n;
  CHECK(cuGetErrorName(700, &n) == 0 && strcmp(n, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
  CHECK(cuGetErrorName(401, &n) == 0 && strcmp(n, "CUDA_ERROR_ILLEGAL_STATE") == 0);
  CHECK(cuGetErrorName(12345, &n) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuemuGetCounter("no such counter") == -1);
}

TEST_MAIN
