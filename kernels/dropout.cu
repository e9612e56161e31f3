// Dropout (CPU twin: src/ops/dropout/cpu.rs, Philox in src/rng.rs):
// v = v * mask * scale with the mask drawn per element from Philox4x32-10,
// counter (lo32(e / 4), hi32(e / 4), ctr_hi0, ctr_hi1) and key (key0, key1),
// word e % 4; the element is dropped when that word is below `threshold`
// (round(p * 2^32)). Every element's bit is a function of its index alone,
// so the mask is the CPU's whatever the launch geometry. Each thread
// computes one group of four elements (one Philox call). In-place use
// (y == x) is allowed: each element is read before the same thread writes it.
#include "common.cuh"

namespace ddp {

// Random123's philox4x32 with 10 rounds (cuRAND's curand_Philox4x32_10).
__device__ __forceinline__ void philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
    const unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
    const unsigned int n0 = (unsigned int)(p1 >> 32) ^ c[1] ^ k0;
    const unsigned int n1 = (unsigned int)p1;
    const unsigned int n2 = (unsigned int)(p0 >> 32) ^ c[3] ^ k1;
    const unsigned int n3 = (unsigned int)p0;
    c[0] = n0;
    c[1] = n1;
    c[2] = n2;
    c[3] = n3;
  }
}

}  // namespace ddp

template <typename T>
__device__ void dropout_apply_impl(const T* x, T* y, long long n, unsigned int key0, unsigned int key1,
                                   unsigned int ctr_hi0, unsigned int ctr_hi1, unsigned long long threshold,
                                   float scale) {
  const long long groups = (n + 3) / 4;
  DDP_FOR_EACH(g, groups) {
    unsigned int w[4] = {(unsigned int)g, (unsigned int)((unsigned long long)g >> 32), ctr_hi0, ctr_hi1};
    ddp::philox4x32_10(w, key0, key1);
    for (int j = 0; j < 4; ++j) {
      const long long e = g * 4 + j;
      if (e >= n) break;
      const float bit = (unsigned long long)w[j] >= threshold ? 1.f : 0.f;
      y[e] = ddp::from_f32<T>(ddp::to_f32(x[e]) * bit * scale);
    }
  }
}
DDP_INSTANTIATE(dropout_apply,
                (const T* x, T* y, long long n, unsigned int key0, unsigned int key1, unsigned int ctr_hi0,
                 unsigned int ctr_hi1, unsigned long long threshold, float scale),
                (x, y, n, key0, key1, ctr_hi0, ctr_hi1, threshold, scale))

// The raw generator for the parity test: out[4i..4i+4] = philox4x32_10(ctr[4i..4i+4], key).
extern "C" __global__ void dropout_philox(const unsigned int* ctr, unsigned int* out, long long n,
                                          unsigned int key0, unsigned int key1) {
  DDP_FOR_EACH(i, n) {
    unsigned int c[4] = {ctr[4 * i], ctr[4 * i + 1], ctr[4 * i + 2], ctr[4 * i + 3]};
    ddp::philox4x32_10(c, key0, key1);
    for (int j = 0; j < 4; ++j) out[4 * i + j] = c[j];
  }
}
