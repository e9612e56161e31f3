// Handle management and the small informational entry points of the emulated
// cuBLAS: create / destroy, stream, math, pointer and atomics modes, workspace,
// version and status strings. The GEMMs are in gemm.cpp.
#include <stdio.h>
#include <stdlib.h>

#include <mutex>
#include <new>
#include <unordered_set>

#include <cuemu/internal.h>

#include "cublas_internal.h"

// From libcuda.so (the emulated driver): the context a handle belongs to.
extern "C" int cuCtxGetCurrent(void** pctx);

namespace cuemu_blas {
namespace {

// Live handles. A set (not only the magic word) so that a pointer into freed
// memory that happens to still hold kMagic is refused too.
std::mutex g_mu;
std::unordered_set<Handle*>& live() {
  static auto* s = new std::unordered_set<Handle*>();  // leaked: usable during exit
  return *s;
}

}  // namespace

Handle* lookup(cublasHandle_t h, const char* fn) {
  Handle* p = reinterpret_cast<Handle*>(h);
  if (p == nullptr) {
    fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle is NULL (cublasCreate_v2 not called or failed)");
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (live().count(p) && p->magic == kMagic) return p;
  }
  fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle %p is not a live cuBLAS handle (destroyed, or never created)",
       (void*)p);
  return nullptr;
}

cublasStatus_t fail(cublasStatus_t status, const char* fn, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuemu cublas: %s: %s\n", fn, msg);
  return status;
}

}  // namespace cuemu_blas

using namespace cuemu_blas;

// Set once before the first GEMM can run: OpenBLAS's own thread pool would
// make results depend on its partitioning and compete with the trainer's and
// the stream workers' threads. The stream worker is the emulated "GPU".
extern "C" void openblas_set_num_threads(int);
static std::once_flag g_openblas_once;

CUBLASAPI cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  static const char* fn = "cublasCreate_v2";
  if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "handle pointer is NULL");
  *handle = nullptr;
  // Real cuBLAS initializes the CUDA runtime, which would make device 0's
  // primary context current. Here a handle needs a context the caller made
  // current (cudarc always binds one first): a missing one is a bug worth
  // reporting rather than papering over.
  void* ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != 0 || ctx == nullptr)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "no CUDA context is current on this thread");
  std::call_once(g_openblas_once, [] { openblas_set_num_threads(1); });
  Handle* h = new (std::nothrow) Handle{kMagic, ctx, nullptr, CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST,
                                        CUBLAS_ATOMICS_NOT_ALLOWED, nullptr, 0};
  if (h == nullptr) return fail(CUBLAS_STATUS_ALLOC_FAILED, fn, "out of host memory");
  {
    std::lock_guard<std::mutex> lk(g_mu);
    live().insert(h);
  }
  *handle = reinterpret_cast<cublasHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

// Queued GEMMs own copies of everything they use, so there is nothing to
// drain. (Real cuBLAS documents an implicit device synchronization here; the
// emulator does not add one, so the driver's host_syncs counter only counts
// what the project itself asked for.)
CUBLASAPI cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  Handle* h = lookup(handle, "cublasDestroy_v2");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    live().erase(h);
  }
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

// The stream is not validated here (cuBLAS does not either); a dead stream is
// reported by cuemu_enqueue when a GEMM is issued on it.
CUBLASAPI cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  Handle* h = lookup(handle, "cublasSetStream_v2");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = stream;
  // cuBLAS resets a user workspace to its default one on a stream change.
  h->workspace = nullptr;
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  Handle* h = lookup(handle, "cublasGetStream_v2");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream_v2", "streamId is NULL");
  *stream = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}

// Valid modes: one base mode, optionally with the DISALLOW_REDUCED_PRECISION
// bit. f32 GEMMs always compute in full f32 here, and f16 GEMMs accumulate
// in f32; without the DISALLOW bit a 16-bit C is reduced split-K style in
// 16 bits, as the hardware may (see gemm_exec.cpp).
CUBLASAPI cublasStatus_t cublasSetMathMode(cublasHandle_t handle, int mode) {
  static const char* fn = "cublasSetMathMode";
  Handle* h = lookup(handle, fn);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
    case CUBLAS_FP32_EMULATED_BF16X9_MATH:
    case CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH:
      h->math_mode = mode;
      return CUBLAS_STATUS_SUCCESS;
    default:
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "mode %d is not a cublasMath_t", mode);
  }
}

CUBLASAPI cublasStatus_t cublasGetMathMode(cublasHandle_t handle, int* mode) {
  Handle* h = lookup(handle, "cublasGetMathMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetMathMode", "mode is NULL");
  *mode = h->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, int mode) {
  static const char* fn = "cublasSetPointerMode_v2";
  Handle* h = lookup(handle, fn);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "mode %d is not a cublasPointerMode_t", mode);
  h->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, int* mode) {
  Handle* h = lookup(handle, "cublasGetPointerMode_v2");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetPointerMode_v2", "mode is NULL");
  *mode = h->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, int mode) {
  Handle* h = lookup(handle, "cublasSetAtomicsMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetAtomicsMode", "mode %d is not a cublasAtomicsMode_t",
                mode);
  h->atomics_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, int* mode) {
  Handle* h = lookup(handle, "cublasGetAtomicsMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetAtomicsMode", "mode is NULL");
  *mode = h->atomics_mode;
  return CUBLAS_STATUS_SUCCESS;
}

// The emulator needs no workspace; the buffer is still checked (cuBLAS asks
// for 256-byte alignment, and it must be device memory) so a wrong one is
// found here rather than on real hardware.
CUBLASAPI cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  static const char* fn = "cublasSetWorkspace_v2";
  Handle* h = lookup(handle, fn);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (workspace != nullptr && bytes > 0) {
    if ((uintptr_t)workspace % 256 != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p is not 256-byte aligned", workspace);
    char err[512] = "";
    if (cuemu_check_range(workspace, bytes, err, sizeof err) != 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace of %zu bytes: %s", bytes, err);
  }
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  Handle* h = lookup(handle, "cublasGetVersion_v2");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetVersion_v2", "version is NULL");
  *version = CUEMU_CUBLAS_VER_MAJOR * 10000 + CUEMU_CUBLAS_VER_MINOR * 100 + CUEMU_CUBLAS_VER_PATCH;
  return CUBLAS_STATUS_SUCCESS;
}

CUBLASAPI cublasStatus_t cublasGetProperty(int type, int* value) {
  if (value == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetProperty", "value is NULL");
  switch (type) {
    case MAJOR_VERSION: *value = CUEMU_CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUEMU_CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUEMU_CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    default: return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetProperty", "type %d is not a libraryPropertyType", type);
  }
}

CUBLASAPI const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

CUBLASAPI const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    default: return "unknown error";
  }
}
