// Initialization, devices and their attributes, contexts (primary and
// created) and the per-thread current-context stack.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <set>

#include "api_decls.h"
#include "driver.h"
#include "hostcheck.h"

namespace cuemu {

Global& g() {
  static Global* g = new Global;  // leaked on purpose (see driver.h)
  return *g;
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static std::atomic<bool> g_initialized{false};
bool initialized() { return g_initialized.load(); }

// Emulated devices before CUDA_VISIBLE_DEVICES: CUEMU_DEVICE_COUNT (default 1).
static int physical_devices() {
  const char* e = getenv("CUEMU_DEVICE_COUNT");
  if (!e || !*e) return 1;
  int n = atoi(e);
  return n < 0 ? 0 : (n > 64 ? 64 : n);
}

// CUDA_VISIBLE_DEVICES as the real driver reads it: a comma-separated list of
// indices; the list ends at the first entry that is not a valid index, so ""
// or "-1" hides every device. (Duplicates also end it.)
int device_count() {
  static int n = [] {
    int phys = physical_devices();
    const char* v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) return phys;
    int count = 0;
    std::set<long> seen;
    const char* p = v;
    while (*p) {
      while (*p == ' ') p++;
      char* end;
      long idx = strtol(p, &end, 10);
      if (end == p || idx < 0 || idx >= phys || seen.count(idx)) break;
      seen.insert(idx);
      count++;
      p = end;
      while (*p == ' ') p++;
      if (*p != ',') break;
      p++;
    }
    return count;
  }();
  return n;
}

static thread_local std::vector<CUctx_st*> t_ctx_stack;
static std::set<CUctx_st*>& all_ctxs() {
  static auto* s = new std::set<CUctx_st*>;
  return *s;
}

CUctx_st* current_ctx() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

int call_ctx(CUctx_st** out) {
  if (!initialized()) return fail_quiet(3, "the emulated driver was used before cuInit");
  CUctx_st* c = current_ctx();
  std::lock_guard<std::mutex> lk(g().mu);
  if (!c && !g().primary.empty() && g().primary[0] && g().primary[0]->active) c = g().primary[0];
  if (!c) return 201;  // CUDA_ERROR_INVALID_CONTEXT
  if (!c->active) return 709;  // CUDA_ERROR_CONTEXT_IS_DESTROYED
  take_host_fault_locked();
  *out = c;
  // The first failure stays the last error a caller can read, not whatever
  // later call happened to return the sticky code.
  if (c->sticky) fail_quiet(c->sticky, "%s", c->sticky_msg.c_str());
  return c->sticky;
}

std::string sticky_cause(int code) {
  std::lock_guard<std::mutex> lk(g().mu);
  CUctx_st* c = current_ctx();
  if (c && c->sticky == code) return c->sticky_msg;
  for (CUctx_st* p : all_ctxs())
    if (p->active && p->sticky == code) return p->sticky_msg;
  return "";
}

static void activate_locked(CUctx_st* c) {
  c->active = true;
  c->sticky = 0;
  c->sticky_msg.clear();
  c->limits[0] = 1024;           // stack size
  c->limits[1] = 1 << 20;        // printf fifo
  c->limits[2] = 8 << 20;        // malloc heap
  c->legacy = new_stream_locked(c, 0, 0, true);
}

// Tears a context down as cuDevicePrimaryCtxRelease (to 0) / cuCtxDestroy do:
// waits for its work, ends its streams, frees its memory.
static void deactivate_locked(std::unique_lock<std::mutex>& lk, CUctx_st* c) {
  std::vector<std::shared_ptr<Stream>> ss = c->streams;
  ss.push_back(c->legacy);
  for (auto& s : ss) {
    g().cv.wait(lk, [&] { return s->completed >= s->enqueued; });
    s->destroyed = true;
  }
  g().cv.notify_all();
  c->streams.clear();
  c->legacy.reset();
  for (auto& [start, a] : g().allocs)
    if (a->ctx == c && a->live) {
      a->live = false;
      a->freed_by = "the destruction of its context";
      release_alloc_locked(a);
    }
  c->active = false;
}

}  // namespace cuemu

using namespace cuemu;

CUEMU_API int cuInit(unsigned flags) {
  if (flags != 0) return fail(1, "cuInit(%u): flags must be 0", flags);
  if (!g_initialized.exchange(true)) {
    std::lock_guard<std::mutex> lk(g().mu);
    const char* lag = getenv("CUEMU_STREAM_LAG_US");
    if (lag && *lag) g().lag_ns = (int64_t)atoll(lag) * 1000;
    const char* rc = getenv("CUEMU_RACECHECK");
    g().racecheck = !(rc && strcmp(rc, "0") == 0);
    int n = device_count();
    g().primary.resize(n);
    for (int i = 0; i < n; i++) {
      g().primary[i] = new CUctx_st;
      g().primary[i]->device = i;
      all_ctxs().insert(g().primary[i]);
    }
  }
  install_fault_handler();
  return 0;
}

