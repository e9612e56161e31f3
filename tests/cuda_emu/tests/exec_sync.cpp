// Barriers, warp shuffles and static shared memory, right and wrong.
#include <cmath>

#include "exec_util.h"

static const char* kSrc = R"(
// out[lane] = results of shuffle trees over in[] (per warp), for width w
extern "C" __global__ void shfl_trees(const int* in, int* out, int w) {
  const int t = threadIdx.x;
  int v = in[t];
  int down = v, x = v, up = v;
  for (int o = w / 2; o > 0; o >>= 1) down += __shfl_down_sync(0xffffffffu, down, o, w);
  for (int o = w / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o, w);
  for (int o = 1; o < w; o <<= 1) { int y = __shfl_up_sync(0xffffffffu, up, o, w); if ((t % w) >= o) up += y; }
  int idx = __shfl_sync(0xffffffffu, v, 3, w);
  float f = __shfl_xor_sync(0xffffffffu, (float)v * 0.5f, 1, w);
  double d = __shfl_down_sync(0xffffffffu, (double)v, 1, w);
  long long ll = __shfl_sync(0xffffffffu, (long long)v << 33, (t + 1) % 32, w);
  __half h = __shfl_xor_sync(0xffffffffu, __float2half((float)(v & 1023)), 2, w);
  out[t * 8 + 0] = down; out[t * 8 + 1] = x; out[t * 8 + 2] = up; out[t * 8 + 3] = idx;
  out[t * 8 + 4] = (int)(f * 2.f); out[t * 8 + 5] = (int)d; out[t * 8 + 6] = (int)(ll >> 33);
  out[t * 8 + 7] = (int)__half2float(h);
}

namespace {
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}
}
extern "C" __global__ void block_sums(const float* x, long long n, float* out) {
  float s = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Shared memory: a read before any write is an error (it would read what
// the block before left), and blocks are isolated.
extern "C" __global__ void shared_probe(unsigned* seen, unsigned* after, int probe) {
  __shared__ unsigned buf[64];
  __shared__ float fl;
  if (threadIdx.x == 0 && probe) { seen[blockIdx.x * 2] = buf[5]; seen[blockIdx.x * 2 + 1] = isnan(fl) ? 1u : 0u; }
  __syncthreads();
  buf[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
  if (threadIdx.x == 0) fl = 1.f;
  __syncthreads();
  after[blockIdx.x * 64 + threadIdx.x] = buf[63 - threadIdx.x];
}
extern "C" __global__ void tree_reduce(const double* in, double* out) {
  __shared__ double s[256];
  const int t = threadIdx.x;
  s[t] = in[t];
  __syncthreads();
  for (int half = 128; half > 0; half >>= 1) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) *out = s[0];
}

// ---- wrong kernels
extern "C" __global__ void bad_divergent_sync(int* p) {
  if (threadIdx.x < 16) __syncthreads();
  p[threadIdx.x] = 1;
}
extern "C" __global__ void bad_early_return(int* p) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  p[threadIdx.x] = 1;
}
extern "C" __global__ void bad_two_barriers(int* p) {
  if (threadIdx.x & 1) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = 1;
}
extern "C" __global__ void bad_shfl_divergent(int* p) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
  p[threadIdx.x] = v;
}
extern "C" __global__ void bad_shfl_mask_names_absent(int* p) {
  int v = threadIdx.x;
  if (threadIdx.x != 3) v = __shfl_xor_sync(0x0000ffffu | (threadIdx.x < 16 ? 0u : 0xffff0000u), v, 1);
  p[threadIdx.x] = v;
}
extern "C" __global__ void bad_shfl_source_outside_mask(int* p) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_down_sync(0x0000ffffu, v, 8, 32);
  p[threadIdx.x] = v;
}
extern "C" __global__ void ok_partial_mask(int* p) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_down_sync(0x0000ffffu, v, 8, 16);
  __syncwarp();
  p[threadIdx.x] = v;
}
extern "C" __global__ void bad_shfl_partial_warp(int* p) {
  int v = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
  p[threadIdx.x] = v;
}
)";

