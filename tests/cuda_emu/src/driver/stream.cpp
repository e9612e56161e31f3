// Streams, their worker threads, host synchronization and the stream-order
// race checker.
//
// Every stream (the legacy default stream included) has its own worker thread
// that runs its queue in order, so a stream blocked in an NCCL collective never
// stalls another one. Workers run BEHIND the host: an op starts no earlier than
// CUEMU_STREAM_LAG_US (2 ms) after it was enqueued unless some host thread is
// blocked in a synchronization, so a host that reads results without
// synchronizing reliably sees stale data instead of racing to a lucky answer.
//
// Race checker: happens-before with vector clocks, evaluated at ENQUEUE time
// in the host's program order (so it is deterministic, not timing-dependent).
// Each stream has a clock; each op ticks its stream's component. Event records
// capture the stream's clock, cuStreamWaitEvent joins it into the waiting
// stream, host synchronizations join what they waited for into the host clock,
// and every enqueue joins the host clock into its stream. An access of an
// allocation races with another stream's earlier access (write/write,
// write/read, read/write) unless the earlier op's epoch is covered by the new
// op's clock.
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "api_decls.h"
#include "driver.h"
#include "hostcheck.h"
#include "memcheck.h"

namespace cuemu {

void vc_join(VClock& into, const VClock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); i++)
    if (from[i] > into[i]) into[i] = from[i];
}

std::string Stream::label() const {
  if (legacy) return "the legacy default stream (stream " + std::to_string(id) + ")";
  return "stream " + std::to_string(id);
}

static bool deps_done(const Op& op) {
  for (auto& [s, seq] : op.deps)
    if (s->completed < seq) return false;
  return true;
}

// The signal handler needs an alternate stack on every thread that may fault
// in kernel code: the fault may be a stack overflow of a fiber.
static void give_altstack() {
  stack_t ss;
  ss.ss_size = 256 * 1024;
  ss.ss_sp = malloc(ss.ss_size);
  ss.ss_flags = 0;
  if (ss.ss_sp) sigaltstack(&ss, nullptr);
}

static void worker(std::shared_ptr<Stream> s) {
  give_altstack();
  std::unique_lock<std::mutex> lk(g().mu);
  for (;;) {
    if (s->queue.empty()) {
      if (s->destroyed) break;
      g().cv.wait(lk);
      continue;
    }
    Op& front = s->queue.front();
    if (!deps_done(front)) {
      g().cv.wait(lk);
      continue;
    }
    if (g().hurry == 0) {
      int64_t now = now_ns();
      if (now < front.ready_ns) {
        g().cv.wait_for(lk, std::chrono::nanoseconds(front.ready_ns - now));
        continue;
      }
    }
    Op op = std::move(front);
    s->queue.pop_front();
    CUctx_st* ctx = s->ctx;
    // After a sticky error nothing runs any more (the context is dead), but
    // the queue still drains so that waits return.
    bool skip = ctx->sticky != 0;
    s->running = true;
    lk.unlock();
    int rc = 0;
    char err[1024] = "";
    if (!skip && op.run) rc = op.run(err, sizeof err);
    if (op.done) op.done();
    lk.lock();
    s->running = false;
    if (rc != 0) {
      std::string msg = err[0] ? std::string(err) : op.name + " failed";
      set_sticky_locked(ctx, rc, msg);
    }
    s->completed = op.seq;
    g().cv.notify_all();
  }
}

std::shared_ptr<Stream> new_stream_locked(CUctx_st* ctx, unsigned flags, int priority, bool legacy) {
  auto s = std::make_shared<Stream>();
  s->id = g().next_stream_id++;
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  // A new stream starts ordered after everything the host has seen.
  s->clock = g().host_clock;
  if (!legacy) ctx->streams.push_back(s);
  std::thread(worker, s).detach();
  return s;
}

static thread_local std::map<CUctx_st*, std::shared_ptr<Stream>>* t_per_thread;

