// Failure semantics of the emulated NCCL, as real NCCL behaves: a rank whose
// process dies leaves its peers blocked inside the collective until
// ncclCommAbort is called from another host thread; then the stream moves
// on, and abort returns. Meanwhile every survivor reports ncclRemoteError
// naming the dead rank (rank 0, the hub of the emulated star, tells the
// ranks that are not connected to it).
// Every wait here is bounded (run_ranks kills everything after its limit).
#include <atomic>
#include <thread>

#include "nccl_ranks.h"

using namespace nt;

namespace {

// Ranks other than `victim` start an all-reduce the victim never joins (it is
// SIGKILLed after a first, successful one). They must still be blocked after
// `wait_s`; then a watchdog thread aborts and the stream must drain promptly.
void killed_rank_case(int victim) {
  const int n = 3;
  run_ranks(
      n,
      [victim](int rank, const ncclUniqueId& id) {
        Dev d;
        ncclComm_t c = join(rank, n, id);
        CUdeviceptr a = d.upload(std::vector<float>(1000, 1.0f));
        CHECK(ncclAllReduce((void*)a, (void*)a, 1000, Float32, Sum, c, d.s) == Success);
        CHECK(d.download<float>(a, 1)[0] == 3.0f);
        if (rank == victim) raise(SIGKILL);
        CHECK(ncclAllReduce((void*)a, (void*)a, 1000, Float32, Sum, c, d.s) == Success);
        std::atomic<int> query{-1}, before{-1}, abort_rc{-1};
        std::atomic<double> abort_done{0};
        std::string before_msg;
        // Rank 0 aborts last: its abort closes its sockets, which the other
        // survivors would see as a lost peer if they had not looked yet.
        std::thread watchdog([&] {
          usleep(rank == 0 ? 1200 * 1000 : 700 * 1000);
          query = cuStreamQuery(d.s);  // still blocked: CUDA_ERROR_NOT_READY
          int ae = -1;
          ncclCommGetAsyncError(c, &ae);
          before = ae;
          before_msg = ncclGetLastError(c);
          abort_rc = ncclCommAbort(c);
          abort_done = now_s();
        });
        double t0 = now_s();
        int sync = cuStreamSynchronize(d.s);
        double t_sync = now_s();
        watchdog.join();
        CHECK_MSG(query == 600, "the collective was not blocked: cuStreamQuery %d", query.load());
        CHECK_MSG(abort_rc == Success, "ncclCommAbort returned %d", abort_rc.load());
        CHECK_MSG(sync == 0, "cuStreamSynchronize after abort returned %d", sync);
        CHECK_MSG(t_sync - t0 > 0.5 && t_sync - t0 < 5, "the stream drained after %.2f s", t_sync - t0);
        CHECK(abort_done.load() - t0 < 5);
        // Every survivor reports the death before the abort, naming the victim.
        CHECK_MSG(before == RemoteError, "async error before abort: %d", before.load());
        char lost[64];
        std::snprintf(lost, sizeof lost, "lost its connection to rank %d", victim);
        CHECK_MSG(before_msg.find(lost) != std::string::npos, "rank %d's message: %s", rank, before_msg.c_str());
        int ae = -1;
        CHECK(ncclCommGetAsyncError(c, &ae) == Success);
        CHECK_MSG(ae == RemoteError, "async error after abort: %d", ae);
        // The output of the interrupted collective is poisoned, the context still works.
        CHECK(std::isnan(d.download<float>(a, 1)[0]));
        CHECK(ncclAllReduce((void*)a, (void*)a, 1000, Float32, Sum, c, d.s) == InvalidArgument);
        CHECK(ncclCommAbort(c) == InvalidArgument);
      },
      20, {victim});
}

}  // namespace

TEST_CASE(nccl_killed_leaf_rank_blocks_peers_until_abort) { killed_rank_case(2); }

TEST_CASE(nccl_killed_middle_rank_blocks_peers_until_abort) { killed_rank_case(1); }

TEST_CASE(nccl_killed_rank_zero_blocks_peers_until_abort) { killed_rank_case(0); }

// Rank 0 notices a dead rank 2 while still waiting for a live but slow rank 1
// (it watches all its connections at once), so its watchdog sees the error.
TEST_CASE(nccl_dead_peer_is_reported_while_another_is_slow) {
  run_ranks(
      3,
      [](int rank, const ncclUniqueId& id) {
        Dev d;
        ncclComm_t c = join(rank, 3, id);
        if (rank == 2) raise(SIGKILL);
        if (rank == 1) {  // never joins the collective
          usleep(1500 * 1000);
          CHECK(ncclCommAbort(c) == Success);
          return;
        }
        CUdeviceptr a = d.upload(std::vector<float>(4, 1.0f));
        CHECK(ncclAllReduce((void*)a, (void*)a, 4, Float32, Sum, c, d.s) == Success);
        int ae = Success;
        for (int i = 0; i < 100 && ae == Success; i++) {
          usleep(20 * 1000);
          CHECK(ncclCommGetAsyncError(c, &ae) == Success);
        }
        CHECK_MSG(ae == RemoteError, "async error %d", ae);
        CHECK_MSG(std::strstr(ncclGetLastError(c), "rank 0 lost its connection to rank 2"), "message: %s",
                  ncclGetLastError(c));
        CHECK(cuStreamQuery(d.s) == 600);
        CHECK(ncclCommAbort(c) == Success);
        CHECK(cuStreamSynchronize(d.s) == 0);
      },
      20, {2});
}

// Abort with operations queued behind the blocked one: they finish without
// communicating, and ncclCommAbort does not wait for them.
TEST_CASE(nccl_abort_releases_queued_operations_too) {
  run_ranks(2, [](int rank, const ncclUniqueId& id) {
    Dev d;
    ncclComm_t c = join(rank, 2, id);
    CUdeviceptr a = d.upload(std::vector<float>(10, 1.0f));
    if (rank == 1) {
      usleep(1500 * 1000);  // join nothing; just outlive rank 0's abort
      CHECK(ncclCommAbort(c) == Success);
      return;
    }
    for (int i = 0; i < 5; i++) CHECK(ncclAllReduce((void*)a, (void*)a, 10, Float32, Sum, c, d.s) == Success);
    int abort_rc = -1;
    std::thread t([&] {
      usleep(300 * 1000);
      abort_rc = ncclCommAbort(c);
    });
    double t0 = now_s();
    CHECK(cuStreamSynchronize(d.s) == 0);
    t.join();
    CHECK(abort_rc == Success);
    CHECK(now_s() - t0 < 3);
    int ae = -1;
    CHECK(ncclCommGetAsyncError(c, &ae) == Success && ae == SystemError);
  });
}

TEST_MAIN
