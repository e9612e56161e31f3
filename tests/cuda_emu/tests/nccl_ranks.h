// Helpers of the emulated NCCL's tests (tests/nccl_*.cpp): the driver and
// NCCL prototypes they use, f16 reference arithmetic, and run_ranks(), which
// forks one child process per rank (each its own "GPU" process, as the
// project runs them) and collects what each reports.
//
// The parent never touches CUDA, so forking is safe; every child sets up its
// own context and stream.
#pragma once
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness.h"

extern "C" {
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st* CUstream;
int cuInit(unsigned);
int cuDeviceGet(int*, int);
int cuDevicePrimaryCtxRetain(void**, int);
int cuCtxSetCurrent(void*);
int cuStreamCreate(CUstream*, unsigned);
int cuStreamSynchronize(CUstream);
int cuStreamQuery(CUstream);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
int cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);

typedef struct ncclComm* ncclComm_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
int ncclGetVersion(int*);
int ncclGetUniqueId(ncclUniqueId*);
int ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
int ncclCommDestroy(ncclComm_t);
int ncclCommAbort(ncclComm_t);
int ncclCommCount(ncclComm_t, int*);
int ncclCommUserRank(ncclComm_t, int*);
int ncclCommCuDevice(ncclComm_t, int*);
int ncclCommGetAsyncError(ncclComm_t, int*);
const char* ncclGetErrorString(int);
const char* ncclGetLastError(ncclComm_t);
int ncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
int ncclBroadcast(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
int ncclReduce(const void*, void*, size_t, int, int, int, ncclComm_t, CUstream);
int ncclAllGather(const void*, void*, size_t, int, ncclComm_t, CUstream);
int ncclReduceScatter(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclRedOpCreatePreMulSum(int*, void*, int, int, ncclComm_t);
int ncclRedOpDestroy(int, ncclComm_t);
}

namespace nt {

enum { Success = 0, SystemError = 2, InvalidArgument = 4, InvalidUsage = 5, RemoteError = 6 };
enum { Int32 = 2, Float16 = 6, Float32 = 7, Float64 = 8 };
enum { Sum = 0, Prod = 1, Max = 2, Min = 3, Avg = 4 };
enum { ScalarDevice = 0, ScalarHost = 1 };

// f16 reference, independent of the library's: float -> half by bit
// manipulation, round to nearest even. Sums/products of two halves computed in
// float and then rounded give the correctly rounded half result (float has
// more than 2*11+2 significant bits), which is what __hadd/__hmul return.
inline uint16_t f2h(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                                // below 2^-14: subnormal
    float v;
    std::memcpy(&v, &a, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(v * 16777216.0f)));
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
  uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
  return static_cast<uint16_t>(sign | h);
}

inline float h2f(uint16_t h) {
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
  return (h & 0x8000) ? -v : v;
}

// A CUDA context and stream for this child process.
struct Dev {
  CUstream s = nullptr;
  Dev() {
    int d;
    void* ctx;
    CHECK(cuInit(0) == 0);
    CHECK(cuDeviceGet(&d, 0) == 0);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d) == 0);
    CHECK(cuCtxSetCurrent(ctx) == 0);
    CHECK(cuStreamCreate(&s, 0) == 0);
  }
  template <typename T> CUdeviceptr upload(const std::vector<T>& v) {
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, v.size() * sizeof(T) + (v.empty() ? 1 : 0)) == 0);
    if (!v.empty()) CHECK(cuMemcpyHtoD_v2(p, v.data(), v.size() * sizeof(T)) == 0);
    return p;
  }
  template <typename T> std::vector<T> download(CUdeviceptr p, size_t n) {
    std::vector<T> v(n);
    CHECK(cuStreamSynchronize(s) == 0);
    if (n) CHECK(cuMemcpyDtoH_v2(v.data(), p, n * sizeof(T)) == 0);
    return v;
  }
};

inline ncclComm_t join(int rank, int n, const ncclUniqueId& id) {
  ncclComm_t c = nullptr;
  int r = ncclCommInitRank(&c, n, id, rank);
  CHECK_MSG(r == Success, "ncclCommInitRank rank %d: %d %s", rank, r, ncclGetLastError(nullptr));
  return c;
}

inline double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Forks n ranks. Rank 0 makes the unique id (so its process owns the
// listener, as in the project) and passes it to the others through pipes.
// body returns normally on success or throws harness::Failure (CHECK). Ranks
// in `may_die` are allowed to end by SIGKILL. Fails the calling test case if
// any rank fails or the whole run exceeds `limit_s` (then every child is killed).
inline void run_ranks(int n, const std::function<void(int, const ncclUniqueId&)>& body, double limit_s = 30,
                      std::vector<int> may_die = {}) {
  std::vector<int> idpipe(2 * n), outpipe(2 * n);
  for (int r = 0; r < n; r++) {
    CHECK(pipe(&idpipe[2 * r]) == 0);
    CHECK(pipe(&outpipe[2 * r]) == 0);
  }
  std::fflush(stdout);
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) {
      std::string msg;
      try {
        ncclUniqueId id;
        if (r == 0) {
          CHECK(ncclGetUniqueId(&id) == Success);
          for (int k = 1; k < n; k++) CHECK(write(idpipe[2 * k + 1], &id, sizeof id) == sizeof id);
        } else {
          CHECK(read(idpipe[2 * r], &id, sizeof id) == sizeof id);
        }
        body(r, id);
      } catch (const harness::Failure& f) {
        msg = f.why;
      }
      if (!msg.empty() && write(outpipe[2 * r + 1], msg.data(), msg.size()) < 0) _exit(3);
      _exit(msg.empty() ? 0 : 1);
    }
    pids[r] = p;
  }
  for (int r = 0; r < n; r++) {
    close(idpipe[2 * r]);
    close(idpipe[2 * r + 1]);
    close(outpipe[2 * r + 1]);
  }
  std::string why;
  double end = now_s() + limit_s;
  std::vector<bool> done(n, false);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; r++) {
      if (done[r]) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      done[r] = true;
      left--;
      char buf[4096];
      ssize_t k = read(outpipe[2 * r], buf, sizeof buf - 1);
      std::string out = k > 0 ? std::string(buf, static_cast<size_t>(k)) : "";
      bool killed_ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL &&
                       std::find(may_die.begin(), may_die.end(), r) != may_die.end();
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !killed_ok)
        why += "rank " + std::to_string(r) + " " +
               (WIFSIGNALED(st) ? "died of signal " + std::to_string(WTERMSIG(st)) : "failed") + ": " + out + "; ";
    }
    if (left > 0 && now_s() > end) {
      for (int r = 0; r < n; r++)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          why += "rank " + std::to_string(r) + " still running after " + std::to_string(limit_s) + " s; ";
        }
      break;
    }
    if (left > 0) usleep(2000);
  }
  for (int r = 0; r < n; r++) close(outpipe[2 * r]);
  CHECK_MSG(why.empty(), "%s", why.c_str());
}

}  // namespace nt
