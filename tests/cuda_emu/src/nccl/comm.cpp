// Communicator lifetime, queries, errors and user reduction ops of the
// emulated libnccl.
//
// Handles: a communicator object is never freed. ncclCommDestroy/Abort close
// its sockets and turn it into a tombstone, so a stale handle (or an operation
// still queued on a stream) finds a "closed" comm instead of freed memory, and
// every later call on it fails with ncclInvalidArgument (real NCCL: undefined
// behaviour). The exceptions are ncclGetLastError and ncclCommGetAsyncError,
// which keep answering on a tombstone: after an abort the latter reports the
// error the interrupted operation recorded (ncclRemoteError when a peer was
// seen to die, else ncclSystemError for an op cut short by the abort), or
// ncclSuccess when nothing was in flight.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cuemu/internal.h"
#include "nccl_internal.h"

// From libcuda (weak: if the driver lacks it the comm reports device 0).
extern "C" int cuCtxGetDevice(int* device) __attribute__((weak));

namespace cuemu_nccl {

namespace {

// Never destroyed: stream workers may still record errors while the process exits.
std::mutex& g_mu = *new std::mutex;              // the registry and the process-wide last error
std::set<Comm*>& g_comms = *new std::set<Comm*>;  // every communicator ever made (tombstones included)
std::string& g_last_error = *new std::string;

}  // namespace

size_t dtype_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

const char* dtype_name(int t) {
  static const char* names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",
                                "ncclInt64",   "ncclUint64",  "ncclFloat16",  "ncclFloat32",
                                "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? names[t] : "(invalid datatype)";
}

ncclResult_t set_error(Comm* c, ncclResult_t code, bool async, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (c) {
    std::lock_guard<std::mutex> g(c->mu);
    // Once the comm has failed, its first cause stays its last error: the
    // consequences (a second peer going, the abort) must not hide it from
    // a watchdog that reads the message after seeing the error.
    if (!async || c->async_error == ncclSuccess) c->last_error = buf;
    if (async && c->async_error == ncclSuccess) {
      c->async_error = code;
      c->async_msg = buf;
    }
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_last_error = buf;
  return code;
}

Comm* comm_check(void* handle, const char* fn, ncclResult_t* res, bool allow_closed) {
  Comm* c = static_cast<Comm*>(handle);
  bool known;
  {
    std::lock_guard<std::mutex> g(g_mu);
    known = c && g_comms.count(c);
  }
  if (!known) {
    *res = set_error(nullptr, ncclInvalidArgument, false, "%s: comm %p is %s", fn, handle,
                     handle ? "not a communicator made by ncclCommInitRank" : "NULL");
    return nullptr;
  }
  if (c->closed.load() && !allow_closed) {
    *res = set_error(c, ncclInvalidArgument, false, "%s: the communicator (rank %d of %d) was already destroyed "
                     "or aborted", fn, c->rank, c->nranks);
    return nullptr;
  }
  *res = ncclSuccess;
  return c;
}

namespace {

ncclResult_t init_rank(ncclComm** out, int nranks, const ncclUniqueId& id, int rank, int device) {
  if (!out) return set_error(nullptr, ncclInvalidArgument, false, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return set_error(nullptr, ncclInvalidArgument, false, "ncclCommInitRank: rank %d of nranks %d is invalid",
                     rank, nranks);
  Comm* c = new Comm;
  c->magic = kCommMagic;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  if (device < 0) {
    int d = 0;
    if (cuCtxGetDevice && cuCtxGetDevice(&d) == 0) c->device = d;
    else c->device = 0;
  }
  if (pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    delete c;
    return set_error(nullptr, ncclSystemError, false, "ncclCommInitRank: pipe2: %s", std::strerror(errno));
  }
  std::string err;
  ncclResult_t r = connect_comm(c, id, &err);
  if (r != ncclSuccess) {
    ::close(c->wake[0]);
    ::close(c->wake[1]);
    delete c;
    return set_error(nullptr, r, false, "%s (rank %d of %d)", err.c_str(), rank, nranks);
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_comms.insert(c);
  }
  *out = reinterpret_cast<ncclComm*>(c);
  return ncclSuccess;
}

// Waits until every operation enqueued on `c` finished (or an abort started).
void drain(Comm* c) {
  std::unique_lock<std::mutex> lk(c->mu);
  c->cv.wait(lk, [&] { return c->pending == 0 || c->aborting.load(); });
}

void tombstone(Comm* c) {
  close_conns(c);
  c->closed = true;
  std::lock_guard<std::mutex> g(c->mu);
  for (auto& u : c->user_ops) u.live = false;
}

}  // namespace
}  // namespace cuemu_nccl

using namespace cuemu_nccl;

NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (!version) return set_error(nullptr, ncclInvalidArgument, false, "ncclGetVersion: version is NULL");
  *version = CUEMU_NCCL_VERSION;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return set_error(nullptr, ncclInvalidArgument, false, "ncclGetUniqueId: uniqueId is NULL");
  std::string err;
  ncclResult_t r = make_unique_id(id, &err);
  if (r != ncclSuccess) return set_error(nullptr, r, false, "%s", err.c_str());
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm** comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank(comm, nranks, id, rank, -1);
}

// ncclConfig_t: only checked for NCCL's magic; blocking and the tuning fields
// change nothing here (init is always blocking, which nonblocking callers
// accept: they see ncclSuccess instead of ncclInProgress).
NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm** comm, int nranks, ncclUniqueId id, int rank,
                                                void* config) {
  if (config) {
    unsigned magic;
    std::memcpy(&magic, static_cast<char*>(config) + sizeof(size_t), sizeof magic);
    if (magic != 0xcafebeefu)
      return set_error(nullptr, ncclInvalidArgument, false,
                       "ncclCommInitRankConfig: config was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  return init_rank(comm, nranks, id, rank, -1);
}

// One process, ndev ranks: each rank joins from its own thread (the star
// needs them concurrently). Device i is devlist[i], or i without a list.
NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm** comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1)
    return set_error(nullptr, ncclInvalidArgument, false, "ncclCommInitAll: comms NULL or ndev %d < 1", ndev);
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  std::vector<ncclResult_t> res(ndev, ncclSuccess);
  std::vector<std::thread> ts;
  for (int i = 0; i < ndev; i++)
    ts.emplace_back([&, i] { res[i] = init_rank(&comms[i], ndev, id, i, devlist ? devlist[i] : i); });
  for (auto& t : ts) t.join();
  for (int i = 0; i < ndev; i++)
    if (res[i] != ncclSuccess) return res[i];
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm* comm) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclCommFinalize", &r);
  if (!c) return r;
  drain(c);
  return ncclSuccess;
}

