// The stream-side half of a collective: the wire protocol through rank 0 and
// the reduction, run on the stream worker when the op's turn has come.
//
// Per collective, every rank r > 0 sends rank 0 a Hdr (what it called: seq,
// collective, count, datatype, op, root) followed by its contribution, then
// waits for a Reply (status + message) followed by its result. Rank 0 first
// reads every header and compares them with its own; on any difference it
// drains the payloads and answers ncclInvalidUsage with one message to every
// rank (real NCCL would hang or corrupt memory).
//
// Reduction order (documented, deterministic): rank 0 starts from its own
// contribution and folds in ranks 1, 2, .., n-1 in that order:
//   result = ((x0 op x1) op x2) ... op x(n-1), every step rounded to the type
// (f16/bf16 round to nearest even per pairwise step, as NCCL's kernels do).
// For PreMulSum, and for ncclAvg of floating types (NCCL: PreMulSum by
// 1/nranks, the scalar rounded to the type), each rank first multiplies its
// own input by its scalar (rounded to the type), then the products are summed
// as above. Integer ncclAvg sums and then divides by nranks (truncating), as
// NCCL's SumPostDiv.
//
// A failure (misuse reported by rank 0, abort) is recorded on the comm as its
// asynchronous error with a message, and the output buffer is filled with 0xFF
// bytes (NaN for floats) so a result nobody checked cannot pass for data.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "nccl_internal.h"

namespace cuemu_nccl {

namespace {

constexpr uint32_t kHdrMagic = 0x43554e48u;

struct Hdr {
  uint32_t magic, coll;
  uint64_t seq, count;
  int32_t dtype, red, root, rank;
  uint64_t payload;  // bytes of contribution that follow
};

const char* red_name(int r) {
  static const char* names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg", "PreMulSum"};
  return r >= 0 && r <= kRedPreMulSum ? names[r] : "(none)";
}

void move_bytes(void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

struct Run {
  Op* o;
  Comm* c;
  size_t sz, chunk;  // element size; count * size
  int n;

  // The number of elements each rank contributes to the reduction.
  size_t red_elems() const { return o->coll == kReduceScatter ? o->count * n : o->count; }

  size_t contrib_bytes(int rank) const {
    switch (o->coll) {
      case kBroadcast: return rank == o->root ? chunk : 0;
      case kReduceScatter: return chunk * n;
      default: return chunk;
    }
  }

  // This rank's input, premultiplied by its scalar where the op says so.
  const void* contribution(std::vector<char>& tmp) const {
    if (!o->premul) return o->send;
    uint64_t s = o->scalar_bits;
    if (o->scalar_is_ptr) std::memcpy(&s, o->scalar_ptr, sz);  // device scalar: read now, on the stream
    tmp.resize(red_elems() * sz);
    premul(o->dtype, tmp.data(), o->send, red_elems(), s);
    return tmp.data();
  }

  ncclResult_t fail(ncclResult_t code, const std::string& msg) {
    set_error(c, code, true, "%s", msg.c_str());
    if (o->recv_bytes) std::memset(o->recv, 0xff, o->recv_bytes);
    return code;
  }

  ncclResult_t aborted(int peer) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s #%llu (rank %d of %d) was interrupted by ncclCommAbort while waiting for rank %d",
                  coll_name(o->coll), static_cast<unsigned long long>(o->seq), c->rank, n, peer);
    return fail(ncclSystemError, buf);
  }

  Hdr header() const {
    Hdr h{};
    h.magic = kHdrMagic;
    h.coll = o->coll;
    h.seq = o->seq;
    h.count = o->count;
    h.dtype = o->dtype;
    h.red = o->red;
    h.root = o->root;
    h.rank = c->rank;
    h.payload = contrib_bytes(c->rank);
    return h;
  }

