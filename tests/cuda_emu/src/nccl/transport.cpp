// TCP transport of the emulated NCCL: the unique id, the star of connections
// through rank 0, and abortable blocking IO.
//
// The 128-byte ncclUniqueId (all integers little-endian unless noted):
//   [0, 8)   "cuemuNCL"            magic: ids from anything else are rejected
//   [8, 12)  1                     layout version
//   [12, 16) IPv4 address          network byte order
//   [16, 18) TCP port              network byte order
//   [20, 28) nonce                 64 random bits; a connecting rank must quote it
//   [28, 32) pid of the creator    for messages
//   the rest is zero.
// ncclGetUniqueId listens on 127.0.0.1 (or CUEMU_NCCL_ADDR: "a.b.c.d" or
// "a.b.c.d:port") and keeps the listener in a per-process table keyed by the
// nonce; rank 0's ncclCommInitRank takes it from there, so rank 0 must run in
// the process that made the id. The listener serves one communicator.
//
// Failure semantics, like NCCL's kernels: a peer that dies (EOF, ECONNRESET,
// EPIPE) does NOT end a collective. The connection is marked lost, the comm
// records ncclRemoteError (what NCCL's socket/IB transports report, so a
// watchdog polling ncclCommGetAsyncError sees it), and the call keeps waiting,
// in 100 ms poll slices, until ncclCommAbort sets the abort flag and writes to
// the comm's wake pipe. Only the ranks directly connected to the dead one
// see it on their sockets (everyone else talks only to rank 0), so rank 0
// sends each of the others a notice naming the lost rank, which they record
// the same way: every survivor names the rank that died.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "nccl_internal.h"

