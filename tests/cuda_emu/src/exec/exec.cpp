// The block executor: runs a grid's blocks in order on the calling (stream
// worker) thread, each block's CUDA threads as fibers, and checks the rules
// the GPU leaves undefined, stricter than the hardware (the rules of
// __syncthreads, the warp-level operations and deadlock: sync.cpp):
//
//  * assert / __trap: CUDA_ERROR_ASSERT (710).
//  * Memory faults: the driver's SIGSEGV handler calls cuemu_exec_fault with
//    its own code (700), which siglongjmps back here.
//
// Scheduling: a fiber runs CUDA threads one after another (thread t, then the
// next not yet started one, ...) until the thread it runs blocks (barrier,
// shuffle); then the scheduler starts a new fiber for the next thread, and
// resumes blocked threads once whatever they wait for is complete. An
// elementwise kernel thus runs all threads of a block on one fiber with no
// context switch at all. Stacks (CUEMU_STACK_KB, default 64 KiB, each with a
// guard page below) are allocated once per OS thread and reused.
#include "exec_internal.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <unordered_map>

extern "C" void cuemu_fiber_start(void);

namespace cuemu_exec {

// The executor state of this OS thread. initial-exec: one pointer of static
// TLS, readable from the SIGSEGV handler without allocating, and the fast path
// of cuemu_thread().
__thread Worker* tls_w __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

thread_local std::unique_ptr<Worker> tls_owner;

Worker* worker() {
  if (!tls_w) {
    tls_owner.reset(new Worker());
    tls_w = tls_owner.get();
    size_t kb = 64;
    if (const char* e = getenv("CUEMU_STACK_KB")) {
      long v = atol(e);
      if (v >= 16 && v <= 65536) kb = (size_t)v;
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    tls_w->stack_bytes = (kb * 1024 + page - 1) / page * page;
    tls_w->slot_bytes = tls_w->stack_bytes + page;  // guard page at the bottom of each slot
    void* p = mmap(nullptr, tls_w->slot_bytes * kMaxThreads, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    tls_w->stack_region = p == MAP_FAILED ? nullptr : (char*)p;
  }
  return tls_w;
}

}  // namespace

void fmt_where(const Worker* w, int t, char* buf, size_t len) {
  const cuemu_thread_ctx& c = w->ctx[t];
  snprintf(buf, len, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", w->k ? w->k->name : "?", w->block_idx.x,
           w->block_idx.y, w->block_idx.z, c.thread_idx.x, c.thread_idx.y, c.thread_idx.z);
}

void set_error(Worker* w, int code, const char* fmt, ...) {
  if (w->error) return;  // keep the first
  w->error = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->message, sizeof w->message, fmt, ap);
  va_end(ap);
}

// Leaves the current fiber for good after an error: back to the scheduler.
[[noreturn]] void abandon_fiber(Worker* w) {
  void* dummy;
  cuemu_fiber_switch(&dummy, w->sched_sp);
  __builtin_unreachable();
}

namespace {

void thread_finished(Worker* w, int t) {
  w->th[t].state = T_DONE;
  w->warp_done[t / 32] |= 1u << (t % 32);
  w->ndone++;
  if (__builtin_expect(w->prof != nullptr, 0)) prof_thread_done(w, t);
}

void fiber_main(Worker* w, long stack_slot) {
  for (;;) {
    const int t = w->next_unstarted;
    if (t >= w->nthreads) break;
    w->next_unstarted = t + 1;
    w->cur = t;
    cuemu_thread_ctx* c = &w->ctx[t];
    c->block_idx = w->block_idx;
    w->cur_ctx = c;
    w->th[t].state = T_RUNNING;
    w->k->entry(w->args);
    thread_finished(w, t);
  }
  w->free_stacks[w->nfree++] = (int)stack_slot;
  abandon_fiber(w);
}

// A fresh context on stack slot `s` that starts in fiber_main(w, s).
void* new_fiber(Worker* w, int s) {
  char* base = w->stack_region + (size_t)s * w->slot_bytes;
  const size_t page = w->slot_bytes - w->stack_bytes;
  if (!w->stack_ready[s]) {
    if (mprotect(base + page, w->stack_bytes, PROT_READ | PROT_WRITE) != 0) return nullptr;
    w->stack_ready[s] = true;
  }
  uint64_t* top = (uint64_t*)(base + w->slot_bytes);  // 16-aligned
  uint64_t* sp = top - 8;
  uint32_t mx;
  __asm__ volatile("stmxcsr %0" : "=m"(mx));
  uint16_t cw;
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  sp[0] = (uint64_t)mx | ((uint64_t)cw << 32);
  sp[1] = 0;                          // r15
  sp[2] = 0;                          // r14
  sp[3] = (uint64_t)s;                // r13 -> rsi
  sp[4] = (uint64_t)w;                // r12 -> rdi
  sp[5] = (uint64_t)&fiber_main;      // rbx -> called
  sp[6] = 0;                          // rbp
  sp[7] = (uint64_t)&cuemu_fiber_start;
  return sp;
}

int take_stack(Worker* w) {
  if (w->nfree > 0) return w->free_stacks[--w->nfree];
  if (w->stacks_used < kMaxThreads) return w->stacks_used++;
  return -1;
}

// Runs one block to completion or error.
void run_block(Worker* w) {
  w->next_unstarted = 0;
  w->ndone = 0;
  w->nbar = 0;
  w->nwarp_wait = 0;
  memset(w->warp_waiting, 0, sizeof w->warp_waiting);
  memset(w->warp_done, 0, sizeof w->warp_done);
  w->rq_head = w->rq_tail = w->rq_len = 0;
  w->nfree = 0;
  w->stacks_used = 0;
  if (w->mod && w->mod->shared_begin && w->mod->shared_end > w->mod->shared_begin)
    memset(w->mod->shared_begin, 0xff, (size_t)(w->mod->shared_end - w->mod->shared_begin));
  shared_block_start(w);
  for (int t = 0; t < w->nthreads; t++) w->th[t].state = T_UNSTARTED;
  for (;;) {
    if (w->rq_len > 0) {
      const int t = w->runq[w->rq_head];
      w->rq_head = (w->rq_head + 1) % kMaxThreads;
      w->rq_len--;
      w->cur = t;
      w->cur_ctx = &w->ctx[t];
      w->th[t].state = T_RUNNING;
      cuemu_fiber_switch(&w->sched_sp, w->th[t].sp);
    } else if (w->next_unstarted < w->nthreads) {
      const int s = take_stack(w);
      void* sp = s < 0 ? nullptr : new_fiber(w, s);
      if (!sp) {
        set_error(w, kErrLaunch, "kernel %s: cannot allocate a fiber stack (%s)", w->k->name, strerror(errno));
        return;
      }
      cuemu_fiber_switch(&w->sched_sp, sp);
    } else if (w->ndone == w->nthreads) {
      shared_barrier(w, true);
      return;
    } else {
      if (!resolve_stall(w)) return;
    }
    if (w->error) return;
  }
}

std::mutex g_mod_mu;
std::unordered_map<const void*, std::mutex*>* g_mod_locks;

std::mutex* module_lock(const void* key) {
  std::lock_guard<std::mutex> g(g_mod_mu);
  if (!g_mod_locks) g_mod_locks = new std::unordered_map<const void*, std::mutex*>();
  auto& m = (*g_mod_locks)[key];
  if (!m) m = new std::mutex();
  return m;
}

// The part of a launch between sigsetjmp and the end; no objects with
// destructors live here (a fault siglongjmps over it).
__attribute__((noinline)) void run_grid(Worker* w) {
  for (uint32_t z = 0; z < w->grid.z && !w->error; z++)
    for (uint32_t y = 0; y < w->grid.y && !w->error; y++)
      for (uint32_t x = 0; x < w->grid.x && !w->error; x++) {
        w->block_idx = cuemu_dim3{x, y, z};
        run_block(w);
      }
}

}  // namespace
}  // namespace cuemu_exec

