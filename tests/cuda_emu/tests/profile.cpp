// The profiler (CUEMU_PROFILE): warp-level requests and their sectors for
// coalesced, strided, 128-bit and divergent accesses, shared-memory bank
// conflicts and broadcasts, the L2 model's DRAM bytes across launches, a
// GEMM's record, and host order in `seq`. Every figure is what Nsight
// Compute's l1tex__t_requests / l1tex__t_sectors / l1tex__data_bank_conflicts
// would count for the same kernel on a GPU. Then the arithmetic per
// thread-operation: kernels whose every FMA, add, divide, special function,
// integer divide and half conversion is known, and instructions that grow
// exactly with a loop's trip count.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../src/driver/api_decls.h"
#include "cuemu/internal.h"
#include "driver_util.h"
#include "exec_util.h"
#include "harness.h"


namespace {

// A plain array: the constructor below runs before C++ globals are built.
char g_path[128];

// Before anything reads it: the libraries decide once per process.
__attribute__((constructor)) void profile_on() {
  snprintf(g_path, sizeof g_path, "/tmp/cuemu-profile-test-%ld.jsonl", (long)getpid());
  setenv("CUEMU_PROFILE", g_path, 1);
  setenv("CUEMU_L2_BYTES", "1048576", 1);  // 1 MiB: small enough to overflow in a test
}
__attribute__((destructor)) void profile_gone() { unlink(g_path); }

const char* kSource = R"(
extern "C" __global__ void copy_f32(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
// One thread a row of 64 floats: lane l reads row l, 32 rows 256 bytes apart.
extern "C" __global__ void row_sum(const float* x, float* y, int rows) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int c = 0; c < 64; c++) s += x[r * 64 + c];
  y[r] = s;
}
extern "C" __global__ void copy_f4(const float4* x, float4* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
// Odd lanes take a second load: the warp issues it once, for 16 lanes.
extern "C" __global__ void diverge(const float* x, float* y) {
  int i = threadIdx.x;
  float v = x[i];
  if (i & 1) v += x[i + 32];
  y[i] = v;
}
// stride 1: conflict-free; stride 32: every lane in bank 0 (32 wavefronts);
// stride 0: one word for all (a broadcast, one wavefront).
extern "C" __global__ void banks(float* y, int stride) {
  __shared__ float s[32 * 32];
  for (int i = threadIdx.x; i < 32 * 32; i += 32) s[i] = (float)i;
  __syncwarp();
  y[threadIdx.x] = s[(threadIdx.x * stride) % (32 * 32)];
}
)";

// One thread an element; 256 threads in the tests below.
const char* kArith = R"(
#include <cuda_fp16.h>
#define TID (blockIdx.x * blockDim.x + threadIdx.x)
extern "C" __global__ void fma_f32(const float* x, float* y, float a, float b) { y[TID] = fmaf(x[TID], a, b); }
extern "C" __global__ void fma_rn(const float* x, float* y, float a, float b) { y[TID] = __fmaf_rn(x[TID], a, b); }
// Contracted into an FMA under --fmad=true, a multiply and an add otherwise.
extern "C" __global__ void mul_add(const float* x, float* y, float a, float b) { y[TID] = x[TID] * a + b; }
extern "C" __global__ void add_sub_mul(const float* x, float* y, float a, float b) {
  y[TID] = (x[TID] + a) * (x[TID] - b);
}
extern "C" __global__ void sqrt_div(const float* x, float* y, float a) { y[TID] = sqrtf(x[TID]) / a; }
extern "C" __global__ void rsqrt_f32(const float* x, float* y) { y[TID] = rsqrtf(x[TID]); }
extern "C" __global__ void idiv32(const int* x, int* y, int d) { y[TID] = x[TID] / d; }
extern "C" __global__ void idiv_const(const int* x, int* y) { y[TID] = x[TID] / 7 + x[TID] % 10; }
extern "C" __global__ void imod64(const long long* x, long long* y, long long d) { y[TID] = x[TID] % d; }
extern "C" __global__ void exps(const float* x, float* y) { y[TID] = expf(x[TID]) + __expf(-x[TID]); }
// Odd threads only.
extern "C" __global__ void odd_tanh(const float* x, float* y) {
  const unsigned i = TID;
  y[i] = (i & 1) ? tanhf(x[i]) : x[i];
}
extern "C" __global__ void f64_fma(const double* x, double* y, double a, double b) { y[TID] = x[TID] * a + b; }
extern "C" __global__ void to_half(const float* x, __half* y) { y[TID] = __float2half_rn(x[TID]); }
extern "C" __global__ void from_half(const __half* x, float* y) { y[TID] = __half2float(x[TID]); }
// Half arithmetic is native on the GPU: no conversions (the add, computed
// in f32 here, is an f32_add).
extern "C" __global__ void half_add(const __half* x, __half* y) { y[TID] = __hadd(x[TID], y[TID]); }
__device__ __noinline__ float exp_sum(float v) { return expf(v) + expf(-v); }
extern "C" __global__ void calls_device_fn(const float* x, float* y) { y[TID] = exp_sum(x[TID]); }
// 64 floats a thread in a loop (the instrumentation keeps it scalar).
extern "C" __global__ void scale_row(const float* x, float* y, float a) {
  for (int j = 0; j < 64; j++) y[TID * 64 + j] = x[TID * 64 + j] * a;
}
// 8 floats a thread in one 256-bit multiply.
typedef float f32x8 __attribute__((vector_size(32)));
extern "C" __global__ void scale_simd(const float* x, float* y, float a) {
  f32x8 v;
  __builtin_memcpy(&v, x + TID * 8, sizeof v);
  v *= a;
  __builtin_memcpy(y + TID * 8, &v, sizeof v);
}
// A serial chain of n FMAs.
extern "C" __global__ void chain(const float* x, float* y, int n) {
  float s = 0.f;
  for (int j = 0; j < n; j++) s = s * x[j] + 1.0f;
  y[TID] = s;
}
#undef TID
)";