// Waits for the communicator's enqueued operations (NCCL's destroy finalizes
// first), so with a dead peer it blocks like NCCL: use ncclCommAbort there.
NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm* comm) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclCommDestroy", &r);
  if (!c) return r;
  drain(c);
  if (c->aborting.load()) return ncclSuccess;  // an abort from another thread owns the teardown
  tombstone(c);
  return ncclSuccess;
}

// Safe to call from any thread while a stream worker is blocked inside one of
// this comm's collectives: sets the abort flag, wakes the blocked IO, and
// returns once no operation of the comm is running. Operations still queued
// behind it finish at once without communicating (their buffers untouched).
NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm* comm) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclCommAbort", &r);
  if (!c) return r;
  {
    std::unique_lock<std::mutex> lk(c->mu);
    if (c->aborting.exchange(true)) {
      lk.unlock();
      return set_error(c, ncclInvalidArgument, false, "ncclCommAbort: the communicator is already being aborted");
    }
    char b = 1;
    if (::write(c->wake[1], &b, 1) < 0) { /* the pipe is full: already woken */ }
    c->cv.notify_all();
    c->cv.wait(lk, [&] { return c->running == 0; });
  }
  tombstone(c);
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm* comm, int* count) {
  ncclResult_t r;
  Comm* c = comm_check(const_cast<ncclComm*>(comm), "ncclCommCount", &r);
  if (!c) return r;
  if (!count) return set_error(c, ncclInvalidArgument, false, "ncclCommCount: count is NULL");
  *count = c->nranks;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm* comm, int* device) {
  ncclResult_t r;
  Comm* c = comm_check(const_cast<ncclComm*>(comm), "ncclCommCuDevice", &r);
  if (!c) return r;
  if (!device) return set_error(c, ncclInvalidArgument, false, "ncclCommCuDevice: device is NULL");
  *device = c->device;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm* comm, int* rank) {
  ncclResult_t r;
  Comm* c = comm_check(const_cast<ncclComm*>(comm), "ncclCommUserRank", &r);
  if (!c) return r;
  if (!rank) return set_error(c, ncclInvalidArgument, false, "ncclCommUserRank: rank is NULL");
  *rank = c->rank;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm* comm, ncclResult_t* asyncError) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclCommGetAsyncError", &r, /*allow_closed=*/true);
  if (!c) return r;
  if (!asyncError) return set_error(c, ncclInvalidArgument, false, "ncclCommGetAsyncError: asyncError is NULL");
  std::lock_guard<std::mutex> g(c->mu);
  *asyncError = c->async_error;
  return ncclSuccess;
}

NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (see ncclGetLastError for details)";
    case ncclSystemError: return "unhandled system error (see ncclGetLastError for details)";
    case ncclInternalError: return "internal error (see ncclGetLastError for details)";
    case ncclInvalidArgument: return "invalid argument (see ncclGetLastError for details)";
    case ncclInvalidUsage: return "invalid usage (see ncclGetLastError for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "operation timed out";
    default: return "unknown result code";
  }
}

// The communicator's last failure message, else the process's (NCCL keeps
// one per process); "" when there was none. The text stays valid until the
// calling thread's next ncclGetLastError.
NCCL_EXPORT const char* ncclGetLastError(ncclComm* comm) {
  thread_local std::string copy;
  Comm* c = static_cast<Comm*>(static_cast<void*>(comm));
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!c || !g_comms.count(c)) {
      copy = g_last_error;
      return copy.c_str();
    }
  }
  {
    std::lock_guard<std::mutex> g(c->mu);
    copy = c->last_error;
  }
  if (copy.empty()) {
    std::lock_guard<std::mutex> g(g_mu);
    copy = g_last_error;
  }
  return copy.c_str();
}

NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence, ncclComm* comm) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclRedOpCreatePreMulSum", &r);
  if (!c) return r;
  size_t sz = dtype_size(datatype);
  if (!op || !scalar)
    return set_error(c, ncclInvalidArgument, false, "ncclRedOpCreatePreMulSum: op or scalar is NULL");
  if (sz == 0 || datatype == ncclFloat8e4m3 || datatype == ncclFloat8e5m2)
    return set_error(c, ncclInvalidArgument, false, "ncclRedOpCreatePreMulSum: datatype %d (%s) is not supported",
                     static_cast<int>(datatype), dtype_name(datatype));
  UserOp u;
  u.live = true;
  u.dtype = datatype;
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(&u.scalar_bits, scalar, sz);  // read now, as NCCL does
  } else if (residence == ncclScalarDevice) {
    char err[512];
    if (cuemu_check_range(scalar, sz, err, sizeof err) != 0)
      return set_error(c, ncclInvalidArgument, false,
                       "ncclRedOpCreatePreMulSum: ncclScalarDevice scalar %p is not device memory: %s", scalar, err);
    u.scalar_is_ptr = true;
    u.scalar_ptr = scalar;  // read by each collective, on the stream
  } else {
    return set_error(c, ncclInvalidArgument, false, "ncclRedOpCreatePreMulSum: residence %d is invalid",
                     static_cast<int>(residence));
  }
  std::lock_guard<std::mutex> g(c->mu);
  size_t i = 0;
  while (i < c->user_ops.size() && c->user_ops[i].live) i++;
  if (i == c->user_ops.size()) c->user_ops.push_back(u);
  else c->user_ops[i] = u;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(i));
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm* comm) {
  ncclResult_t r;
  Comm* c = comm_check(comm, "ncclRedOpDestroy", &r);
  if (!c) return r;
  int i = static_cast<int>(op) - ncclNumOps;
  std::unique_lock<std::mutex> lk(c->mu);
  if (static_cast<int>(op) < ncclNumOps || i >= static_cast<int>(c->user_ops.size()) || !c->user_ops[i].live) {
    lk.unlock();
    return set_error(c, ncclInvalidArgument, false,
                     "ncclRedOpDestroy: op %d is not a live ncclRedOpCreatePreMulSum op of this communicator",
                     static_cast<int>(op));
  }
  c->user_ops[i].live = false;
  return ncclSuccess;
}