std::shared_ptr<Stream> resolve_stream_locked(CUstream h, CUctx_st* ctx) {
  if (h == nullptr || h == CU_STREAM_LEGACY) return ctx ? ctx->legacy : nullptr;
  if (h == CU_STREAM_PER_THREAD) {
    // The per-thread default stream: a blocking stream of its own per thread.
    if (!ctx) return nullptr;
    if (!t_per_thread) t_per_thread = new std::map<CUctx_st*, std::shared_ptr<Stream>>;
    auto& s = (*t_per_thread)[ctx];
    if (!s || s->destroyed) s = new_stream_locked(ctx, 0, 0, false);
    return s;
  }
  auto it = g().stream_handles.find(h);
  if (it == g().stream_handles.end()) return nullptr;
  return h->s;
}

static const char* verb(bool write) { return write ? "writes" : "reads"; }

// Checks one access against the allocation's history. Returns a message on a race.
static bool find_race(const Alloc* a, bool write, const VClock& clk, int sid, const AccessRec** other,
                      bool* other_write) {
  const AccessRec& w = a->last_write;
  if (w.stream && w.stream != sid && vc_get(clk, w.stream) < w.epoch) {
    *other = &w;
    *other_write = true;
    return true;
  }
  if (write)
    for (auto& [rs, r] : a->reads)
      if (rs != sid && vc_get(clk, rs) < r.epoch) {
        *other = &r;
        *other_write = false;
        return true;
      }
  return false;
}

int enqueue_locked(const std::shared_ptr<Stream>& s, Op&& op, const std::vector<Access>& acc, const char* call) {
  CUctx_st* ctx = s->ctx;
  if (!ctx->active) return 709;
  if (ctx->sticky) return ctx->sticky;
  if (s->destroyed) return fail(400, "%s: the stream was destroyed", call);
  std::vector<Alloc*> allocs(acc.size());
  for (size_t i = 0; i < acc.size(); i++) {
    std::string msg;
    char what[256];
    snprintf(what, sizeof what, "%s (%s %zu bytes)", call, acc[i].write ? "writing" : "reading", acc[i].bytes);
    if (check_range_locked(acc[i].ptr, acc[i].bytes, what, &allocs[i], &msg)) return fail(1, "%s", msg.c_str());
  }
  VClock clk = s->clock;
  vc_join(clk, g().host_clock);
  vc_join(clk, op.join);
  // The legacy default stream's implicit synchronization: its ops wait for
  // all earlier work of the blocking streams, and theirs for its.
  if (s->legacy) {
    for (auto& b : ctx->streams)
      if (b->flags == 0 && !b->destroyed) {
        op.deps.push_back({b, b->enqueued});
        vc_join(clk, b->clock);
      }
  } else if (s->flags == 0 && ctx->legacy) {
    op.deps.push_back({ctx->legacy, ctx->legacy->enqueued});
    vc_join(clk, ctx->legacy->clock);
  }
  if (clk.size() <= (size_t)s->id) clk.resize(s->id + 1, 0);
  uint64_t epoch = ++clk[s->id];
  if (g().racecheck) {
    for (size_t i = 0; i < acc.size(); i++) {
      const AccessRec* other;
      bool other_write;
      if (!find_race(allocs[i], acc[i].write, clk, s->id, &other, &other_write)) continue;
      char buf[1024];
      snprintf(buf, sizeof buf,
               "stream-order race on allocation 0x%lx (%zu bytes): %s on %s %s it while %s on %s %s it with no "
               "event or synchronization between them",
               (unsigned long)allocs[i]->start, allocs[i]->size, op.name.c_str(), s->label().c_str(),
               verb(acc[i].write), other->op.c_str(), other->where.c_str(), verb(other_write));
      count(C_RACES);
      // CUDA_ERROR_ILLEGAL_STATE: the program's stream order is wrong; the
      // context is poisoned like after a device fault.
      set_sticky_locked(ctx, 401, buf);
      return 401;
    }
    for (size_t i = 0; i < acc.size(); i++) {
      AccessRec rec{s->id, epoch, op.name, s->label()};
      if (acc[i].write) {
        allocs[i]->last_write = rec;
        allocs[i]->reads.clear();
      } else {
        allocs[i]->reads[s->id] = rec;
      }
    }
  }
  s->clock = clk;
  op.seq = ++s->enqueued;
  op.ready_ns = now_ns() + g().lag_ns;
  s->queue.push_back(std::move(op));
  g().cv.notify_all();
  return 0;
}