CUEMU_API int cuDriverGetVersion(int* v) {
  if (!v) return 1;
  *v = 13000;
  return 0;
}

// The driver's private tables (by UUID), which the real NVRTC asks a driver
// it finds for: this one has none, and saying so lets a process that loads
// both (scripts/gpu_model/resources.py under scripts/emulated-gpu.sh) compile
// as it does with no driver, where a missing symbol crashed it.
CUEMU_API int cuGetExportTable(const void** table, const void* uuid) {
  (void)uuid;
  if (table) *table = nullptr;
  return 801;  // CUDA_ERROR_NOT_SUPPORTED
}

#define NEED_INIT() \
  if (!initialized()) return 3
#define CHECK_DEV(d)                                                                            \
  if ((d) < 0 || (d) >= device_count())                                                         \
  return fail(101, "%s: device %d does not exist (%d emulated device(s) visible)", __func__, (int)(d), \
              device_count())

CUEMU_API int cuDeviceGetCount(int* count) {
  NEED_INIT();
  if (!count) return 1;
  *count = device_count();
  return 0;
}

CUEMU_API int cuDeviceGet(CUdevice* dev, int ordinal) {
  NEED_INIT();
  if (!dev) return 1;
  if (device_count() == 0) return 100;
  CHECK_DEV(ordinal);
  *dev = ordinal;
  return 0;
}

CUEMU_API int cuDeviceGetName(char* name, int len, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!name || len <= 0) return 1;
  snprintf(name, (size_t)len, "cuemu emulated sm_90 (CPU)");
  return 0;
}

static const size_t kTotalMem = 80ull << 30;  // an H100's 80 GB

CUEMU_API int cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!bytes) return 1;
  *bytes = kTotalMem;
  return 0;
}

CUEMU_API int cuMemGetInfo_v2(size_t* free_b, size_t* total) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  size_t used = 0;
  {
    std::lock_guard<std::mutex> lk(g().mu);
    for (auto& [s, a] : g().allocs)
      if (a->live) used += a->size;
  }
  if (free_b) *free_b = used > kTotalMem ? 0 : kTotalMem - used;
  if (total) *total = kTotalMem;
  return 0;
}

static void fill_uuid(CUuuid* u, CUdevice dev) {
  memcpy(u->bytes, "cuemu-device-\0\0\0", 16);
  u->bytes[15] = (char)dev;
}

CUEMU_API int cuDeviceGetUuid(CUuuid* u, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!u) return 1;
  fill_uuid(u, dev);
  return 0;
}
CUEMU_API int cuDeviceGetUuid_v2(CUuuid* u, CUdevice dev) { return cuDeviceGetUuid(u, dev); }

// H100 SXM (sm_90) values for what a program may reasonably ask; 0 for the
// graphics/texture corners nobody here uses.
static bool attribute_value(int a, int dev, int* v) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 48 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *v = 64 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *v = 2147483647; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *v = 512; return true;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x18 + dev; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 5120; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 * 1024 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 3; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *v = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *v = 0; return true;  // not emulated
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *v = 0; return true;  // not emulated
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *v = 32; return true;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: *v = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; return true;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: *v = 2; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: *v = dev; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *v = 0; return true;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: *v = -1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *v = -1; return true;
    default:
      if (a > 0 && a < CU_DEVICE_ATTRIBUTE_MAX) {
        *v = 0;
        return true;
      }
      return false;
  }
}

CUEMU_API int cuDeviceGetAttribute(int* v, int attrib, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!v) return 1;
  if (!attribute_value(attrib, dev, v)) return fail(1, "cuDeviceGetAttribute: unknown attribute %d", attrib);
  return 0;
}

CUEMU_API int cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!major || !minor) return 1;
  *major = 9;
  *minor = 0;
  return 0;
}

// ----------------------------------------------------------- contexts ------

CUEMU_API int cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  if (!pctx) return 1;
  std::lock_guard<std::mutex> lk(g().mu);
  CUctx_st* c = g().primary[dev];
  if (c->refcount++ == 0) activate_locked(c);
  *pctx = c;
  return 0;
}

CUEMU_API int cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  std::unique_lock<std::mutex> lk(g().mu);
  CUctx_st* c = g().primary[dev];
  if (c->refcount <= 0) return 201;
  if (--c->refcount == 0) deactivate_locked(lk, c);
  return 0;
}
CUEMU_API int cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

// Destroys the primary context's resources now (clearing a sticky error);
// retains stay counted, so the context is recreated at once if retained.
CUEMU_API int cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  NEED_INIT();
  CHECK_DEV(dev);
  std::unique_lock<std::mutex> lk(g().mu);
  CUctx_st* c = g().primary[dev];
  if (c->active) deactivate_locked(lk, c);
  if (c->refcount > 0) activate_locked(c);
  return 0;
}
CUEMU_API int cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUEMU_API int cuDevicePrimaryCtxGetState(CUdevice dev, unsigned* flags, int* active) {
  NEED_INIT();
  CHECK_DEV(dev);
  std::lock_guard<std::mutex> lk(g().mu);
  if (flags) *flags = g().primary[dev]->flags;
  if (active) *active = g().primary[dev]->active ? 1 : 0;
  return 0;
}

