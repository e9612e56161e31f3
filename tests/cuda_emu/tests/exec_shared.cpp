// The shared-memory race checker: a missing barrier in a block reduction, a
// read across warps without a barrier, a warp-synchronous reduction without
// __syncwarp and a read of shared memory nobody wrote are each caught naming
// the kernel, the __shared__ variable and offset and the threads; the
// correct versions are quiet.
#include "exec_util.h"

static const char* kSrc = R"(
template <bool kBarrier, bool kLoopBarrier> __device__ void block_sum(const float* x, float* out) {
  __shared__ float partial[256];
  const unsigned t = threadIdx.x;
  partial[t] = x[blockIdx.x * blockDim.x + t];
  if (kBarrier) __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    if (kLoopBarrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}
extern "C" __global__ void reduce_ok(const float* x, float* out) { block_sum<true, true>(x, out); }
extern "C" __global__ void reduce_nobar(const float* x, float* out) { block_sum<false, true>(x, out); }
extern "C" __global__ void reduce_loop_nobar(const float* x, float* out) { block_sum<true, false>(x, out); }

// Each thread reads its neighbour's slot one warp over.
extern "C" __global__ void cross_warp(float* out, int barrier) {
  __shared__ float slot[64];
  const unsigned t = threadIdx.x;
  slot[t] = (float)t;
  if (barrier) __syncthreads();
  out[t] = slot[(t + 32) % 64];
}

// The last-warp unrolling of old CUDA samples: correct only in lockstep.
extern "C" __global__ void warp_sum(const float* x, float* out, int syncwarp) {
  __shared__ float v[64];
  const unsigned t = threadIdx.x;
  v[t] = x[t] + x[t + 32];
  if (syncwarp) __syncwarp();
  for (unsigned s = 16; s > 0; s >>= 1) {
    if (t < s) v[t] += v[t + s];
    if (syncwarp) __syncwarp();
  }
  if (t == 0) out[0] = v[0];
}

// Reads one slot past the ones the block fills.
extern "C" __global__ void stale_shared(float* out, int extra) {
  __shared__ float buf[128];
  const unsigned t = threadIdx.x;
  buf[t] = 1.0f;
  __syncthreads();
  out[t] = buf[t + extra];
}
)";

static const emu::Module& module() {
  static emu::Module m = emu::build(kSrc, "shared.cu");
  return m;
}

static bool has(const char* s, const char* sub) { return strstr(s, sub) != nullptr; }

TEST_CASE(block_reduction_missing_barrier) {
  std::vector<float> x(512), out(2, 0.f);
  for (int i = 0; i < 512; i++) x[i] = (float)(i % 7);
  const float* xp = x.data();
  float* op = out.data();
  emu::expect_ok(emu::launch(module(), "reduce_ok", {2, 1, 1}, {256, 1, 1}, {&xp, &op}));
  float want0 = 0, want1 = 0;
  for (int i = 0; i < 256; i++) want0 += x[i], want1 += x[256 + i];
  CHECK_MSG(out[0] == want0 && out[1] == want1, "%g %g, want %g %g", out[0], out[1], want0, want1);
  cuemu_exec_result r = emu::launch(module(), "reduce_nobar", {2, 1, 1}, {256, 1, 1}, {&xp, &op});
  // Thread 0 reads partial[128] before thread 128 has stored it.
  CHECK_MSG(!r.ok && r.cuda_error == 719 &&
                has(r.message, "shared-memory race in kernel reduce_nobar, block (0,0,0): thread (128,0,0) writes "
                               "__shared__ block_sum<false, true>(float const*, float*)::partial + 512 bytes, which "
                               "thread (0,0,0) read with no __syncthreads between them"),
            "%s", r.message);
  // The barrier inside the loop missing: thread 0's last step reads
  // partial[1] before thread 1 has added partial[3] into it (a store right
  // after a load of the same address, which must still be seen).
  r = emu::launch(module(), "reduce_loop_nobar", {2, 1, 1}, {256, 1, 1}, {&xp, &op});
  CHECK_MSG(!r.ok && has(r.message, "shared-memory race in kernel reduce_loop_nobar, block (0,0,0): thread (1,0,0) "
                                    "writes __shared__ block_sum<true, false>(float const*, float*)::partial + 4 "
                                    "bytes, which thread (0,0,0) read"),
            "%s", r.message);
}

TEST_CASE(cross_warp_read_without_barrier) {
  std::vector<float> out(64, -1.f);
  float* op = out.data();
  int barrier = 1;
  emu::expect_ok(emu::launch(module(), "cross_warp", {1, 1, 1}, {64, 1, 1}, {&op, &barrier}));
  for (int t = 0; t < 64; t++) CHECK_MSG(out[t] == (float)((t + 32) % 64), "out[%d] = %g", t, out[t]);
  barrier = 0;
  cuemu_exec_result r = emu::launch(module(), "cross_warp", {1, 1, 1}, {64, 1, 1}, {&op, &barrier});
  CHECK_MSG(!r.ok && has(r.message, "kernel cross_warp") && has(r.message, "thread (32,0,0) writes __shared__ cross_warp::slot + 128 bytes, which thread (0,0,0) read") &&
                !has(r.message, "lanes of one warp"),
            "%s", r.message);
}

TEST_CASE(warp_synchronous_without_syncwarp) {
  std::vector<float> x(64), out(1, 0.f);
  float want = 0;
  for (int i = 0; i < 64; i++) want += (x[i] = (float)(i % 5));
  const float* xp = x.data();
  float* op = out.data();
  int sync = 1;
  emu::expect_ok(emu::launch(module(), "warp_sum", {1, 1, 1}, {32, 1, 1}, {&xp, &op, &sync}));
  CHECK_MSG(out[0] == want, "%g, want %g", out[0], want);
  sync = 0;
  cuemu_exec_result r = emu::launch(module(), "warp_sum", {1, 1, 1}, {32, 1, 1}, {&xp, &op, &sync});
  CHECK_MSG(!r.ok && has(r.message, "kernel warp_sum") &&
                has(r.message, "thread (1,0,0) writes __shared__ warp_sum::v + 4 bytes, which thread (0,0,0) read") &&
                has(r.message, "lanes of one warp: they are not in lockstep; a __syncwarp orders them"),
            "%s", r.message);
}

TEST_CASE(shared_read_never_written) {
  std::vector<float> out(128, 0.f);
  float* op = out.data();
  int extra = 0;
  emu::expect_ok(emu::launch(module(), "stale_shared", {1, 1, 1}, {128, 1, 1}, {&op, &extra}));
  extra = 1;
  // 64 threads fill buf[0..63]; thread 63 reads buf[64].
  cuemu_exec_result r = emu::launch(module(), "stale_shared", {1, 1, 1}, {64, 1, 1}, {&op, &extra});
  CHECK_MSG(!r.ok && has(r.message, "uninitialized shared read in kernel stale_shared, block (0,0,0): thread "
                                    "(63,0,0) reads __shared__ stale_shared::buf + 256 bytes, which no thread of the "
                                    "block had written"),
            "%s", r.message);
}

TEST_MAIN
