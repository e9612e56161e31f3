// The profiler's kernel side: each CUDA thread's device and shared accesses
// (site, address, size) are kept until every lane of its warp has exited,
// then the warp's lanes are matched into warp-level requests the way the
// hardware issues them: the k-th access a lane makes at one instruction is
// the same request as every other lane's k-th access there. A request's
// global cost is the number of distinct 32-byte sectors its lanes touch; a
// shared one's is its wavefronts (the most distinct 4-byte words any one of
// the 32 banks must serve, per phase of a wide access). The executor runs a
// warp's lanes one after another, so matching by occurrence, not by time, is
// what reconstructs the lockstep instruction.
//
// Most warps run the same accesses in every lane (no divergence): their
// lanes are matched by position with no hashing at all.
#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "exec_internal.h"
#include "profile.h"

namespace cuemu_exec {

namespace {

// Sectors of [a, a + n) into out; returns how many.
inline int sectors_of(uintptr_t a, uint32_t n, uint64_t* out, int cap) {
  const uint64_t s0 = a >> 5, s1 = (a + (n ? n - 1 : 0)) >> 5;
  int k = 0;
  for (uint64_t s = s0; s <= s1 && k < cap; s++) out[k++] = s;
  return k;
}

// One warp-level global request: the lanes' accesses (up to 32). Its cost
// in L1 is a wavefront per distinct 128-byte line (l1tex's t-stage serves
// one line a cycle), in L2 a transfer per distinct 32-byte sector.
void global_request(LaunchProf* p, int kind, const Rec* const* r, int nlanes) {
  constexpr int kCap = 32 * 3;
  uint64_t sec[kCap];
  std::vector<uint64_t>& big = p->scratch;  // only for range accesses (a struct copy)
  big.clear();
  int ns = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < nlanes; i++) {
    bytes += r[i]->n;
    if (r[i]->n <= 64 && ns + 3 <= kCap) {
      ns += sectors_of(r[i]->addr, r[i]->n, sec + ns, 3);
    } else {
      for (uint64_t s = r[i]->addr >> 5; s <= (r[i]->addr + r[i]->n - 1) >> 5; s++) big.push_back(s);
    }
  }
  uint64_t* v = sec;
  size_t nv = (size_t)ns;
  if (!big.empty()) {
    big.insert(big.end(), sec, sec + ns);
    v = big.data();
    nv = big.size();
  }
  bool sorted = true;
  for (size_t i = 1; i < nv && sorted; i++) sorted = v[i - 1] <= v[i];
  if (!sorted) std::sort(v, v + nv);
  size_t uniq = 0, lines = 0;
  for (size_t i = 0; i < nv; i++) {
    if (i > 0 && v[i] == v[uniq - 1]) continue;
    if (uniq == 0 || (v[i] >> 2) != (v[uniq - 1] >> 2)) lines++;
    v[uniq++] = v[i];
  }
  p->req[kind]++;
  p->sectors[kind] += uniq;
  p->wavefronts[kind] += lines;
  p->bytes[kind] += bytes;
  // The launch's footprint for the L2 model: loads read, stores write, an
  // atomic does both (at the L2, where the hardware performs it). A run of
  // requests over the same sectors (a loop over a row) adds them once.
  for (size_t i = 0; i < uniq; i++) {
    if (kind != CUEMU_PROF_ST && (p->read_sectors.empty() || p->read_sectors.back() != v[i]))
      p->read_sectors.push_back(v[i]);
    if (kind != CUEMU_PROF_LD && (p->write_sectors.empty() || p->write_sectors.back() != v[i]))
      p->write_sectors.push_back(v[i]);
  }
}

// One warp-level shared request. An access of 8 (16) bytes is served a half
// (quarter) warp at a time; in each phase a bank serves one 4-byte word per
// wavefront, and lanes reading the same word share it (broadcast).
void shared_request(LaunchProf* p, int kind, const Rec* const* r, int nlanes) {
  uint32_t widest = 4;
  uint64_t bytes = 0;
  for (int i = 0; i < nlanes; i++) {
    widest = std::max(widest, r[i]->n);
    bytes += r[i]->n;
  }
  const int per_phase = widest >= 16 ? 8 : widest >= 8 ? 16 : 32;
  uint64_t wavefronts = 0;
  for (int base = 0; base < nlanes; base += per_phase) {
    uint64_t words[32 * 4];
    int nw = 0;
    for (int i = base; i < std::min(nlanes, base + per_phase); i++) {
      const uint64_t w0 = r[i]->addr >> 2, w1 = (r[i]->addr + (r[i]->n ? r[i]->n - 1 : 0)) >> 2;
      for (uint64_t w = w0; w <= w1 && nw < 128; w++) words[nw++] = w;
    }
    std::sort(words, words + nw);
    nw = (int)(std::unique(words, words + nw) - words);
    int per_bank[32] = {};
    int most = 0;
    for (int i = 0; i < nw; i++) most = std::max(most, ++per_bank[words[i] & 31]);
    wavefronts += (uint64_t)most;
  }
  p->req[kind]++;
  p->bytes[kind] += bytes;
  p->sh_wavefronts += wavefronts;
  // The conflict-free minimum: 128 bytes a wavefront.
  p->sh_ideal += std::max<uint64_t>(1, (bytes + 127) / 128);
}

void request(LaunchProf* p, const Rec* const* r, int nlanes) {
  const int kind = r[0]->kind;
  if (kind == CUEMU_PROF_SHLD || kind == CUEMU_PROF_SHST)
    shared_request(p, kind, r, nlanes);
  else
    global_request(p, kind, r, nlanes);
}

// The lanes [t0, t1) of one warp have all exited: their requests.
void warp_done(Worker* w, int t0, int t1) {
  LaunchProf* p = w->prof;
  std::vector<Rec>* lane = p->lane;
  const int n = t1 - t0;
  uint64_t global_reqs = p->req[CUEMU_PROF_LD] + p->req[CUEMU_PROF_ST] + p->req[CUEMU_PROF_ATOM];
  bool same = true;
  const size_t len = lane[t0].size();
  for (int t = t0 + 1; t < t1 && same; t++) {
    if (lane[t].size() != len) {
      same = false;
      break;
    }
    for (size_t i = 0; i < len; i++)
      if (lane[t][i].site != lane[t0][i].site) {
        same = false;
        break;
      }
  }
  const Rec* grp[32];
  if (same) {
    for (size_t i = 0; i < len; i++) {
      for (int j = 0; j < n; j++) grp[j] = &lane[t0 + j][i];
      request(p, grp, n);
    }
  } else {
    // Divergent lanes: (site, occurrence) -> the request's lanes, in the
    // order the warp first reached each one.
    std::map<std::pair<uintptr_t, uint32_t>, int> index;
    std::vector<std::vector<const Rec*>> groups;
    for (int t = t0; t < t1; t++) {
      std::unordered_map<uintptr_t, uint32_t> occ;
      for (const Rec& r : lane[t]) {
        const auto key = std::make_pair(r.site, occ[r.site]++);
        auto it = index.find(key);
        if (it == index.end()) {
          it = index.emplace(key, (int)groups.size()).first;
          groups.emplace_back();
        }
        groups[it->second].push_back(&r);
      }
    }
    for (auto& g : groups) request(p, g.data(), (int)g.size());
  }
  const uint64_t mine = p->req[CUEMU_PROF_LD] + p->req[CUEMU_PROF_ST] + p->req[CUEMU_PROF_ATOM] - global_reqs;
  p->max_warp_requests = std::max(p->max_warp_requests, mine);
  p->warps++;
  for (int t = t0; t < t1; t++) lane[t].clear();
}

}  // namespace

void prof_launch_start(Worker* w) {
  if (!cuemu_profile_enabled()) return;
  if (!w->prof) w->prof = new LaunchProf();
  w->prof->reset();
  prof_blocks_start(w);
}

LaunchProf* last_launch_profile() { return tls_w ? tls_w->prof : nullptr; }

void prof_thread_done(Worker* w, int t) {
  const int warp = t / 32, t0 = warp * 32, t1 = std::min(w->nthreads, t0 + 32);
  const uint32_t full = t1 - t0 == 32 ? 0xffffffffu : ((1u << (t1 - t0)) - 1u);
  if (w->warp_done[warp] == full) warp_done(w, t0, t1);
}

}  // namespace cuemu_exec

using namespace cuemu_exec;

CUEMU_EXPORT void cuemu_profile_access(uintptr_t a, uint32_t n, int kind, const void* site) {
  Worker* w = tls_w;
  if (!w || !w->in_kernel || w->cur < 0 || !w->prof) return;
  w->prof->lane[w->cur].push_back(Rec{(uintptr_t)site, a, n, (uint8_t)kind});
}