CUmodule load(const char* src, const char* name, std::vector<std::string> opts) {
  drv::ctx();
  emu::Compiled c = emu::compile(src, name, {}, opts);
  CHECK_MSG(c.rc == 0, "compile: %s", c.log.c_str());
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, c.ptx.c_str()) == 0);
  return mod;
}

CUmodule module() {
  static CUmodule m = load(kSource, "profile.cu", {"--gpu-architecture=compute_90"});
  return m;
}
CUmodule arith(bool fmad = true) {
  static CUmodule fused = load(kArith, "arith.cu", {"--gpu-architecture=compute_90", "--fmad=true"});
  static CUmodule unfused = load(kArith, "arith.cu", {"--gpu-architecture=compute_90", "--fmad=false"});
  return fmad ? fused : unfused;
}

CUdeviceptr dzeros(size_t bytes) {
  drv::ctx();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, bytes) == 0);
  CHECK(cuMemsetD8_v2(p, 0, bytes) == 0);
  return p;
}

void run_in(CUmodule m, const char* kernel, unsigned grid, unsigned block, std::vector<void*> args) {
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, m, kernel) == 0);
  CHECK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, nullptr, args.data(), nullptr) == 0);
  CHECK(cuCtxSynchronize() == 0);
}

void run(const char* kernel, unsigned grid, unsigned block, std::vector<void*> args) {
  run_in(module(), kernel, grid, block, args);
}

// The last record whose name is `name`.
std::string last_record(const char* name) {
  FILE* f = fopen(g_path, "r");
  CHECK_MSG(f, "no profile at %s", g_path);
  std::string found, needle = std::string("\"name\":\"") + name + "\"";
  char line[4096];
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle.c_str())) found = line;
  fclose(f);
  CHECK_MSG(!found.empty(), "no record of %s", name);
  return found;
}

long long field(const std::string& rec, const char* key) {
  const std::string k = std::string("\"") + key + "\":";
  size_t a = rec.find(k);
  CHECK_MSG(a != std::string::npos, "no %s in %s", key, rec.c_str());
  return atoll(rec.c_str() + a + k.size());
}

#define EXPECT_FIELD(rec, key, want) \
  CHECK_MSG(field(rec, key) == (want), "%s = %lld, want %lld: %s", key, field(rec, key), (long long)(want), rec.c_str())

const char* const kArithFields[] = {"f32_fma", "f32_add", "f32_mul", "f32_div", "f32_sqrt", "f32_other",
                                    "f64_ops", "f16_cvt", "special", "int_div32", "int_div64"};

