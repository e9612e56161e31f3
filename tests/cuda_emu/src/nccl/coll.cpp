// The collective entry points of the emulated libnccl: host-side validation,
// ncclGroupStart/End, and enqueueing each collective as a stream operation.
//
// Call-time checks (returned at once, like NCCL's argument checks): comm,
// datatype, op (a PreMulSum op must belong to this comm and match the
// datatype), root, buffer ranges (cuemu_check_range: send count x size, recv
// count x size, x nranks where the API says so), and overlap: buffers may
// only alias in NCCL's in-place layouts (send == recv; all-gather send ==
// recv + rank*count; reduce-scatter recv == send + rank*count), any other
// overlap is ncclInvalidArgument. A communicator that has an asynchronous
// error refuses further collectives with that error (NCCL refuses them too).
//
// The transfer itself runs later, on the stream worker (exec_coll.cpp), with
// the accesses declared to the driver: send read, recv written.
#include <cstdio>
#include <cstring>
#include <string>

#include "cuemu/internal.h"
#include "nccl_internal.h"

namespace cuemu_nccl {

const char* coll_name(uint32_t c) {
  switch (c) {
    case kAllReduce: return "ncclAllReduce";
    case kBroadcast: return "ncclBroadcast";
    case kReduce: return "ncclReduce";
    case kAllGather: return "ncclAllGather";
    case kReduceScatter: return "ncclReduceScatter";
  }
  return "(unknown collective)";
}

namespace {

// Group state is per host thread, as in NCCL.
thread_local int t_depth = 0;
thread_local std::vector<Op*> t_group;
thread_local ncclResult_t t_group_err = ncclSuccess;
// Whether the driver dropped (destroyed) the op during a failed cuemu_enqueue.
thread_local Op* t_enqueuing = nullptr;
thread_local bool t_dropped = false;

// With c->mu held: the op's turn is over (ran, skipped or dropped).
void finish_seq(Comm* c, Op* o) {
  if (o->finished) return;
  o->finished = true;
  c->finished.insert(o->seq);
  while (c->finished.erase(c->next_exec)) c->next_exec++;
  c->cv.notify_all();
}

// Stream worker: waits for the op's turn in the comm's order (NCCL runs one
// communicator's collectives one after another whatever streams they are
// on), then transfers. NCCL-level failures are recorded on the comm and do
// not fail the stream (the CUDA context stays usable, as with a real NCCL
// kernel that was aborted); the output buffer is then poisoned (0xFF bytes).
int op_run(void* user, char*, size_t) {
  Op* o = static_cast<Op*>(user);
  Comm* c = o->comm;
  o->ran = true;
  {
    std::unique_lock<std::mutex> lk(c->mu);
    c->cv.wait(lk, [&] { return c->next_exec == o->seq || c->aborting.load(); });
    if (c->aborting.load()) {
      finish_seq(c, o);
      return 0;
    }
    c->running++;
  }
  run_coll(o);
  std::lock_guard<std::mutex> g(c->mu);
  c->running--;
  finish_seq(c, o);
  return 0;
}

// Called once per op by the driver, after it ran or when it was dropped.
// An op refused by cuemu_enqueue itself (dropped synchronously, on this
// thread) never happened: its seq is handed back, so the ranks stay in step.
void op_drop(void* user) {
  Op* o = static_cast<Op*>(user);
  Comm* c = o->comm;
  {
    std::lock_guard<std::mutex> g(c->mu);
    if (o == t_enqueuing) {
      t_dropped = true;
      c->next_seq--;  // enqueue_mu is held: o->seq is the last one handed out
    } else {
      finish_seq(c, o);  // dropped later (e.g. a dead context): its turn is given up
    }
    c->pending--;
    c->cv.notify_all();
  }
  delete o;
}

ncclResult_t enqueue_op(Op* o) {
  Comm* c = o->comm;
  std::lock_guard<std::mutex> eg(c->enqueue_mu);
  {
    std::lock_guard<std::mutex> g(c->mu);
    o->seq = c->next_seq++;
    c->pending++;
  }
  cuemu_access acc[3];
  int na = 0;
  const char* s = static_cast<const char*>(o->send);
  char* r = static_cast<char*>(o->recv);
  bool send_in_recv = o->send_bytes && o->recv_bytes && s >= r && s + o->send_bytes <= r + o->recv_bytes;
  bool recv_in_send = o->send_bytes && o->recv_bytes && r >= s && r + o->recv_bytes <= s + o->send_bytes;
  if (send_in_recv) {
    acc[na++] = {r, o->recv_bytes, 1};  // in place: the write covers the read
  } else if (recv_in_send) {
    acc[na++] = {s, o->send_bytes, 1};  // in-place reduce-scatter: declared as a write of all of send
  } else {
    if (o->send_bytes) acc[na++] = {s, o->send_bytes, 0};
    if (o->recv_bytes) acc[na++] = {r, o->recv_bytes, 1};
  }
  if (o->scalar_is_ptr) acc[na++] = {o->scalar_ptr, dtype_size(o->dtype), 0};
  const uint32_t coll = o->coll;  // `o` may be freed by the driver from here on
  t_enqueuing = o;
  t_dropped = false;
  int rc = cuemu_enqueue(o->stream, coll_name(o->coll), acc, na, op_run, o, op_drop);
  t_enqueuing = nullptr;
  if (rc != 0) {
    const char* why = cuemuLastErrorMessage();
    std::string msg = why ? why : "";
    if (!t_dropped) {
      t_enqueuing = o;
      op_drop(o);
      t_enqueuing = nullptr;
    }
    return set_error(c, ncclUnhandledCudaError, false, "%s: the stream refused the operation (CUresult %d): %s",
                     coll_name(coll), rc, msg.c_str());
  }
  return ncclSuccess;
}

ncclResult_t group_fail(ncclResult_t r) {
  if (t_depth > 0 && t_group_err == ncclSuccess) t_group_err = r;
  return r;
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  if (!an || !bn) return false;
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x < y + bn && y < x + an;
}

ncclResult_t issue(uint32_t coll, const void* send, void* recv, size_t count, int dtype, int op, int root,
                   ncclComm* comm, void* stream) {
  const char* fn = coll_name(coll);
  ncclResult_t r;
  Comm* c = comm_check(comm, fn, &r);
  if (!c) return group_fail(r);
  ncclResult_t earlier;
  std::string earlier_msg;
  {
    std::lock_guard<std::mutex> g(c->mu);
    earlier = c->async_error;
    earlier_msg = c->async_msg;
  }
  if (earlier != ncclSuccess)
    return group_fail(set_error(c, earlier, false, "%s: the communicator failed earlier: %s", fn,
                                earlier_msg.c_str()));
  const int n = c->nranks;
  size_t sz = dtype_size(dtype);
  if (sz == 0 || dtype == ncclFloat8e4m3 || dtype == ncclFloat8e5m2)
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: datatype %d (%s) is not supported", fn, dtype,
                                dtype_name(dtype)));
  Op o;
  o.comm = c;
  o.coll = coll;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dtype;
  o.stream = stream;
  bool reducing = coll == kAllReduce || coll == kReduce || coll == kReduceScatter;
  if (reducing) {
    if (op >= 0 && op < ncclNumOps) {
      o.red = op;
      if (op == ncclAvg && dtype_is_float(dtype)) {  // NCCL: PreMulSum by 1/nranks
        o.premul = true;
        o.scalar_bits = avg_scalar(dtype, n);
      }
    } else {
      int i = op - ncclNumOps;
      UserOp u;  // a copy: the op may be destroyed while this collective is queued
      {
        std::lock_guard<std::mutex> g(c->mu);
        if (op >= ncclNumOps && i < static_cast<int>(c->user_ops.size())) u = c->user_ops[i];
      }
      if (!u.live)
        return group_fail(set_error(c, ncclInvalidArgument, false,
                                    "%s: op %d is neither a built-in op nor a live PreMulSum op of this communicator",
                                    fn, op));
      if (u.dtype != dtype)
        return group_fail(set_error(c, ncclInvalidArgument, false,
                                    "%s: PreMulSum op %d was created for %s but used with %s", fn, op,
                                    dtype_name(u.dtype), dtype_name(dtype)));
      o.red = kRedPreMulSum;
      o.premul = true;
      o.scalar_is_ptr = u.scalar_is_ptr;
      o.scalar_bits = u.scalar_bits;
      o.scalar_ptr = u.scalar_ptr;
    }
  }
  if ((coll == kBroadcast || coll == kReduce) && (root < 0 || root >= n))
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: root %d is not a rank of a world of %d", fn,
                                root, n));
  if (coll == kBroadcast || coll == kReduce) o.root = root;
  size_t scale = (coll == kAllGather || coll == kReduceScatter) ? static_cast<size_t>(n) : 1;
  if (count > SIZE_MAX / sz / scale)
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: count %zu overflows", fn, count));
  size_t bytes = count * sz;
  switch (coll) {
    case kAllReduce: o.send_bytes = o.recv_bytes = bytes; break;
    case kBroadcast: o.send_bytes = c->rank == root ? bytes : 0; o.recv_bytes = bytes; break;
    case kReduce: o.send_bytes = bytes; o.recv_bytes = c->rank == root ? bytes : 0; break;
    case kAllGather: o.send_bytes = bytes; o.recv_bytes = bytes * n; break;
    case kReduceScatter: o.send_bytes = bytes * n; o.recv_bytes = bytes; break;
  }
  char err[512];
  if (o.send_bytes && cuemu_check_range(send, o.send_bytes, err, sizeof err) != 0)
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: sendbuff %p (%zu bytes): %s", fn, send,
                                o.send_bytes, err));
  if (o.recv_bytes && cuemu_check_range(recv, o.recv_bytes, err, sizeof err) != 0)
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: recvbuff %p (%zu bytes): %s", fn, recv,
                                o.recv_bytes, err));
  if (o.scalar_is_ptr && cuemu_check_range(o.scalar_ptr, sz, err, sizeof err) != 0)
    return group_fail(set_error(c, ncclInvalidArgument, false, "%s: the PreMulSum device scalar %p: %s", fn,
                                o.scalar_ptr, err));
  if (overlap(send, o.send_bytes, recv, o.recv_bytes)) {
    const char* s = static_cast<const char*>(send);
    const char* rv = static_cast<const char*>(recv);
    bool ok = coll == kAllGather       ? s == rv + c->rank * bytes
              : coll == kReduceScatter ? rv == s + c->rank * bytes
                                       : s == rv;
    if (!ok)
      return group_fail(set_error(c, ncclInvalidArgument, false,
                                  "%s: sendbuff %p and recvbuff %p overlap but not in NCCL's in-place layout", fn,
                                  send, recv));
  }
  Op* heap = new Op(o);
  if (t_depth > 0) {
    t_group.push_back(heap);
    return ncclSuccess;
  }
  return enqueue_op(heap);
}

}  // namespace
}  // namespace cuemu_nccl

