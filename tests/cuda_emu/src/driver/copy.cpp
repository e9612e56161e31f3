// Copies and memsets, with CUDA's pageable/pinned rules:
//  - HtoD Async from pageable memory snapshots the source before returning
//    (the real driver stages it), counted as a host-blocking sync;
//  - DtoH Async into pageable memory blocks the host until the copy ran
//    (a host-blocking sync, which orders the host after the stream);
//  - with pinned host memory both are truly asynchronous: the copy reads or
//    writes the host buffer when the stream reaches it, so a host that reads
//    a pinned DtoH destination without synchronizing sees the old bytes;
//  - the synchronous copies (cuMemcpyHtoD_v2, cuMemcpyDtoH_v2) run on the
//    legacy default stream and return once done (host syncs); DtoD and the
//    memsets are asynchronous even in their "synchronous" form, as in CUDA.
#include <string.h>

#include "api_decls.h"
#include "driver.h"
#include "profile.h"
#include "hostcheck.h"
#include "memcheck.h"

using namespace cuemu;

namespace {

// The stream an entry point works on, under the lock; error if none.
struct Target {
  CUctx_st* ctx = nullptr;
  std::shared_ptr<Stream> s;
};

int target(CUstream h, const char* call, std::unique_lock<std::mutex>& lk, Target* t) {
  if (int r = call_ctx(&t->ctx)) return r;
  lk.lock();
  t->s = resolve_stream_locked(h, t->ctx);
  if (!t->s) {
    lk.unlock();
    return fail(400, "%s: %p is not a live stream handle", call, (void*)h);
  }
  return 0;
}

// A host pointer passed where the call expects one must not be a device
// allocation (arguments swapped) and must not be NULL.
int check_host_locked(const void* p, size_t n, const char* call, const char* which) {
  if (!p) return fail(1, "%s: the %s host pointer is NULL (%zu bytes)", call, which, n);
  if (Alloc* a = find_alloc_locked((uintptr_t)p))
    return fail(1, "%s: the %s 0x%lx is a device pointer (allocation #%llu), not host memory; are the arguments "
                "swapped?", call, which, (unsigned long)p, (unsigned long long)a->serial);
  return 0;
}

int check_dev_locked(CUdeviceptr p, size_t n, const char* call, const char* which) {
  std::string msg;
  char what[200];
  snprintf(what, sizeof what, "%s %s", call, which);
  if (check_range_locked(p, n, what, nullptr, &msg)) return fail(1, "%s", msg.c_str());
  return 0;
}

int htod(CUdeviceptr dst, const void* src, size_t n, CUstream h, bool async, const char* call) {
  std::unique_lock<std::mutex> lk(g().mu, std::defer_lock);
  Target t;
  if (int r = target(async ? h : nullptr, call, lk, &t)) return r;
  if (n == 0) return 0;
  if (int r = check_host_locked(src, n, call, "source")) return r;
  if (int r = check_dev_locked(dst, n, call, "destination")) return r;
  bool pinned = is_pinned(src, n);
  const char* view = (const char*)host_view(src, n);
  Op op;
  op.name = call;
  const unsigned long long ticket = cuemu_profile_enabled() ? profile_ticket() : 0;
  if (async && pinned) {
    op.run = [dst, view, n, ticket, call](char*, size_t) {
      memcpy((void*)dst, view, n);
      if (cuemu_profile_enabled()) {
        const cuemu_prof_span sp = {dst, n, 1, 0, 1};
        profile_op_bytes(ticket, "memcpy_htod", call, n, &sp, 1);
      }
      return 0;
    };
  } else {
    auto snap = std::make_shared<std::vector<char>>(view, view + n);
    op.run = [dst, snap, ticket, call](char*, size_t) {
      memcpy((void*)dst, snap->data(), snap->size());
      if (cuemu_profile_enabled()) {
        const cuemu_prof_span sp = {dst, snap->size(), 1, 0, 1};
        profile_op_bytes(ticket, "memcpy_htod", call, snap->size(), &sp, 1);
      }
      return 0;
    };
  }
  if (int r = enqueue_locked(t.s, std::move(op), {{dst, n, true}}, call)) return r;
  shadow_set(dst, n, SH_INIT);
  count(C_HTOD, (long long)n);
  if (!async) return sync_stream_locked(lk, t.s);
  if (pinned) guard_host_copy(src, n, false, *t.s, call);
  if (!pinned) count(C_HOST_SYNCS);  // the staging copy blocked the host
  return 0;
}

int dtoh(void* dst, CUdeviceptr src, size_t n, CUstream h, bool async, const char* call) {
  std::unique_lock<std::mutex> lk(g().mu, std::defer_lock);
  Target t;
  if (int r = target(async ? h : nullptr, call, lk, &t)) return r;
  if (n == 0) return 0;
  if (int r = check_host_locked(dst, n, call, "destination")) return r;
  if (int r = check_dev_locked(src, n, call, "source")) return r;
  bool pinned = is_pinned(dst, n);
  void* view = host_view(dst, n);
  Op op;
  op.name = call;
  const unsigned long long ticket = cuemu_profile_enabled() ? profile_ticket() : 0;
  op.run = [view, src, n, ticket, call](char*, size_t) {
    memcpy(view, (const void*)src, n);
    if (cuemu_profile_enabled()) {
      const cuemu_prof_span sp = {src, n, 1, 0, 0};
      profile_op_bytes(ticket, "memcpy_dtoh", call, n, &sp, 1);
    }
    return 0;
  };
  if (int r = enqueue_locked(t.s, std::move(op), {{src, n, false}}, call)) return r;
  count(C_DTOH, (long long)n);
  if (async && pinned) {
    guard_host_copy(dst, n, true, *t.s, call);
    return 0;
  }
  // Pageable destination (or the synchronous call): the host waits for this
  // copy, which orders it after everything before it on the stream.
  return sync_stream_locked(lk, t.s);
}

int dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, const char* call) {
  std::unique_lock<std::mutex> lk(g().mu, std::defer_lock);
  Target t;
  if (int r = target(h, call, lk, &t)) return r;
  if (n == 0) return 0;
  if (int r = check_dev_locked(src, n, call, "source")) return r;
  if (int r = check_dev_locked(dst, n, call, "destination")) return r;
  Op op;
  op.name = call;
  const unsigned long long ticket = cuemu_profile_enabled() ? profile_ticket() : 0;
  op.run = [dst, src, n, ticket, call](char*, size_t) {
    memmove((void*)dst, (const void*)src, n);
    if (cuemu_profile_enabled()) {
      const cuemu_prof_span sp[2] = {{src, n, 1, 0, 0}, {dst, n, 1, 0, 1}};
      profile_op_bytes(ticket, "memcpy_dtod", call, n, sp, 2);
    }
    return 0;
  };
  if (int r = enqueue_locked(t.s, std::move(op), {{src, n, false}, {dst, n, true}}, call)) return r;
  shadow_set(dst, n, SH_INIT);
  count(C_DTOD, (long long)n);
  return 0;
}