namespace cuemu_nccl {

namespace {

const char kIdMagic[8] = {'c', 'u', 'e', 'm', 'u', 'N', 'C', 'L'};

struct IdFields {
  uint32_t addr;   // network order
  uint16_t port;   // network order
  uint64_t nonce;
  uint32_t pid;
};

std::mutex& g_listen_mu = *new std::mutex;  // never destroyed (see comm.cpp)
std::map<uint64_t, int>& g_listeners = *new std::map<uint64_t, int>;  // nonce -> listening fd (this process)

// Connection handshake.
struct Hello {
  char magic[8];
  uint64_t nonce;
  int32_t rank, nranks, device, pid;
};
struct Welcome {
  char magic[8];
  int32_t status;  // ncclResult_t
  char msg[500];
};

bool decode_id(const ncclUniqueId& id, IdFields* f) {
  if (std::memcmp(id.internal, kIdMagic, 8) != 0) return false;
  uint32_t ver;
  std::memcpy(&ver, id.internal + 8, 4);
  if (ver != 1) return false;
  std::memcpy(&f->addr, id.internal + 12, 4);
  std::memcpy(&f->port, id.internal + 16, 2);
  std::memcpy(&f->nonce, id.internal + 20, 8);
  std::memcpy(&f->pid, id.internal + 28, 4);
  return true;
}

std::string errno_text(const char* what) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: %s", what, std::strerror(errno));
  return buf;
}

// Plain blocking IO for the handshake (before the comm exists there is nothing
// to abort). False on EOF or error.
bool full_io(int fd, void* buf, size_t n, bool send) {
  char* p = static_cast<char*>(buf);
  while (n) {
    ssize_t k = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void send_welcome(int fd, ncclResult_t status, const std::string& msg) {
  Welcome w{};
  std::memcpy(w.magic, kIdMagic, 8);
  w.status = status;
  std::snprintf(w.msg, sizeof w.msg, "%s", msg.c_str());
  full_io(fd, &w, sizeof w, true);
}

// Rank 0: accepts the other nranks-1 ranks on the id's listener.
ncclResult_t accept_all(Comm* c, int lfd, std::string* err) {
  c->conns.assign(c->nranks, Conn{});
  int joined = 1;
  ncclResult_t bad = ncclSuccess;
  std::string why;
  while (joined < c->nranks && bad == ncclSuccess) {
    int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      *err = errno_text("ncclCommInitRank (rank 0): accept");
      bad = ncclSystemError;
      break;
    }
    // A silent client must not stall the job forever: 60 s to say hello.
    timeval tv{60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Hello h{};
    if (!full_io(fd, &h, sizeof h, false) || std::memcmp(h.magic, kIdMagic, 8) != 0 || h.nonce != c->nonce) {
      // Not one of ours (a stray connection, or a rank holding another id).
      send_welcome(fd, ncclInvalidArgument, "this rank's ncclUniqueId belongs to another communicator");
      ::close(fd);
      continue;
    }
    char msg[300] = "";
    if (h.nranks != c->nranks) {
      std::snprintf(msg, sizeof msg, "ncclCommInitRank: rank %d was given nranks %d but rank 0 nranks %d", h.rank,
                    h.nranks, c->nranks);
    } else if (h.rank <= 0 || h.rank >= c->nranks) {
      std::snprintf(msg, sizeof msg, "ncclCommInitRank: a rank joined as rank %d of %d (rank 0 is taken)", h.rank,
                    c->nranks);
    } else if (c->conns[h.rank].fd >= 0) {
      std::snprintf(msg, sizeof msg, "ncclCommInitRank: two processes joined as rank %d of %d", h.rank,
                    c->nranks);
    }
    if (msg[0]) {
      send_welcome(fd, ncclInvalidUsage, msg);
      ::close(fd);
      *err = msg;
      bad = ncclInvalidUsage;
      break;
    }
    timeval zero{0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof zero);
    tune(fd);
    c->conns[h.rank].fd = fd;
    c->conns[h.rank].peer = h.rank;
    joined++;
  }
  // Everyone who joined learns the outcome (so nobody waits for a comm that failed).
  for (int r = 1; r < c->nranks; r++) {
    if (c->conns[r].fd < 0) continue;
    send_welcome(c->conns[r].fd, bad, bad == ncclSuccess ? "" : "rank 0: " + *err);
  }
  return bad;
}

ncclResult_t connect_hub(Comm* c, const IdFields& f, std::string* err) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = f.addr;
  sa.sin_port = f.port;
  char where[64];
  std::snprintf(where, sizeof where, "%s:%u", inet_ntoa(sa.sin_addr), ntohs(f.port));
  // The listener exists as soon as the id does, so a refusal means rank 0's
  // process is gone or not reachable: retry for 30 s, then give up.
  int fd = -1;
  for (int attempt = 0;; attempt++) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno_text("ncclCommInitRank: socket");
      return ncclSystemError;
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) break;
    int e = errno;
    ::close(fd);
    if (attempt >= 600) {
      errno = e;
      *err = errno_text((std::string("ncclCommInitRank: cannot reach rank 0 at ") + where).c_str());
      return ncclSystemError;
    }
    usleep(50 * 1000);
  }
  tune(fd);
  Hello h{};
  std::memcpy(h.magic, kIdMagic, 8);
  h.nonce = f.nonce;
  h.rank = c->rank;
  h.nranks = c->nranks;
  h.device = c->device;
  h.pid = static_cast<int32_t>(getpid());
  Welcome w{};
  if (!full_io(fd, &h, sizeof h, true) || !full_io(fd, &w, sizeof w, false)) {
    ::close(fd);
    *err = std::string("ncclCommInitRank: rank 0 at ") + where + " closed the connection during setup";
    return ncclSystemError;
  }
  if (w.status != ncclSuccess) {
    ::close(fd);
    w.msg[sizeof w.msg - 1] = 0;
    *err = w.msg;
    return static_cast<ncclResult_t>(w.status);
  }
  c->conns.assign(1, Conn{});
  c->conns[0].fd = fd;
  c->conns[0].peer = 0;
  return ncclSuccess;
}

