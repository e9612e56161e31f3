// Streams, events, the pageable/pinned copy rules, host-sync counting and the
// stream-order race checker of the emulated driver. Each check is shown to
// fire on a wrong program and to stay quiet on the corrected one.
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "../src/driver/api_decls.h"
#include "cuemu/internal.h"
#include "driver_util.h"
#include "harness.h"

namespace {

using drv::contains;
using drv::ctx;


// After a test that poisons the context on purpose: a fresh primary context.
void reset_ctx() { CHECK(cuDevicePrimaryCtxReset_v2(0) == 0); }


CUstream stream(unsigned flags = 1) {
  CUstream s;
  CHECK(cuStreamCreate(&s, flags) == 0);
  return s;
}

CUdeviceptr dalloc(size_t n) {
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, n) == 0);
  return p;
}

int read_int(CUdeviceptr p) {
  int v;
  CHECK(cuMemcpyDtoH_v2(&v, p, 4) == 0);
  return v;
}

}  // namespace

// Streams run behind the host: work just enqueued is reliably not done.
TEST_CASE(stream_lag) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dalloc(4);
  CHECK(cuMemsetD8Async(p, 0, 4, s) == 0);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  CHECK(*(volatile unsigned*)p == 0xFFFFFFFFu);  // not written yet
  CHECK(cuStreamSynchronize(s) == 0);
  CHECK(cuStreamQuery(s) == 0);
  CHECK(*(volatile unsigned*)p == 0);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

TEST_CASE(pinned_dtoh_is_async) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dalloc(4);
  int one = 1;
  CHECK(cuMemcpyHtoD_v2(p, &one, 4) == 0);
  int* h;
  CHECK(cuMemHostAlloc((void**)&h, 4, 0) == 0);
  *h = 0;
  cuemuResetCounters();
  CHECK(cuMemcpyDtoHAsync_v2(h, p, 4, s) == 0);
  // Not touched before the sync: that is the host-access check's error
  // (host_access.cpp shows the copy's asynchrony with the check off).
  CHECK(cuemuGetCounter("host_syncs") == 0);
  CHECK(cuStreamSynchronize(s) == 0);
  CHECK(*h == 1);
  CHECK(cuemuGetCounter("host_syncs") == 1);
  CHECK(cuemuGetCounter("bytes_dtoh") == 4);
  CHECK(cuMemFreeHost(h) == 0);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

TEST_CASE(pageable_dtoh_blocks) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dalloc(4);
  CHECK(cuMemsetD32Async(p, 7, 1, s) == 0);
  int h = 0;
  cuemuResetCounters();
  CHECK(cuMemcpyDtoHAsync_v2(&h, p, 4, s) == 0);
  CHECK(h == 7);  // pageable: the host waited
  CHECK(cuemuGetCounter("host_syncs") == 1);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

TEST_CASE(pageable_htod_snapshots_pinned_does_not) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dalloc(4), q = dalloc(4);
  int src = 5;
  int* pin;
  CHECK(cuMemAllocHost_v2((void**)&pin, 4) == 0);
  *pin = 5;
  cuemuResetCounters();
  CHECK(cuMemcpyHtoDAsync_v2(p, &src, 4, s) == 0);
  CHECK(cuemuGetCounter("host_syncs") == 1);  // the staging copy
  CHECK(cuMemcpyHtoDAsync_v2(q, pin, 4, s) == 0);
  CHECK(cuemuGetCounter("host_syncs") == 1);  // truly asynchronous
  src = 6;
  CHECK(cuStreamSynchronize(s) == 0);
  CHECK(read_int(p) == 5);
  CHECK(read_int(q) == 5);
  CHECK(cuemuGetCounter("bytes_htod") == 8);
  CHECK(cuMemFreeHost(pin) == 0);
  CHECK(cuMemFree_v2(p) == 0 && cuMemFree_v2(q) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

TEST_CASE(host_sync_counter_exact) {
  ctx();
  CUstream a = stream(), b = stream();
  CUevent e;
  CHECK(cuEventCreate(&e, 2) == 0);
  CUdeviceptr p = dalloc(16);
  cuemuResetCounters();
  CHECK(cuMemsetD8Async(p, 1, 16, a) == 0);
  CHECK(cuEventRecord(e, a) == 0);
  CHECK(cuStreamWaitEvent(b, e, 0) == 0);  // not a host sync
  CHECK(cuEventQuery(e) == CUDA_ERROR_NOT_READY);  // nor is a query
  CHECK(cuemuGetCounter("host_syncs") == 0);
  CHECK(cuEventSynchronize(e) == 0);        // 1
  CHECK(cuStreamSynchronize(a) == 0);       // 2
  CHECK(cuStreamSynchronize(b) == 0);       // 3
  CHECK(cuCtxSynchronize() == 0);           // 4
  char h[16];
  CHECK(cuMemcpyDtoHAsync_v2(h, p, 16, a) == 0);  // 5 (pageable)
  CHECK(cuMemcpyDtoH_v2(h, p, 16) == 0);          // 6
  CHECK_MSG(cuemuGetCounter("host_syncs") == 6, "host_syncs = %lld", cuemuGetCounter("host_syncs"));
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuEventQuery(e) == 0);
  CHECK(cuEventDestroy_v2(e) == 0);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(a) == 0 && cuStreamDestroy_v2(b) == 0);
}

