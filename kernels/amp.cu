// Mixed precision on the device: the fused unscale + inf/NaN check over flat
// gradient buffers, the dynamic loss scaler's update, and the global gradient
// norm for clip_grad_norm_. CPU twins: src/amp/scaler.rs (LossScaler::unscale,
// LossScaler::update) and src/amp/mod.rs (clip_grad_norm_).
//
// The scaler's state (scale, growth tracker, overflow count) and the overflow
// flag stay on the device, so a training step never waits for the host: the
// optimizer kernels read the flag to skip the step.
#include "common.cuh"

namespace {

// Sums `v` over the block in a fixed tree (deterministic); valid in thread 0.
// blockDim.x must be a multiple of 32, at most 1024.
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

}  // namespace

// out[i] = grads[i] * (1 / scale) in f32, and *found_inf = 1 if any result is
// inf or NaN (a non-finite gradient stays non-finite after the multiply, so one
// check covers both). torch's _amp_foreach_non_finite_check_and_unscale_ also
// multiplies by the f32 reciprocal. Every writer stores the same 1, so the
// unordered stores need no atomics; the caller zeroes the flag once per step.
template <typename T>
__device__ void amp_unscale_impl(const T* grads, float* out, long long n, const float* scale, int* found_inf) {
  const float inv = __fdiv_rn(1.f, *scale);
  bool bad = false;
  DDP_FOR_EACH(i, n) {
    const float v = __fmul_rn(ddp::to_f32(grads[i]), inv);
    bad |= !isfinite(v);
    out[i] = v;
  }
  if (bad) *found_inf = 1;
}
DDP_INSTANTIATE(amp_unscale, (const T* grads, float* out, long long n, const float* scale, int* found_inf),
                (grads, out, n, scale, found_inf))

// The loss scaler's update after the unscale pass of optimizer step `step`,
// one thread. counters = [growth_tracker, overflow_steps, error, error_step].
// What LossScaler::update returns as an error (overflow with a static scale
// = 1, a dynamic scale that would fall below min_scale = 2) is recorded in
// counters[2] with the step, and from then on every step is marked as
// overflowing so no optimizer moves the weights until the host reads the
// error (at its next logging step) and stops. The scale stays as it was.
extern "C" __global__ void amp_scaler_update(float* scale, long long* counters, int* found_inf, long long step, int dynamic, float growth_factor, float backoff_factor, long long growth_interval, float min_scale, float max_scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (counters[2] != 0) {
    *found_inf = 1;
    return;
  }
  if (*found_inf == 0) {
    if (dynamic) {
      const long long t = counters[0] + 1;
      if (t >= growth_interval) {
        *scale = fminf(__fmul_rn(*scale, growth_factor), max_scale);
        counters[0] = 0;
      } else {
        counters[0] = t;
      }
    }
    return;
  }
  if (!dynamic) {
    counters[2] = 1;
    counters[3] = step;
    return;
  }
  const float next = __fmul_rn(*scale, backoff_factor);
  if (next < min_scale) {
    counters[2] = 2;
    counters[3] = step;
    return;
  }
  *scale = next;
  counters[0] = 0;
  counters[1] += 1;
}

// Sum of squares of g, stage 1: block b writes the sum of its grid-stride
// share to partials[b]. The launcher fixes the grid for a given n, so the
// partition (and the result) does not vary from run to run.
extern "C" __global__ void amp_sumsq_partials(const float* g, long long n, float* partials) {
  float s = 0.f;
  DDP_FOR_EACH(i, n) {
    const float v = g[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// Stage 2, one block: *out = (accumulate ? *out : 0) + sum(partials), so the
// squared norm of several buffers (one per bucket) adds up in launch order.
extern "C" __global__ void amp_sumsq_finish(const float* partials, long long nparts, float* out, int accumulate) {
  float s = 0.f;
  for (long long i = threadIdx.x; i < nparts; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = accumulate ? __fadd_rn(*out, s) : s;
}

// clip_grad_norm_ given the squared total norm: g *= max_norm / (norm + 1e-6)
// when that is < 1, as src/amp/mod.rs. Does nothing on an overflowing step
// (the step is skipped; the twin never clips then).
extern "C" __global__ void amp_clip_by_norm(float* g, long long n, const float* norm_sq, float max_norm, const int* found_inf) {
  if (*found_inf) return;
  const float norm = (float)sqrt((double)*norm_sq);
  const float coef = __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f));
  if (!(coef < 1.f)) return;
  DDP_FOR_EACH(i, n) { g[i] = __fmul_rn(g[i], coef); }
}

// out = *scale / divisor: the factor the loss gradient is multiplied by when
// gradients are accumulated over `divisor` micro-batches (the CPU loop's
// `loss_scale / grad_accum_steps`), kept on the device with the scale.
extern "C" __global__ void amp_divided_scale(const float* scale, float divisor, float* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = __fdiv_rn(scale[0], divisor);
}
