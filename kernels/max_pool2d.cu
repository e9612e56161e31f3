// MaxPool2d, no padding, floor mode, with PyTorch-style indices (CPU twin:
// src/ops/max_pool2d/cpu.rs). Indices are u32 flat positions within each
// (n, c) input plane.
#include "common.cuh"

// NVRTC has no math.h, so no INFINITY / NAN macros.
__device__ __forceinline__ float NEG_INF() { return __int_as_float(0xff800000); }

// One thread per output element. The window is scanned row-major with the
// CPU's rule (scan_window): strictly greater wins, so the first of equal
// maxima stays, and any NaN is taken, so the last NaN wins; a window of only
// -inf keeps its first element. The value stored is the chosen input
// element itself.
template <typename T>
__device__ void max_pool2d_forward_impl(const T* x, T* y, unsigned int* idx, long long planes, long long h,
                                        long long w, long long oh, long long ow, long long k, long long s) {
  DDP_FOR_EACH(i, planes * oh * ow) {
    long long plane = i / (oh * ow);
    long long r = i - plane * (oh * ow);
    long long oy = r / ow, ox = r - (r / ow) * ow;
    const T* xp = x + plane * h * w;
    long long h0 = oy * s, w0 = ox * s;
    long long best_at = h0 * w + w0;
    float best = NEG_INF();
    for (long long ky = 0; ky < k; ++ky) {
      long long row = (h0 + ky) * w + w0;
      for (long long kx = 0; kx < k; ++kx) {
        float v = ddp::to_f32(xp[row + kx]);
        if (v > best || isnan(v)) {
          best = v;
          best_at = row + kx;
        }
      }
    }
    y[i] = xp[best_at];
    idx[i] = (unsigned int)best_at;
  }
}
DDP_INSTANTIATE(max_pool2d_forward,
                (const T* x, T* y, unsigned int* idx, long long planes, long long h, long long w, long long oh,
                 long long ow, long long k, long long s),
                (x, y, idx, planes, h, w, oh, ow, k, s))

// Gather formulation, one thread per input element: it sums dy over the
// (at most ceil(k/s)^2) windows that contain it and chose it. No atomics, so
// the result is deterministic, every dx element is written (no zeroing
// pass), overlapping windows are handled, and f16 gradients are summed in
// f32 and rounded once. The windows are visited in output order, the order
// the CPU's scatter adds in. An index outside the plane matches no input
// and is dropped (the indices come from the forward kernel).
template <typename T>
__device__ void max_pool2d_backward_impl(const T* dy, const unsigned int* idx, T* dx, long long planes,
                                         long long h, long long w, long long oh, long long ow, long long k,
                                         long long s) {
  DDP_FOR_EACH(i, planes * h * w) {
    long long plane = i / (h * w);
    long long at = i - plane * (h * w);
    long long iy = at / w, ix = at - (at / w) * w;
    // Windows oy with oy*s <= iy < oy*s + k, clipped to the output.
    long long oy_lo = iy >= k ? (iy - k) / s + 1 : 0;
    long long oy_hi = min(iy / s, oh - 1);
    long long ox_lo = ix >= k ? (ix - k) / s + 1 : 0;
    long long ox_hi = min(ix / s, ow - 1);
    const T* g = dy + plane * oh * ow;
    const unsigned int* id = idx + plane * oh * ow;
    float acc = 0.f;
    for (long long oy = oy_lo; oy <= oy_hi; ++oy) {
      for (long long ox = ox_lo; ox <= ox_hi; ++ox) {
        long long o = oy * ow + ox;
        if ((long long)id[o] == at) acc += ddp::to_f32(g[o]);
      }
    }
    dx[i] = ddp::from_f32<T>(acc);
  }
}
DDP_INSTANTIATE(max_pool2d_backward,
                (const T* dy, const unsigned int* idx, T* dx, long long planes, long long h, long long w,
                 long long oh, long long ow, long long k, long long s),
                (dy, idx, dx, planes, h, w, oh, ow, k, s))
