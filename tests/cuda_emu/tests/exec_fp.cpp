// Device-side floating point: every binary16 value, float->half rounding
// edges against a software reference, and the _rn intrinsics never fused.
#include <cmath>
#include <cstring>
#include <immintrin.h>

#include "exec_util.h"

static const char* kSrc = R"(
extern "C" __global__ void h2f(const unsigned short* in, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
    out[i] = __half2float(__ushort_as_half(in[i]));
}
extern "C" __global__ void f2h(const float* in, unsigned short* out, long long n, int mode) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {
    __half h = mode == 0 ? __float2half_rn(in[i]) : mode == 1 ? __float2half_rz(in[i]) : mode == 2 ? __float2half_rd(in[i]) : mode == 3 ? __float2half_ru(in[i]) : __float2half(in[i]);
    out[i] = __half_as_ushort(h);
  }
}
extern "C" __global__ void rn_ops(const float* a, const float* b, const float* c, float* out, long long n) {
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    out[i * 4 + 0] = __fadd_rn(__fmul_rn(a[i], b[i]), c[i]);
    out[i * 4 + 1] = __fmaf_rn(a[i], b[i], c[i]);
    out[i * 4 + 2] = __fadd_rn(a[i] * b[i], c[i]);   // a plain product rounds too: never fused into __fadd_rn
    out[i * 4 + 3] = __fsub_rn(__fdiv_rn(a[i], b[i]), __fsqrt_rn(c[i] < 0 ? -c[i] : c[i]));
  }
}
extern "C" __global__ void half_math(const unsigned short* a, const unsigned short* b, unsigned short* out, long long n) {
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    __half x = __ushort_as_half(a[i]), y = __ushort_as_half(b[i]);
    out[i * 3 + 0] = __half_as_ushort(__hadd(x, y));
    out[i * 3 + 1] = __half_as_ushort(__hmul(x, y));
    out[i * 3 + 2] = __half_as_ushort(x - y);
  }
}
)";

static emu::Module& mod() {
  static emu::Module m = emu::build(kSrc, "fp.cu");
  return m;
}

// F16C as a second reference, without needing -mf16c for the whole program.
__attribute__((target("f16c"))) static float hw_h2f(unsigned short h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) static unsigned short hw_f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// Reference: exact value via double, round by the mode with explicit ties.
static uint16_t ref_f2h(float f, int mode) {
  if (std::isnan(f)) return 0x7fff;
  const bool neg = std::signbit(f);
  double a = std::fabs((double)f);
  const uint16_t s = neg ? 0x8000 : 0;
  if (std::isinf(f)) return s | 0x7c00;
  // candidates: all finite halves in order; find the two neighbours
  // (binary search over magnitudes 0..0x7bff)
  auto val = [](int h) { return h < 0x400 ? h * std::ldexp(1.0, -24) : std::ldexp(1.0 + (h & 0x3ff) / 1024.0, (h >> 10) - 15); };
  int lo = 0, hi = 0x7bff;
  if (a >= val(0x7bff)) {
    // between max and "2^16" (the next step)
    double next = 65536.0;
    bool up;
    if (a == val(0x7bff)) return s | 0x7bff;
    switch (mode) {
      case 0: up = a >= (val(0x7bff) + next) / 2; break;
      case 1: up = false; break;
      case 2: up = neg; break;
      default: up = !neg; break;
    }
    return s | (up ? 0x7c00 : 0x7bff);
  }
  while (hi - lo > 1) { int m = (lo + hi) / 2; if (val(m) <= a) lo = m; else hi = m; }
  if (val(lo) == a) return s | lo;
  bool up;
  switch (mode) {
    case 0: { double mid = (val(lo) + val(hi)) / 2; up = a > mid || (a == mid && (lo & 1)); break; }
    case 1: up = false; break;
    case 2: up = neg; break;
    default: up = !neg; break;
  }
  return s | (up ? hi : lo);
}

TEST_CASE(half_to_float_all_65536) {
  std::vector<unsigned short> in(65536);
  std::vector<float> out(65536);
  for (int i = 0; i < 65536; i++) in[i] = (unsigned short)i;
  const unsigned short* ip = in.data();
  float* op = out.data();
  long long n = 65536;
  emu::expect_ok(emu::launch(mod(), "h2f", {64, 1, 1}, {256, 1, 1}, {&ip, &op, &n}));
  for (int i = 0; i < 65536; i++) {
    float ref = hw_h2f((unsigned short)i);  // F16C: exact widening
    if (std::isnan(ref)) {
      CHECK_MSG(std::isnan(out[i]), "%04x", i);
      CHECK_MSG(f2u(out[i]) == f2u(ref), "%04x: NaN payload %08x != %08x", i, f2u(out[i]), f2u(ref));
    } else {
      CHECK_MSG(f2u(out[i]) == f2u(ref), "%04x: %08x != %08x", i, f2u(out[i]), f2u(ref));
    }
  }
  // and back: every non-NaN half round-trips exactly
  std::vector<unsigned short> back(65536);
  unsigned short* bp = back.data();
  const float* fp = out.data();
  int mode = 0;
  emu::expect_ok(emu::launch(mod(), "f2h", {64, 1, 1}, {256, 1, 1}, {&fp, &bp, &n, &mode}));
  for (int i = 0; i < 65536; i++) {
    bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
    if (nan) CHECK_MSG(back[i] == 0x7fff, "NaN %04x -> %04x", i, back[i]);
    else CHECK_MSG(back[i] == i, "%04x -> %04x", i, back[i]);
  }
}

