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
#include <utility>

#include "exec_internal.h"
#include "profile.h"

namespace cuemu_exec {

namespace {

using PerfSlot = LaunchProf::Slot;

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
  // atomic does both (at the L2, where the hardware performs it). A sector
  // the filter holds was added already.
  constexpr uint64_t mask = LaunchProf::kFootprintFilter - 1;
  for (size_t i = 0; i < uniq; i++) {
    const uint64_t s = v[i], tag = s + 1;
    if (kind != CUEMU_PROF_ST && p->read_filter[s & mask] != tag) {
      p->read_filter[s & mask] = tag;
      p->read_sectors.push_back(s);
    }
    if (kind != CUEMU_PROF_LD && p->write_filter[s & mask] != tag) {
      p->write_filter[s & mask] = tag;
      p->write_sectors.push_back(s);
    }
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

// Open addressing over `table` (a power of two, at least twice the keys),
// whose slots are empty unless they carry the current generation: clearing
// it between warps is one increment.
PerfSlot* find_slot(std::vector<PerfSlot>& table, uint32_t gen, uint32_t site, uint32_t occ) {
  const size_t mask = table.size() - 1;
  uint64_t h = (uint64_t)site * 0x9e3779b97f4a7c15ull ^ (uint64_t)occ * 0xc2b2ae3d27d4eb4full;
  for (size_t i = (h >> 32) & mask;; i = (i + 1) & mask) {
    PerfSlot& s = table[i];
    if (s.gen != gen) {
      s = PerfSlot{site, occ, gen, -1};
      return &s;
    }
    if (s.site == site && s.occ == occ) return &s;
  }
}

// A fresh generation of `table`, sized for `keys` keys.
uint32_t next_gen(std::vector<PerfSlot>& table, uint32_t& gen, size_t keys) {
  size_t want = 64;
  while (want < 2 * keys) want *= 2;
  if (table.size() < want || ++gen == 0) {
    table.assign(std::max(want, table.size()), PerfSlot{0, 0, 0, -1});
    gen = 1;
  }
  return gen;
}

// Divergent lanes: the k-th access of a lane at a site joins the request
// (site, k), requests in the order the warp first reached them, lanes in
// lane order within each.
void divergent_warp(LaunchProf* p, const std::vector<Rec>* lane, int n) {
  size_t total = 0, longest = 0;
  for (int t = 0; t < n; t++) {
    total += lane[t].size();
    longest = std::max(longest, lane[t].size());
  }
  const uint32_t rgen = next_gen(p->request_of, p->request_gen, total);
  p->member.clear();
  int groups = 0;
  for (int t = 0; t < n; t++) {
    const uint32_t sgen = next_gen(p->seen, p->seen_gen, longest);
    for (const Rec& r : lane[t]) {
      PerfSlot* s = find_slot(p->seen, sgen, r.site, 0);
      const uint32_t occ = (uint32_t)(s->group + 1);  // occurrences so far, -1 when new
      s->group = (int)occ;
      PerfSlot* g = find_slot(p->request_of, rgen, r.site, occ);
      if (g->group < 0) g->group = groups++;
      p->member.emplace_back(g->group, &r);
    }
  }
  // Counting sort by request, stable, so each request's lanes keep their order.
  p->group_start.assign((size_t)groups + 1, 0);
  for (const auto& m : p->member) p->group_start[(size_t)m.first + 1]++;
  for (int g = 0; g < groups; g++) p->group_start[(size_t)g + 1] += p->group_start[(size_t)g];
  p->grouped.resize(p->member.size());
  {
    std::vector<int>& at = p->group_start;
    for (const auto& m : p->member) p->grouped[(size_t)at[(size_t)m.first]++] = m.second;
    // `at` now holds each request's end; its start is the previous one's end.
    for (int g = groups; g > 0; g--) at[(size_t)g] = at[(size_t)g - 1];
    at[0] = 0;
  }
  for (int g = 0; g < groups; g++) {
    const int b = p->group_start[(size_t)g], e = p->group_start[(size_t)g + 1];
    request(p, p->grouped.data() + b, e - b);
  }
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
    divergent_warp(p, lane + t0, n);
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

namespace {
inline void record(uintptr_t a, size_t n, int kind, const void* site) {
  Worker* w = tls_w;
  if (!w || !w->in_kernel || w->cur < 0 || !w->prof) return;
  const uint32_t bytes = n < (1u << 28) ? (uint32_t)n : (1u << 28) - 1;
  w->prof->lane[w->cur].push_back(Rec{a, (uint32_t)(uintptr_t)site, bytes, (uint32_t)kind});
}
}  // namespace

// A profiled object's access: checked and recorded in one call.
CUEMU_EXPORT void cuemu_profile_device(uintptr_t a, size_t n, int write, int kind, const void* site) {
  cuemu_check_device(a, n, write);
  record(a, n, kind, site);
}

CUEMU_EXPORT void cuemu_profile_shared(uintptr_t a, size_t n, int write, int kind, const void* site) {
  cuemu_check_shared(a, n, write);
  record(a, n, kind, site);
}

