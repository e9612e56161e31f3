// Batch assembly from a dataset that lives on the device (CPU twin: the
// loader's `build` in src/data/loader.rs): row i of the batch is sample
// indices[offset + i]. The epoch's index order is uploaded once per epoch,
// so a training step copies nothing from the host.
#include "common.cuh"

extern "C" __global__ void gather_batch(const float* images, const unsigned int* labels,
                                        const unsigned int* indices, long long offset, long long n,
                                        long long sample_len, float* x, unsigned int* y) {
  DDP_FOR_EACH(k, n * sample_len) {
    long long i = k / sample_len;
    long long j = k - i * sample_len;
    long long src = (long long)indices[offset + i];
    x[k] = images[src * sample_len + j];
    if (j == 0) y[i] = labels[src];
  }
}
