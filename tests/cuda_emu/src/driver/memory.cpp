// Device and pinned host memory. Every device allocation is carved from one
// reserved region (memcheck.cpp keeps a shadow byte per byte of it), never
// reused:
//
//   [guard page][ user bytes | slack ... ][guard page]
//               ^ page boundary (256-byte aligned, as cuMemAlloc's)
//
// The slack after the user bytes, the guards and freed memory are
// unaddressable in the shadow, so a kernel touching any byte outside
// [ptr, ptr + size) is reported at once, whatever the size. Fresh memory is
// 0xFF bytes (a NaN in every float format) and uninitialized in the shadow,
// so a kernel reading bytes nobody wrote is reported too (and reads NaN
// where that check is off). A free makes the whole mapping PROT_NONE, drops
// its pages and keeps the address range forever (quarantine), so a use
// after free faults and the messages can say whose allocation it was.
#include <sys/mman.h>
#include <unistd.h>
#include <string.h>

#include "api_decls.h"
#include "driver.h"
#include "hostcheck.h"
#include "memcheck.h"

namespace cuemu {

static size_t page_size() {
  static size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

int alloc_device(size_t bytes, const char* who, CUctx_st* ctx, uintptr_t* out) {
  size_t page = page_size();
  if (bytes > (1ull << 46)) return fail(2, "%s: %zu bytes is more than the emulated device has", who, bytes);
  size_t data = bytes == 0 ? page : (bytes + page - 1) / page * page;
  size_t len = data + 2 * page;
  if (!reserve_device_region()) return fail(2, "%s: cannot reserve the emulated device's address space", who);
  char* base;
  {
    std::lock_guard<std::mutex> lk(g().mu);
    // The region's last page stays unused (see reserve_device_region).
    if (len > sh_len - page - g().region_used)
      return fail(2, "%s: out of memory: %zu bytes requested, %zu of the emulated device's %zu bytes of address "
                  "space left (freed allocations are never reused)", who, bytes,
                  sh_len - page - g().region_used, sh_len);
    base = (char*)(sh_base + g().region_used);
    g().region_used += len;
  }
  if (mprotect(base + page, data, PROT_READ | PROT_WRITE) != 0) return fail(2, "%s: mprotect failed", who);
  memset(base + page, 0xFF, data);
  Alloc* a = new Alloc;
  a->start = (uintptr_t)(base + page);
  a->size = bytes;
  a->map_base = base;
  a->map_len = len;
  a->ctx = ctx;
  a->allocated_by = who;
  shadow_set(a->start, bytes, SH_UNINIT);
  {
    std::lock_guard<std::mutex> lk(g().mu);
    a->serial = ++g().alloc_serial;
    g().allocs[a->start] = a;
  }
  count(C_ALLOCS);
  *out = a->start;
  return 0;
}

void release_alloc_locked(Alloc* a) {
  mprotect(a->map_base, a->map_len, PROT_NONE);
  madvise(a->map_base, a->map_len, MADV_DONTNEED);
  shadow_drop((uintptr_t)a->map_base, a->map_len);
}

Alloc* find_alloc_locked(uintptr_t addr) {
  auto& m = g().allocs;
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return nullptr;
  --it;
  Alloc* a = it->second;
  if (addr - a->start < a->size || (a->size == 0 && addr == a->start)) return a;
  return nullptr;
}

// The allocation whose mapping (guards included) holds addr, if any.
Alloc* find_mapping_locked(uintptr_t addr) {
  auto& m = g().allocs;
  auto it = m.upper_bound(addr);
  // The mapping starts before `start`, so look at the next one too.
  for (int k = 0; k < 2; k++) {
    if (it != m.end()) {
      Alloc* a = it->second;
      if (addr >= (uintptr_t)a->map_base && addr < (uintptr_t)a->map_base + a->map_len) return a;
    }
    if (it == m.begin()) break;
    --it;
  }
  return nullptr;
}

static std::string alloc_name(const Alloc* a) {
  char buf[160];
  snprintf(buf, sizeof buf, "allocation #%llu at 0x%lx (%zu bytes)", (unsigned long long)a->serial,
           (unsigned long)a->start, a->size);
  return buf;
}

int check_range_locked(uintptr_t ptr, size_t bytes, const char* what, Alloc** out, std::string* msg) {
  char buf[1024];
  Alloc* a = find_alloc_locked(ptr);
  if (!a) {
    Alloc* near = find_mapping_locked(ptr);
    if (near && ptr >= near->start + near->size)
      snprintf(buf, sizeof buf, "%s: 0x%lx is %zu bytes past the end of %s", what, (unsigned long)ptr,
               (size_t)(ptr - near->start - near->size), alloc_name(near).c_str());
    else if (near)
      snprintf(buf, sizeof buf, "%s: 0x%lx is %zu bytes before the start of %s", what, (unsigned long)ptr,
               (size_t)(near->start - ptr), alloc_name(near).c_str());
    else if (is_pinned((void*)ptr, 1))
      snprintf(buf, sizeof buf, "%s: 0x%lx is pinned host memory, not a device pointer", what,
               (unsigned long)ptr);
    else
      snprintf(buf, sizeof buf, "%s: 0x%lx is not a device pointer", what, (unsigned long)ptr);
    *msg = buf;
    return 1;
  }
  if (!a->live) {
    snprintf(buf, sizeof buf, "%s: 0x%lx lies in %s, which was freed by %s", what, (unsigned long)ptr,
             alloc_name(a).c_str(), a->freed_by.c_str());
    *msg = buf;
    return 1;
  }
  if (bytes > a->size - (ptr - a->start)) {
    snprintf(buf, sizeof buf, "%s: the range [0x%lx, +%zu bytes) ends %zu bytes past the end of %s", what,
             (unsigned long)ptr, bytes, (size_t)(ptr + bytes - a->start - a->size), alloc_name(a).c_str());
    *msg = buf;
    return 1;
  }
  if (out) *out = a;
  return 0;
}

void describe_addr_locked(uintptr_t addr, char* buf, size_t len) {
  Alloc* a = find_alloc_locked(addr);
  if (!a) a = find_mapping_locked(addr);
  if (a && !a->live)
    snprintf(buf, len, "0x%lx: use after free of %s, freed by %s", (unsigned long)addr, alloc_name(a).c_str(),
             a->freed_by.c_str());
  else if (a && addr >= a->start + a->size)
    snprintf(buf, len, "0x%lx is %zu bytes past the end of %s", (unsigned long)addr,
             (size_t)(addr - a->start - a->size), alloc_name(a).c_str());
  else if (a && addr < a->start)
    snprintf(buf, len, "0x%lx is %zu bytes before the start of %s", (unsigned long)addr,
             (size_t)(a->start - addr), alloc_name(a).c_str());
  else if (a)
    snprintf(buf, len, "0x%lx lies inside %s (a protection fault)", (unsigned long)addr, alloc_name(a).c_str());
  else if (addr < 65536)
    snprintf(buf, len, "0x%lx is not a device address (a small integer, or a null pointer plus an offset)", (unsigned long)addr);
  else
    snprintf(buf, len, "0x%lx is not a device address", (unsigned long)addr);
}

}  // namespace cuemu

using namespace cuemu;

CUEMU_API int cuemu_check_range(const void* ptr, size_t bytes, char* err, size_t err_len) {
  std::string msg;
  std::lock_guard<std::mutex> lk(g().mu);
  int r = check_range_locked((uintptr_t)ptr, bytes, "device range", nullptr, &msg);
  if (r && err && err_len) snprintf(err, err_len, "%s", msg.c_str());
  return r;
}

CUEMU_API int cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!dptr) return fail(1, "cuMemAlloc_v2: dptr is NULL");
  if (bytes == 0) return fail(1, "cuMemAlloc_v2: 0 bytes requested");
  uintptr_t p;
  if (int r = alloc_device(bytes, "cuMemAlloc_v2", c, &p)) return r;
  *dptr = p;
  return 0;
}