TEST_CASE(event_timing) {
  ctx();
  CUstream s = stream();
  CUevent a, b, nt;
  CHECK(cuEventCreate(&a, 0) == 0 && cuEventCreate(&b, 0) == 0 && cuEventCreate(&nt, 2) == 0);
  CHECK(cuEventRecord(a, s) == 0);
  CHECK(cuLaunchHostFunc(s, [](void*) { usleep(3000); }, nullptr) == 0);
  CHECK(cuEventRecord(b, s) == 0);
  CHECK(cuEventRecord(nt, s) == 0);
  float ms = -1;
  CHECK(cuEventElapsedTime_v2(&ms, a, b) == CUDA_ERROR_NOT_READY);
  CHECK(cuEventSynchronize(b) == 0);
  CHECK(cuEventElapsedTime_v2(&ms, a, b) == 0);
  CHECK_MSG(ms >= 2.5f && ms < 1000.f, "elapsed %f ms", ms);
  CHECK(cuEventElapsedTime_v2(&ms, a, nt) == CUDA_ERROR_INVALID_HANDLE);  // disable-timing
  CHECK(cuEventDestroy_v2(a) == 0 && cuEventDestroy_v2(b) == 0 && cuEventDestroy_v2(nt) == 0);
  CHECK(cuEventDestroy_v2(a) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

// A stream blocked (here in a host function waiting for another stream, as an
// NCCL collective waits for its peer) never stalls other streams.
TEST_CASE(streams_progress_independently) {
  ctx();
  CUstream a = stream(), b = stream();
  static std::atomic<int> flag;
  flag = 0;
  CHECK(cuLaunchHostFunc(a, [](void*) { while (flag.load() == 0) usleep(100); }, nullptr) == 0);
  CHECK(cuLaunchHostFunc(b, [](void*) { flag = 1; }, nullptr) == 0);
  CHECK(cuStreamSynchronize(a) == 0);
  CHECK(cuStreamSynchronize(b) == 0);
  CHECK(cuStreamDestroy_v2(a) == 0 && cuStreamDestroy_v2(b) == 0);
}

TEST_CASE(event_orders_two_streams_no_race) {
  ctx();
  CUstream s1 = stream(), s2 = stream();
  CUdeviceptr p = dalloc(256), q = dalloc(256);
  CUevent e;
  CHECK(cuEventCreate(&e, 2) == 0);
  cuemuResetCounters();
  CHECK(cuMemsetD8Async(p, 3, 256, s1) == 0);   // s1 writes p
  CHECK(cuEventRecord(e, s1) == 0);
  CHECK(cuStreamWaitEvent(s2, e, 0) == 0);
  CHECK(cuMemcpyDtoDAsync_v2(q, p, 256, s2) == 0);  // s2 reads p after the event
  CHECK(cuEventRecord(e, s2) == 0);
  CHECK(cuStreamWaitEvent(s1, e, 0) == 0);
  CHECK(cuMemsetD8Async(p, 4, 256, s1) == 0);   // s1 writes p after s2's read
  // A host sync orders too.
  CHECK(cuStreamSynchronize(s1) == 0);
  CHECK(cuMemsetD8Async(p, 5, 256, s2) == 0);
  CHECK(cuStreamSynchronize(s2) == 0);
  unsigned char h[256];
  CHECK(cuMemcpyDtoH_v2(h, q, 256) == 0);
  for (unsigned char c : h) CHECK(c == 3);
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuEventDestroy_v2(e) == 0);
  CHECK(cuMemFree_v2(p) == 0 && cuMemFree_v2(q) == 0);
  CHECK(cuStreamDestroy_v2(s1) == 0 && cuStreamDestroy_v2(s2) == 0);
}

TEST_CASE(race_without_event_is_reported) {
  ctx();
  CUstream s1 = stream(), s2 = stream();
  CUdeviceptr p = dalloc(256), q = dalloc(256);
  cuemuResetCounters();
  CHECK(cuMemsetD8Async(p, 3, 256, s1) == 0);
  CHECK(cuMemcpyDtoDAsync_v2(q, p, 256, s2) == CUDA_ERROR_ILLEGAL_STATE);
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "stream-order race on allocation") && contains(m, "(256 bytes)") &&
                contains(m, "cuMemcpyDtoDAsync_v2 on stream") && contains(m, "reads it while cuMemsetD8Async on stream") &&
                contains(m, "writes it with no event or synchronization between them"),
            "message: %s", m.c_str());
  CHECK(cuemuGetCounter("races") == 1);
  // Sticky: the context is unusable afterwards.
  CHECK(cuMemsetD8Async(q, 0, 4, s1) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuStreamSynchronize(s1) == CUDA_ERROR_ILLEGAL_STATE);
  reset_ctx();
  CHECK(cuMemsetD8_v2(dalloc(4), 0, 4) == 0);
}

