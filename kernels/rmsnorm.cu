// RMSNorm over the last dimension of a [rows, C] view, forward and backward
// (CPU twin: src/nn/layers/rmsnorm/cpu.rs, whose summation orders are the
// contract): y = x * rstd (* w), rstd = 1 / sqrt(mean(x^2) + eps).
// Activations (x, y, dy, dx) are `T` (float or __half); the weight, its
// gradient, the saved rstd and every sum are f32 (apex's class for norms).
//
// Gradient rule: dx is written (`=`); weight.grad is accumulated (`+=`).
//
// Determinism and bits: each row's sum runs in one warp (lane l over the
// columns l, l + 32, ..., then ddp::warp_sum's butterfly); the weight
// gradient is per-chunk partial sums (chunk_rows rows in row order, one
// thread per (chunk, column)) added chunk by chunk in a second kernel, the
// CPU's order; no atomics. Every f32 operation is an _rn intrinsic, so f32
// results are the CPU's bits. `w` and `dw` may be null
// (elementwise_affine = False).
#include "common.cuh"

// One warp per row: the mean square from -0.0, then y = x * rstd (* w).
template <typename T>
__device__ void rmsnorm_forward_impl(const T* x, const float* w, T* y, float* rstd, long long rows, long long c,
                                     float eps) {
  const float inv_c = __fdiv_rn(1.f, (float)c);
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const T* xr = x + r * c;
    float sq = -0.f;
    for (long long k = lane; k < c; k += 32) {
      const float v = ddp::to_f32(xr[k]);
      sq = __fadd_rn(sq, __fmul_rn(v, v));
    }
    const float rs = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fmul_rn(ddp::warp_sum(sq), inv_c), eps)));
    T* yr = y + r * c;
    for (long long k = lane; k < c; k += 32) {
      float h = __fmul_rn(ddp::to_f32(xr[k]), rs);
      if (w != nullptr) h = __fmul_rn(h, w[k]);
      yr[k] = ddp::from_f32<T>(h);
    }
    if (lane == 0) rstd[r] = rs;
  }
}
DDP_INSTANTIATE(rmsnorm_forward,
                (const T* x, const float* w, T* y, float* rstd, long long rows, long long c, float eps),
                (x, w, y, rstd, rows, c, eps))

// One warp per row: dx = rstd * (g - xhat * mean(g * xhat)) with
// g = dy (* w) and xhat = x * rstd, the sum from 0 in the warp's order.
template <typename T>
__device__ void rmsnorm_backward_dx_impl(const T* x, const float* w, const float* rstd, const T* dy, T* dx,
                                         long long rows, long long c) {
  const float inv_c = __fdiv_rn(1.f, (float)c);
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const T* xr = x + r * c;
    const T* gr = dy + r * c;
    const float rs = rstd[r];
    float sgx = 0.f;
    for (long long k = lane; k < c; k += 32) {
      const float g = w != nullptr ? __fmul_rn(ddp::to_f32(gr[k]), w[k]) : ddp::to_f32(gr[k]);
      sgx = __fadd_rn(sgx, __fmul_rn(g, __fmul_rn(ddp::to_f32(xr[k]), rs)));
    }
    const float mgx = __fmul_rn(ddp::warp_sum(sgx), inv_c);
    T* dr = dx + r * c;
    for (long long k = lane; k < c; k += 32) {
      const float g = w != nullptr ? __fmul_rn(ddp::to_f32(gr[k]), w[k]) : ddp::to_f32(gr[k]);
      const float xhat = __fmul_rn(ddp::to_f32(xr[k]), rs);
      dr[k] = ddp::from_f32<T>(__fmul_rn(rs, __fsub_rn(g, __fmul_rn(xhat, mgx))));
    }
  }
}
DDP_INSTANTIATE(rmsnorm_backward_dx,
                (const T* x, const float* w, const float* rstd, const T* dy, T* dx, long long rows, long long c),
                (x, w, rstd, dy, dx, rows, c))

// One thread per (chunk, column): sum(dy * xhat) over the chunk's
// chunk_rows rows (fewer in the last), in row order from 0, into
// pw[chunk * c + k].
template <typename T>
__device__ void rmsnorm_backward_partials_impl(const T* x, const float* rstd, const T* dy, float* pw, long long rows,
                                               long long c, long long chunk_rows) {
  const long long chunks = (rows + chunk_rows - 1) / chunk_rows;
  DDP_FOR_EACH(i, chunks * c) {
    const long long chunk = i / c, k = i - chunk * c;
    const long long r1 = min(rows, (chunk + 1) * chunk_rows);
    float sw = 0.f;
    for (long long r = chunk * chunk_rows; r < r1; ++r) {
      const float xhat = __fmul_rn(ddp::to_f32(x[r * c + k]), rstd[r]);
      sw = __fadd_rn(sw, __fmul_rn(ddp::to_f32(dy[r * c + k]), xhat));
    }
    pw[i] = sw;
  }
}
DDP_INSTANTIATE(rmsnorm_backward_partials,
                (const T* x, const float* rstd, const T* dy, float* pw, long long rows, long long c,
                 long long chunk_rows),
                (x, rstd, dy, pw, rows, c, chunk_rows))

// One thread per column: dw[k] += pw[0][k], += pw[1][k], ... in chunk order.
extern "C" __global__ void rmsnorm_backward_accumulate(const float* pw, float* dw, long long chunks, long long c) {
  DDP_FOR_EACH(k, c) {
    float a = dw[k];
    for (long long j = 0; j < chunks; ++j) a = __fadd_rn(a, pw[j * c + k]);
    dw[k] = a;
  }
}
