// Pinned host memory, and the host-access check on it: a pinned buffer that
// a pending asynchronous copy writes (device to host) cannot be touched by
// the host, and one a pending copy reads (host to device) cannot be written,
// until the host has synchronized with that copy (stream, event or context).
//
// Each pinned buffer is a memfd mapped twice: the view the program gets, and
// an alias only the emulator's copies use. Arming a guard takes the program's
// view of the copy's pages away (PROT_NONE, or PROT_READ for a host-to-device
// source); a synchronization that orders the host after the copy gives them
// back. An access before that faults into the driver's SIGSEGV handler,
// which reports the copy, its stream and the buffer, gives the pages back so
// the access completes, and makes the error sticky in the buffer's context:
// the program's next CUDA call fails with it. A fault on a guarded page
// outside the copy's bytes (protection is per page) is not an error: that
// page stays accessible until the buffer's guards are released.
// CUEMU_HOSTCHECK=0 arms no guards.
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <set>

#include "driver.h"
#include "hostcheck.h"

namespace cuemu {

namespace {

struct HostGuard {
  uintptr_t lo, hi;      // the copy's bytes in the program's view
  bool device_writes;    // DtoH: no host access at all; HtoD: no host write
  int stream;
  uint64_t epoch;        // the copy's clock value on its stream
  std::string what;      // "cuMemcpyDtoHAsync_v2 on stream 3"
};

struct Pinned {
  size_t len = 0;
  char* alias = nullptr;
  CUctx_st* ctx = nullptr;
  std::vector<HostGuard> guards;
  std::set<uintptr_t> loose;  // pages given back after a fault outside a copy's bytes
};

// Its own lock: the SIGSEGV handler takes it on whatever thread faulted,
// and no code holding it touches the program's view of a pinned buffer.
std::mutex& mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<uintptr_t, Pinned>& bufs() {
  static auto* m = new std::map<uintptr_t, Pinned>;
  return *m;
}
std::atomic<bool> fault_pending{false};
CUctx_st* fault_ctx = nullptr;
std::string fault_msg;

bool hostcheck_on() {
  static bool on = [] {
    const char* e = getenv("CUEMU_HOSTCHECK");
    return !(e && strcmp(e, "0") == 0);
  }();
  return on;
}

size_t page() {
  static size_t p = (size_t)sysconf(_SC_PAGESIZE);
  return p;
}

// The buffer holding [p, p + n), or null.
std::map<uintptr_t, Pinned>::iterator find_locked(uintptr_t p, size_t n) {
  auto& m = bufs();
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p >= it->first && p + n <= it->first + it->second.len ? it : m.end();
}

// Each page's protection: the strictest guard covering it.
void protect_locked(uintptr_t base, Pinned& b) {
  for (uintptr_t pg = base; pg < base + b.len; pg += page()) {
    int prot = PROT_READ | PROT_WRITE;
    if (!b.loose.count(pg))
      for (auto& gd : b.guards)
        if (gd.lo < pg + page() && gd.hi > pg) prot &= gd.device_writes ? PROT_NONE : PROT_READ;
    mprotect((void*)pg, page(), prot);
  }
}

}  // namespace

int pinned_alloc(size_t bytes, CUctx_st* ctx, void** out) {
  size_t len = (bytes + page() - 1) / page() * page();
  int fd = memfd_create("cuemu-pinned", MFD_CLOEXEC);
  if (fd < 0) return 2;
  void* user = MAP_FAILED;
  void* alias = MAP_FAILED;
  if (ftruncate(fd, (off_t)len) == 0) {
    user = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    alias = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (user == MAP_FAILED || alias == MAP_FAILED) {
    if (user != MAP_FAILED) munmap(user, len);
    if (alias != MAP_FAILED) munmap(alias, len);
    return 2;
  }
  std::lock_guard<std::mutex> lk(mu());
  Pinned& b = bufs()[(uintptr_t)user];
  b.len = len;
  b.alias = (char*)alias;
  b.ctx = ctx;
  *out = user;
  return 0;
}

bool pinned_free(void* p) {
  std::lock_guard<std::mutex> lk(mu());
  auto it = bufs().find((uintptr_t)p);
  if (it == bufs().end()) return false;
  munmap(p, it->second.len);
  munmap(it->second.alias, it->second.len);
  bufs().erase(it);
  return true;
}

bool is_pinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu());
  return find_locked((uintptr_t)p, bytes) != bufs().end();
}