TEST_CASE(float_to_half_rounding_edges) {
  std::vector<float> in;
  // every half neighbourhood: exact, +-1 ulp(f32), midpoints, midpoints +-1 ulp
  for (int h = 0; h < 0x7c00; h++) {
    float v = hw_h2f((unsigned short)h);
    float nx = h < 0x7bff ? hw_h2f((unsigned short)(h + 1)) : 65536.f;
    float mid = (float)(((double)v + (double)nx) / 2);
    for (float x : {v, mid, nextafterf(mid, 0.f), nextafterf(mid, 1e30f), nextafterf(v, 1e30f)}) {
      in.push_back(x);
      in.push_back(-x);
    }
  }
  for (float x : {65504.f, 65519.f, 65519.99f, 65520.f, 65536.f, 1e10f, 3.4e38f, 1e-8f, 2.98e-8f, 2.9802322e-8f,
                  2.9802326e-8f, 5.96e-8f, 1e-40f, 1.4e-45f, 0.f, INFINITY, NAN, u2f(0x7f800001), u2f(0xffc00000)}) {
    in.push_back(x);
    in.push_back(-x);
  }
  long long n = (long long)in.size();
  std::vector<unsigned short> out(in.size());
  const float* ip = in.data();
  unsigned short* op = out.data();
  for (int mode = 0; mode < 5; mode++) {
    emu::expect_ok(emu::launch(mod(), "f2h", {128, 1, 1}, {256, 1, 1}, {&ip, &op, &n, &mode}));
    for (size_t i = 0; i < in.size(); i++) {
      uint16_t ref = ref_f2h(in[i], mode == 4 ? 0 : mode);
      CHECK_MSG(out[i] == ref, "mode %d: %.9g (%08x) -> %04x, expected %04x", mode, in[i], f2u(in[i]), out[i], ref);
      if (mode == 0 && !std::isnan(in[i])) {
        uint16_t hw = hw_f2h(in[i]);
        CHECK_MSG(out[i] == hw, "F16C disagrees for %.9g: %04x vs %04x", in[i], out[i], hw);
      }
    }
  }
}

TEST_CASE(half_arith_rounds_once) {
  std::vector<unsigned short> a, b;
  for (int i = 0; i < 4000; i++) { a.push_back((unsigned short)((i * 2654435761u) >> 16)); b.push_back((unsigned short)((i * 40503u + 7) & 0xffff)); }
  long long n = (long long)a.size();
  std::vector<unsigned short> out(a.size() * 3);
  const unsigned short* ap = a.data();
  const unsigned short* bp = b.data();
  unsigned short* op = out.data();
  emu::expect_ok(emu::launch(mod(), "half_math", {1, 1, 1}, {128, 1, 1}, {&ap, &bp, &op, &n}));
  for (size_t i = 0; i < a.size(); i++) {
    float x = hw_h2f(a[i]), y = hw_h2f(b[i]);
    uint16_t r[3] = {ref_f2h(x + y, 0), ref_f2h(x * y, 0), ref_f2h(x - y, 0)};
    for (int k = 0; k < 3; k++) CHECK_MSG(out[i * 3 + k] == r[k], "%zu op %d: %04x vs %04x", i, k, out[i * 3 + k], r[k]);
  }
}

TEST_CASE(rn_intrinsics_not_contracted) {
  // a*b+c where the FMA result differs from the two-rounding one
  std::vector<float> a, b, c;
  for (int i = 0; i < 1000; i++) {
    float x = 1.f + (float)i * 1.1920929e-7f * 3, y = 1.f - (float)i * 1.1920929e-7f * 5;
    a.push_back(x); b.push_back(y); c.push_back(-1.f);
  }
  long long n = (long long)a.size();
  std::vector<float> out(n * 4);
  const float *ap = a.data(), *bp = b.data(), *cp = c.data();
  float* op = out.data();
  emu::expect_ok(emu::launch(mod(), "rn_ops", {1, 1, 1}, {64, 1, 1}, {&ap, &bp, &cp, &op, &n}));
  int differ = 0;
  for (long long i = 0; i < n; i++) {
    volatile float p = a[i] * b[i];
    volatile float two = p + c[i];
    float fused = std::fma(a[i], b[i], c[i]);  // libm: exact fma
    CHECK_MSG(f2u(out[i * 4 + 0]) == f2u(two), "%lld: __fadd_rn(__fmul_rn) %.9g != %.9g", i, out[i * 4], (float)two);
    CHECK_MSG(f2u(out[i * 4 + 1]) == f2u(fused), "%lld: __fmaf_rn", i);
    CHECK_MSG(f2u(out[i * 4 + 2]) == f2u(two), "%lld: __fadd_rn(a*b) was fused", i);
    volatile float q = a[i] / b[i];
    volatile float sq = std::sqrt(std::fabs(c[i]));
    CHECK_MSG(f2u(out[i * 4 + 3]) == f2u((float)(q - sq)), "%lld: div/sqrt", i);
    differ += f2u(two) != f2u(fused);
  }
  CHECK_MSG(differ > 100, "test inputs do not separate FMA from mul+add (%d)", differ);
}

TEST_MAIN
