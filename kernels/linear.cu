// Linear layer helpers around the cuBLAS GEMMs (CPU twin: src/ops/linear/cpu.rs):
// the bias broadcast that the forward GEMM accumulates onto (beta = 1), and
// the bias gradient (column sums of dy), added into the existing gradient.
#include "common.cuh"

// y[r, c] = bias[c] for a row-major y[rows, cols].
template <typename T>
__device__ void linear_bias_fill_impl(const T* bias, T* y, long long rows, long long cols) {
  DDP_FOR_EACH(i, rows * cols) { y[i] = bias[i % cols]; }
}
DDP_INSTANTIATE(linear_bias_fill, (const T* bias, T* y, long long rows, long long cols),
                (bias, y, rows, cols))

// Block shape of linear_bias_backward: DDP_DB_COLS consecutive columns per
// block (one warp reads one row segment, coalesced), DDP_DB_ROWS row lanes.
#define DDP_DB_COLS 32
#define DDP_DB_ROWS 8

// db[c] += sum_r dy[r, c], accumulated in f32 and rounded once. Each column
// is summed by the same threads in the same order on every launch (row lane
// ty takes rows ty, ty + 8, ...; the 8 lane sums are added in lane order), so
// the result is deterministic, unlike an atomicAdd reduction.
template <typename T>
__device__ void linear_bias_backward_impl(const T* dy, T* db, long long rows, long long cols) {
  __shared__ float part[DDP_DB_ROWS][DDP_DB_COLS + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (long long c0 = (long long)blockIdx.x * DDP_DB_COLS; c0 < cols;
       c0 += (long long)gridDim.x * DDP_DB_COLS) {
    const long long c = c0 + tx;
    float acc = 0.f;
    if (c < cols) {
      for (long long r = ty; r < rows; r += DDP_DB_ROWS) acc += ddp::to_f32(dy[r * cols + c]);
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < cols) {
      float s = 0.f;
      for (int k = 0; k < DDP_DB_ROWS; ++k) s += part[k][tx];
      db[c] = ddp::from_f32<T>(ddp::to_f32(db[c]) + s);
    }
    // The next column block reuses `part`.
    __syncthreads();
  }
}
DDP_INSTANTIATE(linear_bias_backward, (const T* dy, T* db, long long rows, long long cols),
                (dy, db, rows, cols))