TEST_CASE(write_after_read_race) {
  ctx();
  CUstream s1 = stream(), s2 = stream();
  CUdeviceptr p = dalloc(64), q = dalloc(64);
  CHECK(cuCtxSynchronize() == 0);
  cuemuResetCounters();
  CHECK(cuMemcpyDtoDAsync_v2(q, p, 64, s1) == 0);  // s1 reads p
  CHECK(cuMemsetD8Async(p, 0, 64, s2) == CUDA_ERROR_ILLEGAL_STATE);  // s2 overwrites it
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "cuMemsetD8Async on stream") && contains(m, "writes it while cuMemcpyDtoDAsync_v2") &&
                contains(m, "reads it"),
            "message: %s", m.c_str());
  CHECK(cuemuGetCounter("races") == 1);
  reset_ctx();
}

// The legacy default stream synchronizes with blocking streams (flags 0), not
// with non-blocking ones.
TEST_CASE(legacy_stream_implicit_sync) {
  ctx();
  CUstream blocking = stream(0), nonblocking = stream(1);
  CUdeviceptr p = dalloc(64);
  CHECK(cuCtxSynchronize() == 0);
  cuemuResetCounters();
  CHECK(cuMemsetD8Async(p, 1, 64, blocking) == 0);
  CHECK(cuMemsetD8_v2(p, 2, 64) == 0);  // legacy stream: after `blocking`
  CHECK(cuMemsetD8Async(p, 3, 64, blocking) == 0);  // and `blocking` after it
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuMemsetD8Async(p, 4, 64, nonblocking) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuemuGetCounter("races") == 1);
  reset_ctx();
}

TEST_CASE(stream_ordered_alloc_is_a_write) {
  ctx();
  CUstream s1 = stream(), s2 = stream();
  CUdeviceptr p;
  CUevent e;
  CHECK(cuEventCreate(&e, 2) == 0);
  cuemuResetCounters();
  CHECK(cuMemAllocAsync(&p, 128, s1) == 0);
  CHECK(cuEventRecord(e, s1) == 0);
  CHECK(cuStreamWaitEvent(s2, e, 0) == 0);
  CHECK(cuMemsetD8Async(p, 0, 128, s2) == 0);  // ordered after the allocation
  CHECK(cuEventRecord(e, s2) == 0);
  CHECK(cuStreamWaitEvent(s1, e, 0) == 0);
  CHECK(cuMemFreeAsync(p, s1) == 0);  // ordered after the use
  CHECK(cuemuGetCounter("races") == 0);
  CHECK(cuMemsetD8Async(p, 0, 128, s1) == CUDA_ERROR_INVALID_VALUE);  // use after (enqueued) free
  CHECK(cuMemAllocAsync(&p, 128, s1) == 0);
  CHECK(cuMemsetD8Async(p, 0, 128, s2) == CUDA_ERROR_ILLEGAL_STATE);  // not ordered after it
  reset_ctx();
}