void* host_view(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu());
  auto it = find_locked((uintptr_t)p, bytes);
  if (it == bufs().end()) return (void*)p;
  return it->second.alias + ((uintptr_t)p - it->first);
}

void guard_host_copy(const void* p, size_t n, bool device_writes, const Stream& s, const std::string& call) {
  if (!hostcheck_on() || n == 0) return;
  std::lock_guard<std::mutex> lk(mu());
  auto it = find_locked((uintptr_t)p, n);
  if (it == bufs().end()) return;
  it->second.guards.push_back(HostGuard{(uintptr_t)p, (uintptr_t)p + n, device_writes, s.id, vc_get(s.clock, s.id),
                                        call + " on " + s.label()});
  protect_locked(it->first, it->second);
  count(C_HOST_GUARDS);
}

void release_host_guards_locked() {
  const VClock& host = g().host_clock;
  std::lock_guard<std::mutex> lk(mu());
  for (auto& [base, b] : bufs()) {
    if (b.guards.empty()) continue;
    size_t before = b.guards.size();
    for (size_t i = b.guards.size(); i-- > 0;)
      if (vc_get(host, b.guards[i].stream) >= b.guards[i].epoch) b.guards.erase(b.guards.begin() + i);
    if (b.guards.size() == before) continue;
    if (b.guards.empty()) b.loose.clear();
    protect_locked(base, b);
  }
}

// The report of a host access before its copy's stream was synchronized
// (out of line: its buffer is off the fault handler's stack until needed).
__attribute__((noinline)) static void report_host_race(uintptr_t addr, bool write, uintptr_t base, const Pinned& b,
                                                       const HostGuard& gd) {
  char msg[1024];
  snprintf(msg, sizeof msg,
           "host %s of pinned memory at 0x%lx (byte %zu of the %zu-byte pinned buffer at 0x%lx) before the host "
           "synchronized with %s, which %s [0x%lx, +%zu bytes) of it (synchronize the stream, an event recorded "
           "after the copy, or the context first)",
           write ? "write" : "read", (unsigned long)addr, (size_t)(addr - base), b.len, (unsigned long)base,
           gd.what.c_str(), gd.device_writes ? "writes" : "reads", (unsigned long)gd.lo, (size_t)(gd.hi - gd.lo));
  fprintf(stderr, "cuemu: error: %s\n", msg);
  if (!fault_pending.load()) {
    fault_ctx = b.ctx;
    fault_msg = msg;
    fault_pending.store(true);
  }
}

bool host_guard_fault(uintptr_t addr, bool write) {
  std::lock_guard<std::mutex> lk(mu());
  auto it = find_locked(addr, 1);
  if (it == bufs().end()) return false;
  Pinned& b = it->second;
  const uintptr_t pg = addr & ~(uintptr_t)(page() - 1);
  for (auto& gd : b.guards) {
    if (addr < gd.lo || addr >= gd.hi || (!gd.device_writes && !write)) continue;
    report_host_race(addr, write, it->first, b, gd);
    // Let the program go on to its next CUDA call, which reports the error.
    b.guards.clear();
    b.loose.clear();
    protect_locked(it->first, b);
    return true;
  }
  // A page shared with a guarded copy, outside its bytes.
  b.loose.insert(pg);
  mprotect((void*)pg, page(), PROT_READ | PROT_WRITE);
  return true;
}

void take_host_fault_locked() {
  if (!fault_pending.load(std::memory_order_relaxed)) return;
  CUctx_st* ctx;
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(mu());
    ctx = fault_ctx;
    msg = fault_msg;
    fault_pending.store(false);
  }
  // CUDA_ERROR_ILLEGAL_STATE: like a stream-order race, the program's order
  // is wrong, and nothing after it can be trusted.
  set_sticky_locked(ctx, 401, msg);
}

}  // namespace cuemu
