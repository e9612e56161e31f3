// Shared state of the emulated driver (src/driver/*.cpp): contexts, streams,
// events, the allocation map and the race checker's vector clocks.
//
// One process-wide mutex (`G.mu`) guards all of it and one condition variable
// (`G.cv`) announces every change (an op finished, work was enqueued, a host
// thread started waiting). Stream workers never hold the mutex while an
// operation runs, so kernels, cuBLAS and NCCL work run concurrently, and the
// SIGSEGV handler may take the mutex on a worker thread.
#pragma once
#include "cuda_api.h"
#include "cuemu/internal.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define CUEMU_API extern "C" __attribute__((visibility("default")))

namespace cuemu {

// A vector clock, indexed by stream id (every stream of the process has a
// distinct id; 0 is unused).
using VClock = std::vector<uint64_t>;
void vc_join(VClock& into, const VClock& from);
inline uint64_t vc_get(const VClock& c, int i) { return (size_t)i < c.size() ? c[i] : 0; }

struct Stream;

// One access of an allocation recorded for the race checker.
struct AccessRec {
  int stream = 0;        // stream id (0: none)
  uint64_t epoch = 0;    // that stream's clock value of the op
  std::string op;        // "kernel foo", "cuMemcpyHtoDAsync"
  std::string where;     // the stream, for messages
};

// A device allocation: its own mapping, with a PROT_NONE page on each side.
// Freed allocations stay in the map (PROT_NONE, never reused) for messages.
struct Alloc {
  uintptr_t start = 0;
  size_t size = 0;
  char* map_base = nullptr;  // the whole mapping (guards included)
  size_t map_len = 0;
  uint64_t serial = 0;       // allocation number, for messages
  bool live = true;          // false once a free was issued (sync or enqueued)
  std::string freed_by;      // "cuMemFreeAsync on stream 3"
  std::string allocated_by;
  CUctx_st* ctx = nullptr;
  // Race history (whole-allocation granularity): the last write, and the
  // reads of each stream since it.
  AccessRec last_write;
  std::map<int, AccessRec> reads;
};

// A stream operation as queued.
struct Op {
  std::string name;
  std::function<int(char* err, size_t len)> run;  // may be empty (a marker)
  std::function<void()> done;                      // after run or drop
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> deps;  // wait for (stream, seq)
  VClock join;           // extra happens-before edge (cuStreamWaitEvent)
  uint64_t seq = 0;
  int64_t ready_ns = 0;  // the stream lag: not started before this time
};

struct Stream {
  int id = 0;
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;     // CU_STREAM_NON_BLOCKING or 0
  int priority = 0;
  bool legacy = false;    // the context's legacy default stream
  std::deque<Op> queue;
  uint64_t enqueued = 0, completed = 0;
  bool destroyed = false;
  bool running = false;
  VClock clock;
  std::string label() const;
};

}  // namespace cuemu

struct CUctx_st {
  int device = 0;
  bool primary = true;
  int refcount = 0;        // primary-context retains
  bool active = false;
  unsigned flags = 0;
  int sticky = 0;          // CUresult that every later call returns
  std::string sticky_msg;
  std::shared_ptr<cuemu::Stream> legacy;
  std::vector<std::shared_ptr<cuemu::Stream>> streams;  // created, not destroyed
  size_t limits[16] = {};
  int cache_config = 0;
};

struct CUstream_st {
  std::shared_ptr<cuemu::Stream> s;
};

struct CUevent_st {
  CUctx_st* ctx = nullptr;
  unsigned flags = 0;
  std::shared_ptr<cuemu::Stream> stream;  // of the last record
  uint64_t seq = 0;                       // 0: never recorded
  uint64_t record_gen = 0;
  cuemu::VClock clock;
  int64_t time_ns = -1;                   // when the record op ran
};

struct CUfunc_st;
struct CUmod_st {
  CUctx_st* ctx = nullptr;
  void* handle = nullptr;
  const cuemu_module_info* info = nullptr;
  std::string path;
  bool unloaded = false;
  std::vector<std::unique_ptr<CUfunc_st>> funcs;
};

struct CUfunc_st {
  CUmod_st* mod = nullptr;
  const cuemu_kernel_desc* desc = nullptr;
  int max_dynamic_smem = 48 * 1024;
  int carveout = -1;
};

