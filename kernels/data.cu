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

// A text batch (CPU twin: Windows::push in src/data/text.rs): row i is the
// window of the token stream starting at starts[offset + i] (drawn on the
// host), its first `t` tokens the input ids (as f32) and the next `t` its
// targets. gather_batch's signature, with the stream as `labels`.
extern "C" __global__ void gather_text(const float* unused, const unsigned int* tokens,
                                       const unsigned int* starts, long long offset, long long n,
                                       long long t, float* x, unsigned int* y) {
  DDP_FOR_EACH(k, n * t) {
    long long i = k / t;
    long long j = k - i * t;
    long long at = (long long)starts[offset + i] + j;
    x[k] = (float)tokens[at];
    y[k] = tokens[at + 1];
  }
}

// gather_batch with torchvision's RandomCrop (constant padding) then
// RandomHorizontalFlip (CPU twin: Augment::apply in src/data/augment.rs).
// Row i's draws are draws[3 * (offset + i) ..]: the crop's top and left in the
// image padded by `pad` on each side, and whether it is mirrored; outside the
// image the value is fill[c], the channel's normalized padding. The crop is
// the image's own h x w (config validation), so rows keep sample_len values.
extern "C" __global__ void gather_batch_augment(const float* images, const unsigned int* labels,
                                                const unsigned int* indices, const int* draws,
                                                const float* fill, long long offset, long long n,
                                                long long channels, long long h, long long w,
                                                long long pad, float* x, unsigned int* y) {
  long long plane = h * w;
  long long sample_len = channels * plane;
  DDP_FOR_EACH(k, n * sample_len) {
    long long i = k / sample_len;
    long long j = k - i * sample_len;
    long long c = j / plane;
    long long p = j - c * plane;
    long long oy = p / w;
    long long ox = p - oy * w;
    long long row = offset + i;
    long long src = (long long)indices[row];
    long long top = draws[3 * row];
    long long left = draws[3 * row + 1];
    long long cx = draws[3 * row + 2] ? w - 1 - ox : ox;
    long long sy = top + oy - pad;
    long long sx = left + cx - pad;
    bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
    x[k] = inside ? images[src * sample_len + c * plane + sy * w + sx] : fill[c];
    if (j == 0) y[i] = labels[src];
  }
}
