// Shared declarations of the emulated libnccl (src/nccl/*.cpp). The public
// types mirror cudarc 0.19.10's src/nccl/sys/mod.rs for feature "nccl-02030"
// (what cudarc's "nccl" feature selects): the Rust side passes and receives
// them as 32-bit integers, so only the listed values may ever be returned
// (PreMulSum ops are numbered from ncclNumOps = 5 up, as NCCL does before its
// mangling; cudarc's Rust enum names only 5, but small values stay inside the
// range of its discriminants 0..=0x7fffffff).
//
// Design, in one place:
//  * Topology: a star through rank 0 (the "hub"). ncclGetUniqueId opens the
//    listening socket in the calling process; that process must then be rank
//    0 of ncclCommInitRank. Every other rank holds one TCP connection to it.
//  * Every collective is a stream operation (cuemu_enqueue). Operations of one
//    communicator run one at a time, in the order they were enqueued on the
//    host (a ticket per communicator), as NCCL serializes a communicator's
//    kernels; so the sockets are only ever used by one worker thread.
//  * Per collective every rank sends the hub a header (what it called, with
//    which count/type/op/root) plus its data; the hub checks the headers agree
//    (ncclInvalidUsage on all ranks otherwise), reduces in rank order
//    0,1,..,n-1 and replies to each rank with a status and its result.
//  * A dead peer never makes a collective fail: the op keeps waiting (in short
//    poll slices) until ncclCommAbort; see transport.cpp.
//  * Asynchronous errors (ncclCommGetAsyncError), first one wins:
//      ncclRemoteError   a rank saw its connection to a peer drop (only the
//                        ranks directly connected to the dead one: rank 0, or
//                        everyone when rank 0 dies); the op stays blocked.
//      ncclSystemError   an op was cut short by ncclCommAbort.
//      ncclInvalidUsage  ranks disagreed on a collective (count, datatype, op,
//                        root, or which collective / how many): all ranks.
//    A comm with an asynchronous error refuses new collectives with it.
//    Failed ops never fail the CUDA stream (the context stays usable); their
//    output is filled with 0xFF bytes.
//  * Not emulated: ncclSend/ncclRecv, ncclCommSplit (they return
//    ncclInvalidUsage with a message), user buffer registration, fp8 types.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#define NCCL_EXPORT extern "C" __attribute__((visibility("default")))

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9,
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12,
} ncclDataType_t;

// Built-in ops; ops made by ncclRedOpCreatePreMulSum are ncclNumOps + index
// (NCCL's numbering before its per-communicator mangling).
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff,
} ncclRedOp_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

// NCCL 2.30.x, as NCCL_VERSION(2,30,0) = 2*10000 + 30*100 + 0.
#define CUEMU_NCCL_VERSION 23000

// The opaque handle type of the API; it points at a cuemu_nccl::Comm.
struct ncclComm;

namespace cuemu_nccl {

// What the collective is; also travels in the per-collective header.
enum Coll : uint32_t { kAllReduce = 1, kBroadcast, kReduce, kAllGather, kReduceScatter };
const char* coll_name(uint32_t c);

// The reduction each rank asked for. kPreMulSum covers ncclAvg of floating
// types too (NCCL implements it as PreMulSum by 1/nranks); integer ncclAvg is
// a sum followed by a division at the hub.
enum RedKind : int32_t { kRedSum = 0, kRedProd, kRedMax, kRedMin, kRedAvg, kRedPreMulSum, kRedNone = -1 };

struct UserOp {
  bool live = false;
  int dtype = 0;
  bool scalar_is_ptr = false;
  uint64_t scalar_bits = 0;       // host-immediate scalar, dtype's bytes
  const void* scalar_ptr = nullptr;  // device-resident scalar
};

struct Conn {
  int fd = -1;
  int peer = -1;                 // the rank on the other end
  bool lost = false;             // EOF or reset seen: the peer is gone
};

struct Comm {
  uint32_t magic;                // kCommMagic while the object is a communicator
  int rank = 0, nranks = 1, device = 0;
  uint64_t nonce = 0;
  std::vector<Conn> conns;       // hub: conns[r] for r >= 1; others: conns[0] = hub
  int wake[2] = {-1, -1};        // self-pipe: ncclCommAbort wakes blocked IO

  std::atomic<bool> aborting{false};
  std::atomic<bool> closed{false};  // destroyed or aborted: a tombstone

