// Shared-memory race detection (racecheck) and reads of shared bytes the
// block never wrote. Kernel loads and stores reach here through the
// instrumentation entry points (src/driver/memcheck.cpp) when they fall in
// the running module's __shared__ variables.
//
// Every shared byte keeps its last write and up to two reads of the current
// barrier interval: the thread, the block-wide epoch (bumped at the block's
// start and at every completed __syncthreads) and the thread's count of
// completed __syncwarp. Two accesses of one byte by different threads, one a
// write, in the same epoch race, unless both are lanes of one warp and a
// __syncwarp both took part in lies between them. The executor runs a warp's
// lanes one after another, not in lockstep, so code that relies on the
// warp-synchronous assumption would compute something else here and on Volta
// and later GPUs alike: it is reported as a race, not silently miscomputed.
//
// A read of a byte no thread of the block has written yet is only noted: if
// another thread writes it in the same epoch, that write reports the race
// (naming both threads); if nobody does before the next barrier or the
// block's end, the read is reported as uninitialized. CUEMU_SHAREDCHECK=0
// turns all of this off.
#include "exec_internal.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace cuemu_exec {

namespace {

constexpr uint16_t kNoThread = 0xffff;

std::mutex g_shadow_mu;
std::unordered_map<const void*, SharedShadow*>* g_shadows;

bool sharedcheck_on() {
  static bool on = [] {
    const char* e = getenv("CUEMU_SHAREDCHECK");
    return !(e && strcmp(e, "0") == 0);
  }();
  return on;
}

// The symbol of the ELF object `path` (loaded at `base`) whose storage holds
// `addr`: the __shared__ variables are local symbols, in .symtab only.
bool symbol_at(const char* path, uintptr_t base, uintptr_t addr, std::string* name, uintptr_t* start) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool found = false;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(Elf64_Ehdr)) {
    void* m = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      const char* f = (const char*)m;
      const Elf64_Ehdr* eh = (const Elf64_Ehdr*)f;
      const Elf64_Shdr* sh = (const Elf64_Shdr*)(f + eh->e_shoff);
      for (int i = 0; i < eh->e_shnum && !found; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const Elf64_Sym* sym = (const Elf64_Sym*)(f + sh[i].sh_offset);
        const char* strtab = f + sh[sh[i].sh_link].sh_offset;
        const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t j = 0; j < n; j++) {
          if (ELF64_ST_TYPE(sym[j].st_info) != STT_OBJECT) continue;
          const uintptr_t lo = base + sym[j].st_value;
          if (addr < lo || addr >= lo + (sym[j].st_size ? sym[j].st_size : 1)) continue;
          const char* raw = strtab + sym[j].st_name;
          int status = 0;
          char* dem = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
          *name = status == 0 && dem ? dem : raw;
          free(dem);
          *start = lo;
          found = true;
          break;
        }
      }
      munmap(m, st.st_size);
    }
  }
  close(fd);
  return found;
}

// "`reduce::partial` + 12" or, without symbols, the module's shared offset.
void shared_location(const Worker* w, uintptr_t a, char* buf, size_t len) {
  Dl_info info;
  std::string name;
  uintptr_t start = 0;
  if (dladdr((void*)a, &info) && info.dli_fname &&
      symbol_at(info.dli_fname, (uintptr_t)info.dli_fbase, a, &name, &start)) {
    snprintf(buf, len, "__shared__ %s + %zu bytes", name.c_str(), (size_t)(a - start));
    return;
  }
  snprintf(buf, len, "__shared__ byte %zu of module %s", (size_t)(a - (uintptr_t)w->mod->shared_begin),
           w->mod->source_name ? w->mod->source_name : "?");
}

void thread_name(const Worker* w, int t, char* buf, size_t len) {
  const cuemu_thread_ctx& c = w->ctx[t];
  snprintf(buf, len, "thread (%u,%u,%u)", c.thread_idx.x, c.thread_idx.y, c.thread_idx.z);
}

bool same_warp(int a, int b) { return a / 32 == b / 32; }

// Is an access by `before` (with its __syncwarp count then) ordered before
// thread `now`'s access in the same epoch?
bool warp_ordered(const Worker* w, int before, uint32_t before_wsync, int now) {
  return same_warp(before, now) && w->wsync[now] > before_wsync;
}

