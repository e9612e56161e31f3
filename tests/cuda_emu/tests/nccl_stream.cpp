// The emulated NCCL's collectives as stream operations of the emulated
// driver: buffer ranges are checked at call time, the driver's race checker
// sees a collective's reads and writes, and a communicator's collectives run
// in call order even when issued on different streams.
#include "nccl_ranks.h"

extern "C" {
typedef struct CUevent_st* CUevent;
int cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, CUstream);
int cuEventCreate(CUevent*, unsigned);
int cuEventRecord(CUevent, CUstream);
int cuStreamWaitEvent(CUstream, CUevent, unsigned);
int cuDevicePrimaryCtxReset_v2(int);
int ncclCommInitAll(ncclComm_t*, int, const int*);
int cuStreamDestroy_v2(CUstream);
long long cuemuGetCounter(const char*);
const char* cuemuLastErrorMessage(void);
}

using namespace nt;

TEST_CASE(nccl_buffer_ranges_are_checked_when_called) {
  run_ranks(2, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, 2, id);
    CUdeviceptr a = d.upload(std::vector<float>(8, 1.0f)), small = d.upload(std::vector<float>(8, 0.0f));
    // All-gather needs nranks x count in recv: 16 floats do not fit in 8.
    CHECK(ncclAllGather((void*)a, (void*)small, 8, Float32, c, d.s) == InvalidArgument);
    const char* m = ncclGetLastError(c);
    CHECK_MSG(std::strstr(m, "ncclAllGather: recvbuff") != nullptr, "message: %s", m);
    CHECK(ncclAllReduce((void*)a, (void*)a, 9, Float32, Sum, c, d.s) == InvalidArgument);
    int host[4];
    CHECK(ncclAllReduce(host, host, 4, Int32, Sum, c, d.s) == InvalidArgument);  // host memory
    CHECK(cuMemFree_v2(small) == 0);
    CHECK(ncclBroadcast((void*)small, (void*)small, 1, Float32, 0, c, d.s) == InvalidArgument);
    // Partial overlap outside NCCL's in-place layouts.
    CHECK(ncclAllReduce((void*)a, (void*)(a + 4), 4, Float32, Sum, c, d.s) == InvalidArgument);
    CHECK_MSG(std::strstr(ncclGetLastError(c), "overlap"), "message: %s", ncclGetLastError(c));
    // A stream the driver refuses: the collective never happened on this rank.
    CUstream dead;
    CHECK(cuStreamCreate(&dead, 0) == 0 && cuStreamDestroy_v2(dead) == 0);
    if (rank == 0) {
      CHECK(ncclAllReduce((void*)a, (void*)a, 8, Float32, Sum, c, dead) == 1);  // ncclUnhandledCudaError
      CHECK_MSG(std::strstr(ncclGetLastError(c), "stream"), "message: %s", ncclGetLastError(c));
    }
    int ae = -1;  // call-time errors are not asynchronous errors
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == Success);
    // Nothing was enqueued on either rank: a real collective still pairs up.
    CHECK(ncclAllReduce((void*)a, (void*)a, 8, Float32, Sum, c, d.s) == Success);
    CHECK(d.download<float>(a, 8)[7] == 2.0f);
    CHECK(ncclCommDestroy(c) == Success);
  });
}

TEST_CASE(nccl_collectives_are_seen_by_the_race_checker) {
  run_ranks(1, [](int, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(0, 1, id);
    CUstream s2;
    CHECK(cuStreamCreate(&s2, 0) == 0);
    CUdeviceptr a = d.upload(std::vector<float>(64, 1.0f)), b = d.upload(std::vector<float>(64, 0.0f));
    // Ordered through an event: no race.
    CUevent e;
    CHECK(cuEventCreate(&e, 0) == 0);
    CHECK(ncclAllReduce((void*)a, (void*)a, 64, Float32, Sum, c, d.s) == Success);
    CHECK(cuEventRecord(e, d.s) == 0);
    CHECK(cuStreamWaitEvent(s2, e, 0) == 0);
    CHECK(cuMemcpyDtoDAsync_v2(b, a, 256, s2) == 0);
    CHECK(cuStreamSynchronize(s2) == 0);
    CHECK(cuemuGetCounter("races") == 0);
    // Not ordered: the collective's write of `a` races with the copy's read.
    CHECK(ncclAllReduce((void*)a, (void*)a, 64, Float32, Sum, c, d.s) == Success);
    int r = cuMemcpyDtoDAsync_v2(b, a, 256, s2);
    const char* m = cuemuLastErrorMessage();
    CHECK_MSG(r != 0 && std::strstr(m, "ncclAllReduce"), "copy returned %d: %s", r, m);
    CHECK(cuemuGetCounter("races") == 1);
  });
}

