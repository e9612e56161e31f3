// The profiler's records (CUEMU_PROFILE=<file>): one JSON line per device
// operation, and the L2 model that turns each operation's sectors into DRAM
// bytes. A kernel's record also has its arithmetic (src/exec/profile_blocks.cpp).
//
// The L2 model: a set of resident 32-byte sectors of CUEMU_L2_BYTES (default
// 50 MiB, an H100's and an H200's L2), least recently used out, at the
// granularity of whole operations (the sectors one operation touched are one
// age). A read of a sector not resident is a DRAM read; every sector written
// is a DRAM write (the write-back happens sooner or later). Reuse inside one
// operation is taken to hit, which is what the hardware's L1 and L2 give a
// kernel whose footprint fits them; an operation larger than the L2 is
// counted at its footprint, a lower bound.
//
// Records are written on the stream worker when the operation runs, with the
// ticket it got on the host at enqueue: sorting by `seq` gives host order,
// which is the same in every run of the same program (worker timing is not).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <errno.h>

#include <algorithm>
#include <iterator>
#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../exec/profile.h"
#include "driver.h"
#include "profile.h"

namespace cuemu {

namespace {

std::atomic<unsigned long long> g_ticket{0};

struct Profiler {
  std::mutex mu;
  FILE* out = nullptr;
  bool failed = false;
  // The L2 model.
  std::unordered_map<uint64_t, uint64_t> stamp;  // resident sector -> the age it was last touched
  std::deque<std::pair<uint64_t, std::vector<uint64_t>>> ages;
  uint64_t age = 0, capacity = 0;

  // Sorted, unique sectors read and written by one operation: DRAM bytes.
  void through_l2(const std::vector<uint64_t>& rd, const std::vector<uint64_t>& wr, uint64_t* dram_rd,
                  uint64_t* dram_wr) {
    const uint64_t a = ++age;
    uint64_t miss = 0;
    for (uint64_t s : rd) {
      auto it = stamp.find(s);
      if (it == stamp.end())
        miss++, stamp.emplace(s, a);
      else
        it->second = a;
    }
    for (uint64_t s : wr) stamp[s] = a;
    *dram_rd = miss * 32;
    *dram_wr = (uint64_t)wr.size() * 32;
    std::vector<uint64_t> touched;
    touched.reserve(rd.size() + wr.size());
    std::set_union(rd.begin(), rd.end(), wr.begin(), wr.end(), std::back_inserter(touched));
    ages.emplace_back(a, std::move(touched));
    while (stamp.size() > capacity && !ages.empty()) {
      auto& [old, secs] = ages.front();
      for (uint64_t s : secs) {
        auto it = stamp.find(s);
        if (it != stamp.end() && it->second == old) stamp.erase(it);
      }
      ages.pop_front();
    }
  }

