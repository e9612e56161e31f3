// BatchNorm2d over NCHW, forward (training and eval), backward, and the
// SyncBatchNorm pieces. CPU twins: src/ops/batch_norm/mod.rs + cpu.rs (the
// local op) and src/ops/batch_norm/sync.rs (the all-reduced statistics).
//
// Activations (x, y, dy, dx) are `T` (float or __half); weight, bias, running
// statistics, saved mean/invstd and every reduction are f32, as apex O2's
// keep_batchnorm_fp32 has them.
//
// Determinism: a channel's reductions run in one block with a fixed thread
// count (the launcher's BN_THREADS), each thread summing a fixed strided
// subset in order, then a fixed warp-shuffle tree; no atomics, so the same
// input gives the same bits on every run.
//
// BatchNorm + ReLU and BatchNorm + add + ReLU fused (the device plan's
// groups, src/nn/cuda/fused/): the forwards' `_relu` and `_add_relu` twins
// apply relu.cu's forward (after add.cu's sum with the residual) to each
// output as they store it, so the bits are those of the layers run one by
// one, with a pass over the activations fewer per layer fused. Backward
// keeps relu.cu's own pass: its masked gradient is what both backward
// kernels read, and the per-channel reduction, the slowest of them, would
// otherwise load a third tensor.
//
// Elementwise formulas use explicit round-to-nearest intrinsics (__fmul_rn,
// __fadd_rn, ...) where the CPU twin rounds op by op: NVRTC contracts a*b+c
// into an FMA otherwise, and the twin's results would differ in the last bit.
#include "common.cuh"

namespace {

// Sums (a, b) over the block; the result is valid in thread 0. blockDim.x must
// be a multiple of 32, at most 1024. Ends with a barrier so it can be called
// again in the same kernel.
__device__ float2 block_sum2(float a, float b) {
  __shared__ float sa[32], sb[32];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    a = lane < nwarps ? sa[lane] : 0.f;
    b = lane < nwarps ? sb[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      b += __shfl_down_sync(0xffffffffu, b, o);
    }
  }
  __syncthreads();
  return make_float2(a, b);
}

// Element k (0 <= k < n*hw) of channel ch: sample k / hw, position k % hw.
// The launcher checks n*hw fits in 32 bits, so the division stays 32-bit.
__device__ __forceinline__ long long chan_index(unsigned k, unsigned hw, long long c, long long ch) {
  return ((long long)(k / hw) * c + ch) * hw + (k % hw);
}

// running = (1 - momentum) * running + momentum * batch, rounded op by op as
// cpu::update_running does.
__device__ __forceinline__ float running_update(float r, float batch, float momentum) {
  return __fadd_rn(__fmul_rn(__fsub_rn(1.f, momentum), r), __fmul_rn(momentum, batch));
}

// Per-channel (scale, shift) with y = x * scale + shift, as cpu::affine_coefficients.
__device__ __forceinline__ float2 affine(float mean, float invstd, float w, float b) {
  const float scale = __fmul_rn(w, invstd);
  return make_float2(scale, __fsub_rn(b, __fmul_rn(mean, scale)));
}


// What the forwards store for output v at i (the epilogue, see the
// launchers' Epilogue): v rounded to T (BN_PLAIN); then relu.cu's forward on
// it, which zeroes only a value < 0 (BN_RELU); or add.cu's sum with r[i],
// rounded, then that ReLU (BN_ADD_RELU: a residual block's end).
enum { BN_PLAIN, BN_RELU, BN_ADD_RELU };
template <typename T, int EPI>
__device__ __forceinline__ T bn_store(float v, const T* r, long long i) {
  T t = ddp::from_f32<T>(v);
  if (EPI == BN_ADD_RELU) t = ddp::from_f32<T>(ddp::to_f32(t) + ddp::to_f32(r[i]));
  if (EPI != BN_PLAIN && ddp::to_f32(t) < 0.f) return ddp::from_f32<T>(0.f);
  return t;
}

}  // namespace

