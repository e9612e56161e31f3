// Causal self-attention's softmax, forward and backward (CPU twin:
// src/ops/attention/cpu.rs; the GEMMs around it, q k^T, att v and their
// backward products, are cuBLAS's, see src/ops/attention/cuda.rs).
// Activations and the [N, H, T, T] score/probability rows are `T`; the
// softmax math is f32, each row's max subtracted first.
//
// Gradient rule: both kernels overwrite (`=`) the whole row, the masked
// part (j > i) with 0, in place, one warp per row.
//
// Bits: each row is one warp, in the CPU's order (the max, then the
// exponentials, the CPU's own ddp::exp_rn, summed from 0, then the
// divisions; the backward dot summed from -0.0; both sums in the warp order
// of ddp::warp_sum), with _rn intrinsics where the CPU rounds op by op, so
// from the same scores the f32 softmax is the CPU's.
// The GEMMs' summation order is cuBLAS's, not the CPU's: see the launcher.
#include "common.cuh"

// Row (n, h, i) of `att` holds the scaled scores q_i . k_j / sqrt(hd) for
// j <= i; it becomes softmax over j <= i, and 0 for j > i. One warp per row
// (DDP_FOR_EACH_ROW): lane l takes j = l, l + 32, ...
template <typename T>
__device__ void causal_softmax_forward_impl(T* att, long long rows, long long t) {
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const long long i = r % t;
    T* row = att + r * t;
    float max = -__int_as_float(0x7f800000);
    for (long long j = lane; j <= i; j += 32) max = fmaxf(max, ddp::to_f32(row[j]));
    max = ddp::warp_max(max);
    // The exponentials stay in f32 between the passes, as on the CPU, even
    // where T is __half.
    float sum = 0.f;
    for (long long j = lane; j <= i; j += 32) sum = __fadd_rn(sum, ddp::exp_rn(__fsub_rn(ddp::to_f32(row[j]), max)));
    sum = ddp::warp_sum(sum);
    for (long long j = lane; j < t; j += 32) {
      const float p = j <= i ? __fdiv_rn(ddp::exp_rn(__fsub_rn(ddp::to_f32(row[j]), max)), sum) : 0.f;
      row[j] = ddp::from_f32<T>(p);
    }
  }
}
DDP_INSTANTIATE(causal_softmax_forward, (T * att, long long rows, long long t), (att, rows, t))

// `grad` row (n, h, i) holds d(att) = dy v^T; it becomes the scores'
// gradient times the scale: ds_j = a_j (da_j - sum_{j' <= i} a_j' da_j') * scale
// for j <= i, 0 above the diagonal. One warp per row, as forward.
template <typename T>
__device__ void causal_softmax_backward_impl(const T* att, T* grad, long long rows, long long t, float scale) {
  DDP_FOR_EACH_ROW(r, lane, rows) {
    const long long i = r % t;
    const T* a = att + r * t;
    T* g = grad + r * t;
    float dot = -0.f;
    for (long long j = lane; j <= i; j += 32)
      dot = __fadd_rn(dot, __fmul_rn(ddp::to_f32(a[j]), ddp::to_f32(g[j])));
    dot = ddp::warp_sum(dot);
    for (long long j = lane; j < t; j += 32) {
      const float ds =
          j <= i ? __fmul_rn(__fmul_rn(ddp::to_f32(a[j]), __fsub_rn(ddp::to_f32(g[j]), dot)), scale) : 0.f;
      g[j] = ddp::from_f32<T>(ds);
    }
  }
}
DDP_INSTANTIATE(causal_softmax_backward, (const T* att, T* grad, long long rows, long long t, float scale),
                (att, grad, rows, t, scale))