  // "" when rank r's header agrees with rank 0's, else what differs.
  std::string compare(const Hdr& a, const Hdr& b, int r) const {
    char buf[400];
    auto seqname = [](const Hdr& h) { return coll_name(h.coll); };
    if (b.magic != kHdrMagic || b.rank != r) {
      std::snprintf(buf, sizeof buf, "rank %d sent a malformed header (protocol error)", r);
    } else if (a.seq != b.seq || a.coll != b.coll) {
      std::snprintf(buf, sizeof buf,
                    "rank 0 is at its collective #%llu (%s) but rank %d at #%llu (%s): the ranks did not make the "
                    "same collective calls in the same order",
                    static_cast<unsigned long long>(a.seq), seqname(a), r, static_cast<unsigned long long>(b.seq),
                    seqname(b));
    } else if (a.count != b.count) {
      std::snprintf(buf, sizeof buf, "%s #%llu: count mismatch: rank 0 passed count %llu, rank %d count %llu",
                    seqname(a), static_cast<unsigned long long>(a.seq), static_cast<unsigned long long>(a.count), r,
                    static_cast<unsigned long long>(b.count));
    } else if (a.dtype != b.dtype) {
      std::snprintf(buf, sizeof buf, "%s #%llu: datatype mismatch: rank 0 passed %s, rank %d %s", seqname(a),
                    static_cast<unsigned long long>(a.seq), dtype_name(a.dtype), r, dtype_name(b.dtype));
    } else if (a.red != b.red) {
      std::snprintf(buf, sizeof buf, "%s #%llu: reduction op mismatch: rank 0 passed %s, rank %d %s", seqname(a),
                    static_cast<unsigned long long>(a.seq), red_name(a.red), r, red_name(b.red));
    } else if (a.root != b.root) {
      std::snprintf(buf, sizeof buf, "%s #%llu: root mismatch: rank 0 passed root %d, rank %d root %d", seqname(a),
                    static_cast<unsigned long long>(a.seq), a.root, r, b.root);
    } else if (b.payload != contrib_bytes(r)) {
      std::snprintf(buf, sizeof buf, "rank %d sent %llu bytes where %zu were due (protocol error)", r,
                    static_cast<unsigned long long>(b.payload), contrib_bytes(r));
    } else {
      return "";
    }
    return std::string(buf) + "; every rank must pass the same count, datatype, op and root to each collective";
  }

  ncclResult_t reply(int r, ncclResult_t status, const std::string& msg, const void* data, size_t bytes) {
    Reply p{};
    p.magic = kReplyMagic;
    p.status = status;
    p.payload = bytes;
    std::snprintf(p.msg, sizeof p.msg, "%s", msg.c_str());
    if (xfer(c, c->conns[r], &p, sizeof p, true) || xfer(c, c->conns[r], const_cast<void*>(data), bytes, true))
      return aborted(r);
    return ncclSuccess;
  }

  ncclResult_t hub() {
    std::vector<Hdr> h(n);
    h[0] = header();
    int waiting = 1;
    if (recv_all(c, 1, &h[1], sizeof(Hdr), &waiting)) return aborted(waiting);
    std::string bad;
    for (int r = 1; r < n && bad.empty(); r++) bad = compare(h[0], h[r], r);
    if (!bad.empty()) {
      std::vector<char> junk(1 << 16);
      for (int r = 1; r < n; r++) {
        if (h[r].magic != kHdrMagic) continue;
        for (uint64_t left = h[r].payload; left;) {
          size_t k = static_cast<size_t>(std::min<uint64_t>(left, junk.size()));
          if (xfer(c, c->conns[r], junk.data(), k, false)) return aborted(r);
          left -= k;
        }
      }
      std::string msg = "collective misuse detected by rank 0: " + bad;
      for (int r = 1; r < n; r++)
        if (ncclResult_t e = reply(r, ncclInvalidUsage, msg, nullptr, 0)) return e;
      return fail(ncclInvalidUsage, msg);
    }
    switch (o->coll) {
      case kBroadcast: {
        std::vector<char> buf;
        const void* data = o->send;
        if (o->root != 0) {
          buf.resize(chunk);
          if (xfer(c, c->conns[o->root], buf.data(), chunk, false)) return aborted(o->root);
          data = buf.data();
        }
        move_bytes(o->recv, data, chunk);
        for (int r = 1; r < n; r++)
          if (ncclResult_t e = reply(r, ncclSuccess, "", data, r == o->root ? 0 : chunk)) return e;
        return ncclSuccess;
      }
      case kAllGather: {
        std::vector<char> buf(chunk * n);
        move_bytes(buf.data(), o->send, chunk);
        for (int r = 1; r < n; r++)
          if (xfer(c, c->conns[r], buf.data() + r * chunk, chunk, false)) return aborted(r);
        move_bytes(o->recv, buf.data(), buf.size());
        for (int r = 1; r < n; r++)
          if (ncclResult_t e = reply(r, ncclSuccess, "", buf.data(), buf.size())) return e;
        return ncclSuccess;
      }
      default: break;
    }
    // Reductions: fold ranks 1..n-1 into rank 0's contribution, in rank order.
    size_t ne = red_elems(), bytes = ne * sz;
    std::vector<char> tmp, acc(bytes), in(bytes);
    move_bytes(acc.data(), contribution(tmp), bytes);
    int base = o->red == kRedAvg || o->red == kRedPreMulSum ? kRedSum : o->red;
    for (int r = 1; r < n; r++) {
      if (xfer(c, c->conns[r], in.data(), bytes, false)) return aborted(r);
      combine(o->dtype, base, acc.data(), in.data(), ne);
    }
    if (o->red == kRedAvg && !dtype_is_float(o->dtype)) divide(o->dtype, acc.data(), ne, n);
    if (o->coll == kAllReduce) {
      move_bytes(o->recv, acc.data(), bytes);
      for (int r = 1; r < n; r++)
        if (ncclResult_t e = reply(r, ncclSuccess, "", acc.data(), bytes)) return e;
    } else if (o->coll == kReduce) {
      if (o->root == 0) move_bytes(o->recv, acc.data(), bytes);
      for (int r = 1; r < n; r++)
        if (ncclResult_t e = reply(r, ncclSuccess, "", acc.data(), r == o->root ? bytes : 0)) return e;
    } else {  // reduce-scatter: rank r gets chunk r
      move_bytes(o->recv, acc.data(), chunk);
      for (int r = 1; r < n; r++)
        if (ncclResult_t e = reply(r, ncclSuccess, "", acc.data() + r * chunk, chunk)) return e;
    }
    return ncclSuccess;
  }

