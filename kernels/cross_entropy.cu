// Softmax cross-entropy with mean reduction, fused with its gradient and
// with the top-1 hit count (CPU twin: src/ops/cross_entropy/cpu.rs). All
// arithmetic in f32 with the CPU's formulas: shift by the row max, loss =
// log(sum exp(x - max)) + (max - x[label]), dlogits = exp(x - max) * (scale /
// sum) - scale * onehot with scale = grad_scale / n, rounded once to T.
#include "common.cuh"

// NVRTC has no math.h, so no INFINITY / NAN macros.
__device__ __forceinline__ float NEG_INF() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float QNAN() { return __int_as_float(0x7fc00000); }

namespace {

constexpr unsigned FULL = 0xffffffffu;

// Whether candidate (b, ib) beats (a, ia) under the CPU's sequential argmax
// (row_max): the first NaN if there is one, else the first maximum.
__device__ __forceinline__ bool beats(float b, int ib, float a, int ia) {
  bool nb = isnan(b), na = isnan(a);
  if (nb != na) return nb;
  if (nb || b == a) return ib < ia;
  return b > a;
}

}  // namespace

// One warp per row (DDP_FOR_EACH_ROW, launched by cuda::launch_rows), rows grid-strided
// over the warps. `dlogits` and `grad_scale` may be null (evaluation: loss
// and hits only). `grad_scale` is a device scalar (the loss scale stays on
// the device under mixed precision). Each row writes its loss to
// row_loss[r] and whether its argmax equals the label to row_hit[r]; the
// batch totals come from cross_entropy_accumulate, in a fixed order.
// A label outside 0..c cannot be checked on the host without a copy back,
// so it makes its row's loss and gradient NaN, which the trainer reports.
template <typename T>
__device__ void cross_entropy_rows_impl(const T* logits, const unsigned int* labels, long long n, long long c,
                                        const float* grad_scale, T* dlogits, float* row_loss,
                                        unsigned int* row_hit) {
  DDP_FOR_EACH_ROW(r, lane, n) {
    const T* row = logits + r * c;
    // Lanes scan their columns in order; a lane that sees only -inf keeps
    // the sentinel index c, and a row of only -inf resolves to column 0,
    // as on the CPU.
    float best = NEG_INF();
    int at = (int)c;
    for (int j = lane; j < c; j += 32) {
      float v = ddp::to_f32(row[j]);
      if (v > best || (isnan(v) && !isnan(best))) {
        best = v;
        at = j;
      }
    }
    // Butterfly: every lane ends with the same (best, at).
    for (int off = 16; off > 0; off >>= 1) {
      float ob = __shfl_xor_sync(FULL, best, off);
      int oa = __shfl_xor_sync(FULL, at, off);
      if (beats(ob, oa, best, at)) {
        best = ob;
        at = oa;
      }
    }
    if (at == (int)c) at = 0;

    float sum = 0.f;
    for (int j = lane; j < c; j += 32) sum += expf(ddp::to_f32(row[j]) - best);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(FULL, sum, off);

    const unsigned int label = labels[r];
    const bool valid = label < (unsigned long long)c;
    if (lane == 0) {
      row_loss[r] = valid ? logf(sum) + (best - ddp::to_f32(row[label])) : QNAN();
      row_hit[r] = valid && (unsigned int)at == label ? 1u : 0u;
    }
    if (dlogits != nullptr) {
      const float scale = *grad_scale / (float)n;
      const float k = scale / sum;
      T* d = dlogits + r * c;
      for (int j = lane; j < c; j += 32) {
        float g = expf(ddp::to_f32(row[j]) - best) * k;
        if ((unsigned int)j == label) g = g - scale;
        d[j] = ddp::from_f32<T>(valid ? g : QNAN());
      }
    }
  }
}
DDP_INSTANTIATE(cross_entropy_rows,
                (const T* logits, const unsigned int* labels, long long n, long long c, const float* grad_scale,
                 T* dlogits, float* row_loss, unsigned int* row_hit),
                (logits, labels, n, c, grad_scale, dlogits, row_loss, row_hit))

// Adds the batch's loss sum (f64, like the CPU's) and hit count to the
// running totals. Launched as ONE block of 256 threads: each thread sums a
// fixed stride of rows, then a shared-memory tree, so the result does not
// depend on scheduling.
extern "C" __global__ void cross_entropy_accumulate(const float* row_loss, const unsigned int* row_hit,
                                                    long long n, double* loss_sum,
                                                    unsigned long long* correct) {
  __shared__ double loss[256];
  __shared__ unsigned long long hits[256];
  const int t = threadIdx.x;
  double l = 0.0;
  unsigned long long h = 0;
  for (long long r = t; r < n; r += 256) {
    l += (double)row_loss[r];
    h += row_hit[r];
  }
  loss[t] = l;
  hits[t] = h;
  __syncthreads();
  for (int half = 128; half > 0; half >>= 1) {
    if (t < half) {
      loss[t] += loss[t + half];
      hits[t] += hits[t + half];
    }
    __syncthreads();
  }
  if (t == 0) {
    *loss_sum += loss[0];
    *correct += hits[0];
  }
}