  std::mutex enqueue_mu;         // seq assignment + cuemu_enqueue, in call order
  std::mutex mu;                 // everything below
  std::condition_variable cv;
  uint64_t next_seq = 0;         // next seq to hand out at enqueue
  uint64_t next_exec = 0;        // the seq allowed to run now
  std::set<uint64_t> finished;   // seqs done out of order (dropped ops)
  int running = 0;               // ops inside their transfer now (0 or 1)
  int pending = 0;               // enqueued ops not yet finished or dropped
  ncclResult_t async_error = ncclSuccess;
  std::string async_msg;         // the message of async_error
  std::string last_error;
  std::vector<UserOp> user_ops;
};
constexpr uint32_t kCommMagic = 0x4e43434cu;  // "NCCL"

// One collective as enqueued on a stream (coll.cpp builds it on the host;
// exec_coll.cpp runs it on the stream worker).
struct Op {
  Comm* comm = nullptr;
  uint32_t coll = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;              // NCCL's count argument (per rank for all-gather/reduce-scatter)
  int dtype = 0;
  int red = kRedNone;            // RedKind; kRedNone for broadcast/all-gather
  int root = -1;                 // broadcast/reduce
  bool premul = false;           // premultiply this rank's input (PreMulSum, floating avg)
  bool scalar_is_ptr = false;
  uint64_t scalar_bits = 0;
  const void* scalar_ptr = nullptr;
  void* stream = nullptr;
  size_t send_bytes = 0, recv_bytes = 0;  // what this rank reads/writes (0: unused here)
  uint64_t seq = 0;              // position in the communicator's collective order
  bool ran = false, finished = false;
};
// Runs the transfer of `o` (its turn has come); records any failure on the
// comm (asynchronous error + message) and returns it.
ncclResult_t run_coll(Op* o);

// comm.cpp
// The communicator behind a handle, or null with the error recorded in *res
// (ncclInvalidArgument for null/garbage/destroyed handles).
Comm* comm_check(void* handle, const char* fn, ncclResult_t* res, bool allow_closed = false);
// Records a failure: the comm's and the process's last error message, and, when
// async, the comm's asynchronous error (the first one wins). Returns `code`.
ncclResult_t set_error(Comm* c, ncclResult_t code, bool async, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
size_t dtype_size(int dtype);       // 0 for an unknown type
const char* dtype_name(int dtype);

// What rank 0 sends a rank after each collective (then `payload` result
// bytes). kLostMagic marks a notice instead: rank 0 lost its connection to
// the rank in `msg`, which the others, connected only to rank 0, cannot see
// for themselves; a rank records it as its asynchronous error and keeps
// waiting, as for a peer of its own.
constexpr uint32_t kReplyMagic = 0x43554e52u;
constexpr uint32_t kLostMagic = 0x43554e4cu;
struct Reply {
  uint32_t magic;
  int32_t status;
  uint64_t payload;  // bytes of result that follow
  char msg[496];
};

// transport.cpp
// Builds the 128-byte id and the listener behind it.
ncclResult_t make_unique_id(ncclUniqueId* id, std::string* err);
// Connects this rank (star through rank 0); fills c->conns.
ncclResult_t connect_comm(Comm* c, const ncclUniqueId& id, std::string* err);
// Blocking, abortable IO on one connection. 0: done; -1: aborted (the comm's
// abort flag). A lost peer does not end the wait, it only marks conn.lost and
// records ncclRemoteError on the comm: the call keeps waiting for abort.
// A rank sending to rank 0 also takes in a lost-rank notice meanwhile (rank 0
// may not read until the lost rank's part arrives).
int xfer(Comm* c, Conn& conn, void* buf, size_t n, bool send);
// Records a lost-rank notice from rank 0 as this comm's asynchronous error.
void take_lost_notice(Comm* c, Reply& r);
// Rank 0: receives n bytes from each of ranks first..nranks-1 into
// buf + (r-first)*n, from whichever is ready, so a dead peer is noticed (and
// reported) even while another one is slow. Same return values as xfer; on
// abort *waiting_for names a rank not yet heard from.
int recv_all(Comm* c, int first, void* buf, size_t n, int* waiting_for);
void close_conns(Comm* c);

// reduce.cpp (host arithmetic on typed buffers; n elements)
uint16_t f16_from_double(double x);
double f16_to_double(uint16_t h);
uint16_t bf16_from_double(double x);
double bf16_to_double(uint16_t h);
// dst[i] = src[i] * scalar (scalar holds dtype's bytes), rounded to dtype.
void premul(int dtype, void* dst, const void* src, size_t n, uint64_t scalar);
// acc[i] = acc[i] OP in[i], each result rounded to dtype; op is a RedKind in
// {sum, prod, max, min} (avg/premulsum reduce as sum).
void combine(int dtype, int op, void* acc, const void* in, size_t n);
// acc[i] /= nranks, for the integer ncclAvg.
void divide(int dtype, void* acc, size_t n, int nranks);
// The scalar 1/nranks of a floating ncclAvg, in dtype's bits (NCCL: from
// float(1.0/nranks) for f32/f16/bf16, 1.0/nranks for f64).
uint64_t avg_scalar(int dtype, int nranks);
bool dtype_is_float(int dtype);

}  // namespace cuemu_nccl
