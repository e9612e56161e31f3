// The host-access check on pinned memory: the host may not touch a pinned
// buffer a pending device-to-host copy writes, nor write one a pending
// host-to-device copy reads, before it synchronized with that copy. Each
// wrong program is caught with a message naming the copy, its stream and the
// buffer; each corrected one (stream, event or context synchronization) is
// quiet; with CUEMU_HOSTCHECK=0 the copies are seen to be truly asynchronous.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include "../src/driver/api_decls.h"
#include "cuemu/internal.h"
#include "driver_util.h"
#include "harness.h"

namespace {

using drv::contains;
using drv::ctx;

CUstream stream() {
  CUstream s;
  CHECK(cuStreamCreate(&s, 1) == 0);
  return s;
}

// A device int holding v, written and synchronized.
CUdeviceptr dint(int v) {
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 4) == 0);
  CHECK(cuMemcpyHtoD_v2(p, &v, 4) == 0);
  return p;
}

int* pinned(size_t bytes) {
  void* h;
  CHECK(cuMemHostAlloc(&h, bytes, 0) == 0);
  return (int*)h;
}

}  // namespace

TEST_CASE(host_read_before_dtoh_sync) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dint(1);
  int* h = pinned(4);
  CHECK(cuMemcpyDtoHAsync_v2(h, p, 4, s) == 0);
  int early = *(volatile int*)h;  // the bug: no synchronization yet
  (void)early;
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_STATE);
  std::string m = cuemuLastErrorMessage();
  char buf[64];
  snprintf(buf, sizeof buf, "pinned buffer at %p", (void*)h);
  CHECK_MSG(contains(m, "host read of pinned memory") && contains(m, buf) &&
                contains(m, "before the host synchronized with cuMemcpyDtoHAsync_v2 on stream") &&
                contains(m, "which writes"),
            "%s", m.c_str());
  CHECK(cuDevicePrimaryCtxReset_v2(0) == 0);
}

TEST_CASE(host_write_during_htod) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p;
  CHECK(cuMemAlloc_v2(&p, 4) == 0);
  int* h = pinned(4);
  *h = 5;
  CHECK(cuMemcpyHtoDAsync_v2(p, h, 4, s) == 0);
  CHECK(*(volatile int*)h == 5);  // reading the source meanwhile is fine
  *(volatile int*)h = 6;          // the bug: the copy may not have read it yet
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_STATE);
  std::string m = cuemuLastErrorMessage();
  CHECK_MSG(contains(m, "host write of pinned memory") &&
                contains(m, "before the host synchronized with cuMemcpyHtoDAsync_v2 on stream") &&
                contains(m, "which reads"),
            "%s", m.c_str());
  CHECK(cuDevicePrimaryCtxReset_v2(0) == 0);
}

// Every way of synchronizing with the copy releases the buffer; bytes the
// copy does not touch stay usable throughout, even on the copy's own page.
TEST_CASE(synchronized_access_is_quiet) {
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dint(3);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  int* h = pinned(2 * page);
  int* other_page = h + page / sizeof(int);
  cuemuResetCounters();
  for (int how = 0; how < 3; how++) {
    h[0] = 0;
    CHECK(cuMemcpyDtoHAsync_v2(h, p, 4, s) == 0);
    h[1] = 9;            // same page, outside the copy's bytes
    other_page[0] = 7;   // another page
    if (how == 0) CHECK(cuStreamSynchronize(s) == 0);
    if (how == 1) {
      CUevent e;
      CHECK(cuEventCreate(&e, 0) == 0);
      CHECK(cuEventRecord(e, s) == 0);
      CHECK(cuEventSynchronize(e) == 0);
      CHECK(cuEventDestroy_v2(e) == 0);
    }
    if (how == 2) CHECK(cuCtxSynchronize() == 0);
    CHECK_MSG(h[0] == 3 && h[1] == 9 && other_page[0] == 7, "sync %d: %d %d %d", how, h[0], h[1], other_page[0]);
  }
  CHECK(cuemuGetCounter("host_guards") == 3);
  CHECK(cuemuGetCounter("errors") == 0);
  CHECK(cuMemFreeHost(h) == 0);
  CHECK(cuMemFree_v2(p) == 0);
  CHECK(cuStreamDestroy_v2(s) == 0);
}

// Run in a child with CUEMU_HOSTCHECK=0 by hostcheck_env_switch: the copies
// really are asynchronous, which is what the check protects against.
TEST_CASE(unchecked_copies_are_asynchronous) {
  if (!getenv("HOST_ACCESS_CHILD")) return;
  ctx();
  CUstream s = stream();
  CUdeviceptr p = dint(1), q;
  CHECK(cuMemAlloc_v2(&q, 4) == 0);
  int* h = pinned(4);
  int* src = pinned(4);
  *h = 0;
  *src = 5;
  CHECK(cuMemcpyDtoHAsync_v2(h, p, 4, s) == 0);
  CHECK(cuMemcpyHtoDAsync_v2(q, src, 4, s) == 0);
  const int early = *(volatile int*)h;  // the stream lags the host: not written yet
  *src = 6;                              // nor read yet: the copy sees 6
  CHECK(cuStreamSynchronize(s) == 0);
  int late = 0;
  CHECK(cuMemcpyDtoH_v2(&late, q, 4) == 0);
  printf("%d %d %d %lld\n", early, *h, late, cuemuGetCounter("host_guards"));
}

TEST_CASE(hostcheck_env_switch) {
  std::string line = drv::run_child("HOST_ACCESS_CHILD=1 CUEMU_HOSTCHECK=0", "unchecked_copies_are_asynchronous");
  CHECK_MSG(line == "0 1 6 0\n", "child printed '%s'", line.c_str());
}

TEST_MAIN