// cuemu_enqueue: the way cuBLAS and NCCL run work.
TEST_CASE(enqueue_api) {
  ctx();
  CUstream s1 = stream(), s2 = stream();
  CUdeviceptr p = dalloc(64);
  CHECK(cuCtxSynchronize() == 0);
  static int runs, destroys;
  runs = destroys = 0;
  cuemu_access acc = {(void*)p, 64, 1};
  auto fn = [](void* u, char*, size_t) {
    memset(u, 9, 64);
    runs++;
    return 0;
  };
  auto destroy = [](void*) { destroys++; };
  CHECK(cuemu_enqueue(s1, "testOp", &acc, 1, fn, (void*)p, destroy) == 0);
  CHECK(cuStreamSynchronize(s1) == 0);
  CHECK(runs == 1 && destroys == 1);
  CHECK(*(unsigned char*)p == 9);
  // Out of bounds: refused, dropped (destroy still runs once).
  cuemu_access bad = {(void*)p, 65, 0};
  CHECK(cuemu_enqueue(s1, "testOp", &bad, 1, fn, (void*)p, destroy) == CUDA_ERROR_INVALID_VALUE);
  CHECK(runs == 1 && destroys == 2);
  // An op's failure becomes the context's sticky error.
  auto failing = [](void*, char* err, size_t len) {
    snprintf(err, len, "testFail: something broke");
    return 719;
  };
  CHECK(cuemu_enqueue(s1, "testFail", nullptr, 0, failing, nullptr, nullptr) == 0);
  CHECK(cuStreamSynchronize(s1) == 719);
  CHECK(contains(cuemuLastErrorMessage(), "testFail: something broke"));
  CHECK(cuMemsetD8Async(p, 0, 4, s2) == 719);
  reset_ctx();
  // And a race through it.
  CUstream a = stream(), b = stream();
  p = dalloc(64);
  CHECK(cuCtxSynchronize() == 0);
  CHECK(cuemu_enqueue(a, "ncclAllReduce", &acc, 0, nullptr, nullptr, nullptr) == 0);
  acc.ptr = (void*)p;
  CHECK(cuemu_enqueue(a, "ncclAllReduce", &acc, 1, nullptr, nullptr, nullptr) == 0);
  CHECK(cuMemsetD8Async(p, 0, 64, b) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(contains(cuemuLastErrorMessage(), "while ncclAllReduce on stream"));
  reset_ctx();
}

// CUEMU_RACECHECK=0 turns the checker off (checked in a child process).
static int child_mode = [] {
  if (getenv("DRIVER_TEST_RACE_CHILD")) {
    cuInit(0);
    CUcontext c;
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    CUstream s1, s2;
    cuStreamCreate(&s1, 1);
    cuStreamCreate(&s2, 1);
    CUdeviceptr p;
    cuMemAlloc_v2(&p, 64);
    cuMemsetD8Async(p, 1, 64, s1);
    int r = cuMemsetD8Async(p, 2, 64, s2);
    printf("%d %lld", r, cuemuGetCounter("races"));
    fflush(stdout);
    _exit(0);
  }
  return 0;
}();

TEST_CASE(racecheck_env_switch) {
  (void)child_mode;
  for (int on = 0; on < 2; on++) {
    std::string cmd = std::string("DRIVER_TEST_RACE_CHILD=1 ") + (on ? "" : "CUEMU_RACECHECK=0 ") + "/proc/" +
                      std::to_string(getpid()) + "/exe 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    CHECK(f);
    char buf[32] = {};
    CHECK(fgets(buf, sizeof buf, f) != nullptr);
    pclose(f);
    CHECK_MSG(strcmp(buf, on ? "401 1" : "0 0") == 0, "racecheck %s: got '%s'", on ? "on" : "off", buf);
  }
}

TEST_MAIN
