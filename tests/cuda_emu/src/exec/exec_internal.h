// What the block executor's files share: the per-OS-thread Worker with its
// CUDA threads, and the error path. exec.cpp runs the fibers, sync.cpp the
// barriers and warp-level operations.
#pragma once
#include "cuemu/internal.h"
#include "profile.h"

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include <vector>

#define CUEMU_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" void cuemu_fiber_switch(void** save_sp, void* new_sp);

namespace cuemu_exec {

constexpr int kMaxThreads = 1024;
constexpr int kErrLaunch = 719;  // CUDA_ERROR_LAUNCH_FAILED: barrier/shuffle misuse, deadlock
constexpr int kErrAssert = 710;  // CUDA_ERROR_ASSERT: assert, __trap
constexpr int kErrInvalidValue = 1;

enum State : uint8_t { T_UNSTARTED, T_RUNNING, T_RUNNABLE, T_BAR, T_WARP, T_DONE };

// kind 0..3: shuffles (idx, up, down, xor); 4: __syncwarp.
struct Thread {
  void* sp;
  uint8_t state;
  uint8_t kind;
  uint8_t bytes;
  int line;
  const char* file;
  uint32_t mask;
  int lane_arg;
  int width;
  uint64_t value;
  uint64_t result;
};

// The shared-memory race checker's record of one shared byte (sharedcheck.cpp).
struct ShCell {
  uint32_t w_epoch = 0, r_epoch = 0;          // 0: never
  uint32_t w_wsync = 0, r1_wsync = 0, r2_wsync = 0;
  uint16_t w_tid = 0, r1 = 0, r2 = 0;
};
// Per module: one block of a module runs at a time (the module lock).
struct SharedShadow {
  std::vector<ShCell> cells;  // one per byte of the module's __shared__ variables
  uint32_t epoch = 0;         // bumped at each block start and completed __syncthreads
};
struct PendingRead {
  uintptr_t addr;
  int thread;
};

struct Worker {
  // ---- hot state
  cuemu_thread_ctx* cur_ctx = nullptr;
  int cur = -1;
  void* sched_sp = nullptr;
  int in_kernel = 0;
  // ---- launch
  const cuemu_kernel_desc* k = nullptr;
  const cuemu_module_info* mod = nullptr;
  void* const* args = nullptr;
  cuemu_dim3 grid{}, block{}, block_idx{};
  int nthreads = 0;
  int next_unstarted = 0;
  int ndone = 0;
  int nbar = 0;
  int nwarp_wait = 0;
  // Per warp, the lanes waiting at a shuffle or __syncwarp (T_WARP) and the
  // lanes that exited (T_DONE): a warp operation reads who is there in O(1).
  uint32_t warp_waiting[kMaxThreads / 32] = {};
  uint32_t warp_done[kMaxThreads / 32] = {};
  int runq[kMaxThreads];
  int rq_head = 0, rq_tail = 0, rq_len = 0;
  // ---- error
  int error = 0;  // CUresult, 0 = none
  char message[1024];
  sigjmp_buf jb;
  uint32_t saved_mxcsr = 0x1f80;
  // ---- stacks
  char* stack_region = nullptr;
  size_t stack_bytes = 0, slot_bytes = 0;
  bool stack_ready[kMaxThreads] = {};
  int free_stacks[kMaxThreads];
  int nfree = 0;
  int stacks_used = 0;  // high-water mark of slots handed out this block
  // ---- threads
  cuemu_thread_ctx ctx[kMaxThreads];
  Thread th[kMaxThreads];
  // ---- shared-memory race checker
  SharedShadow* ss = nullptr;            // null: not checked
  uintptr_t sh_begin = 0, sh_end = 0;
  uint32_t block_epoch = 0;              // the epoch the running block started in
  uint32_t wsync[kMaxThreads];           // __syncwarp each thread completed this block
  bool shared_pending = false;           // a read of a byte the block had not written
  PendingRead pending{};
  long long shared_checks = 0;
  // ---- profiler (null unless CUEMU_PROFILE is set)
  LaunchProf* prof = nullptr;
};
static_assert(kMaxThreads == kProfMaxThreads, "one profile lane per CUDA thread");

extern __thread Worker* tls_w __attribute__((tls_model("initial-exec")));

void fmt_where(const Worker* w, int t, char* buf, size_t len);
void set_error(Worker* w, int code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
[[noreturn]] void abandon_fiber(Worker* w);
bool resolve_stall(Worker* w);

// The shared-memory race checker's hooks (sharedcheck.cpp).
void shared_launch(Worker* w, const cuemu_module_info* mod);
void shared_block_start(Worker* w);
// At a completed __syncthreads or the block's end: false (error set) when a
// read of never-written shared memory is pending.
bool shared_barrier(Worker* w, bool block_end);
void shared_warp_synced(Worker* w, int t);

// The profiler's hooks (profile.cpp): a launch starts; thread t exited;
// the launch ended (profile_blocks.cpp: its arithmetic), before the module
// lock is released.
void prof_launch_start(Worker* w);
void prof_thread_done(Worker* w, int t);
void prof_launch_end(Worker* w);
// The launch's block counters (profile_blocks.cpp), from prof_launch_start.
void prof_blocks_start(Worker* w);

}  // namespace cuemu_exec
