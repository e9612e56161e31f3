// What the profiler's kernel side (src/exec/profile.cpp) hands the driver's
// record writer (src/driver/profile.cpp) after each profiled launch.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "cuemu/internal.h"

namespace cuemu_exec {

constexpr int kProfMaxThreads = 1024;

// A launch's arithmetic, per thread-operation, summed over its threads (a
// SIMD instruction counts its lanes): the record's fields of the same names.
enum ArithKind {
  A_F32_FMA, A_F32_ADD, A_F32_MUL, A_F32_DIV, A_F32_SQRT, A_F32_OTHER, A_F64, A_F16_CVT, A_SPECIAL,
  A_INT_DIV32, A_INT_DIV64, A_INSTRUCTIONS, A_KINDS
};
extern const char* const kArithNames[A_KINDS];

// One kernel object's basic blocks (profile_blocks.cpp).
struct ModuleBlocks;

// One access of one CUDA thread, until its warp is complete: 16 bytes, as
// the lanes' records are most of the profiler's memory traffic. A launch
// runs the code of one object, smaller than 4 GB, so the low half of a
// site's address names it within the launch.
struct Rec {
  uintptr_t addr;
  uint32_t site;
  uint32_t n : 28;     // larger accesses are counted as 2^28 - 1 bytes
  uint32_t kind : 4;   // cuemu_prof_kind
};
static_assert(sizeof(Rec) == 16, "a lane record is two words");
static_assert(CUEMU_PROF_KINDS <= 16, "a record's kind is 4 bits");

struct LaunchProf {
  std::vector<Rec> lane[kProfMaxThreads];
  // Per cuemu_prof_kind: warp-level requests, distinct sectors summed over
  // requests (global kinds), bytes the lanes asked for.
  uint64_t req[CUEMU_PROF_KINDS], sectors[CUEMU_PROF_KINDS], bytes[CUEMU_PROF_KINDS];
  // Per global kind: distinct 128-byte lines summed over requests (L1 wavefronts).
  uint64_t wavefronts[CUEMU_PROF_KINDS];
  std::vector<uint64_t> scratch;  // a request's sectors when a lane's access spans many
  uint64_t sh_wavefronts, sh_ideal;
  uint64_t warps, max_warp_requests;
  // Every sector a request read or wrote (the driver makes them unique
  // once per launch). A direct-mapped filter of recently added sectors
  // (sector + 1; 0 is empty) keeps most repeats out: a kernel that reads
  // each input many times (im2col) would otherwise list it as often.
  std::vector<uint64_t> read_sectors, write_sectors;
  static constexpr size_t kFootprintFilter = 1u << 12;
  uint64_t read_filter[kFootprintFilter], write_filter[kFootprintFilter];
  uint64_t arith[A_KINDS];
  // A divergent warp's matching (profile.cpp), kept between warps so that
  // matching allocates nothing once warmed up.
  struct Slot {
    uint32_t site, occ, gen;
    int group;
  };
  std::vector<Slot> request_of;  // (site, occurrence) -> request, open addressing
  std::vector<Slot> seen;        // one lane's site -> occurrences so far
  uint32_t request_gen = 0, seen_gen = 0;
  std::vector<std::pair<int, const Rec*>> member;  // (request, access), lane order
  std::vector<int> group_start;
  std::vector<const Rec*> grouped;
  ModuleBlocks* blocks;  // the running launch's object
  void reset() {
    for (auto& l : lane) l.clear();
    for (int k = 0; k < CUEMU_PROF_KINDS; k++) req[k] = sectors[k] = bytes[k] = wavefronts[k] = 0;
    sh_wavefronts = sh_ideal = warps = max_warp_requests = 0;
    for (auto& a : arith) a = 0;
    blocks = nullptr;
    read_sectors.clear();
    write_sectors.clear();
    std::fill(std::begin(read_filter), std::end(read_filter), 0);
    std::fill(std::begin(write_filter), std::end(write_filter), 0);
  }
};

// The profile of the launch that last ran on this OS thread (null if none
// was profiled).
LaunchProf* last_launch_profile();

}  // namespace cuemu_exec