void wait_stream_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s, uint64_t seq) {
  if (s->completed >= seq) return;
  g().hurry++;
  g().cv.notify_all();
  g().cv.wait(lk, [&] { return s->completed >= seq; });
  g().hurry--;
}

int sync_stream_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s) {
  if (s->legacy) {
    // Synchronizing the legacy stream also waits for the blocking streams'
    // work: a marker op picks those dependencies up.
    Op marker;
    marker.name = "cuStreamSynchronize";
    enqueue_locked(s, std::move(marker), {}, "cuStreamSynchronize");
  }
  uint64_t target = s->enqueued;
  VClock clk = s->clock;
  count(C_HOST_SYNCS);
  wait_stream_locked(lk, s, target);
  vc_join(g().host_clock, clk);
  release_host_guards_locked();
  return s->ctx->sticky;
}

int sync_ctx_locked(std::unique_lock<std::mutex>& lk, CUctx_st* ctx) {
  std::vector<std::shared_ptr<Stream>> ss = ctx->streams;
  if (ctx->legacy) ss.push_back(ctx->legacy);
  std::vector<uint64_t> targets;
  for (auto& s : ss) {
    targets.push_back(s->enqueued);
    vc_join(g().host_clock, s->clock);
  }
  count(C_HOST_SYNCS);
  for (size_t i = 0; i < ss.size(); i++) wait_stream_locked(lk, ss[i], targets[i]);
  release_host_guards_locked();
  return ctx->sticky;
}

}  // namespace cuemu

using namespace cuemu;

// ------------------------------------------------------------ streams ------

static int stream_create(CUstream* ph, unsigned flags, int priority, const char* call) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!ph) return fail(1, "%s: phStream is NULL", call);
  if (flags & ~1u) return fail(1, "%s: unknown flags 0x%x", call, flags);
  std::lock_guard<std::mutex> lk(g().mu);
  auto* h = new CUstream_st;
  h->s = new_stream_locked(c, flags, priority, false);
  g().stream_handles[h] = true;
  *ph = h;
  return 0;
}

CUEMU_API int cuStreamCreate(CUstream* ph, unsigned flags) { return stream_create(ph, flags, 0, "cuStreamCreate"); }
CUEMU_API int cuStreamCreateWithPriority(CUstream* ph, unsigned flags, int priority) {
  return stream_create(ph, flags, priority, "cuStreamCreateWithPriority");
}

// Looks the stream up under the lock: `c` is the current context (for NULL).
#define GET_STREAM(h, call)                                                       \
  CUctx_st* c_ = nullptr;                                                         \
  if (int r_ = call_ctx(&c_)) return r_;                                          \
  std::unique_lock<std::mutex> lk(g().mu);                                        \
  auto s = resolve_stream_locked(h, c_);                                          \
  if (!s) {                                                                       \
    lk.unlock();                                                                  \
    return fail(400, "%s: %p is not a live stream handle", call, (void*)(h));     \
  }

CUEMU_API int cuStreamDestroy_v2(CUstream h) {
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return fail(400, "cuStreamDestroy: %p is a default stream", (void*)h);
  GET_STREAM(h, "cuStreamDestroy");
  // Pending work still completes (CUDA semantics); the worker exits after it.
  s->destroyed = true;
  auto& v = s->ctx->streams;
  for (size_t i = 0; i < v.size(); i++)
    if (v[i] == s) {
      v.erase(v.begin() + i);
      break;
    }
  g().stream_handles.erase(h);
  delete h;
  g().cv.notify_all();
  return 0;
}
CUEMU_API int cuStreamDestroy(CUstream h) { return cuStreamDestroy_v2(h); }

CUEMU_API int cuStreamSynchronize(CUstream h) {
  GET_STREAM(h, "cuStreamSynchronize");
  return sync_stream_locked(lk, s);
}