template <typename T>
int memset_n(CUdeviceptr dst, T value, size_t count_n, CUstream h, const char* call) {
  std::unique_lock<std::mutex> lk(g().mu, std::defer_lock);
  Target t;
  if (int r = target(h, call, lk, &t)) return r;
  if (count_n == 0) return 0;
  if (dst % sizeof(T))
    return fail(1, "%s: 0x%llx is not aligned to %zu bytes", call, (unsigned long long)dst, sizeof(T));
  size_t n = count_n * sizeof(T);
  if (int r = check_dev_locked(dst, n, call, "destination")) return r;
  Op op;
  op.name = call;
  const unsigned long long ticket = cuemu_profile_enabled() ? profile_ticket() : 0;
  op.run = [dst, value, count_n, ticket, call, n](char*, size_t) {
    if (cuemu_profile_enabled()) {
      const cuemu_prof_span sp = {dst, n, 1, 0, 1};
      profile_op_bytes(ticket, "memset", call, n, &sp, 1);
    }
    T* p = (T*)dst;
    if (sizeof(T) == 1)
      memset(p, (int)value, count_n);
    else
      for (size_t i = 0; i < count_n; i++) p[i] = value;
    return 0;
  };
  if (int r = enqueue_locked(t.s, std::move(op), {{dst, n, true}}, call)) return r;
  shadow_set(dst, n, SH_INIT);
  return 0;
}

}  // namespace

CUEMU_API int cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return htod(dst, src, n, nullptr, false, "cuMemcpyHtoD_v2");
}
CUEMU_API int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
  return htod(dst, src, n, h, true, "cuMemcpyHtoDAsync_v2");
}
CUEMU_API int cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return dtoh(dst, src, n, nullptr, false, "cuMemcpyDtoH_v2");
}
CUEMU_API int cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream h) {
  return dtoh(dst, src, n, h, true, "cuMemcpyDtoHAsync_v2");
}
CUEMU_API int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return dtod(dst, src, n, nullptr, "cuMemcpyDtoD_v2");
}
CUEMU_API int cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  return dtod(dst, src, n, h, "cuMemcpyDtoDAsync_v2");
}
// Every emulated device shares the process's address space.
CUEMU_API int cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n, CUstream h) {
  return dtod(dst, src, n, h, "cuMemcpyPeerAsync");
}

CUEMU_API int cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  return memset_n<uint8_t>(d, v, n, nullptr, "cuMemsetD8_v2");
}
CUEMU_API int cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) {
  return memset_n<uint16_t>(d, v, n, nullptr, "cuMemsetD16_v2");
}
CUEMU_API int cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) {
  return memset_n<uint32_t>(d, v, n, nullptr, "cuMemsetD32_v2");
}
CUEMU_API int cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream h) {
  return memset_n<uint8_t>(d, v, n, h, "cuMemsetD8Async");
}
CUEMU_API int cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream h) {
  return memset_n<uint16_t>(d, v, n, h, "cuMemsetD16Async");
}
CUEMU_API int cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream h) {
  return memset_n<uint32_t>(d, v, n, h, "cuMemsetD32Async");
}