using namespace cuemu_exec;

// ------------------------------------------------------------ kernel ABI ---

CUEMU_EXPORT const cuemu_thread_ctx* cuemu_thread(void) { return tls_w->cur_ctx; }

CUEMU_EXPORT void cuemu_trap(const char* what, const char* file, int line) {
  Worker* w = tls_w;
  if (!w || !w->in_kernel || w->cur < 0) {
    fprintf(stderr, "cuemu: %s at %s:%d outside a kernel\n", what, file, line);
    abort();
  }
  char where[160];
  fmt_where(w, w->cur, where, sizeof where);
  set_error(w, kErrAssert, "%s: %s at %s:%d", where, what, file, line);
  abandon_fiber(w);
}

// ----------------------------------------------------------- driver side ---

CUEMU_EXPORT void cuemu_exec_grid(const cuemu_module_info* module, const cuemu_kernel_desc* k, cuemu_dim3 grid,
                                  cuemu_dim3 block, size_t dynamic_smem, void* const* args, cuemu_exec_result* out) {
  (void)dynamic_smem;  // `extern __shared__` is not emulated (see cuemu_device.h)
  out->ok = 1;
  out->cuda_error = 0;
  out->message[0] = 0;
  const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
  if (!k || !k->entry || nthreads == 0 || nthreads > (unsigned long long)kMaxThreads || grid.x == 0 || grid.y == 0 ||
      grid.z == 0) {
    out->ok = 0;
    out->cuda_error = kErrInvalidValue;
    snprintf(out->message, sizeof out->message, "kernel %s: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u)",
             k && k->name ? k->name : "?", grid.x, grid.y, grid.z, block.x, block.y, block.z);
    return;
  }
  Worker* w = worker();
  if (!w->stack_region) {
    out->ok = 0;
    out->cuda_error = 2;  // CUDA_ERROR_OUT_OF_MEMORY
    snprintf(out->message, sizeof out->message, "kernel %s: cannot reserve fiber stacks", k->name);
    return;
  }
  std::mutex* lock = module_lock(module ? (const void*)module : (const void*)k);
  lock->lock();
  w->k = k;
  w->mod = module;
  shared_launch(w, module);
  prof_launch_start(w);
  w->args = args;
  w->grid = grid;
  w->block = block;
  w->nthreads = (int)nthreads;
  w->error = 0;
  w->message[0] = 0;
  w->cur = -1;
  for (int t = 0; t < w->nthreads; t++) {
    cuemu_thread_ctx& c = w->ctx[t];
    c.thread_idx = cuemu_dim3{(uint32_t)(t % block.x), (uint32_t)((t / block.x) % block.y),
                              (uint32_t)(t / (block.x * block.y))};
    c.block_dim = block;
    c.grid_dim = grid;
    c.lane = (uint32_t)(t % 32);
    c.linear_tid = (uint32_t)t;
  }
  __asm__ volatile("stmxcsr %0" : "=m"(w->saved_mxcsr));
  w->in_kernel = 1;
  if (sigsetjmp(w->jb, 1) == 0) {
    run_grid(w);
  }
  // normal end, or back from cuemu_exec_fault
  w->in_kernel = 0;
  w->cur = -1;
  w->cur_ctx = nullptr;
  __asm__ volatile("ldmxcsr %0" : : "m"(w->saved_mxcsr));
  if (__builtin_expect(w->prof != nullptr, 0)) prof_launch_end(w);
  lock->unlock();
  if (w->error) {
    out->ok = 0;
    out->cuda_error = w->error;
    snprintf(out->message, sizeof out->message, "%s", w->message);
  }
}

CUEMU_EXPORT int cuemu_exec_in_kernel(void) {
  Worker* w = tls_w;
  return w && w->in_kernel;
}

CUEMU_EXPORT void cuemu_exec_fault(const char* message, int cuda_error) {
  Worker* w = tls_w;
  if (!w || !w->in_kernel) {
    static const char m[] = "cuemu: cuemu_exec_fault outside a kernel\n";
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    abort();
  }
  // async-signal-safe copy (no stdio)
  const char* m = message ? message : "memory fault in kernel";
  size_t i = 0;
  for (; m[i] && i + 1 < sizeof w->message; i++) w->message[i] = m[i];
  w->message[i] = 0;
  w->error = cuda_error ? cuda_error : 700;
  siglongjmp(w->jb, 1);
}

CUEMU_EXPORT void cuemu_exec_where(char* buf, size_t len) {
  if (!len) return;
  Worker* w = tls_w;
  if (!w || !w->in_kernel || w->cur < 0) {
    snprintf(buf, len, "outside a kernel");
    return;
  }
  fmt_where(w, w->cur, buf, len);
}