// Runs `kernel` of the arithmetic module on 256 threads (two blocks) with
// zeroed buffers and scalar arguments `scalars`; every arithmetic field of
// its record must be 0 but those in `want`.
std::string arith_run(const char* kernel, std::vector<std::pair<const char*, long long>> want,
                      std::vector<void*> scalars = {}, bool fmad = true) {
  static CUdeviceptr x = dzeros(256 * 64 * 8), y = dzeros(256 * 64 * 8);
  std::vector<void*> args = {&x, &y};
  args.insert(args.end(), scalars.begin(), scalars.end());
  run_in(arith(fmad), kernel, 2, 128, args);
  std::string r = last_record(kernel);
  for (const char* k : kArithFields) {
    long long expect = 0;
    for (auto& [name, n] : want)
      if (strcmp(name, k) == 0) expect = n;
    EXPECT_FIELD(r, k, expect);
  }
  CHECK_MSG(field(r, "instructions") > 0, "no instructions: %s", r.c_str());
  return r;
}

}  // namespace

TEST_CASE(coalesced_f32_is_four_sectors_a_request) {
  const int n = 1024;
  CUdeviceptr x = dzeros(n * 4), y = dzeros(n * 4);
  int nn = n;
  run("copy_f32", n / 256, 256, {&x, &y, &nn});
  std::string r = last_record("copy_f32");
  EXPECT_FIELD(r, "warps", n / 32);
  EXPECT_FIELD(r, "ld_requests", n / 32);
  EXPECT_FIELD(r, "ld_sectors", n / 8);
  EXPECT_FIELD(r, "st_requests", n / 32);
  EXPECT_FIELD(r, "st_sectors", n / 8);
  EXPECT_FIELD(r, "ld_bytes", n * 4);
  EXPECT_FIELD(r, "ld_wavefronts", n / 32);  // one 128-byte line a request
  EXPECT_FIELD(r, "threads", n);
}

TEST_CASE(one_thread_a_row_is_32_sectors_a_request) {
  const int rows = 64;
  CUdeviceptr x = dzeros(rows * 64 * 4), y = dzeros(rows * 4);
  int nr = rows;
  run("row_sum", 1, rows, {&x, &y, &nr});
  std::string r = last_record("row_sum");
  EXPECT_FIELD(r, "ld_requests", 2 * 64);       // two warps, 64 columns each
  EXPECT_FIELD(r, "ld_sectors", 2 * 64 * 32);   // every lane its own sector
  EXPECT_FIELD(r, "ld_wavefronts", 2 * 64 * 32);  // and its own line
  EXPECT_FIELD(r, "max_warp_requests", 64 + 1);  // 64 loads and the store
}

TEST_CASE(float4_is_sixteen_sectors_a_request) {
  const int n = 256;  // float4s
  CUdeviceptr x = dzeros(n * 16), y = dzeros(n * 16);
  int nn = n;
  run("copy_f4", 1, n, {&x, &y, &nn});
  std::string r = last_record("copy_f4");
  EXPECT_FIELD(r, "ld_requests", n / 32);
  EXPECT_FIELD(r, "ld_sectors", n / 32 * 16);
  EXPECT_FIELD(r, "ld_wavefronts", n / 32 * 4);
}

TEST_CASE(divergent_lanes_share_one_request) {
  CUdeviceptr x = dzeros(64 * 4), y = dzeros(32 * 4);
  run("diverge", 1, 32, {&x, &y});
  std::string r = last_record("diverge");
  // x[i] for 32 lanes (4 sectors), then x[i + 32] for the 16 odd lanes:
  // still the 4 sectors of x[33..63], 2 requests.
  EXPECT_FIELD(r, "ld_requests", 2);
  EXPECT_FIELD(r, "ld_sectors", 8);
}

TEST_CASE(shared_bank_conflicts_and_broadcast) {
  CUdeviceptr y = dzeros(32 * 4);
  for (int stride : {1, 32, 0}) {
    run("banks", 1, 32, {&y, &stride});
    std::string r = last_record("banks");
    // 32 stores conflict-free, then the one load under test.
    const long long want_load = stride == 32 ? 32 : 1;
    EXPECT_FIELD(r, "shared_st_requests", 32);
    EXPECT_FIELD(r, "shared_ld_requests", 1);
    EXPECT_FIELD(r, "shared_wavefronts", 32 + want_load);
    EXPECT_FIELD(r, "shared_wavefronts_ideal", 33);
  }
}