CUEMU_API int cuStreamQuery(CUstream h) {
  GET_STREAM(h, "cuStreamQuery");
  if (s->ctx->sticky) return s->ctx->sticky;
  return s->completed >= s->enqueued ? 0 : 600;
}

CUEMU_API int cuStreamGetFlags(CUstream h, unsigned* flags) {
  GET_STREAM(h, "cuStreamGetFlags");
  if (flags) *flags = s->flags;
  return 0;
}

CUEMU_API int cuStreamGetPriority(CUstream h, int* p) {
  GET_STREAM(h, "cuStreamGetPriority");
  if (p) *p = s->priority;
  return 0;
}

CUEMU_API int cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  GET_STREAM(h, "cuStreamGetCtx");
  if (pctx) *pctx = s->ctx;
  return 0;
}

CUEMU_API int cuStreamGetId(CUstream h, unsigned long long* id) {
  GET_STREAM(h, "cuStreamGetId");
  if (id) *id = (unsigned long long)s->id;
  return 0;
}

CUEMU_API int cuLaunchHostFunc(CUstream h, CUhostFn fn, void* user) {
  if (!fn) return fail(1, "cuLaunchHostFunc: fn is NULL");
  GET_STREAM(h, "cuLaunchHostFunc");
  Op op;
  op.name = "cuLaunchHostFunc";
  op.run = [fn, user](char*, size_t) {
    fn(user);
    return 0;
  };
  return enqueue_locked(s, std::move(op), {}, "cuLaunchHostFunc");
}

// ------------------------------------------------------------- events ------

static std::shared_ptr<CUevent_st> get_event_locked(CUevent e) {
  auto it = g().events.find(e);
  return it == g().events.end() ? nullptr : it->second;
}

CUEMU_API int cuEventCreate(CUevent* ph, unsigned flags) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!ph) return fail(1, "cuEventCreate: phEvent is NULL");
  if (flags & ~7u) return fail(1, "cuEventCreate: unknown flags 0x%x", flags);
  auto e = std::make_shared<CUevent_st>();
  e->ctx = c;
  e->flags = flags;
  std::lock_guard<std::mutex> lk(g().mu);
  g().events[e.get()] = e;
  *ph = e.get();
  return 0;
}

CUEMU_API int cuEventDestroy_v2(CUevent h) {
  std::lock_guard<std::mutex> lk(g().mu);
  // A pending record op keeps its own reference, as CUDA allows destroying
  // an event whose record has not completed.
  if (!g().events.erase(h)) return fail(400, "cuEventDestroy: %p is not a live event", (void*)h);
  return 0;
}
CUEMU_API int cuEventDestroy(CUevent h) { return cuEventDestroy_v2(h); }

CUEMU_API int cuEventRecordWithFlags(CUevent h, CUstream sh, unsigned flags) {
  (void)flags;
  GET_STREAM(sh, "cuEventRecord");
  auto e = get_event_locked(h);
  if (!e) {
    lk.unlock();
    return fail(400, "cuEventRecord: %p is not a live event", (void*)h);
  }
  uint64_t gen = e->record_gen + 1;
  Op op;
  op.name = "cuEventRecord";
  op.run = [e, gen](char*, size_t) {
    std::lock_guard<std::mutex> lk2(g().mu);
    if (e->record_gen == gen) e->time_ns = now_ns();
    return 0;
  };
  if (int r = enqueue_locked(s, std::move(op), {}, "cuEventRecord")) return r;
  e->record_gen = gen;
  e->stream = s;
  e->seq = s->enqueued;
  e->clock = s->clock;
  e->time_ns = -1;
  return 0;
}
CUEMU_API int cuEventRecord(CUevent h, CUstream sh) { return cuEventRecordWithFlags(h, sh, 0); }

CUEMU_API int cuEventQuery(CUevent h) {
  std::lock_guard<std::mutex> lk(g().mu);
  auto e = get_event_locked(h);
  if (!e) return fail(400, "cuEventQuery: %p is not a live event", (void*)h);
  if (e->ctx->sticky) return e->ctx->sticky;
  if (e->seq == 0 || e->stream->completed >= e->seq) return 0;
  return 600;
}

