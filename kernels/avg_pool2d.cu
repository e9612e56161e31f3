// AvgPool2d, floor mode, count_include_pad (CPU twin:
// src/ops/avg_pool2d/cpu.rs). Every window divides by kh * kw, the padded
// zeros included; AdaptiveAvgPool2d(1) is the window (H, W), stride (H, W).
// Both kernels overwrite (`=`) every element of their output, so neither
// needs a zeroed buffer, and each output element is written by one thread.
// The f32 sums run in the CPU's order (stated per kernel), so f32 results
// agree with the CPU bit for bit; f16 is widened on load and rounded once.
#include "common.cuh"

// One thread per output element. The window is clipped to the unpadded input
// (padding adds zeros) and summed row-major, top row first, left to right,
// starting from 0, then divided once: sum / (kh * kw), as PyTorch's CPU
// kernel does.
template <typename T>
__device__ void avg_pool2d_forward_impl(const T* x, T* y, long long planes, long long h, long long w,
                                        long long oh, long long ow, long long kh, long long kw, long long sh,
                                        long long sw, long long ph, long long pw) {
  float div = (float)(kh * kw);
  DDP_FOR_EACH(i, planes * oh * ow) {
    long long plane = i / (oh * ow);
    long long r = i - plane * (oh * ow);
    long long oy = r / ow, ox = r - (r / ow) * ow;
    long long y0 = max(oy * sh - ph, 0LL), y1 = min(oy * sh - ph + kh, h);
    long long x0 = max(ox * sw - pw, 0LL), x1 = min(ox * sw - pw + kw, w);
    const T* xp = x + plane * h * w;
    float sum = 0.f;
    for (long long iy = y0; iy < y1; ++iy) {
      for (long long ix = x0; ix < x1; ++ix) sum += ddp::to_f32(xp[iy * w + ix]);
    }
    y[i] = ddp::from_f32<T>(sum / div);
  }
}
DDP_INSTANTIATE(avg_pool2d_forward,
                (const T* x, T* y, long long planes, long long h, long long w, long long oh, long long ow,
                 long long kh, long long kw, long long sh, long long sw, long long ph, long long pw),
                (x, y, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw))

// Gather formulation, one thread per input element: it sums dy / (kh * kw)
// over the windows that hold it, visited in output order (row by row, left
// to right), the order the CPU adds in. No atomics, so the result is
// deterministic and every dx element is written (no zeroing pass); an input
// no window covers (floor mode drops it) gets 0.
template <typename T>
__device__ void avg_pool2d_backward_impl(const T* dy, T* dx, long long planes, long long h, long long w,
                                         long long oh, long long ow, long long kh, long long kw, long long sh,
                                         long long sw, long long ph, long long pw) {
  float div = (float)(kh * kw);
  DDP_FOR_EACH(i, planes * h * w) {
    long long plane = i / (h * w);
    long long at = i - plane * (h * w);
    // Padded coordinates: window o covers [o * s, o * s + k).
    long long py = at / w + ph, px = at - (at / w) * w + pw;
    long long oy_lo = py >= kh ? (py - kh) / sh + 1 : 0;
    long long oy_hi = min(py / sh, oh - 1);
    long long ox_lo = px >= kw ? (px - kw) / sw + 1 : 0;
    long long ox_hi = min(px / sw, ow - 1);
    const T* g = dy + plane * oh * ow;
    float acc = 0.f;
    for (long long oy = oy_lo; oy <= oy_hi; ++oy) {
      for (long long ox = ox_lo; ox <= ox_hi; ++ox) acc += ddp::to_f32(g[oy * ow + ox]) / div;
    }
    dx[i] = ddp::from_f32<T>(acc);
  }
}
DDP_INSTANTIATE(avg_pool2d_backward,
                (const T* dy, T* dx, long long planes, long long h, long long w, long long oh, long long ow,
                 long long kh, long long kw, long long sh, long long sw, long long ph, long long pw),
                (dy, dx, planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw))