// Rank 0 tells the other live ranks which one it lost: best effort, one
// frame each, never blocking for long (a rank busy sending to rank 0 still
// has room to receive it).
void notify_lost(Comm* c, int lost, const char* why) {
  Reply r{};
  r.magic = kLostMagic;
  r.status = ncclRemoteError;
  std::snprintf(r.msg, sizeof r.msg,
                "rank %d lost: rank 0, through which the ranks of this communicator talk, lost its connection to "
                "rank %d (%s): the remote process exited or there was a network error; this communicator's "
                "collectives wait until ncclCommAbort",
                lost, lost, why);
  for (auto& k : c->conns) {
    if (k.lost || k.fd < 0 || k.peer == lost || k.peer == 0) continue;
    const char* p = reinterpret_cast<const char*>(&r);
    size_t left = sizeof r;
    for (int tries = 0; left && tries < 20; tries++) {
      pollfd f = {k.fd, POLLOUT, 0};
      if (::poll(&f, 1, 50) <= 0) continue;
      ssize_t m = ::send(k.fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (m <= 0) break;
      p += m;
      left -= static_cast<size_t>(m);
    }
  }
}

void mark_lost(Comm* c, Conn& conn, const char* why) {
  conn.lost = true;
  set_error(c, ncclRemoteError, true,
            "rank %d lost its connection to rank %d (%s): the remote process exited or there was a network "
            "error; this communicator's collectives wait until ncclCommAbort",
            c->rank, conn.peer, why);
  if (c->rank == 0) notify_lost(c, conn.peer, why);
}

}  // namespace

ncclResult_t make_unique_id(ncclUniqueId* id, std::string* err) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (const char* env = std::getenv("CUEMU_NCCL_ADDR"); env && *env) {
    std::string s = env, host = s;
    if (auto colon = s.find(':'); colon != std::string::npos) {
      host = s.substr(0, colon);
      sa.sin_port = htons(static_cast<uint16_t>(std::atoi(s.c_str() + colon + 1)));
    }
    if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
      *err = "ncclGetUniqueId: CUEMU_NCCL_ADDR=\"" + s + "\" is not an IPv4 address[:port]";
      return ncclInvalidArgument;
    }
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno_text("ncclGetUniqueId: socket");
    return ncclSystemError;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof sa;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 1024) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    *err = errno_text("ncclGetUniqueId: bind/listen");
    ::close(fd);
    return ncclSystemError;
  }
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    nonce = (static_cast<uint64_t>(ts.tv_nsec) << 20) ^ static_cast<uint64_t>(getpid()) ^
            reinterpret_cast<uintptr_t>(&nonce);
  }
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, kIdMagic, 8);
  uint32_t ver = 1, pid = static_cast<uint32_t>(getpid());
  std::memcpy(id->internal + 8, &ver, 4);
  std::memcpy(id->internal + 12, &sa.sin_addr.s_addr, 4);
  std::memcpy(id->internal + 16, &sa.sin_port, 2);
  std::memcpy(id->internal + 20, &nonce, 8);
  std::memcpy(id->internal + 28, &pid, 4);
  std::lock_guard<std::mutex> g(g_listen_mu);
  g_listeners[nonce] = fd;
  return ncclSuccess;
}

