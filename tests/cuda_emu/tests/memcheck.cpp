// Exact-byte bounds and uninitialized reads of device memory by kernels. The
// buffers come from the driver (256-byte aligned, as cuMemAlloc's); the
// kernels run through cuemu_exec_grid directly, so a fault ends one launch
// and poisons no context. Every size from 1 to 64 elements, f32 and f16,
// reads and writes, one element past the end and one before the start: each
// is caught naming the kernel, block, thread, allocation and byte offset,
// and the in-bounds launch of the same size is quiet.
#include "driver_util.h"
#include "exec_util.h"

namespace {

const char* kSrc = R"(
#include <cuda_fp16.h>
template <class T> __device__ void rd(const T* x, T* y, long long n, long long off) {
  long long i = threadIdx.x;
  if (i < n) y[i] = x[i + off];
}
template <class T> __device__ void wr(const T* x, T* y, long long n, long long off) {
  long long i = threadIdx.x;
  if (i < n) y[i + off] = x[i];
}
extern "C" __global__ void rd_f32(const float* x, float* y, long long n, long long off) { rd(x, y, n, off); }
extern "C" __global__ void wr_f32(const float* x, float* y, long long n, long long off) { wr(x, y, n, off); }
extern "C" __global__ void rd_f16(const __half* x, __half* y, long long n, long long off) { rd(x, y, n, off); }
extern "C" __global__ void wr_f16(const __half* x, __half* y, long long n, long long off) { wr(x, y, n, off); }
extern "C" __global__ void sum_into(const float* x, float* out, long long n) {
  for (long long i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(out, x[i]);
}
extern "C" __global__ void rotate(float* out, int barrier) {
  __shared__ float s[64];
  s[threadIdx.x] = (float)threadIdx.x;
  if (barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 32) % 64];
}
)";

using drv::ctx;

const emu::Module& module() {
  static emu::Module m = emu::build(kSrc, "memcheck.cu");
  return m;
}

CUdeviceptr dalloc(size_t bytes, bool init) {
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, bytes) == 0);
  if (init) CHECK(cuMemsetD8_v2(p, 0, bytes) == 0);
  CHECK(cuCtxSynchronize() == 0);
  return p;
}

bool has(const char* s, const std::string& sub) { return strstr(s, sub.c_str()) != nullptr; }

// One kernel at every size, off by `off` elements (0: in bounds).
void sweep(const char* kernel, size_t elem, bool write) {
  ctx();
  for (long long n = 1; n <= 64; n++) {
    CUdeviceptr x = dalloc((size_t)n * elem, true), y = dalloc((size_t)n * elem, true);
    CHECK_MSG(x % 256 == 0 && y % 256 == 0, "allocations not 256-byte aligned: 0x%llx 0x%llx", x, y);
    for (long long off : {0LL, 1LL, -1LL}) {
      void* xp = (void*)x;
      void* yp = (void*)y;
      cuemu_exec_result r = emu::launch(module(), kernel, {1, 1, 1}, {64, 1, 1}, {&xp, &yp, &n, &off});
      if (off == 0) {
        CHECK_MSG(r.ok, "%s n=%lld in bounds: %s", kernel, n, r.message);
        continue;
      }
      const CUdeviceptr bad = write ? y : x;
      const long long byte = off > 0 ? n * (long long)elem : -(long long)elem;
      const long long thread = off > 0 ? n - 1 : 0;
      char want[512];
      snprintf(want, sizeof want,
               "invalid global %s of %zu bytes at 0x%llx in kernel %s, block (0,0,0), thread (%lld,0,0): byte offset "
               "%lld of allocation #",
               write ? "write" : "read", elem, (unsigned long long)(bad + byte), kernel, thread, byte);
      char rel[96];
      if (off > 0)
        snprintf(rel, sizeof rel, "(%lld bytes, cuMemAlloc_v2): 0 bytes past its end", n * (long long)elem);
      else
        snprintf(rel, sizeof rel, "(%lld bytes, cuMemAlloc_v2): %zu bytes before its start", n * (long long)elem,
                 elem);
      CHECK_MSG(!r.ok && r.cuda_error == 700 && has(r.message, want) && has(r.message, rel),
                "%s n=%lld off=%lld: error %d '%s', want '%s' ... '%s'", kernel, n, off, r.cuda_error, r.message,
                want, rel);
    }
    CHECK(cuMemFree_v2(x) == 0 && cuMemFree_v2(y) == 0);
  }
}

}  // namespace

TEST_CASE(f32_reads_1_to_64) { sweep("rd_f32", 4, false); }
TEST_CASE(f32_writes_1_to_64) { sweep("wr_f32", 4, true); }
TEST_CASE(f16_reads_1_to_64) { sweep("rd_f16", 2, false); }
TEST_CASE(f16_writes_1_to_64) { sweep("wr_f16", 2, true); }