CUEMU_API int cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned flags) {
  NEED_INIT();
  CHECK_DEV(dev);
  std::lock_guard<std::mutex> lk(g().mu);
  g().primary[dev]->flags = flags;
  return 0;
}

static bool valid_ctx(CUctx_st* c) {
  std::lock_guard<std::mutex> lk(g().mu);
  return all_ctxs().count(c) && c->active;
}

CUEMU_API int cuCtxCreate_v4(CUcontext* pctx, void* params, unsigned flags, CUdevice dev) {
  (void)params;
  NEED_INIT();
  CHECK_DEV(dev);
  if (!pctx) return 1;
  CUctx_st* c = new CUctx_st;
  c->device = dev;
  c->primary = false;
  c->flags = flags;
  {
    std::lock_guard<std::mutex> lk(g().mu);
    all_ctxs().insert(c);
    activate_locked(c);
  }
  t_ctx_stack.push_back(c);  // cuCtxCreate makes the new context current
  *pctx = c;
  return 0;
}
CUEMU_API int cuCtxCreate_v3(CUcontext* pctx, void*, int, unsigned flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
CUEMU_API int cuCtxCreate_v2(CUcontext* pctx, unsigned flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

CUEMU_API int cuCtxDestroy_v2(CUcontext c) {
  NEED_INIT();
  if (!valid_ctx(c)) return fail(201, "cuCtxDestroy: %p is not a live context", (void*)c);
  if (c->primary) return fail(201, "cuCtxDestroy: %p is a primary context (release it instead)", (void*)c);
  {
    std::unique_lock<std::mutex> lk(g().mu);
    deactivate_locked(lk, c);  // the object stays allocated: a stale handle is detected
  }
  for (auto& e : t_ctx_stack)
    if (e == c) e = nullptr;
  return 0;
}

CUEMU_API int cuCtxGetCurrent(CUcontext* pctx) {
  NEED_INIT();
  if (!pctx) return 1;
  *pctx = current_ctx();
  return 0;
}

CUEMU_API int cuCtxSetCurrent(CUcontext c) {
  NEED_INIT();
  if (c && !valid_ctx(c)) return fail(201, "cuCtxSetCurrent: %p is not a live context", (void*)c);
  if (t_ctx_stack.empty()) {
    if (c) t_ctx_stack.push_back(c);
  } else {
    t_ctx_stack.back() = c;
  }
  return 0;
}

CUEMU_API int cuCtxPushCurrent_v2(CUcontext c) {
  NEED_INIT();
  if (!valid_ctx(c)) return fail(201, "cuCtxPushCurrent: %p is not a live context", (void*)c);
  t_ctx_stack.push_back(c);
  return 0;
}

CUEMU_API int cuCtxPopCurrent_v2(CUcontext* pctx) {
  NEED_INIT();
  if (t_ctx_stack.empty()) return fail(201, "cuCtxPopCurrent: no context is current on this thread");
  if (pctx) *pctx = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  return 0;
}

CUEMU_API int cuCtxGetDevice(CUdevice* dev) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!dev) return 1;
  *dev = c->device;
  return 0;
}

CUEMU_API int cuCtxSynchronize(void) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  std::unique_lock<std::mutex> lk(g().mu);
  return sync_ctx_locked(lk, c);
}

CUEMU_API int cuCtxSetFlags(unsigned flags) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  c->flags = flags;
  return 0;
}

CUEMU_API int cuCtxGetFlags(unsigned* flags) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!flags) return 1;
  *flags = c->flags;
  return 0;
}

CUEMU_API int cuCtxGetLimit(size_t* v, int limit) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!v) return 1;
  if (limit < 0 || limit >= CU_LIMIT_MAX) return fail(215, "cuCtxGetLimit: unsupported limit %d", limit);
  *v = c->limits[limit];
  return 0;
}

CUEMU_API int cuCtxSetLimit(int limit, size_t v) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (limit < 0 || limit >= CU_LIMIT_MAX) return fail(215, "cuCtxSetLimit: unsupported limit %d", limit);
  c->limits[limit] = v;
  return 0;
}

CUEMU_API int cuCtxGetCacheConfig(int* cfg) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!cfg) return 1;
  *cfg = c->cache_config;
  return 0;
}

CUEMU_API int cuCtxSetCacheConfig(int cfg) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  c->cache_config = cfg;
  return 0;
}

// Priorities are accepted and recorded; every stream gets its own worker, so
// they change nothing. The range is an H100's.
CUEMU_API int cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return 0;
}

CUEMU_API int cuCtxGetApiVersion(CUcontext, unsigned* v) {
  if (v) *v = 13000;
  return 0;
}