static emu::Module& mod() {
  static emu::Module m = emu::build(kSrc, "sync.cu");
  return m;
}

static int ref_shfl(int kind, const std::vector<int>& v, int lane, int b, int w) {
  int seg = lane & ~(w - 1), j;
  bool in;
  switch (kind) {
    case 0: j = seg + (b & (w - 1)); in = true; break;
    case 1: j = lane - b; in = j >= seg; break;
    case 2: j = lane + b; in = j < seg + w; break;
    default: j = lane ^ b; in = j < seg + w; break;
  }
  return in ? v[j] : v[lane];
}

TEST_CASE(shuffle_trees_match_cpu) {
  for (int w : {32, 16, 8, 4, 2}) {
    std::vector<int> in(64), out(64 * 8);
    for (int i = 0; i < 64; i++) in[i] = (i * 7919 + 13) % 1000 - 300;
    const int* ip = in.data();
    int* op = out.data();
    emu::expect_ok(emu::launch(mod(), "shfl_trees", {1, 1, 1}, {64, 1, 1}, {&ip, &op, &w}));
    for (int warp = 0; warp < 2; warp++) {
      std::vector<int> v(in.begin() + warp * 32, in.begin() + warp * 32 + 32);
      // simulate each tree on the CPU with the same rules
      std::vector<int> down = v, x = v, up = v;
      for (int o = w / 2; o > 0; o >>= 1) {
        std::vector<int> d2 = down, x2 = x;
        for (int l = 0; l < 32; l++) { d2[l] += ref_shfl(2, down, l, o, w); x2[l] += ref_shfl(3, x, l, o, w); }
        down = d2; x = x2;
      }
      for (int o = 1; o < w; o <<= 1) {
        std::vector<int> u2 = up;
        for (int l = 0; l < 32; l++) if ((l % w) >= o) u2[l] += ref_shfl(1, up, l, o, w);
        up = u2;
      }
      for (int l = 0; l < 32; l++) {
        const int t = warp * 32 + l;
        const int* r = &out[t * 8];
        CHECK_MSG(r[0] == down[l], "w %d t %d down %d != %d", w, t, r[0], down[l]);
        CHECK_MSG(r[1] == x[l], "w %d t %d xor %d != %d", w, t, r[1], x[l]);
        CHECK_MSG(r[2] == up[l], "w %d t %d up %d != %d", w, t, r[2], up[l]);
        CHECK_MSG(r[3] == ref_shfl(0, v, l, 3, w), "w %d t %d idx", w, t);
        CHECK_MSG(r[4] == ref_shfl(3, v, l, 1, w), "w %d t %d float xor %d", w, t, r[4]);
        CHECK_MSG(r[5] == ref_shfl(2, v, l, 1, w), "w %d t %d double down", w, t);
        CHECK_MSG(r[6] == ref_shfl(0, v, l, (l + 1) % 32, w), "w %d t %d ll idx %d", w, t, r[6]);
        std::vector<int> hv(32);
        for (int k = 0; k < 32; k++) hv[k] = v[k] & 1023;
        CHECK_MSG(r[7] == ref_shfl(3, hv, l, 2, w), "w %d t %d half xor %d", w, t, r[7]);
      }
    }
  }
}

TEST_CASE(block_sum_like_amp) {
  const long long n = 100000;
  std::vector<float> x(n);
  for (long long i = 0; i < n; i++) x[i] = (float)((i * 37) % 101) * 0.25f;
  for (unsigned threads : {32u, 64u, 256u, 1024u}) {
    const unsigned blocks = 7;
    std::vector<float> out(blocks);
    const float* xp = x.data();
    float* op = out.data();
    long long nn = n;
    emu::expect_ok(emu::launch(mod(), "block_sums", {blocks, 1, 1}, {threads, 1, 1}, {&xp, &nn, &op}));
    // CPU reference with the same fixed tree
    for (unsigned b = 0; b < blocks; b++) {
      std::vector<float> s(threads, 0.f);
      for (unsigned t = 0; t < threads; t++)
        for (long long i = b * (long long)threads + t; i < n; i += (long long)threads * blocks) s[t] += x[i];
      std::vector<float> part(32, 0.f);
      for (unsigned wp = 0; wp < threads / 32; wp++) {
        std::vector<float> v(s.begin() + wp * 32, s.begin() + wp * 32 + 32);
        for (int o = 16; o > 0; o >>= 1) { auto v2 = v; for (int l = 0; l < 32; l++) if (l + o < 32) v2[l] += v[l + o]; v = v2; }
        part[wp] = v[0];
      }
      std::vector<float> v(32);
      for (int l = 0; l < 32; l++) v[l] = l < (int)(threads / 32) ? part[l] : 0.f;
      for (int o = 16; o > 0; o >>= 1) { auto v2 = v; for (int l = 0; l < 32; l++) if (l + o < 32) v2[l] += v[l + o]; v = v2; }
      CHECK_MSG(out[b] == v[0], "threads %u block %u: %.9g != %.9g", threads, b, out[b], v[0]);
    }
  }
}

