// Error names and strings, the last-error message, sticky errors and the test
// counters of the emulated driver.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api_decls.h"
#include "driver.h"

namespace cuemu {

std::atomic<long long> counters[C_N];

namespace {
struct ErrName {
  int code;
  const char* name;
};
// Every CUresult of the CUDA 13.0 bindings, so cuGetErrorName answers any code
// a caller may hold, not only those this driver returns.
const ErrName kNames[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {5, "CUDA_ERROR_PROFILER_DISABLED"},
    {6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED"},
    {7, "CUDA_ERROR_PROFILER_ALREADY_STARTED"},
    {8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"},
    {205, "CUDA_ERROR_MAP_FAILED"},
    {206, "CUDA_ERROR_UNMAP_FAILED"},
    {207, "CUDA_ERROR_ARRAY_IS_MAPPED"},
    {208, "CUDA_ERROR_ALREADY_MAPPED"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {210, "CUDA_ERROR_ALREADY_ACQUIRED"},
    {211, "CUDA_ERROR_NOT_MAPPED"},
    {212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY"},
    {213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"},
    {224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"},
    {225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC"},
    {226, "CUDA_ERROR_CONTAINED"},
    {300, "CUDA_ERROR_INVALID_SOURCE"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND"},
    {302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND"},
    {303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {401, "CUDA_ERROR_ILLEGAL_STATE"},
    {402, "CUDA_ERROR_LOSSY_QUERY"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {710, "CUDA_ERROR_ASSERT"},
    {711, "CUDA_ERROR_TOO_MANY_PEERS"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {718, "CUDA_ERROR_INVALID_PC"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"},
    {721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
    {806, "CUDA_ERROR_MPS_RPC_FAILURE"},
    {807, "CUDA_ERROR_MPS_SERVER_NOT_READY"},
    {808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"},
    {809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED"},
    {810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"},
    {811, "CUDA_ERROR_CDP_NOT_SUPPORTED"},
    {812, "CUDA_ERROR_CDP_VERSION_MISMATCH"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
    {907, "CUDA_ERROR_CAPTURED_EVENT"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"},
    {909, "CUDA_ERROR_TIMEOUT"},
    {910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"},
    {911, "CUDA_ERROR_EXTERNAL_DEVICE"},
    {912, "CUDA_ERROR_INVALID_CLUSTER_SIZE"},
    {913, "CUDA_ERROR_FUNCTION_NOT_LOADED"},
    {914, "CUDA_ERROR_INVALID_RESOURCE_TYPE"},
    {915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"},
    {916, "CUDA_ERROR_KEY_ROTATION"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

// Descriptions (as in cuda.h) for the codes this driver returns; the others
// get a generic one naming the code.
const ErrName kStrings[] = {
    {0, "no error"},
    {1, "invalid argument"},
    {2, "out of memory"},
    {3, "initialization error"},
    {4, "driver shutting down"},
    {100, "no CUDA-capable device is detected"},
    {101, "invalid device ordinal"},
    {200, "device kernel image is invalid"},
    {201, "invalid device context"},
    {209, "no kernel image is available for execution on the device"},
    {215, "unsupported limit"},
    {218, "a PTX JIT compilation failed"},
    {301, "file not found"},
    {302, "named symbol not found"},
    {303, "shared object initialization failed"},
    {400, "invalid resource handle"},
    {401, "the operation cannot be performed in the present state"},
    {500, "named symbol not found"},
    {600, "device not ready"},
    {700, "an illegal memory access was encountered"},
    {701, "too many resources requested for launch"},
    {709, "context is destroyed"},
    {710, "device-side assert triggered"},
    {715, "an illegal instruction was encountered"},
    {716, "misaligned address"},
    {719, "unspecified launch failure"},
    {801, "operation not supported"},
    {999, "unknown error"},
};
}  // namespace

const char* error_name(int code) {
  for (const auto& e : kNames)
    if (e.code == code) return e.name;
  return nullptr;
}

// The last error has its own mutex so that `fail` may be called with or
// without G.mu held (lock order: G.mu, then this one).
static std::mutex& err_mu() {
  static auto* m = new std::mutex;
  return *m;
}

static void record(int code, const char* msg, bool print) {
  {
    std::lock_guard<std::mutex> lk(err_mu());
    g().last_error = msg;
  }
  if (print) {
    fprintf(stderr, "cuemu: error: %s (%s)\n", msg, error_name(code) ? error_name(code) : "?");
    count(C_ERRORS);
  }
}

int fail(int code, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  record(code, buf, true);
  return code;
}

int fail_quiet(int code, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  record(code, buf, false);
  return code;
}

void set_sticky_locked(CUctx_st* ctx, int code, const std::string& msg) {
  {
    std::lock_guard<std::mutex> lk(err_mu());
    g().last_error = msg;
  }
  count(C_ERRORS);
  fprintf(stderr, "cuemu: error: %s (%s; the context is now unusable: every later call returns it)\n",
          msg.c_str(), error_name(code) ? error_name(code) : "?");
  if (ctx && ctx->sticky == 0) {
    ctx->sticky = code;
    ctx->sticky_msg = msg;
  }
  g().cv.notify_all();
}

}  // namespace cuemu

using namespace cuemu;

CUEMU_API int cuGetErrorName(int error, const char** pStr) {
  if (!pStr) return 1;
  const char* n = error_name(error);
  if (!n) {
    *pStr = nullptr;
    return 1;  // CUDA_ERROR_INVALID_VALUE, as the real driver does
  }
  *pStr = n;
  return 0;
}

CUEMU_API int cuGetErrorString(int error, const char** pStr) {
  if (!pStr) return 1;
  if (!error_name(error)) {
    *pStr = nullptr;
    return 1;
  }
  // A sticky error carries its first cause: a program that only prints the
  // code's description (cudarc's DriverError does) then names the fault,
  // not the call that happened to report it later.
  const std::string cause = sticky_cause(error);
  for (const auto& e : kStrings)
    if (e.code == error) {
      if (!cause.empty()) {
        static thread_local std::string with_cause;
        with_cause = std::string(e.name) + " (first cause, sticky: " + cause + ")";
        *pStr = with_cause.c_str();
        return 0;
      }
      *pStr = e.name;
      return 0;
    }
  // A code this driver never returns: still a readable sentence.
  static thread_local char buf[128];
  snprintf(buf, sizeof buf, "%s (not produced by the emulated driver)", error_name(error));
  *pStr = buf;
  return 0;
}

static const char* kCounterNames[C_N] = {
    "host_syncs",   "launches",    "bytes_htod",    "bytes_dtoh",  "bytes_dtod", "allocations",
    "frees",        "races",       "errors",        "bounds_checks", "init_checks", "shared_checks",
    "host_guards",  "blas_calls",  "allreduce_calls", "allreduce_bytes"};

CUEMU_API long long cuemuGetCounter(const char* name) {
  if (!name) return -1;
  for (int i = 0; i < C_N; i++)
    if (strcmp(name, kCounterNames[i]) == 0) return counters[i].load();
  return -1;
}

// The libraries beside libcuda count their own calls here; only their
// counters may be bumped (a typo is a silent no-op, not a crash).
CUEMU_API void cuemuAddCounter(const char* name, long long n) {
  if (!name) return;
  for (int i = C_BLAS_CALLS; i < C_N; i++)
    if (strcmp(name, kCounterNames[i]) == 0) count((Counter)i, n);
}

// CUEMU_PRINT_COUNTERS=1: every counter on stderr at process exit, one
// line, for measuring programs that cannot call cuemuGetCounter (a CLI run).
namespace {
struct PrintAtExit {
  ~PrintAtExit() {
    const char* e = getenv("CUEMU_PRINT_COUNTERS");
    if (!e || strcmp(e, "1") != 0) return;
    std::string line = "cuemu: counters:";
    for (int i = 0; i < C_N; i++) line += " " + std::string(kCounterNames[i]) + "=" + std::to_string(counters[i].load());
    fprintf(stderr, "%s\n", line.c_str());
  }
} print_at_exit;
}  // namespace

CUEMU_API void cuemuResetCounters(void) {
  for (auto& c : counters) c.store(0);
}

CUEMU_API const char* cuemuLastErrorMessage(void) {
  // A per-thread copy: the global one may change under the caller.
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lk(err_mu());
  copy = g().last_error;
  return copy.c_str();
}