// Rank 0 issues two all-reduces on two streams (the second may be picked up
// first by its worker: it must wait its turn);
// rank 1 issues both on one stream. NCCL runs a communicator's collectives in
// the order they were called on the host, whatever the streams.
TEST_CASE(nccl_one_comm_on_two_streams_keeps_call_order) {
  run_ranks(2, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, 2, id);
    CUstream s2;
    CHECK(cuStreamCreate(&s2, 0) == 0);
    CUdeviceptr a = d.upload(std::vector<float>(16, 1.0f + rank)), b = d.upload(std::vector<float>(32, 10.0f));
    CHECK(ncclAllReduce((void*)a, (void*)a, 16, Float32, Sum, c, d.s) == Success);
    CHECK(ncclAllReduce((void*)b, (void*)b, 32, Float32, Max, c, rank == 0 ? s2 : d.s) == Success);
    CHECK(cuStreamSynchronize(s2) == 0);
    CHECK(d.download<float>(a, 16)[15] == 3.0f);
    CHECK(d.download<float>(b, 32)[31] == 10.0f);
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == Success);
    CHECK(ncclCommDestroy(c) == Success);
    CHECK(ncclCommDestroy(c) == InvalidArgument);
  });
}

TEST_CASE(nccl_init_rejects_bad_ids_and_ranks) {
  run_ranks(1, [](int, const ncclUniqueId& id) {
    ncclComm_t c = nullptr;
    ncclUniqueId junk;
    std::memset(&junk, 7, sizeof junk);
    CHECK(ncclCommInitRank(&c, 2, junk, 1) == InvalidArgument);
    CHECK(std::strstr(ncclGetLastError(nullptr), "not made by") != nullptr);
    CHECK(ncclCommInitRank(&c, 2, id, 2) == InvalidArgument);
    CHECK(ncclCommInitRank(&c, 0, id, 0) == InvalidArgument);
    CHECK(ncclCommCount(nullptr, nullptr) == InvalidArgument);
    CHECK(std::strcmp(ncclGetErrorString(RemoteError), "remote process exited or there was a network error") == 0);
  });
}

TEST_CASE(nccl_init_with_disagreeing_nranks_fails_on_every_rank) {
  run_ranks(2, [](int rank, const ncclUniqueId& id) {
    ncclComm_t c = nullptr;
    int r = ncclCommInitRank(&c, rank == 1 ? 3 : 2, id, rank);
    const char* m = ncclGetLastError(nullptr);
    CHECK_MSG(r == InvalidUsage && c == nullptr, "rank %d: init returned %d", rank, r);
    CHECK_MSG(std::strstr(m, "rank 1 was given nranks 3 but rank 0 nranks 2"), "message: %s", m);
  });
}

// Large buffers go through partial non-blocking socket reads and writes.
TEST_CASE(nccl_allreduce_of_16_mib_per_rank) {
  run_ranks(3, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, 3, id);
    const size_t n = 4u << 20;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = static_cast<float>((i + rank) % 1024);
    CUdeviceptr a = d.upload(x);
    double t0 = now_s();
    CHECK(ncclAllReduce((void*)a, (void*)a, n, Float32, Sum, c, d.s) == Success);
    auto got = d.download<float>(a, n);
    double dt = now_s() - t0;
    for (size_t i = 0; i < n; i += 4099) {
      float want = static_cast<float>(i % 1024) + static_cast<float>((i + 1) % 1024) + static_cast<float>((i + 2) % 1024);
      CHECK_MSG(got[i] == want, "[%zu] = %g, want %g", i, got[i], want);
    }
    CHECK_MSG(dt < 10, "took %.2f s", dt);
    CHECK(ncclCommDestroy(c) == Success);
  });
}

// One process driving two ranks (ncclCommInitAll), both collectives in one group.
TEST_CASE(nccl_comm_init_all_in_one_process) {
  run_ranks(1, [](int, const ncclUniqueId&) {
    Dev d;
    ncclComm_t cs[2] = {nullptr, nullptr};
    CHECK(ncclCommInitAll(cs, 2, nullptr) == Success);
    int r0 = -1, r1 = -1, dev1 = -1;
    CHECK(ncclCommUserRank(cs[0], &r0) == Success && ncclCommUserRank(cs[1], &r1) == Success && r0 == 0 && r1 == 1);
    CHECK(ncclCommCuDevice(cs[1], &dev1) == Success && dev1 == 1);
    CUstream s2;
    CHECK(cuStreamCreate(&s2, 0) == 0);
    CUdeviceptr a = d.upload(std::vector<float>(10, 2.0f)), b = d.upload(std::vector<float>(10, 5.0f));
    CHECK(ncclGroupStart() == Success);
    CHECK(ncclAllReduce((void*)a, (void*)a, 10, Float32, Prod, cs[0], d.s) == Success);
    CHECK(ncclAllReduce((void*)b, (void*)b, 10, Float32, Prod, cs[1], s2) == Success);
    CHECK(ncclGroupEnd() == Success);
    CHECK(cuStreamSynchronize(s2) == 0);
    CHECK(d.download<float>(a, 10)[9] == 10.0f && d.download<float>(b, 10)[0] == 10.0f);
    CHECK(ncclCommDestroy(cs[0]) == Success && ncclCommDestroy(cs[1]) == Success);
  });
}

TEST_MAIN