CUEMU_API int cuEventSynchronize(CUevent h) {
  std::unique_lock<std::mutex> lk(g().mu);
  auto e = get_event_locked(h);
  if (!e) {
    lk.unlock();
    return fail(400, "cuEventSynchronize: %p is not a live event", (void*)h);
  }
  if (e->seq != 0) {
    count(C_HOST_SYNCS);
    auto st = e->stream;
    uint64_t seq = e->seq;
    VClock clk = e->clock;
    wait_stream_locked(lk, st, seq);
    vc_join(g().host_clock, clk);
    release_host_guards_locked();
  }
  return e->ctx->sticky;
}

CUEMU_API int cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  std::lock_guard<std::mutex> lk(g().mu);
  auto ea = get_event_locked(a), eb = get_event_locked(b);
  if (!ea || !eb) return fail(400, "cuEventElapsedTime: not a live event");
  if (!ms) return 1;
  if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING)
    return fail(400, "cuEventElapsedTime: an event was created with CU_EVENT_DISABLE_TIMING");
  if (ea->seq == 0 || eb->seq == 0) return fail(400, "cuEventElapsedTime: an event was never recorded");
  if (ea->stream->completed < ea->seq || eb->stream->completed < eb->seq || ea->time_ns < 0 || eb->time_ns < 0)
    return 600;
  *ms = (float)((double)(eb->time_ns - ea->time_ns) / 1e6);
  return 0;
}
CUEMU_API int cuEventElapsedTime(float* ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

CUEMU_API int cuStreamWaitEvent(CUstream sh, CUevent h, unsigned flags) {
  (void)flags;
  GET_STREAM(sh, "cuStreamWaitEvent");
  auto e = get_event_locked(h);
  if (!e) {
    lk.unlock();
    return fail(400, "cuStreamWaitEvent: %p is not a live event", (void*)h);
  }
  if (e->seq == 0) return s->ctx->sticky;  // never recorded: nothing to wait for
  Op op;
  op.name = "cuStreamWaitEvent";
  op.deps.push_back({e->stream, e->seq});
  op.join = e->clock;
  return enqueue_locked(s, std::move(op), {}, "cuStreamWaitEvent");
}

// --------------------------------------------- other libraries' stream work -

CUEMU_API int cuemu_enqueue(void* stream, const char* name, const cuemu_access* accesses, int naccesses,
                            cuemu_op_fn fn, void* user, void (*destroy)(void*)) {
  CUstream h = (CUstream)stream;
  CUctx_st* c = nullptr;
  int r = 0;
  {
    std::unique_lock<std::mutex> lk(g().mu);
    bool real = h && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD && g().stream_handles.count(h);
    if (real) c = h->s->ctx;
  }
  if (!c && (r = call_ctx(&c))) {
    if (destroy) destroy(user);
    return r;
  }
  std::vector<Access> acc;
  for (int i = 0; i < naccesses; i++)
    acc.push_back({(uintptr_t)accesses[i].ptr, accesses[i].bytes, accesses[i].write != 0});
  std::unique_lock<std::mutex> lk(g().mu);
  auto s = resolve_stream_locked(h, c);
  if (!s) {
    lk.unlock();
    if (destroy) destroy(user);
    return fail(400, "%s: %p is not a live stream handle", name ? name : "cuemu_enqueue", stream);
  }
  Op op;
  op.name = name ? name : "cuemu_enqueue";
  if (fn) op.run = [fn, user](char* err, size_t len) { return fn(user, err, len); };
  if (destroy) op.done = [destroy, user] { destroy(user); };
  r = enqueue_locked(s, std::move(op), acc, name ? name : "cuemu_enqueue");
  // What a library operation writes counts as initialized (its declared
  // write ranges; a strided GEMM output is marked whole).
  if (r == 0)
    for (auto& x : acc)
      if (x.write) shadow_set(x.ptr, x.bytes, SH_INIT);
  if (r && destroy) {
    lk.unlock();
    destroy(user);  // dropped without running
  }
  return r;
}