[[noreturn]] void race(Worker* w, uintptr_t a, bool write, int other, bool other_write) {
  char loc[320], me[48], them[48];
  shared_location(w, a, loc, sizeof loc);
  thread_name(w, w->cur, me, sizeof me);
  thread_name(w, other, them, sizeof them);
  set_error(w, kErrLaunch,
            "shared-memory race in kernel %s, block (%u,%u,%u): %s %s %s, which %s %s with no __syncthreads between "
            "them%s",
            w->k->name, w->block_idx.x, w->block_idx.y, w->block_idx.z, me, write ? "writes" : "reads", loc, them,
            other_write ? "wrote" : "read",
            same_warp(w->cur, other) ? " (lanes of one warp: they are not in lockstep; a __syncwarp orders them)" : "");
  abandon_fiber(w);
}

}  // namespace

void shared_block_start(Worker* w) {
  w->shared_pending = false;
  for (int t = 0; t < w->nthreads; t++) w->wsync[t] = 0;
  SharedShadow* ss = w->ss;
  if (!ss) return;
  if (ss->epoch > 0xf0000000u) {  // never in practice; the cells would compare wrong after a wrap
    for (auto& c : ss->cells) c = ShCell();
    ss->epoch = 0;
  }
  w->block_epoch = ++ss->epoch;
}

bool shared_barrier(Worker* w, bool block_end) {
  if (w->shared_pending) {
    const PendingRead& p = w->pending;
    char loc[320], me[48], where[160];
    shared_location(w, p.addr, loc, sizeof loc);
    thread_name(w, p.thread, me, sizeof me);
    snprintf(where, sizeof where, "%s", block_end ? "the block's end" : "the next __syncthreads");
    set_error(w, kErrLaunch,
              "uninitialized shared read in kernel %s, block (%u,%u,%u): %s reads %s, which no thread of the block "
              "had written (nor did any before %s)",
              w->k->name, w->block_idx.x, w->block_idx.y, w->block_idx.z, me, loc, where);
    return false;
  }
  if (w->ss) w->ss->epoch++;
  return true;
}

void shared_warp_synced(Worker* w, int t) { w->wsync[t]++; }

void shared_launch(Worker* w, const cuemu_module_info* mod) {
  w->ss = nullptr;
  w->sh_begin = w->sh_end = 0;
  if (!sharedcheck_on() || !mod || !mod->shared_begin || mod->shared_end <= mod->shared_begin) return;
  std::lock_guard<std::mutex> lk(g_shadow_mu);
  if (!g_shadows) g_shadows = new std::unordered_map<const void*, SharedShadow*>();
  SharedShadow*& ss = (*g_shadows)[mod];
  if (!ss) {
    ss = new SharedShadow();
    ss->cells.resize((size_t)(mod->shared_end - mod->shared_begin));
  }
  w->ss = ss;
  w->sh_begin = (uintptr_t)mod->shared_begin;
  w->sh_end = (uintptr_t)mod->shared_end;
}

}  // namespace cuemu_exec

using namespace cuemu_exec;

CUEMU_EXPORT void cuemu_exec_shared_access(uintptr_t a, size_t n, bool write) {
  Worker* w = tls_w;
  if (!w || a - w->sh_begin >= w->sh_end - w->sh_begin) return;
  if (a + n > w->sh_end) n = w->sh_end - a;
  w->shared_checks++;
  const int t = w->cur;
  const uint32_t e = w->ss->epoch;
  ShCell* cells = w->ss->cells.data() + (a - w->sh_begin);
  for (size_t i = 0; i < n; i++) {
    ShCell& c = cells[i];
    if (c.w_epoch == e && c.w_tid != t && !warp_ordered(w, c.w_tid, c.w_wsync, t))
      race(w, a + i, write, c.w_tid, true);
    if (write) {
      if (c.r_epoch == e) {
        if (c.r1 != t && !warp_ordered(w, c.r1, c.r1_wsync, t)) race(w, a + i, true, c.r1, false);
        if (c.r2 != kNoThread && c.r2 != t && !warp_ordered(w, c.r2, c.r2_wsync, t)) race(w, a + i, true, c.r2, false);
      }
      c.w_epoch = e;
      c.w_tid = (uint16_t)t;
      c.w_wsync = w->wsync[t];
      continue;
    }
    if (c.w_epoch < w->block_epoch && !w->shared_pending) {
      w->shared_pending = true;
      w->pending = PendingRead{a + i, t};
    }
    if (c.r_epoch != e) {
      c.r_epoch = e;
      c.r1 = (uint16_t)t;
      c.r1_wsync = w->wsync[t];
      c.r2 = kNoThread;
    } else if (c.r1 == t) {
      c.r1_wsync = w->wsync[t];
    } else {
      c.r2 = (uint16_t)t;
      c.r2_wsync = w->wsync[t];
    }
  }
}

CUEMU_EXPORT long long cuemu_exec_take_shared_checks(void) {
  Worker* w = tls_w;
  if (!w) return 0;
  long long n = w->shared_checks;
  w->shared_checks = 0;
  return n;
}