// Training statistics of a local batch, two-pass (mean, then the centered
// sum of squares, so no cancellation when |mean| >> std), one block per
// channel. Writes mean and invstd = 1/sqrt(biased_var + eps) for the forward
// and backward, and moves the running statistics towards the mean and the
// UNBIASED variance, as PyTorch does. The launcher checks n*hw > 1.
template <typename T>
__device__ void bn_forward_stats_impl(const T* x, long long n, long long c, long long hw, float eps,
                                      float momentum, float* mean, float* invstd, float* running_mean,
                                      float* running_var) {
  __shared__ float s_mean;
  const unsigned count = (unsigned)(n * hw), uhw = (unsigned)hw;
  for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float s = 0.f;
    for (unsigned k = threadIdx.x; k < count; k += blockDim.x) s += ddp::to_f32(x[chan_index(k, uhw, c, ch)]);
    const float2 tot = block_sum2(s, 0.f);
    if (threadIdx.x == 0) s_mean = (float)((double)tot.x / (double)count);
    __syncthreads();
    const float m = s_mean;
    float q = 0.f;
    for (unsigned k = threadIdx.x; k < count; k += blockDim.x) {
      const float d = ddp::to_f32(x[chan_index(k, uhw, c, ch)]) - m;
      q += d * d;
    }
    const float2 qt = block_sum2(q, 0.f);
    if (threadIdx.x == 0) {
      const double var = (double)qt.x / (double)count;
      mean[ch] = m;
      invstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
      const float var_unbiased = (float)(var * (double)count / (double)(count - 1));
      running_mean[ch] = running_update(running_mean[ch], m, momentum);
      running_var[ch] = running_update(running_var[ch], var_unbiased, momentum);
    }
    // s_mean is rewritten for the next channel only after every thread read it.
    __syncthreads();
  }
}
DDP_INSTANTIATE(bn_forward_stats,
                (const T* x, long long n, long long c, long long hw, float eps, float momentum, float* mean,
                 float* invstd, float* running_mean, float* running_var),
                (x, n, c, hw, eps, momentum, mean, invstd, running_mean, running_var))

// SyncBatchNorm, step 1: this rank's per-channel (count, sum, sumsq) into
// `out` = [count, sum[c], sumsq[c]] (f32), the buffer sync.rs all-reduces.
template <typename T>
__device__ void bn_local_sums_impl(const T* x, long long n, long long c, long long hw, float* out) {
  const unsigned count = (unsigned)(n * hw), uhw = (unsigned)hw;
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = (float)count;
  for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float s = 0.f, q = 0.f;
    for (unsigned k = threadIdx.x; k < count; k += blockDim.x) {
      const float v = ddp::to_f32(x[chan_index(k, uhw, c, ch)]);
      s += v;
      q += v * v;
    }
    const float2 t = block_sum2(s, q);
    if (threadIdx.x == 0) {
      out[1 + ch] = t.x;
      out[1 + c + ch] = t.y;
    }
  }
}
DDP_INSTANTIATE(bn_local_sums, (const T* x, long long n, long long c, long long hw, float* out),
                (x, n, c, hw, out))

// SyncBatchNorm, step 2: the all-reduced [count, sum[c], sumsq[c]] to mean,
// invstd and the running statistics, in f64 as cpu::batch_stats (so the bits
// match the twin). A global count <= 1 (the twin's error) cannot be raised
// here: mean and invstd become NaN and the running statistics are left as
// they are; the launcher refuses a local batch of < 1 value per channel.
extern "C" __global__ void bn_sync_stats(const float* totals, long long c, float eps, float momentum, float* mean, float* invstd, float* running_mean, float* running_var) {
  const double nf = roundf(totals[0]);
  DDP_FOR_EACH(ch, c) {
    if (nf <= 1.0) {
      mean[ch] = __int_as_float(0x7fc00000);
      invstd[ch] = __int_as_float(0x7fc00000);
      continue;
    }
    const double m = (double)totals[1 + ch] / nf;
    const double var = fmax((double)totals[1 + c + ch] / nf - m * m, 0.0);
    const float mf = (float)m;
    mean[ch] = mf;
    invstd[ch] = (float)(1.0 / sqrt(var + (double)eps));
    running_mean[ch] = running_update(running_mean[ch], mf, momentum);
    running_var[ch] = running_update(running_var[ch], (float)(var * nf / (nf - 1.0)), momentum);
  }
}

// The (n, c) planes of an NCHW tensor: blockIdx.y strides over planes,
// blockIdx.x/threadIdx.x over the hw positions of one plane, so each thread
// knows its channel without a division per element.
#define BN_FOR_EACH_PLANE(plane, ch, n, c)                                          \
  for (long long plane = blockIdx.y, ch = blockIdx.y % (c); plane < (n) * (c);      \
       plane += gridDim.y, ch = plane % (c))
#define BN_FOR_EACH_POS(j, hw) \
  for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < (hw); j += (long long)blockDim.x * gridDim.x)