  void write(const std::string& line) {
    if (failed) return;
    if (!out) {
      std::string path = getenv("CUEMU_PROFILE");
      for (size_t i = path.find("%p"); i != std::string::npos; i = path.find("%p"))
        path.replace(i, 2, std::to_string((long)getpid()));
      out = fopen(path.c_str(), "w");
      if (!out) {
        fprintf(stderr, "cuemu: cannot write the profile to %s: %s\n", path.c_str(), strerror(errno));
        failed = true;
        return;
      }
    }
    fputs(line.c_str(), out);
    fflush(out);  // a process may end in _exit or a signal: every record is complete on disk
  }
};

Profiler& prof() {
  static Profiler* p = [] {
    auto* q = new Profiler();
    unsigned long long bytes = 50ull << 20;
    if (const char* e = getenv("CUEMU_L2_BYTES"); e && *e) bytes = strtoull(e, nullptr, 10);
    q->capacity = bytes / 32;
    return q;
  }();
  return *p;
}

void sort_unique(std::vector<uint64_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// The sectors of a span set.
void span_sectors(const cuemu_prof_span* sp, int n, std::vector<uint64_t>& rd, std::vector<uint64_t>& wr) {
  for (int i = 0; i < n; i++) {
    auto& dst = sp[i].write ? wr : rd;
    for (size_t c = 0; c < sp[i].count; c++) {
      const uintptr_t a = sp[i].ptr + (uintptr_t)((long long)c * sp[i].stride);
      if (sp[i].run_bytes == 0) continue;
      for (uint64_t s = a >> 5; s <= (a + sp[i].run_bytes - 1) >> 5; s++) dst.push_back(s);
    }
  }
  sort_unique(rd);
  sort_unique(wr);
}

}  // namespace

unsigned long long profile_ticket() { return g_ticket.fetch_add(1, std::memory_order_relaxed); }

void profile_kernel(unsigned long long ticket, const char* name, cuemu_dim3 grid, cuemu_dim3 block, size_t smem) {
  cuemu_exec::LaunchProf* p = cuemu_exec::last_launch_profile();
  if (!p) return;
  sort_unique(p->read_sectors);
  sort_unique(p->write_sectors);
  Profiler& pr = prof();
  std::lock_guard<std::mutex> lk(pr.mu);
  uint64_t dram_rd = 0, dram_wr = 0;
  pr.through_l2(p->read_sectors, p->write_sectors, &dram_rd, &dram_wr);
  const unsigned long long threads = (unsigned long long)grid.x * grid.y * grid.z * block.x * block.y * block.z;
  char buf[1536];
  snprintf(buf, sizeof buf,
           "{\"seq\":%llu,\"kind\":\"kernel\",\"name\":\"%s\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],"
           "\"dynamic_smem\":%zu,\"threads\":%llu,\"warps\":%llu,\"max_warp_requests\":%llu,"
           "\"ld_requests\":%llu,\"ld_sectors\":%llu,\"ld_bytes\":%llu,"
           "\"st_requests\":%llu,\"st_sectors\":%llu,\"st_bytes\":%llu,"
           "\"atom_requests\":%llu,\"atom_sectors\":%llu,"
           "\"shared_ld_requests\":%llu,\"shared_st_requests\":%llu,\"shared_bytes\":%llu,"
           "\"shared_wavefronts\":%llu,\"shared_wavefronts_ideal\":%llu,"
           "\"unique_read_sectors\":%zu,\"unique_write_sectors\":%zu,\"dram_read\":%llu,\"dram_write\":%llu",
           ticket, name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, threads,
           (unsigned long long)p->warps, (unsigned long long)p->max_warp_requests,
           (unsigned long long)p->req[CUEMU_PROF_LD], (unsigned long long)p->sectors[CUEMU_PROF_LD],
           (unsigned long long)p->bytes[CUEMU_PROF_LD], (unsigned long long)p->req[CUEMU_PROF_ST],
           (unsigned long long)p->sectors[CUEMU_PROF_ST], (unsigned long long)p->bytes[CUEMU_PROF_ST],
           (unsigned long long)p->req[CUEMU_PROF_ATOM], (unsigned long long)p->sectors[CUEMU_PROF_ATOM],
           (unsigned long long)p->req[CUEMU_PROF_SHLD], (unsigned long long)p->req[CUEMU_PROF_SHST],
           (unsigned long long)(p->bytes[CUEMU_PROF_SHLD] + p->bytes[CUEMU_PROF_SHST]),
           (unsigned long long)p->sh_wavefronts, (unsigned long long)p->sh_ideal, p->read_sectors.size(),
           p->write_sectors.size(), (unsigned long long)dram_rd, (unsigned long long)dram_wr);
  std::string line = buf;
  line += ",\"ld_wavefronts\":" + std::to_string(p->wavefronts[CUEMU_PROF_LD]) +
          ",\"st_wavefronts\":" + std::to_string(p->wavefronts[CUEMU_PROF_ST]) +
          ",\"atom_wavefronts\":" + std::to_string(p->wavefronts[CUEMU_PROF_ATOM]);
  for (int k = 0; k < cuemu_exec::A_KINDS; k++)
    line += ",\"" + std::string(cuemu_exec::kArithNames[k]) + "\":" + std::to_string(p->arith[k]);
  line += "}\n";
  pr.write(line);
}

void profile_op_bytes(unsigned long long ticket, const char* kind, const char* call, size_t bytes,
                      const cuemu_prof_span* spans, int nspans) {
  const std::string fields = "\"bytes\":" + std::to_string(bytes);
  cuemu_profile_op(ticket, kind, call, fields.c_str(), spans, nspans);
}

}  // namespace cuemu

using namespace cuemu;

CUEMU_API int cuemu_profile_enabled(void) {
  static const bool on = [] {
    const char* e = getenv("CUEMU_PROFILE");
    return e && *e;
  }();
  return on;
}

CUEMU_API unsigned long long cuemu_profile_ticket(void) { return profile_ticket(); }

CUEMU_API void cuemu_profile_op(unsigned long long ticket, const char* kind, const char* name, const char* fields,
                                const cuemu_prof_span* spans, int nspans) {
  if (!cuemu_profile_enabled()) return;
  std::vector<uint64_t> rd, wr;
  span_sectors(spans, nspans, rd, wr);
  Profiler& pr = prof();
  std::lock_guard<std::mutex> lk(pr.mu);
  uint64_t dram_rd = 0, dram_wr = 0;
  pr.through_l2(rd, wr, &dram_rd, &dram_wr);
  std::string line = "{\"seq\":" + std::to_string(ticket) + ",\"kind\":\"" + kind + "\",\"name\":\"" + name + "\"";
  if (fields && *fields) line += std::string(",") + fields;
  line += ",\"unique_read_sectors\":" + std::to_string(rd.size()) +
          ",\"unique_write_sectors\":" + std::to_string(wr.size()) + ",\"dram_read\":" + std::to_string(dram_rd) +
          ",\"dram_write\":" + std::to_string(dram_wr) + "}\n";
  pr.write(line);
}
