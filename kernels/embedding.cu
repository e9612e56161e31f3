// Embedding, forward (a gather of weight rows) and backward (a scatter-add
// into weight.grad), by token ids or by position (CPU twin:
// src/ops/embedding/cpu.rs; the positions variant is nanoGPT's wpe, row
// i % T for output row i). Weights and gradients are `T`; token ids arrive
// as f32 values, as the CPU path receives them (exact below 2^24).
//
// Gradient rule: the forward output is written (`=`); weight.grad is
// accumulated (`+=`); there is no dx (ids have no gradient).
//
// Determinism without atomics: backward runs one thread per weight.grad
// element (row, column), which walks the output rows in order (a shared tile
// of ids at a time) and adds the ones looked up from its row, starting from
// the gradient already there: the CPU's order for every element, so f32
// results are the CPU's bits; an f16 gradient is widened once, summed in f32
// and rounded once, as the CPU does.
//
// An id that is not a whole number in 0..num_embeddings (the CPU refuses
// it before the lookup) gives a NaN output row, so it shows up as a
// non-finite loss, and adds to no gradient row.
#include "common.cuh"

// The row an id selects, or -1 for an id out of range or not whole.
__device__ __forceinline__ long long embedding_row(float id, long long num_embeddings) {
  if (!(id >= 0.f) || id != truncf(id) || id >= (float)num_embeddings) return -1;
  return (long long)id;
}

// One thread per output element: y[i, k] = w[row(i), k]. `ids` null means
// positions: row(i) = i % t.
template <typename T>
__device__ void embedding_forward_impl(const float* ids, const T* w, T* y, long long rows, long long num_embeddings,
                                       long long dim, long long t) {
  DDP_FOR_EACH(i, rows * dim) {
    const long long r = i / dim, k = i - r * dim;
    const long long row = ids != nullptr ? embedding_row(ids[r], num_embeddings) : r % t;
    y[i] = row >= 0 ? w[row * dim + k] : ddp::from_f32<T>(__int_as_float(0x7fc00000));
  }
}
DDP_INSTANTIATE(embedding_forward,
                (const float* ids, const T* w, T* y, long long rows, long long num_embeddings, long long dim,
                 long long t),
                (ids, w, y, rows, num_embeddings, dim, t))

// Ids a block looks up at a time: each block turns TILE ids into rows in
// shared memory once, and its threads scan the tile there (a broadcast read)
// instead of each thread loading and checking every id from global memory.
constexpr int TILE = 256;

// One thread per weight.grad element (row, k) of the first `used` rows:
// dw[row, k] += dy[i, k] for every output row i that looked up `row`, in
// order of i. With ids, used = num_embeddings and every output row is
// tested, a tile of ids at a time; for positions (ids null), used = t and
// row's outputs are row, row + t, row + 2t, ... The element loop runs the
// same number of times in every thread of a block (threads past the end
// only help load the tiles), so each __syncthreads has the whole block.
template <typename T>
__device__ void embedding_backward_impl(const float* ids, const T* dy, T* dw, long long rows, long long used,
                                        long long dim, long long t) {
  __shared__ long long tile[TILE];
  const long long n = used * dim, stride = (long long)blockDim.x * gridDim.x;
  for (long long base = (long long)blockIdx.x * blockDim.x; base < n; base += stride) {
    const long long e = base + threadIdx.x;
    const bool mine = e < n;
    const long long row = mine ? e / dim : -1, k = mine ? e - row * dim : 0;
    float acc = mine ? ddp::to_f32(dw[e]) : 0.f;
    if (ids != nullptr) {
      for (long long i0 = 0; i0 < rows; i0 += TILE) {
        __syncthreads();  // the last tile is read by every thread
        for (int j = threadIdx.x; j < TILE; j += blockDim.x)
          tile[j] = i0 + j < rows ? embedding_row(ids[i0 + j], used) : -1;
        __syncthreads();
        const int m = (int)min((long long)TILE, rows - i0);
        if (mine)
          for (int j = 0; j < m; ++j)
            if (tile[j] == row) acc = __fadd_rn(acc, ddp::to_f32(dy[(i0 + j) * dim + k]));
      }
    } else if (mine) {
      for (long long i = row; i < rows; i += t) acc = __fadd_rn(acc, ddp::to_f32(dy[i * dim + k]));
    }
    if (mine) dw[e] = ddp::from_f32<T>(acc);
  }
}
DDP_INSTANTIATE(embedding_backward,
                (const float* ids, const T* dy, T* dw, long long rows, long long used, long long dim, long long t),
                (ids, dy, dw, rows, used, dim, t))
