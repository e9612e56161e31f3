// The block executor's barriers and warp-level operations (exec.cpp runs
// the fibers), stricter than the hardware:
//
//  * __syncthreads: every thread of the block must reach the SAME barrier
//    (same file:line). A thread that exits while others wait, or threads
//    waiting at barriers on different lines, end the launch with
//    CUDA_ERROR_LAUNCH_FAILED (719).
//  * __shfl*_sync / __syncwarp(mask): every lane of `mask` must reach the same
//    intrinsic (kind, line, mask, width); the calling lane must be in mask; a
//    source lane that is not in mask is an error; lanes of the mask that do
//    not exist (partial last warp) are an error. Also 719.
//  * Deadlock (no runnable thread, some not finished): 719.
#include "exec_internal.h"

#include <stdio.h>
#include <string.h>

namespace cuemu_exec {

namespace {

const char* kind_name(int kind) {
  switch (kind) {
    case 0: return "__shfl_sync";
    case 1: return "__shfl_up_sync";
    case 2: return "__shfl_down_sync";
    case 3: return "__shfl_xor_sync";
    default: return "__syncwarp";
  }
}

const char* thread_str(const Worker* w, int t, char* buf, size_t len) {
  const cuemu_thread_ctx& c = w->ctx[t];
  snprintf(buf, len, "(%u,%u,%u)", c.thread_idx.x, c.thread_idx.y, c.thread_idx.z);
  return buf;
}

// Blocks the running thread until the scheduler resumes it.
inline void block_current(Worker* w) {
  const int t = w->cur;
  cuemu_fiber_switch(&w->th[t].sp, w->sched_sp);
  // resumed: the scheduler has set w->cur and w->cur_ctx
}

void runq_push(Worker* w, int t) {
  w->th[t].state = T_RUNNABLE;
  w->runq[w->rq_tail] = t;
  w->rq_tail = (w->rq_tail + 1) % kMaxThreads;
  w->rq_len++;
}

// Describes what thread t is doing, for messages.
void describe_state(const Worker* w, int t, char* buf, size_t len) {
  char tb[48];
  thread_str(w, t, tb, sizeof tb);
  const Thread& h = w->th[t];
  switch (h.state) {
    case T_DONE: snprintf(buf, len, "thread %s exited", tb); break;
    case T_BAR: snprintf(buf, len, "thread %s waits at __syncthreads at %s:%d", tb, h.file, h.line); break;
    case T_WARP:
      snprintf(buf, len, "thread %s waits at %s(mask 0x%08x) at %s:%d", tb, kind_name(h.kind), h.mask, h.file, h.line);
      break;
    default: snprintf(buf, len, "thread %s has not reached it", tb); break;
  }
}

}  // namespace

// Called when no thread can run and not all are done: releases a complete
// barrier, or reports why the block cannot go on. Returns false on error.
bool resolve_stall(Worker* w) {
  char where[160], other[200];
  const int n = w->nthreads;
  if (w->nwarp_wait > 0) {
    // Some warp-level operation can never complete.
    for (int t = 0; t < n; t++) {
      const Thread& h = w->th[t];
      if (h.state != T_WARP) continue;
      const int warp = t / 32, lane = t % 32;
      for (int j = 0; j < 32; j++) {
        if (!(h.mask & (1u << j)) || j == lane) continue;
        const int u = warp * 32 + j;
        const Thread& o = w->th[u];
        if (o.state == T_WARP && o.kind == h.kind && o.line == h.line && o.mask == h.mask) continue;
        fmt_where(w, t, where, sizeof where);
        describe_state(w, u, other, sizeof other);
        set_error(w, kErrLaunch,
                  "%s: %s(mask 0x%08x) at %s:%d in warp %d never completes: lane %d of the mask is not there: %s",
                  where, kind_name(h.kind), h.mask, h.file, h.line, warp, j, other);
        return false;
      }
    }
    set_error(w, kErrLaunch, "kernel %s: warp-level deadlock in block (%u,%u,%u)", w->k->name, w->block_idx.x,
              w->block_idx.y, w->block_idx.z);
    return false;
  }
  if (w->nbar > 0) {
    int first = -1;
    for (int t = 0; t < n; t++)
      if (w->th[t].state == T_BAR) { first = t; break; }
    const Thread& f = w->th[first];
    for (int t = 0; t < n; t++) {
      const Thread& h = w->th[t];
      if (h.state == T_BAR && h.line == f.line && (h.file == f.file || strcmp(h.file, f.file) == 0)) continue;
      describe_state(w, t, other, sizeof other);
      if (h.state == T_BAR) {
        char tb[48];
        thread_str(w, t, tb, sizeof tb);
        snprintf(other, sizeof other, "thread %s waits at line %d", tb, h.line);
      }
      set_error(w, kErrLaunch,
                "kernel %s: __syncthreads at %s:%d not reached by every thread of block (%u,%u,%u): %s",
                w->k->name, f.file, f.line, w->block_idx.x, w->block_idx.y, w->block_idx.z, other);
      return false;
    }
    if (!shared_barrier(w, false)) return false;
    w->nbar = 0;
    for (int t = 0; t < n; t++) runq_push(w, t);
    return true;
  }
  set_error(w, kErrLaunch, "kernel %s: block (%u,%u,%u) deadlocked", w->k->name, w->block_idx.x, w->block_idx.y,
            w->block_idx.z);
  return false;
}

namespace {

// Shared by shuffles (kind 0..3) and __syncwarp (4).
uint64_t warp_op(Worker* w, int kind, uint32_t mask, uint64_t value, int lane_arg, int width, int bytes,
                 const char* file, int line) {
  const int t = w->cur;
  const int lane = t % 32, warp = t / 32;
  const int warp_lanes = w->nthreads - warp * 32 < 32 ? w->nthreads - warp * 32 : 32;
  char where[160];
  if (!(mask & (1u << lane))) {
    fmt_where(w, t, where, sizeof where);
    set_error(w, kErrLaunch, "%s: %s at %s:%d: mask 0x%08x does not include the calling lane %d", where,
              kind_name(kind), file, line, mask, lane);
    abandon_fiber(w);
  }
  if (warp_lanes < 32 && (mask >> warp_lanes) != 0) {
    fmt_where(w, t, where, sizeof where);
    set_error(w, kErrLaunch,
              "%s: %s at %s:%d: mask 0x%08x names lanes %d..31 of warp %d, which do not exist (block of %d threads)",
              where, kind_name(kind), file, line, mask, warp_lanes, warp, w->nthreads);
    abandon_fiber(w);
  }
  if (kind < 4 && (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    fmt_where(w, t, where, sizeof where);
    set_error(w, kErrLaunch, "%s: %s at %s:%d: width %d is not a power of 2 in [1, 32]", where, kind_name(kind),
              file, line, width);
    abandon_fiber(w);
  }
  Thread& h = w->th[t];
  h.kind = (uint8_t)kind;
  h.mask = mask;
  h.value = value;
  h.lane_arg = lane_arg;
  h.width = width;
  h.bytes = (uint8_t)bytes;
  h.file = file;
  h.line = line;
  // Who of the mask is here already, and at the same operation? Each lane
  // that waits was checked against the first one waiting when it came, so
  // they all agree and one comparison checks the newcomer against all. The
  // lowest lane that is waiting or gone is judged first, as a walk over the
  // lanes would.
  const uint32_t others = mask & ~(1u << lane);
  const uint32_t waiting = w->warp_waiting[warp] & others, done = w->warp_done[warp] & others;
  const int jw = waiting ? __builtin_ctz(waiting) : 32, jd = done ? __builtin_ctz(done) : 32;
  if (jw < jd) {
    const int j = jw;
    const Thread& o = w->th[warp * 32 + j];
    // One call site passes one __FILE__ pointer: strcmp only when they differ.
    if (o.kind != kind || o.line != line || o.mask != mask || (o.file != file && strcmp(o.file, file) != 0) ||
        (kind < 4 && o.width != width)) {
      fmt_where(w, t, where, sizeof where);
      set_error(w, kErrLaunch,
                "%s: %s(mask 0x%08x, width %d) at %s:%d in warp %d while lane %d waits at %s(mask 0x%08x, width "
                "%d) at %s:%d",
                where, kind_name(kind), mask, width, file, line, warp, j, kind_name(o.kind), o.mask, o.width,
                o.file, o.line);
      abandon_fiber(w);
    }
  }
  if (done) {
    const int j = jd;
    char other[200];
    fmt_where(w, t, where, sizeof where);
    describe_state(w, warp * 32 + j, other, sizeof other);
    set_error(w, kErrLaunch, "%s: %s(mask 0x%08x) at %s:%d in warp %d: lane %d of the mask is not there: %s",
              where, kind_name(kind), mask, file, line, warp, j, other);
    abandon_fiber(w);
  }
  const int missing = __builtin_popcount(others & ~waiting);
  if (missing > 0) {
    h.state = T_WARP;
    w->warp_waiting[warp] |= 1u << lane;
    w->nwarp_wait++;
    block_current(w);
    if (w->error) abandon_fiber(w);
    return h.result;
  }
  // Complete: compute every participant's result (PTX shfl.sync semantics).
  for (int i = 0; i < 32; i++) {
    if (!(mask & (1u << i))) continue;
    Thread& p = w->th[warp * 32 + i];
    if (kind < 4) {
      const int seg = ~(width - 1) & 31;
      const int min_lane = i & seg;
      const int max_lane = min_lane | (~seg & 31);
      const int b = p.lane_arg;
      int j;
      bool in;
      switch (kind) {
        case 0: j = min_lane | (b & ~seg & 31); in = j <= max_lane; break;
        case 1: j = i - b; in = j >= min_lane; break;
        case 2: j = i + b; in = j <= max_lane; break;
        default: j = i ^ (b & 31); in = j <= max_lane; break;
      }
      if (!in) j = i;
      if (!(mask & (1u << j))) {
        char pw[160];
        fmt_where(w, warp * 32 + i, pw, sizeof pw);
        set_error(w, kErrLaunch,
                  "%s: %s(mask 0x%08x, %d, width %d) at %s:%d reads lane %d, which is not in the mask", pw,
                  kind_name(kind), mask, b, width, file, line, j);
        abandon_fiber(w);
      }
      p.result = w->th[warp * 32 + j].value;
    }
  }
  if (kind == 4)
    for (int i = 0; i < 32; i++)
      if (mask & (1u << i)) shared_warp_synced(w, warp * 32 + i);
  w->warp_waiting[warp] &= ~others;
  for (int i = 0; i < 32; i++) {
    if (!(others & (1u << i))) continue;
    w->nwarp_wait--;
    runq_push(w, warp * 32 + i);
  }
  return h.result;
}

}  // namespace
}  // namespace cuemu_exec

using namespace cuemu_exec;

// ------------------------------------------------------------ kernel ABI ---

CUEMU_EXPORT void cuemu_syncthreads(const char* file, int line) {
  Worker* w = tls_w;
  const int t = w->cur;
  Thread& h = w->th[t];
  h.state = T_BAR;
  h.file = file;
  h.line = line;
  w->nbar++;
  block_current(w);
  if (w->error) abandon_fiber(w);
}

CUEMU_EXPORT void cuemu_syncwarp(uint32_t mask, const char* file, int line) {
  warp_op(tls_w, 4, mask, 0, 0, 32, 4, file, line);
}

CUEMU_EXPORT uint64_t cuemu_shfl(int kind, uint32_t mask, uint64_t value, int lane_arg, int width, int bytes,
                                 const char* file, int line) {
  if (bytes == 4) value &= 0xffffffffu;
  return warp_op(tls_w, kind & 3, mask, value, lane_arg, width, bytes, file, line);
}
