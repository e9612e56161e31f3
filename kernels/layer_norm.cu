// LayerNorm over the last dimension of a [rows, C] view, forward and
// backward (CPU twin: src/ops/layer_norm/cpu.rs, whose summation orders are
// the contract). Activations (x, y, dy, dx) are `T` (float or __half); the
// weight, bias, their gradients, the saved mean/rstd and every sum are f32,
// as apex keeps LayerNorm (AmpClass::Fp32, like BatchNorm).
//
// Gradient rule: dx is written (`=`); weight.grad and bias.grad are
// accumulated (`+=`), as every parameter gradient is.
//
// Determinism and bits: each row's sums run in one warp, lane by lane in
// column order and then across the lanes in a fixed butterfly, and the
// weight/bias gradients are per-chunk partial sums (rows
// chunk_rows at a time, in row order, one thread per (chunk, column)) added
// to the gradient chunk by chunk in a second kernel, exactly the CPU's
// order; no atomics. Every f32 operation the CPU rounds on its own is an _rn
// intrinsic (NVRTC contracts a*b+c into an FMA otherwise), so f32 results
// are the CPU's bits; f16 activations are widened on load, rounded on store.
#include "common.cuh"

// One warp per row (DDP_FOR_EACH_ROW): mean and variance in two passes from
// -0.0 (ddp::warp_sum), rstd = 1 / sqrt(var + eps), then
// y = (x - mean) * rstd * w (+ b). `b` may be null (bias = False).
template <typename T>
__device__ void layer_norm_forward_impl(const T* x, const float* w, const float* b, T* y, float* mean,
                                        float* rstd, long long rows, long long c, float eps) {
  const float inv_c = __fdiv_rn(1.f, (float)c);
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const T* xr = x + r * c;
    float sum = -0.f;
    for (long long k = lane; k < c; k += 32) sum = __fadd_rn(sum, ddp::to_f32(xr[k]));
    const float mu = __fmul_rn(ddp::warp_sum(sum), inv_c);
    float sq = -0.f;
    for (long long k = lane; k < c; k += 32) {
      const float d = __fsub_rn(ddp::to_f32(xr[k]), mu);
      sq = __fadd_rn(sq, __fmul_rn(d, d));
    }
    const float rs = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fmul_rn(ddp::warp_sum(sq), inv_c), eps)));
    T* yr = y + r * c;
    for (long long k = lane; k < c; k += 32) {
      float h = __fmul_rn(__fmul_rn(__fsub_rn(ddp::to_f32(xr[k]), mu), rs), w[k]);
      if (b != nullptr) h = __fadd_rn(h, b[k]);
      yr[k] = ddp::from_f32<T>(h);
    }
    if (lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}
DDP_INSTANTIATE(layer_norm_forward,
                (const T* x, const float* w, const float* b, T* y, float* mean, float* rstd, long long rows,
                 long long c, float eps),
                (x, w, b, y, mean, rstd, rows, c, eps))

// One warp per row, as forward: dx = rstd * (g - mean(g) - xhat * mean(g *
// xhat)) with g = dy * w, the two sums from 0 in the warp's order.
template <typename T>
__device__ void layer_norm_backward_dx_impl(const T* x, const float* w, const float* mean, const float* rstd,
                                            const T* dy, T* dx, long long rows, long long c) {
  const float inv_c = __fdiv_rn(1.f, (float)c);
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const T* xr = x + r * c;
    const T* gr = dy + r * c;
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.f, sgx = 0.f;
    for (long long k = lane; k < c; k += 32) {
      const float xhat = __fmul_rn(__fsub_rn(ddp::to_f32(xr[k]), mu), rs);
      const float g = __fmul_rn(ddp::to_f32(gr[k]), w[k]);
      sg = __fadd_rn(sg, g);
      sgx = __fadd_rn(sgx, __fmul_rn(g, xhat));
    }
    const float mg = __fmul_rn(ddp::warp_sum(sg), inv_c), mgx = __fmul_rn(ddp::warp_sum(sgx), inv_c);
    T* dr = dx + r * c;
    for (long long k = lane; k < c; k += 32) {
      const float xhat = __fmul_rn(__fsub_rn(ddp::to_f32(xr[k]), mu), rs);
      const float g = __fmul_rn(ddp::to_f32(gr[k]), w[k]);
      dr[k] = ddp::from_f32<T>(__fmul_rn(rs, __fsub_rn(__fsub_rn(g, mg), __fmul_rn(xhat, mgx))));
    }
  }
}
DDP_INSTANTIATE(layer_norm_backward_dx,
                (const T* x, const float* w, const float* mean, const float* rstd, const T* dy, T* dx,
                 long long rows, long long c),
                (x, w, mean, rstd, dy, dx, rows, c))

// One thread per (chunk, column): the chunk's sum(dy * xhat) and sum(dy)
// over its chunk_rows rows (fewer in the last chunk), in row order from 0,
// into pw[chunk * c + k] and pb[chunk * c + k].
template <typename T>
__device__ void layer_norm_backward_partials_impl(const T* x, const float* mean, const float* rstd, const T* dy,
                                                  float* pw, float* pb, long long rows, long long c,
                                                  long long chunk_rows) {
  const long long chunks = (rows + chunk_rows - 1) / chunk_rows;
  DDP_FOR_EACH(i, chunks * c) {
    const long long chunk = i / c, k = i - chunk * c;
    const long long r1 = min(rows, (chunk + 1) * chunk_rows);
    float sw = 0.f, sb = 0.f;
    for (long long r = chunk * chunk_rows; r < r1; ++r) {
      const float g = ddp::to_f32(dy[r * c + k]);
      const float xhat = __fmul_rn(__fsub_rn(ddp::to_f32(x[r * c + k]), mean[r]), rstd[r]);
      sw = __fadd_rn(sw, __fmul_rn(g, xhat));
      sb = __fadd_rn(sb, g);
    }
    pw[i] = sw;
    pb[i] = sb;
  }
}
DDP_INSTANTIATE(layer_norm_backward_partials,
                (const T* x, const float* mean, const float* rstd, const T* dy, float* pw, float* pb,
                 long long rows, long long c, long long chunk_rows),
                (x, mean, rstd, dy, pw, pb, rows, c, chunk_rows))

// One thread per column: dw[k] += pw[0][k], += pw[1][k], ... chunk by chunk
// (and db from pb; db may be null), the CPU's order.
extern "C" __global__ void layer_norm_backward_accumulate(const float* pw, const float* pb, float* dw, float* db,
                                                          long long chunks, long long c) {
  DDP_FOR_EACH(k, c) {
    float aw = dw[k];
    for (long long j = 0; j < chunks; ++j) aw = __fadd_rn(aw, pw[j * c + k]);
    dw[k] = aw;
    if (db != nullptr) {
      float ab = db[k];
      for (long long j = 0; j < chunks; ++j) ab = __fadd_rn(ab, pb[j * c + k]);
      db[k] = ab;
    }
  }
}