// The start of a live allocation, or an error naming the call.
static int free_target_locked(const char* call, CUdeviceptr p, Alloc** out) {
  Alloc* a = find_alloc_locked(p);
  if (!a) {
    std::string msg;
    check_range_locked(p, 0, call, nullptr, &msg);
    return 1;
  }
  if (!a->live) return 1;
  if (a->start != p) return 1;
  *out = a;
  return 0;
}

static int free_error(const char* call, CUdeviceptr p) {
  std::string msg;
  char buf[1024];
  {
    std::lock_guard<std::mutex> lk(g().mu);
    Alloc* a = find_alloc_locked(p);
    if (a && !a->live)
      snprintf(buf, sizeof buf, "%s(0x%llx): double free: allocation #%llu (%zu bytes) was already freed by %s",
               call, p, (unsigned long long)a->serial, a->size, a->freed_by.c_str());
    else if (a)
      snprintf(buf, sizeof buf, "%s(0x%llx): not the start of an allocation (it lies %zu bytes into allocation "
               "#%llu at 0x%lx)", call, p, (size_t)(p - a->start), (unsigned long long)a->serial,
               (unsigned long)a->start);
    else {
      check_range_locked(p, 0, call, nullptr, &msg);
      snprintf(buf, sizeof buf, "%s", msg.c_str());
    }
  }
  return fail(1, "%s", buf);
}

// cuMemFree synchronizes the context first (as the real one does), so the
// free is ordered after every operation and cannot race.
CUEMU_API int cuMemFree_v2(CUdeviceptr p) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  std::unique_lock<std::mutex> lk(g().mu);
  Alloc* a;
  if (free_target_locked("cuMemFree_v2", p, &a)) {
    lk.unlock();
    return free_error("cuMemFree_v2", p);
  }
  int r = sync_ctx_locked(lk, c);
  if (!a->live) {  // freed by another thread meanwhile
    lk.unlock();
    return free_error("cuMemFree_v2", p);
  }
  a->live = false;
  a->freed_by = "cuMemFree_v2";
  release_alloc_locked(a);
  count(C_FREES);
  return r;
}