// y = (x - mean) * invstd * weight + bias, folded into one multiply-add per
// element (cpu::normalize_affine). Used with the batch statistics in training
// (local or synced).
template <typename T, int EPI>
__device__ void bn_forward_apply_tmpl(const T* x, const float* mean, const float* invstd, const float* weight,
                                      const float* bias, long long n, long long c, long long hw, const T* r,
                                      T* y) {
  BN_FOR_EACH_PLANE(plane, ch, n, c) {
    const float2 ab = affine(mean[ch], invstd[ch], weight[ch], bias[ch]);
    const T* xp = x + plane * hw;
    T* yp = y + plane * hw;
    BN_FOR_EACH_POS(j, hw) {
      yp[j] = bn_store<T, EPI>(__fadd_rn(__fmul_rn(ddp::to_f32(xp[j]), ab.x), ab.y), r, plane * hw + j);
    }
  }
}
template <typename T>
__device__ void bn_forward_apply_impl(const T* x, const float* mean, const float* invstd, const float* weight,
                                      const float* bias, long long n, long long c, long long hw, T* y) {
  bn_forward_apply_tmpl<T, BN_PLAIN>(x, mean, invstd, weight, bias, n, c, hw, y, y);
}
template <typename T>
__device__ void bn_forward_apply_relu_impl(const T* x, const float* mean, const float* invstd,
                                           const float* weight, const float* bias, long long n, long long c,
                                           long long hw, T* y) {
  bn_forward_apply_tmpl<T, BN_RELU>(x, mean, invstd, weight, bias, n, c, hw, y, y);
}
template <typename T>
__device__ void bn_forward_apply_add_relu_impl(const T* x, const float* mean, const float* invstd,
                                               const float* weight, const float* bias, long long n, long long c,
                                               long long hw, const T* r, T* y) {
  bn_forward_apply_tmpl<T, BN_ADD_RELU>(x, mean, invstd, weight, bias, n, c, hw, r, y);
}
DDP_INSTANTIATE(bn_forward_apply,
                (const T* x, const float* mean, const float* invstd, const float* weight, const float* bias,
                 long long n, long long c, long long hw, T* y),
                (x, mean, invstd, weight, bias, n, c, hw, y))
DDP_INSTANTIATE(bn_forward_apply_relu,
                (const T* x, const float* mean, const float* invstd, const float* weight, const float* bias,
                 long long n, long long c, long long hw, T* y),
                (x, mean, invstd, weight, bias, n, c, hw, y))
DDP_INSTANTIATE(bn_forward_apply_add_relu,
                (const T* x, const float* mean, const float* invstd, const float* weight, const float* bias,
                 long long n, long long c, long long hw, const T* r, T* y),
                (x, mean, invstd, weight, bias, n, c, hw, r, y))

// Evaluation: normalizes with the running statistics, invstd in f32 as
// cpu::invstd_from_var.
template <typename T, int EPI>
__device__ void bn_forward_eval_tmpl(const T* x, const float* weight, const float* bias,
                                     const float* running_mean, const float* running_var, float eps,
                                     long long n, long long c, long long hw, const T* r, T* y) {
  BN_FOR_EACH_PLANE(plane, ch, n, c) {
    const float istd = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(running_var[ch], eps)));
    const float2 ab = affine(running_mean[ch], istd, weight[ch], bias[ch]);
    const T* xp = x + plane * hw;
    T* yp = y + plane * hw;
    BN_FOR_EACH_POS(j, hw) {
      yp[j] = bn_store<T, EPI>(__fadd_rn(__fmul_rn(ddp::to_f32(xp[j]), ab.x), ab.y), r, plane * hw + j);
    }
  }
}
template <typename T>
__device__ void bn_forward_eval_impl(const T* x, const float* weight, const float* bias,
                                     const float* running_mean, const float* running_var, float eps,
                                     long long n, long long c, long long hw, T* y) {
  bn_forward_eval_tmpl<T, BN_PLAIN>(x, weight, bias, running_mean, running_var, eps, n, c, hw, y, y);
}
template <typename T>
__device__ void bn_forward_eval_relu_impl(const T* x, const float* weight, const float* bias,
                                          const float* running_mean, const float* running_var, float eps,
                                          long long n, long long c, long long hw, T* y) {
  bn_forward_eval_tmpl<T, BN_RELU>(x, weight, bias, running_mean, running_var, eps, n, c, hw, y, y);
}
template <typename T>
__device__ void bn_forward_eval_add_relu_impl(const T* x, const float* weight, const float* bias,
                                              const float* running_mean, const float* running_var, float eps,
                                              long long n, long long c, long long hw, const T* r, T* y) {
  bn_forward_eval_tmpl<T, BN_ADD_RELU>(x, weight, bias, running_mean, running_var, eps, n, c, hw, r, y);
}
DDP_INSTANTIATE(bn_forward_eval,
                (const T* x, const float* weight, const float* bias, const float* running_mean,
                 const float* running_var, float eps, long long n, long long c, long long hw, T* y),
                (x, weight, bias, running_mean, running_var, eps, n, c, hw, y))
