// The parts of conv2d that are not GEMMs (CPU twin: src/ops/conv2d/cpu.rs,
// which does im2col + GEMM per image): im2col, its adjoint col2im, the bias
// add and the bias gradient. The GEMMs run in cuBLAS.
//
// Column layouts (`wide` flag), for N images, CKK = C*K*K rows and
// HW = Ho*Wo output pixels; row r = (c*K + ki)*K + kj, column q = oh*Wo + ow:
//   wide == 0: [N][CKK][HW], one im2col matrix per image, back to back
//              (a strided-batched GEMM with the weight shared);
//   wide == 1: [CKK][N*HW], all images side by side (one GEMM for the batch).
#include "common.cuh"

__device__ __forceinline__ long long col_index(int wide, long long img, long long r, long long q, long long n,
                                               long long ckk, long long hw) {
  return wide ? (r * n + img) * hw + q : (img * ckk + r) * hw + q;
}

// One thread per column element, in the layout's memory order so writes
// coalesce; zero padding reads as 0.
template <typename T>
__device__ void conv2d_im2col_impl(const T* x, T* col, long long n, long long c, long long h, long long w,
                                   long long k, long long s, long long p, long long ho, long long wo, int wide) {
  const long long ckk = c * k * k, hw = ho * wo;
  DDP_FOR_EACH(i, n * ckk * hw) {
    long long q = i % hw;
    long long a = i / hw;
    long long img, r;
    if (wide) {
      img = a % n;
      r = a / n;
    } else {
      r = a % ckk;
      img = a / ckk;
    }
    long long ci = r / (k * k), kk = r % (k * k);
    long long ih = (q / wo) * s - p + kk / k;
    long long iw = (q % wo) * s - p + kk % k;
    bool inside = ih >= 0 && ih < h && iw >= 0 && iw < w;
    col[i] = inside ? x[((img * c + ci) * h + ih) * w + iw] : ddp::from_f32<T>(0.f);
  }
}
DDP_INSTANTIATE(conv2d_im2col,
                (const T* x, T* col, long long n, long long c, long long h, long long w, long long k, long long s,
                 long long p, long long ho, long long wo, int wide),
                (x, col, n, c, h, w, k, s, p, ho, wo, wide))

// The adjoint of im2col, as a gather: one thread per dx element sums the
// column entries that read it (f32, in (ki, kj) order like the CPU's
// col2im) and overwrites dx. No atomics, so it is deterministic and every
// element is written.
template <typename T>
__device__ void conv2d_col2im_impl(const T* col, T* dx, long long n, long long c, long long h, long long w,
                                   long long k, long long s, long long p, long long ho, long long wo, int wide) {
  const long long ckk = c * k * k, hw = ho * wo;
  DDP_FOR_EACH(i, n * c * h * w) {
    long long iw = i % w;
    long long ih = (i / w) % h;
    long long ci = (i / (w * h)) % c;
    long long img = i / (w * h * c);
    float acc = 0.f;
    for (long long ki = 0; ki < k; ++ki) {
      long long th = ih + p - ki;  // = oh * s for the windows that read this pixel
      if (th < 0 || th % s != 0 || th / s >= ho) continue;
      long long oh = th / s;
      for (long long kj = 0; kj < k; ++kj) {
        long long tw = iw + p - kj;
        if (tw < 0 || tw % s != 0 || tw / s >= wo) continue;
        long long r = (ci * k + ki) * k + kj;
        acc += ddp::to_f32(col[col_index(wide, img, r, oh * wo + tw / s, n, ckk, hw)]);
      }
    }
    dx[i] = ddp::from_f32<T>(acc);
  }
}
DDP_INSTANTIATE(conv2d_col2im,
                (const T* col, T* dx, long long n, long long c, long long h, long long w, long long k, long long s,
                 long long p, long long ho, long long wo, int wide),
                (col, dx, n, c, h, w, k, s, p, ho, wo, wide))

// y[N, O, HW] += bias[O], in place.
template <typename T>
__device__ void conv2d_bias_add_impl(T* y, const T* bias, long long n, long long o, long long hw) {
  DDP_FOR_EACH(i, n * o * hw) {
    y[i] = ddp::from_f32<T>(ddp::to_f32(y[i]) + ddp::to_f32(bias[(i / hw) % o]));
  }
}
DDP_INSTANTIATE(conv2d_bias_add, (T * y, const T* bias, long long n, long long o, long long hw),
                (y, bias, n, o, hw))

// db[o] (+)= sum over N and HW of dy[N, O, HW]. One block per channel
// (grid-strided), CONV2D_BIAS_GRAD_THREADS threads: each thread sums a fixed
// stride of the channel's N*HW values in f32, then a shared-memory tree, so
// the result is the same on every run. `accumulate` adds to db (PyTorch's
// .grad +=); otherwise db is overwritten.
#define CONV2D_BIAS_GRAD_THREADS 256
template <typename T>
__device__ void conv2d_bias_grad_impl(const T* dy, T* db, long long n, long long o, long long hw, int accumulate) {
  __shared__ float part[CONV2D_BIAS_GRAD_THREADS];
  const int t = threadIdx.x;
  for (long long ch = blockIdx.x; ch < o; ch += gridDim.x) {
    float acc = 0.f;
    for (long long e = t; e < n * hw; e += CONV2D_BIAS_GRAD_THREADS) {
      long long img = e / hw, q = e - (e / hw) * hw;
      acc += ddp::to_f32(dy[(img * o + ch) * hw + q]);
    }
    part[t] = acc;
    __syncthreads();
    for (int half = CONV2D_BIAS_GRAD_THREADS / 2; half > 0; half >>= 1) {
      if (t < half) part[t] += part[t + half];
      __syncthreads();
    }
    if (t == 0) db[ch] = ddp::from_f32<T>((accumulate ? ddp::to_f32(db[ch]) : 0.f) + part[0]);
    // part[0] is read above before the next channel overwrites part[].
    __syncthreads();
  }
}
DDP_INSTANTIATE(conv2d_bias_grad, (const T* dy, T* db, long long n, long long o, long long hw, int accumulate),
                (dy, db, n, o, hw, accumulate))