using namespace cuemu_nccl;

NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, ncclComm* comm, void* stream) {
  cuemuAddCounter("allreduce_calls", 1);
  cuemuAddCounter("allreduce_bytes", (long long)(count * dtype_size(datatype)));
  return issue(kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

NCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm* comm, void* stream) {
  return issue(kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

// The legacy in-place broadcast.
NCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm* comm,
                                   void* stream) {
  return issue(kBroadcast, buff, buff, count, datatype, ncclSum, root, comm, stream);
}

NCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, int root, ncclComm* comm, void* stream) {
  return issue(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm* comm, void* stream) {
  return issue(kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm, stream);
}

NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm* comm, void* stream) {
  return issue(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream);
}

NCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  t_depth++;
  return ncclSuccess;
}

// Closing the outermost group enqueues the collected operations in call
// order. A call in the group that failed its checks fails the whole group:
// nothing is enqueued and ncclGroupEnd returns that call's error (as NCCL).
NCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (t_depth == 0)
    return set_error(nullptr, ncclInvalidUsage, false, "ncclGroupEnd: no ncclGroupStart is open on this thread");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<Op*> ops;
  ops.swap(t_group);
  ncclResult_t err = t_group_err;
  t_group_err = ncclSuccess;
  size_t i = 0;
  for (; i < ops.size() && err == ncclSuccess; i++) err = enqueue_op(ops[i]);
  if (err != ncclSuccess)
    for (; i < ops.size(); i++) delete ops[i];
  return err;
}

// Point-to-point and communicator splitting are not emulated: say so rather
// than let cudarc panic on a missing symbol.
NCCL_EXPORT ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm* comm, void*) {
  return group_fail(set_error(nullptr, ncclInvalidUsage, false, "ncclSend is not emulated by cuda_emu (comm %p)",
                              static_cast<void*>(comm)));
}
NCCL_EXPORT ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm* comm, void*) {
  return group_fail(set_error(nullptr, ncclInvalidUsage, false, "ncclRecv is not emulated by cuda_emu (comm %p)",
                              static_cast<void*>(comm)));
}
NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm* comm, int, int, ncclComm** newcomm, void*) {
  if (newcomm) *newcomm = nullptr;
  return set_error(nullptr, ncclInvalidUsage, false, "ncclCommSplit is not emulated by cuda_emu (comm %p)",
                   static_cast<void*>(comm));
}