DDP_INSTANTIATE(bn_forward_eval_relu,
                (const T* x, const float* weight, const float* bias, const float* running_mean,
                 const float* running_var, float eps, long long n, long long c, long long hw, T* y),
                (x, weight, bias, running_mean, running_var, eps, n, c, hw, y))
DDP_INSTANTIATE(bn_forward_eval_add_relu,
                (const T* x, const float* weight, const float* bias, const float* running_mean,
                 const float* running_var, float eps, long long n, long long c, long long hw, const T* r, T* y),
                (x, weight, bias, running_mean, running_var, eps, n, c, hw, r, y))

// Backward, step 1 (one block per channel): sums = [sum dy[c], sum dy*xhat[c]]
// of this batch, which SyncBatchNorm all-reduces before step 2; the same
// local sums are added into dbias and dweight (.grad accumulation; the
// weight gradients of SyncBatchNorm are local too, as in PyTorch).
template <typename T>
__device__ void bn_backward_reduce_impl(const T* x, const T* dy, const float* mean, const float* invstd,
                                        long long n, long long c, long long hw, float* sums, float* dweight,
                                        float* dbias) {
  const unsigned count = (unsigned)(n * hw), uhw = (unsigned)hw;
  for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const float m = mean[ch];
    float s = 0.f, q = 0.f;
    for (unsigned k = threadIdx.x; k < count; k += blockDim.x) {
      const long long i = chan_index(k, uhw, c, ch);
      const float g = ddp::to_f32(dy[i]);
      s += g;
      q += g * (ddp::to_f32(x[i]) - m);
    }
    const float2 t = block_sum2(s, q);
    if (threadIdx.x == 0) {
      const float dyxhat = t.y * invstd[ch];
      sums[ch] = t.x;
      sums[c + ch] = dyxhat;
      dbias[ch] += t.x;
      dweight[ch] += dyxhat;
    }
  }
}
DDP_INSTANTIATE(bn_backward_reduce,
                (const T* x, const T* dy, const float* mean, const float* invstd, long long n, long long c,
                 long long hw, float* sums, float* dweight, float* dbias),
                (x, dy, mean, invstd, n, c, hw, sums, dweight, dbias))

// Backward, step 2: dx = weight*invstd*(dy - sum_dy/M - xhat*sum_dy_xhat/M)
// with M = `count` (the global count under SyncBatchNorm), expanded per
// channel into dx = k*dy + p*x + q with (k, p, q) formed in f64 and rounded
// once, as cpu::dx_coefficients / cpu::backward_dx.
template <typename T>
__device__ void bn_backward_dx_impl(const T* x, const T* dy, const float* mean, const float* invstd,
                                    const float* weight, const float* sums, long long count, long long n,
                                    long long c, long long hw, T* dx) {
  const double mcount = (double)count;
  BN_FOR_EACH_PLANE(plane, ch, n, c) {
    const double istd = invstd[ch];
    const double kd = (double)weight[ch] * istd;
    const double a = (double)sums[ch] / mcount;
    const double b = istd * (double)sums[c + ch] / mcount;
    const float k = (float)kd, p = (float)(-kd * b), q = (float)(kd * ((double)mean[ch] * b - a));
    const T* xp = x + plane * hw;
    const T* dp = dy + plane * hw;
    T* op = dx + plane * hw;
    BN_FOR_EACH_POS(j, hw) {
      const float v = __fadd_rn(__fadd_rn(__fmul_rn(k, ddp::to_f32(dp[j])), __fmul_rn(p, ddp::to_f32(xp[j]))), q);
      op[j] = ddp::from_f32<T>(v);
    }
  }
}
DDP_INSTANTIATE(bn_backward_dx,
                (const T* x, const T* dy, const float* mean, const float* invstd, const float* weight,
                 const float* sums, long long count, long long n, long long c, long long hw, T* dx),
                (x, dy, mean, invstd, weight, sums, count, n, c, hw, dx))