namespace cuemu {

struct Global {
  std::mutex mu;
  std::condition_variable cv;
  int hurry = 0;                 // host threads blocked in a synchronization
  int next_stream_id = 1;
  VClock host_clock;             // what the host has synchronized with
  std::map<uintptr_t, Alloc*> allocs;      // by start: live and freed
  uint64_t alloc_serial = 0;
  size_t region_used = 0;                  // bytes of the device region handed out
  std::vector<CUctx_st*> primary;          // per device
  std::map<CUstream_st*, bool> stream_handles;
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::map<CUmod_st*, bool> modules;
  std::map<CUfunc_st*, bool> funcs;
  std::string last_error;
  int64_t lag_ns = 2000000;
  bool racecheck = true;
};
Global& g();  // never destroyed: stream workers may outlive static destructors

enum Counter {
  C_HOST_SYNCS, C_LAUNCHES, C_HTOD, C_DTOH, C_DTOD, C_ALLOCS, C_FREES, C_RACES, C_ERRORS,
  // Checks performed: device accesses of kernels bounds-checked, reads
  // init-checked, shared accesses race-checked, host-access guards armed.
  C_BOUNDS_CHECKS, C_INIT_CHECKS, C_SHARED_CHECKS, C_HOST_GUARDS,
  // Bumped by libcublas and libnccl through cuemuAddCounter.
  C_BLAS_CALLS, C_ALLREDUCE_CALLS, C_ALLREDUCE_BYTES, C_N
};
extern std::atomic<long long> counters[C_N];
inline void count(Counter c, long long n = 1) { counters[c].fetch_add(n, std::memory_order_relaxed); }

int64_t now_ns();
bool initialized();
int device_count();

// Errors. `fail` records the message as the last error, prints it to stderr
// ("cuemu: error: ...") and counts it; `fail_quiet` only records it (for
// answers a caller probes for, like cuFuncGetParamInfo past the last one).
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int fail_quiet(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Makes `code` sticky in ctx (lock held). Prints and records `msg`.
void set_sticky_locked(CUctx_st* ctx, int code, const std::string& msg);
const char* error_name(int code);
// The message of the failure that made `code` sticky in the current context
// (else in any context), "" if none did.
std::string sticky_cause(int code);

// Contexts (device.cpp).
CUctx_st* current_ctx();
// The context a call works in: current, else device 0's primary if active.
// Returns a CUresult (0 ok): no context, or the context's sticky error.
int call_ctx(CUctx_st** out);

// Memory (memory.cpp), lock held.
Alloc* find_alloc_locked(uintptr_t addr);  // live or freed, [start, start+size]
Alloc* find_mapping_locked(uintptr_t addr);  // the mapping, guards included
// Checks [ptr, ptr+bytes) lies in one live allocation; writes a message
// naming `what` (the call and the operand) otherwise. Returns 0 or a CUresult.
int check_range_locked(uintptr_t ptr, size_t bytes, const char* what, Alloc** out, std::string* msg);
void describe_addr_locked(uintptr_t addr, char* buf, size_t len);  // for the fault handler
int alloc_device(size_t bytes, const char* who, CUctx_st* ctx, uintptr_t* out);
void release_alloc_locked(Alloc* a);  // PROT_NONE + DONTNEED (the free's effect)

// Streams (stream.cpp).
// Resolves a CUstream handle (NULL and CU_STREAM_LEGACY: the legacy stream of
// `ctx`). Lock held. Returns nullptr for an invalid handle.
std::shared_ptr<Stream> resolve_stream_locked(CUstream h, CUctx_st* ctx);
struct Access {
  uintptr_t ptr;
  size_t bytes;
  bool write;
};
// The one way work gets onto a stream: checks the ranges and races, assigns
// the op its epoch and queues it. Lock held. On failure nothing is queued and
// `op.done` is not called. Returns 0 or a CUresult.
int enqueue_locked(const std::shared_ptr<Stream>& s, Op&& op, const std::vector<Access>& acc,
                   const char* call);
// Host waits (count a host-blocking sync, join clocks). Lock held (via lk).
void wait_stream_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s, uint64_t seq);
int sync_stream_locked(std::unique_lock<std::mutex>& lk, const std::shared_ptr<Stream>& s);
int sync_ctx_locked(std::unique_lock<std::mutex>& lk, CUctx_st* ctx);
std::shared_ptr<Stream> new_stream_locked(CUctx_st* ctx, unsigned flags, int priority, bool legacy);
void install_fault_handler();

}  // namespace cuemu