// Stream-ordered allocation: the memory is usable on `stream` right away and
// on other streams only once ordered after it, so the allocation counts as a
// write by `stream` for the race checker (the 0xFF fill is done now).
CUEMU_API int cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream h) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!dptr) return fail(1, "cuMemAllocAsync: dptr is NULL");
  uintptr_t p;
  if (int r = alloc_device(bytes, "cuMemAllocAsync", c, &p)) return r;
  std::lock_guard<std::mutex> lk(g().mu);
  auto s = resolve_stream_locked(h, c);
  if (!s) return fail(400, "cuMemAllocAsync: %p is not a stream", (void*)h);
  Op op;
  op.name = "cuMemAllocAsync";
  int r = enqueue_locked(s, std::move(op), {{p, bytes, true}}, "cuMemAllocAsync");
  if (r) {
    Alloc* a = g().allocs[p];
    a->live = false;
    a->freed_by = "the failed cuMemAllocAsync";
    release_alloc_locked(a);
    return r;
  }
  g().allocs[p]->allocated_by = "cuMemAllocAsync on " + s->label();
  *dptr = p;
  return 0;
}

CUEMU_API int cuMemFreeAsync(CUdeviceptr p, CUstream h) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  std::unique_lock<std::mutex> lk(g().mu);
  Alloc* a;
  if (free_target_locked("cuMemFreeAsync", p, &a)) {
    lk.unlock();
    return free_error("cuMemFreeAsync", p);
  }
  auto s = resolve_stream_locked(h, c);
  if (!s) return fail(400, "cuMemFreeAsync: %p is not a stream", (void*)h);
  Op op;
  op.name = "cuMemFreeAsync";
  op.run = [a](char*, size_t) {
    std::lock_guard<std::mutex> lk2(g().mu);
    release_alloc_locked(a);
    return 0;
  };
  // The free is a write: it must be ordered after every other stream's use.
  int r = enqueue_locked(s, std::move(op), {{p, a->size, true}}, "cuMemFreeAsync");
  if (r) return r;
  a->live = false;  // from now on no call may enqueue work on it
  a->freed_by = "cuMemFreeAsync on " + s->label();
  count(C_FREES);
  return 0;
}

// ------------------------------------------------------- pinned host -------

static int host_alloc(void** pp, size_t bytes, const char* who) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!pp) return fail(1, "%s: pp is NULL", who);
  if (bytes == 0) return fail(1, "%s: 0 bytes requested", who);
  if (pinned_alloc(bytes, c, pp)) return fail(2, "%s: out of host memory (%zu bytes)", who, bytes);
  return 0;
}

CUEMU_API int cuMemAllocHost_v2(void** pp, size_t bytes) { return host_alloc(pp, bytes, "cuMemAllocHost_v2"); }
CUEMU_API int cuMemHostAlloc(void** pp, size_t bytes, unsigned flags) {
  if (flags & ~7u) return fail(1, "cuMemHostAlloc: unknown flags 0x%x", flags);
  return host_alloc(pp, bytes, "cuMemHostAlloc");
}

// Like the real one, waits for the device first (pending async copies may
// still use the buffer).
CUEMU_API int cuMemFreeHost(void* p) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!is_pinned(p, 1))
    return fail(1, "cuMemFreeHost(%p): not a pointer returned by cuMemHostAlloc/cuMemAllocHost (or freed twice)", p);
  int r;
  {
    std::unique_lock<std::mutex> lk(g().mu);
    r = sync_ctx_locked(lk, c);
  }
  if (!pinned_free(p))
    return fail(1, "cuMemFreeHost(%p): not a pointer returned by cuMemHostAlloc/cuMemAllocHost (or freed twice)", p);
  return r;
}

CUEMU_API int cuMemHostGetDevicePointer_v2(CUdeviceptr*, void* p, unsigned) {
  return fail(801, "cuMemHostGetDevicePointer(%p): mapped pinned memory is not emulated", p);
}

CUEMU_API int cuPointerGetAttribute(void* data, int attr, CUdeviceptr p) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!data) return 1;
  std::lock_guard<std::mutex> lk(g().mu);
  Alloc* a = find_alloc_locked(p);
  if (a && !a->live) a = nullptr;
  bool pinned = is_pinned((void*)p, 1);
  if (!a && !pinned) return 1;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned*)data = a ? 2 : 1; return 0;  // DEVICE : HOST
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = a ? a->ctx : c; return 0;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = a ? a->ctx->device : c->device; return 0;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = p; return 0;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      if (!a) return 1;
      *(CUdeviceptr*)data = a->start;
      return 0;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      if (!a) return 1;
      *(size_t*)data = a->size;
      return 0;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int*)data = 0; return 0;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long*)data = a ? a->serial : 0; return 0;
    default: return fail(801, "cuPointerGetAttribute: attribute %d is not emulated", attr);
  }
}