// A read of bytes no copy, memset or kernel wrote, including the read half of
// an atomic; what a kernel writes counts as written.
TEST_CASE(uninitialized_reads) {
  ctx();
  long long n = 48, off = 0;
  CUdeviceptr x = dalloc(n * 4, false), y = dalloc(n * 4, true), out = dalloc(4, false);
  void *xp = (void*)x, *yp = (void*)y, *op = (void*)out;
  cuemu_exec_result r = emu::launch(module(), "rd_f32", {1, 1, 1}, {64, 1, 1}, {&xp, &yp, &n, &off});
  CHECK_MSG(!r.ok && r.cuda_error == 719 && has(r.message, "uninitialized global read of 4 bytes") &&
                has(r.message, "in kernel rd_f32, block (0,0,0), thread (0,0,0): byte offset 0 of allocation #") &&
                has(r.message, "(192 bytes, cuMemAlloc_v2): never written by a copy, memset or kernel"),
            "%s", r.message);
  // y was written by a memset: copying it into x initializes x.
  emu::expect_ok(emu::launch(module(), "wr_f32", {1, 1, 1}, {64, 1, 1}, {&yp, &xp, &n, &off}));
  emu::expect_ok(emu::launch(module(), "rd_f32", {1, 1, 1}, {64, 1, 1}, {&xp, &yp, &n, &off}));
  // An atomicAdd into memory nobody zeroed.
  r = emu::launch(module(), "sum_into", {1, 1, 1}, {32, 1, 1}, {&xp, &op, &n});
  CHECK_MSG(!r.ok && has(r.message, "uninitialized global read of 4 bytes") && has(r.message, "kernel sum_into") &&
                has(r.message, "(4 bytes, cuMemAlloc_v2)"),
            "%s", r.message);
  CHECK(cuMemsetD8_v2(out, 0, 4) == 0);
  CHECK(cuCtxSynchronize() == 0);
  emu::expect_ok(emu::launch(module(), "sum_into", {1, 1, 1}, {32, 1, 1}, {&xp, &op, &n}));
  CHECK(cuMemFree_v2(x) == 0 && cuMemFree_v2(y) == 0 && cuMemFree_v2(out) == 0);
}

// A kernel touching freed memory: named as a use after free.
TEST_CASE(use_after_free) {
  ctx();
  long long n = 8, off = 0;
  CUdeviceptr x = dalloc(n * 4, true), y = dalloc(n * 4, true);
  CHECK(cuMemFree_v2(x) == 0);
  void *xp = (void*)x, *yp = (void*)y;
  cuemu_exec_result r = emu::launch(module(), "rd_f32", {1, 1, 1}, {8, 1, 1}, {&xp, &yp, &n, &off});
  CHECK_MSG(!r.ok && r.cuda_error == 700 && has(r.message, "invalid global read") &&
                has(r.message, "use after free: freed by cuMemFree_v2"),
            "%s", r.message);
  CHECK(cuMemFree_v2(y) == 0);
}

// The counters of checks performed, through real launches.
TEST_CASE(check_counters) {
  ctx();
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, emu::compile(kSrc, "memcheck.cu").ptx.c_str()) == 0);
  CUfunction rd, rot;
  CHECK(cuModuleGetFunction(&rd, mod, "rd_f32") == 0 && cuModuleGetFunction(&rot, mod, "rotate") == 0);
  long long n = 64, off = 0;
  int barrier = 1;
  CUdeviceptr x = dalloc(n * 4, true), y = dalloc(n * 4, false);
  void* ra[] = {&x, &y, &n, &off};
  void* sa[] = {&y, &barrier};
  cuemuResetCounters();
  CHECK(cuLaunchKernel(rd, 1, 1, 1, 64, 1, 1, 0, nullptr, ra, nullptr) == 0);
  CHECK(cuLaunchKernel(rot, 1, 1, 1, 64, 1, 1, 0, nullptr, sa, nullptr) == 0);
  CHECK(cuCtxSynchronize() == 0);
  // rd_f32: 64 reads and 64 writes; rotate: 64 writes of out.
  CHECK_MSG(cuemuGetCounter("bounds_checks") == 192, "bounds_checks %lld", cuemuGetCounter("bounds_checks"));
  CHECK_MSG(cuemuGetCounter("init_checks") == 64, "init_checks %lld", cuemuGetCounter("init_checks"));
  // rotate: 64 shared writes and 64 shared reads.
  CHECK_MSG(cuemuGetCounter("shared_checks") == 128, "shared_checks %lld", cuemuGetCounter("shared_checks"));
  CHECK(cuMemFree_v2(x) == 0 && cuMemFree_v2(y) == 0);
  CHECK(cuModuleUnload(mod) == 0);
}

// Run by each_switch_turns_its_check_off in a child: three faults, each
// caught by one check; prints which ones went unreported.
TEST_CASE(faults_under_switches) {
  if (!getenv("MEMCHECK_CHILD")) return;
  ctx();
  long long n = 1, one = 1, zero = 0;
  int barrier = 0;
  CUdeviceptr x = dalloc(4, true), y = dalloc(4, true), fresh = dalloc(4, false);
  std::vector<float> out(64);
  void *xp = (void*)x, *yp = (void*)y, *fp = (void*)fresh, *op = out.data();
  const bool bounds = emu::launch(module(), "rd_f32", {1, 1, 1}, {1, 1, 1}, {&xp, &yp, &n, &one}).ok;
  const bool init = emu::launch(module(), "rd_f32", {1, 1, 1}, {1, 1, 1}, {&fp, &yp, &n, &zero}).ok;
  const bool shared = emu::launch(module(), "rotate", {1, 1, 1}, {64, 1, 1}, {&op, &barrier}).ok;
  printf("%d %d %d\n", bounds, init, shared);
}

TEST_CASE(each_switch_turns_its_check_off) {
  const struct {
    const char* env;
    const char* want;
  } cases[] = {{"", "0 0 0"},
               {"CUEMU_MEMCHECK=0", "1 0 0"},
               {"CUEMU_INITCHECK=0", "0 1 0"},
               {"CUEMU_SHAREDCHECK=0", "0 0 1"},
               {"CUEMU_MEMCHECK=0 CUEMU_INITCHECK=0 CUEMU_SHAREDCHECK=0", "1 1 1"}};
  for (auto& c : cases) {
    std::string line = drv::run_child(std::string("MEMCHECK_CHILD=1 ") + c.env, "faults_under_switches");
    CHECK_MSG(line == std::string(c.want) + "\n", "%s: got '%s', want '%s'", c.env[0] ? c.env : "all on",
              line.c_str(), c.want);
  }
}

TEST_MAIN