TEST_CASE(shared_memory_poisoned_per_block) {
  std::vector<unsigned> seen(8, 0), after(4 * 64, 0);
  unsigned* sp = seen.data();
  unsigned* ap = after.data();
  int probe = 0;
  emu::expect_ok(emu::launch(mod(), "shared_probe", {4, 1, 1}, {64, 1, 1}, {&sp, &ap, &probe}));
  for (int b = 0; b < 4; b++)
    for (int t = 0; t < 64; t++) CHECK(after[b * 64 + t] == (unsigned)(b * 1000 + 63 - t));
  probe = 1;
  emu::expect_error(emu::launch(mod(), "shared_probe", {4, 1, 1}, {64, 1, 1}, {&sp, &ap, &probe}), 719,
                    "uninitialized shared read in kernel shared_probe, block (0,0,0): thread (0,0,0) reads __shared__ "
                    "shared_probe::buf + 20 bytes, which no thread of the block had written");
  CHECK(mod().info->shared_end - mod().info->shared_begin >= (long)(64 * 4 + 4));
  std::vector<double> in(256);
  double s = 0, out = 0;
  for (int i = 0; i < 256; i++) in[i] = i * 1.5;
  for (int i = 0; i < 256; i++) s += in[i];
  const double* ip = in.data();
  double* op = &out;
  emu::expect_ok(emu::launch(mod(), "tree_reduce", {1, 1, 1}, {256, 1, 1}, {&ip, &op}));
  CHECK_MSG(out == s, "%g != %g", out, s);
}

TEST_CASE(wrong_barriers_caught) {
  std::vector<int> buf(64);
  int* p = buf.data();
  auto r = emu::launch(mod(), "bad_divergent_sync", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "not reached by every thread");
  emu::expect_error(r, 719, "exited");
  std::printf("# %s\n", r.message);
  r = emu::launch(mod(), "bad_early_return", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "thread (5,0,0) exited");
  r = emu::launch(mod(), "bad_two_barriers", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "waits at line");
  std::printf("# %s\n", r.message);
}

TEST_CASE(wrong_shuffles_caught) {
  std::vector<int> buf(64);
  int* p = buf.data();
  auto r = emu::launch(mod(), "bad_shfl_divergent", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "__shfl_down_sync");
  emu::expect_error(r, 719, "lane 16");
  std::printf("# %s\n", r.message);
  r = emu::launch(mod(), "bad_shfl_mask_names_absent", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "lane 3");
  std::printf("# %s\n", r.message);
  r = emu::launch(mod(), "bad_shfl_source_outside_mask", {1, 1, 1}, {32, 1, 1}, {&p});
  emu::expect_error(r, 719, "not in the mask");
  std::printf("# %s\n", r.message);
  r = emu::launch(mod(), "bad_shfl_partial_warp", {1, 1, 1}, {48, 1, 1}, {&p});
  emu::expect_error(r, 719, "do not exist");
  emu::expect_ok(emu::launch(mod(), "ok_partial_mask", {1, 1, 1}, {32, 1, 1}, {&p}));
  for (int t = 0; t < 16; t++) CHECK_MSG(buf[t] == (t < 8 ? t + 8 : t), "lane %d: %d", t, buf[t]);
}

TEST_MAIN
