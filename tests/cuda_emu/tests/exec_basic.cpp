// Executor basics: thread coordinates, grid-stride loops, per-thread launch cost.
#include "exec_util.h"

static const char* kSrc = R"(
extern "C" __global__ void coords(unsigned* out) {
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  out[b * nt + t] = (b << 16) | t;
}
extern "C" __global__ void saxpy(const float* x, float* y, float a, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
    y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}
extern "C" __global__ void trap_at(int which) {
  if ((int)threadIdx.x == which) __trap();
}
extern "C" __global__ void assert_at(int which) {
  assert((int)threadIdx.x != which);
}
)";

TEST_CASE(coords_3d) {
  emu::Module m = emu::build(kSrc, "basic.cu");
  cuemu_dim3 g{3, 2, 2}, b{4, 3, 2};
  std::vector<unsigned> out(12 * 24, 0xdeadbeef);
  unsigned* p = out.data();
  emu::expect_ok(emu::launch(m, "coords", g, b, {&p}));
  for (unsigned bb = 0; bb < 12; bb++)
    for (unsigned t = 0; t < 24; t++) CHECK_MSG(out[bb * 24 + t] == ((bb << 16) | t), "b %u t %u: %x", bb, t, out[bb * 24 + t]);
}

TEST_CASE(saxpy_2_5M_threads) {
  emu::Module m = emu::build(kSrc, "basic.cu");
  const long long n = 2500000;
  std::vector<float> x(n), y(n);
  for (long long i = 0; i < n; i++) { x[i] = (float)i * 0.5f; y[i] = 1.0f; }
  const float* xp = x.data();
  float* yp = y.data();
  float a = 2.0f;
  long long nn = n;
  // one thread per element: 9766 blocks of 256
  cuemu_dim3 g{(unsigned)((n + 255) / 256), 1, 1}, b{256, 1, 1};
  double best = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = emu::now_s();
    emu::expect_ok(emu::launch(m, "saxpy", g, b, {&xp, &yp, &a, &nn}));
    best = std::min(best, emu::now_s() - t0);
  }
  for (long long i = 0; i < n; i += 9973) CHECK_MSG(y[i] == 1.0f + 3.0f * (float)i, "y[%lld]=%g", i, y[i]);
  std::printf("# saxpy, 2.5M threads (one element each): %.1f ms, %.1f ns/thread\n", best * 1e3, best * 1e9 / n);
}

TEST_CASE(trap_reports_thread) {
  emu::Module m = emu::build(kSrc, "basic.cu");
  int which = 37;
  emu::expect_error(emu::launch(m, "trap_at", {2, 1, 1}, {64, 1, 1}, {&which}), 710, "thread (37,0,0)");
  emu::expect_error(emu::launch(m, "assert_at", {1, 1, 1}, {64, 1, 1}, {&which}), 710, "assertion");
  // and the next launch works
  which = -1;
  emu::expect_ok(emu::launch(m, "trap_at", {2, 1, 1}, {64, 1, 1}, {&which}));
}

TEST_MAIN