  ncclResult_t leaf() {
    Conn& hubc = c->conns[0];
    Hdr h = header();
    std::vector<char> tmp;
    const void* mine = nullptr;
    if (h.payload) mine = o->coll == kBroadcast || o->coll == kAllGather ? o->send : contribution(tmp);
    if (xfer(c, hubc, &h, sizeof h, true) || xfer(c, hubc, const_cast<void*>(mine), h.payload, true))
      return aborted(0);
    Reply p{};
    do {
      if (xfer(c, hubc, &p, sizeof p, false)) return aborted(0);
      p.msg[sizeof p.msg - 1] = 0;
      if (p.magic == kLostMagic) take_lost_notice(c, p);
    } while (p.magic == kLostMagic);
    if (p.magic != kReplyMagic) return fail(ncclInternalError, "malformed reply from rank 0 (protocol error)");
    if (p.status != ncclSuccess) return fail(static_cast<ncclResult_t>(p.status), p.msg);
    size_t due = 0;
    switch (o->coll) {
      case kAllReduce: case kReduceScatter: due = chunk; break;
      case kBroadcast: due = c->rank == o->root ? 0 : chunk; break;
      case kReduce: due = c->rank == o->root ? chunk : 0; break;
      case kAllGather: due = chunk * n; break;
    }
    if (p.payload != due) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "rank 0 sent %llu result bytes where %zu were due (protocol error)",
                    static_cast<unsigned long long>(p.payload), due);
      return fail(ncclInternalError, buf);
    }
    if (xfer(c, hubc, o->recv, due, false)) return aborted(0);
    if (o->coll == kBroadcast && c->rank == o->root) move_bytes(o->recv, o->send, chunk);
    return ncclSuccess;
  }

  // One rank: the collective is a (premultiplied) copy.
  ncclResult_t alone() {
    std::vector<char> tmp;
    const void* src = o->coll == kBroadcast || o->coll == kAllGather ? o->send : contribution(tmp);
    move_bytes(o->recv, src, o->recv_bytes);
    return ncclSuccess;
  }
};

}  // namespace

ncclResult_t run_coll(Op* o) {
  Run run{o, o->comm, dtype_size(o->dtype), o->count * dtype_size(o->dtype), o->comm->nranks};
  if (run.n == 1) return run.alone();
  return o->comm->rank == 0 ? run.hub() : run.leaf();
}

}  // namespace cuemu_nccl