ncclResult_t connect_comm(Comm* c, const ncclUniqueId& id, std::string* err) {
  IdFields f;
  if (!decode_id(id, &f)) {
    *err = "ncclCommInitRank: the ncclUniqueId was not made by this (emulated) ncclGetUniqueId";
    return ncclInvalidArgument;
  }
  c->nonce = f.nonce;
  if (c->rank != 0) {
    if (c->nranks == 1) return ncclSuccess;
    return connect_hub(c, f, err);
  }
  int lfd = -1;
  {
    std::lock_guard<std::mutex> g(g_listen_mu);
    auto it = g_listeners.find(f.nonce);
    if (it != g_listeners.end()) {
      lfd = it->second;
      g_listeners.erase(it);
    }
  }
  if (lfd < 0) {
    char buf[300];
    std::snprintf(buf, sizeof buf,
                  "ncclCommInitRank: rank 0 must run in the process that called ncclGetUniqueId (pid %u) "
                  "and use its id once; this is pid %d",
                  f.pid, static_cast<int>(getpid()));
    *err = buf;
    return ncclInvalidUsage;
  }
  ncclResult_t r = c->nranks == 1 ? ncclSuccess : accept_all(c, lfd, err);
  ::close(lfd);
  if (r != ncclSuccess) close_conns(c);
  return r;
}

void take_lost_notice(Comm* c, Reply& r) {
  r.msg[sizeof r.msg - 1] = 0;
  set_error(c, static_cast<ncclResult_t>(r.status), true, "%s", r.msg);
}

int xfer(Comm* c, Conn& conn, void* buf, size_t n, bool send) {
  char* p = static_cast<char*>(buf);
  const bool to_hub = send && c->rank != 0 && conn.peer == 0;
  while (n) {
    if (c->aborting.load()) return -1;
    short events = static_cast<short>(send ? POLLOUT : POLLIN);
    if (to_hub) events |= POLLIN;
    pollfd fds[2] = {{conn.lost ? -1 : conn.fd, events, 0}, {c->wake[0], POLLIN, 0}};
    int k = ::poll(fds, 2, 100);
    if (k <= 0 || c->aborting.load()) continue;  // timeout/EINTR: look at the abort flag again
    if (conn.lost || !(fds[0].revents & (POLLIN | POLLOUT | POLLHUP | POLLERR))) continue;
    if (to_hub && (fds[0].revents & POLLIN)) {
      // Rank 0 answers only after it has read everything, so whatever comes
      // before that is a lost-rank notice.
      Reply r{};
      if (xfer(c, conn, &r, sizeof r, false)) return -1;
      if (r.magic == kLostMagic) take_lost_notice(c, r);
      continue;
    }
    ssize_t m = send ? ::send(conn.fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(conn.fd, p, n, MSG_DONTWAIT);
    if (m > 0) {
      p += m;
      n -= static_cast<size_t>(m);
    } else if (m == 0 && !send) {
      mark_lost(c, conn, "connection closed");
    } else if (m < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      mark_lost(c, conn, std::strerror(errno));
    }
  }
  return 0;
}

int recv_all(Comm* c, int first, void* buf, size_t n, int* waiting_for) {
  const int k = c->nranks - first;
  std::vector<size_t> got(k, 0);
  std::vector<pollfd> fds(k + 1);
  for (;;) {
    if (c->aborting.load()) {
      for (int i = 0; i < k; i++)
        if (got[i] < n) *waiting_for = first + i;
      return -1;
    }
    int open = 0;
    for (int i = 0; i < k; i++) {
      Conn& conn = c->conns[first + i];
      bool want = got[i] < n && !conn.lost;
      fds[i] = {want ? conn.fd : -1, POLLIN, 0};
      open += got[i] < n;
    }
    if (!open) return 0;
    fds[k] = {c->wake[0], POLLIN, 0};
    if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (int i = 0; i < k; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Conn& conn = c->conns[first + i];
      char* p = static_cast<char*>(buf) + static_cast<size_t>(i) * n;
      ssize_t m = ::recv(conn.fd, p + got[i], n - got[i], MSG_DONTWAIT);
      if (m > 0) got[i] += static_cast<size_t>(m);
      else if (m == 0) mark_lost(c, conn, "connection closed");
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) mark_lost(c, conn, std::strerror(errno));
    }
  }
}

void close_conns(Comm* c) {
  for (auto& k : c->conns) {
    if (k.fd >= 0) ::close(k.fd);
    k.fd = -1;
  }
}

}  // namespace cuemu_nccl