TEST_CASE(l2_hits_then_evicts) {
  // 256 KiB read twice hits the second time; after 2 MiB of other reads
  // (twice the 1 MiB L2 of this test) it misses again.
  const int n = 64 * 1024;
  CUdeviceptr x = dzeros(n * 4), y = dzeros(n * 4);
  int nn = n;
  run("copy_f32", n / 256, 256, {&x, &y, &nn});
  run("copy_f32", n / 256, 256, {&x, &y, &nn});
  std::string r = last_record("copy_f32");
  EXPECT_FIELD(r, "dram_read", 0);
  EXPECT_FIELD(r, "dram_write", n * 4);
  const int big = 512 * 1024;
  CUdeviceptr a = dzeros(big * 4), b = dzeros(big * 4);
  int nb = big;
  run("copy_f32", big / 256, 256, {&a, &b, &nb});
  run("copy_f32", n / 256, 256, {&x, &y, &nn});
  r = last_record("copy_f32");
  EXPECT_FIELD(r, "dram_read", n * 4);
}

TEST_CASE(records_carry_host_order) {
  const int n = 256;
  CUdeviceptr x = dzeros(n * 4), y = dzeros(n * 4);
  int nn = n;
  run("copy_f32", 1, 256, {&x, &y, &nn});
  CHECK(cuMemcpyDtoD_v2(y, x, n * 4) == 0);
  CHECK(cuCtxSynchronize() == 0);
  std::string k = last_record("copy_f32"), c = last_record("cuMemcpyDtoD_v2");
  CHECK_MSG(field(c, "seq") == field(k, "seq") + 1, "%s then %s", k.c_str(), c.c_str());
  EXPECT_FIELD(c, "bytes", n * 4);
  EXPECT_FIELD(c, "dram_write", n * 4);
}

TEST_CASE(fma_counts_one_a_thread) {
  float a = 2.f, b = 1.f;
  arith_run("fma_f32", {{"f32_fma", 256}}, {&a, &b});
  arith_run("fma_rn", {{"f32_fma", 256}}, {&a, &b});
  arith_run("mul_add", {{"f32_fma", 256}}, {&a, &b});
  arith_run("mul_add", {{"f32_mul", 256}, {"f32_add", 256}}, {&a, &b}, false);
  // Counters start again at every launch.
  arith_run("fma_f32", {{"f32_fma", 256}}, {&a, &b});
}

TEST_CASE(add_sub_mul_div_sqrt) {
  float a = 2.f, b = 1.f;
  arith_run("add_sub_mul", {{"f32_add", 512}, {"f32_mul", 256}}, {&a, &b});
  arith_run("sqrt_div", {{"f32_sqrt", 256}, {"f32_div", 256}}, {&a});
  double da = 2.0, db = 1.0;
  arith_run("f64_fma", {{"f64_ops", 256}}, {&da, &db});
}

TEST_CASE(integer_division_by_a_runtime_divisor) {
  int d = 3;
  long long d64 = 5;
  arith_run("idiv32", {{"int_div32", 256}}, {&d});
  arith_run("idiv_const", {});  // multiplies, as on the GPU
  arith_run("imod64", {{"int_div64", 256}}, {&d64});
}

TEST_CASE(special_functions_and_divergence) {
  arith_run("exps", {{"special", 512}, {"f32_add", 256}, {"f32_other", 256}});
  arith_run("odd_tanh", {{"special", 128}});
  arith_run("rsqrt_f32", {{"special", 256}});
  arith_run("calls_device_fn", {{"special", 512}, {"f32_add", 256}, {"f32_other", 256}});
}

TEST_CASE(half_conversions) {
  arith_run("to_half", {{"f16_cvt", 256}});
  arith_run("from_half", {{"f16_cvt", 256}});
  arith_run("half_add", {{"f32_add", 256}});
}

TEST_CASE(loops_and_simd_lanes) {
  float a = 3.f;
  arith_run("scale_row", {{"f32_mul", 256 * 64}}, {&a});
  arith_run("scale_simd", {{"f32_mul", 256 * 8}}, {&a});
}

TEST_CASE(instructions_grow_with_the_trip_count) {
  long long ins[3];
  for (int k = 0; k < 3; k++) {
    int n = 1 + 10 * k;
    ins[k] = field(arith_run("chain", {{"f32_fma", 256 * n}}, {&n}), "instructions");
  }
  CHECK_MSG(ins[1] > ins[0] && ins[2] - ins[1] == ins[1] - ins[0], "instructions %lld, %lld, %lld for 1, 11, 21",
            ins[0], ins[1], ins[2]);
}

TEST_MAIN
