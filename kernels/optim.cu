// Fused optimizer steps over flat f32 master weights: SGD (momentum,
// dampening, nesterov, weight decay) and Adam/AdamW. CPU twins:
// src/optim/sgd.rs and src/optim/adam.rs (PyTorch's single-tensor formulas,
// op for op). `T` is the model copy's type: after the update each element's
// master is rounded into model[i] (apex O2's f16 weights); model == nullptr
// when the masters are the model's own f32 weights.
//
// Nothing changes when *found_inf is set (the loss scaler found inf/NaN
// gradients): the skip decision never leaves the device. The step counter
// (completed, non-skipped steps) is device state too, advanced by
// optim_advance_step after a step's launches: SGD's first momentum step and
// Adam's bias corrections depend on it, and the host does not know which
// steps were skipped.
//
// The twins use fused multiply-adds exactly where PyTorch's CPU kernels do
// (`add(.., alpha=)`, `lerp`) and round every other op separately; the
// intrinsics below (__fmaf_rn vs __fmul_rn/__fadd_rn/...) reproduce that, so
// GPU and CPU agree bit for bit.
#include "common.cuh"

template <typename T>
__device__ void sgd_step_impl(float* master, const float* grad, float* momentum_buf, T* model, long long n,
                              const long long* step_count, const int* found_inf, float neg_lr, float momentum,
                              float one_minus_dampening, float weight_decay, int nesterov) {
  if (*found_inf) return;
  const bool first = *step_count == 0;
  DDP_FOR_EACH(i, n) {
    float p = master[i];
    float d = grad[i];
    if (weight_decay != 0.f) d = __fmaf_rn(p, weight_decay, d);
    if (momentum != 0.f) {
      // PyTorch's first momentum step clones d into the buffer (no dampening).
      const float b = first ? d : __fmaf_rn(d, one_minus_dampening, __fmul_rn(momentum_buf[i], momentum));
      momentum_buf[i] = b;
      d = nesterov ? __fmaf_rn(b, momentum, d) : b;
    }
    p = __fmaf_rn(d, neg_lr, p);
    master[i] = p;
    if (model != nullptr) model[i] = ddp::from_f32<T>(p);
  }
}
DDP_INSTANTIATE(sgd_step,
                (float* master, const float* grad, float* momentum_buf, T* model, long long n,
                 const long long* step_count, const int* found_inf, float neg_lr, float momentum,
                 float one_minus_dampening, float weight_decay, int nesterov),
                (master, grad, momentum_buf, model, n, step_count, found_inf, neg_lr, momentum,
                 one_minus_dampening, weight_decay, nesterov))

// torch.lerp as PyTorch's CPU kernel: from the nearer end.
__device__ __forceinline__ float lerp_rn(float start, float end, float w) {
  const float diff = __fsub_rn(end, start);
  return fabsf(w) < 0.5f ? __fmaf_rn(w, diff, start) : __fmaf_rn(__fsub_rn(w, 1.f), diff, end);
}

// Adam (decoupled == 0: weight decay as an L2 term on the gradient) or AdamW
// (decoupled == 1: p *= 1 - lr*wd first), amsgrad off. lr, betas and
// weight_decay arrive as the f64 values PyTorch's Python side would hold; the
// step-dependent scalars are formed from them in f64 here, once per block.
template <typename T>
__device__ void adam_step_impl(float* master, const float* grad, float* exp_avg, float* exp_avg_sq, T* model,
                               long long n, const long long* step_count, const int* found_inf, double lr,
                               double beta1, double beta2, double eps, double weight_decay, int decoupled) {
  if (*found_inf) return;
  __shared__ float s_neg_step_size, s_bc2_sqrt;
  if (threadIdx.x == 0) {
    const double t = (double)(*step_count + 1);
    const double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    s_neg_step_size = (float)(-(lr / bc1));
    // Python's `bias_correction2 ** 0.5`: pow, not sqrt.
    s_bc2_sqrt = (float)pow(bc2, 0.5);
  }
  __syncthreads();
  const float neg_step_size = s_neg_step_size, bc2_sqrt = s_bc2_sqrt;
  const float decoupled_factor = (float)(1.0 - lr * weight_decay);
  const float l2 = decoupled ? 0.f : (float)weight_decay;
  const float lerp_w = (float)(1.0 - beta1), b2 = (float)beta2, omb2 = (float)(1.0 - beta2);
  const float epsf = (float)eps;
  DDP_FOR_EACH(i, n) {
    float p = master[i];
    float g = grad[i];
    if (decoupled) {
      p = __fmul_rn(p, decoupled_factor);
    } else if (l2 != 0.f) {
      g = __fmaf_rn(p, l2, g);
    }
    const float m = lerp_rn(exp_avg[i], g, lerp_w);
    const float v = __fadd_rn(__fmul_rn(exp_avg_sq[i], b2), __fmul_rn(__fmul_rn(omb2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2_sqrt), epsf);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step_size, m), denom));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    if (model != nullptr) model[i] = ddp::from_f32<T>(p);
  }
}
DDP_INSTANTIATE(adam_step,
                (float* master, const float* grad, float* exp_avg, float* exp_avg_sq, T* model, long long n,
                 const long long* step_count, const int* found_inf, double lr, double beta1, double beta2,
                 double eps, double weight_decay, int decoupled),
                (master, grad, exp_avg, exp_avg_sq, model, n, step_count, found_inf, lr, beta1, beta2, eps,
                 weight_decay, decoupled))

// After every launch of one optimizer step: count it unless it was skipped.
extern "C" __global__ void optim_advance_step(long long* step_count, const int* found_inf) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && *found_inf == 0) *step_count += 1;
}
