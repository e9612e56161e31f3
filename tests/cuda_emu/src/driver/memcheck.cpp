// Exact-byte bounds (memcheck) and uninitialized reads (initcheck) of device
// memory by kernel code.
//
// The emulated NVRTC compiles kernels with GCC's ThreadSanitizer
// instrumentation (every load, store and atomic of kernel code calls an
// entry point first, reads and writes told apart); the module itself defines
// those entry points (include/device/cuemu_checks.h) and sends accesses to
// device memory here. Device memory lives in one reserved region
// (memory.cpp), and a shadow region maps every byte of it to one state byte:
//
//   SH_NONE   not addressable: guard pages, the slack after an allocation's
//             end up to its page boundary, freed memory;
//   SH_UNINIT inside a live allocation, never written;
//   SH_INIT   written by a copy, memset, library operation or kernel.
//
// A kernel touching a SH_NONE byte ends its launch with
// CUDA_ERROR_ILLEGAL_ADDRESS naming the kernel, block, thread, allocation and
// byte offset; reading a SH_UNINIT byte ends it with CUDA_ERROR_LAUNCH_FAILED
// naming the kernel and allocation.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "driver.h"
#include "memcheck.h"

namespace cuemu {

uintptr_t sh_base = 0;
size_t sh_len = 0;
uint8_t* sh_map = nullptr;
bool memcheck_on = true;
bool initcheck_on = true;

// Per OS thread (kernels run on stream workers); flushed into the process
// counters after each launch, so the hot path never touches an atomic.
__thread long long tls_bounds_checks __attribute__((tls_model("initial-exec"))) = 0;
__thread long long tls_init_checks __attribute__((tls_model("initial-exec"))) = 0;

static bool env_on(const char* name) {
  const char* e = getenv(name);
  return !(e && strcmp(e, "0") == 0);
}

bool reserve_device_region() {
  static bool ok = [] {
    memcheck_on = env_on("CUEMU_MEMCHECK");
    initcheck_on = env_on("CUEMU_INITCHECK");
    // Allocations are never reused (quarantine), so the region is the
    // process's lifetime total. Address space only: nothing is committed
    // until an allocation makes its pages accessible.
    for (int bits = 44; bits >= 36; bits -= 2) {
      size_t len = (size_t)1 << bits;
      void* d = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (d == MAP_FAILED) continue;
      // One extra page: an access of up to 16 bytes starting in the last
      // page of the region reads its shadow without a bounds test.
      void* s = mmap(nullptr, len + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (s == MAP_FAILED) {
        munmap(d, len);
        continue;
      }
      sh_base = (uintptr_t)d;
      sh_len = len;
      sh_map = (uint8_t*)s;
      return true;
    }
    return false;
  }();
  return ok;
}

void shadow_set(uintptr_t p, size_t n, uint8_t state) {
  if (n == 0 || p - sh_base >= sh_len) return;
  memset(sh_map + (p - sh_base), state, n);
}

void shadow_drop(uintptr_t p, size_t n) {
  if (p - sh_base >= sh_len) return;
  // Page-aligned (allocations are): the pages go back to the kernel and read
  // as zero, SH_NONE.
  madvise(sh_map + (p - sh_base), n, MADV_DONTNEED);
}

void flush_check_counters() {
  count(C_BOUNDS_CHECKS, tls_bounds_checks);
  count(C_INIT_CHECKS, tls_init_checks);
  tls_bounds_checks = 0;
  tls_init_checks = 0;
}

// Slow path: the bad byte at `bad` of an access [a, a+n). Does not return.
[[noreturn]] static void report(uintptr_t a, size_t n, bool write, uintptr_t bad, bool uninit) {
  char where[256], msg[1024];
  cuemu_exec_where(where, sizeof where);
  std::string what;
  {
    std::lock_guard<std::mutex> lk(g().mu);
    Alloc* al = find_alloc_locked(bad);
    if (!al) al = find_mapping_locked(bad);
    char buf[512];
    if (!al) {
      snprintf(buf, sizeof buf, "0x%lx is not in any allocation", (unsigned long)a);
    } else {
      const long long off = (long long)a - (long long)al->start;
      char rel[96] = "";
      if (!al->live)
        snprintf(rel, sizeof rel, "use after free: freed by %s", al->freed_by.c_str());
      else if (bad >= al->start + al->size)
        snprintf(rel, sizeof rel, "%zu bytes past its end", (size_t)(bad - al->start - al->size));
      else if (bad < al->start)
        snprintf(rel, sizeof rel, "%zu bytes before its start", (size_t)(al->start - bad));
      else
        snprintf(rel, sizeof rel, "never written by a copy, memset or kernel");
      snprintf(buf, sizeof buf, "byte offset %lld of allocation #%llu at 0x%lx (%zu bytes, %s): %s", off,
               (unsigned long long)al->serial, (unsigned long)al->start, al->size, al->allocated_by.c_str(), rel);
    }
    what = buf;
  }
  snprintf(msg, sizeof msg, "%s global %s of %zu bytes at 0x%lx in %s: %s", uninit ? "uninitialized" : "invalid",
           write ? "write" : "read", n, (unsigned long)a, where, what.c_str());
  cuemu_exec_fault(msg, uninit ? 719 : 700);
  __builtin_unreachable();
}

// Whether the n shadow bytes at s are all SH_INIT, for the access sizes
// kernel code makes, a word at a time: nearly every access is to written
// memory, and a byte loop there was a sixth of an emulated training step.
static inline bool all_written(const uint8_t* s, size_t n) {
  constexpr uint64_t kInit = 0x0101010101010101ull * SH_INIT;
  uint64_t w[2] = {0, 0};
  switch (n) {
    case 1: return s[0] == SH_INIT;
    case 2: memcpy(w, s, 2); return w[0] == (kInit & 0xffff);
    case 4: memcpy(w, s, 4); return w[0] == (kInit & 0xffffffff);
    case 8: memcpy(w, s, 8); return w[0] == kInit;
    case 16: memcpy(w, s, 16); return w[0] == kInit && w[1] == kInit;
    default: return false;
  }
}

static inline void device_access(uintptr_t a, size_t n, bool write) {
  uint8_t* s = sh_map + (a - sh_base);
  tls_bounds_checks++;
  // Written bytes: nothing to report, and a write leaves them as they are.
  if (__builtin_expect(all_written(s, n), 1)) {
    if (!write && initcheck_on) tls_init_checks++;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (s[i] == SH_INIT) continue;
    if (s[i] == SH_NONE) {
      if (memcheck_on) report(a, n, write, a + i, false);
      continue;
    }
    if (!write && initcheck_on) report(a, n, write, a + i, true);
  }
  if (write) {
    for (size_t i = 0; i < n; i++)
      if (s[i] != SH_NONE) s[i] = SH_INIT;
  } else if (initcheck_on) {
    tls_init_checks++;
  }
}

}  // namespace cuemu

using namespace cuemu;

CUEMU_API void cuemu_device_region(uintptr_t* base, size_t* len) {
  reserve_device_region();
  *base = sh_base;
  *len = sh_len;
}

CUEMU_API void cuemu_check_device(uintptr_t a, size_t n, int write) {
  if (n > 0 && a + n - sh_base <= sh_len) device_access(a, n, write != 0);
}

CUEMU_API void cuemu_check_shared(uintptr_t a, size_t n, int write) { cuemu_exec_shared_access(a, n, write != 0); }
