// What the profiler's block analysis (profile_blocks.cpp) and its x86
// instruction classifier (insn_mix.cpp) share.
#pragma once
#include <stdint.h>

#include <string>

#include "profile.h"

namespace cuemu_exec {

// How an instruction passes control on. FL_EXIT: to somewhere the analysis
// does not follow (ret, ud2, an indirect jump, a jump out of the object).
enum Flow : uint8_t { FL_NONE, FL_JCC, FL_JMP, FL_EXIT };

struct Insn {
  uint64_t addr = 0;
  uint64_t target = 0;  // a direct jump's destination (FL_JCC, FL_JMP)
  Flow flow = FL_NONE;
  bool site = false;    // the call to the block callback
  bool call = false;
  uint8_t checker_args = 0;  // a checker's call: its argument registers (1 %rdi, 2 %rsi)
  uint8_t sets_arg = 0;      // a mov or lea into an argument register (1 %rdi, 2 %rsi)
  bool work = true;     // the kernel's own (not a checker's call, not a marker)
  bool rsqrt = false;   // rsqrtf's marker: one special op for a square root and a divide
  int8_t kind = -1;     // the ArithKind it adds `lanes` to
  int16_t lanes = 0;
};

// One line of `objdump -d --no-show-raw-insn -w` after the address and tab.
void classify(const std::string& text, Insn& in);

inline void add_mix(const Insn& in, int64_t* mix) {
  if (in.work) mix[A_INSTRUCTIONS]++;
  if (in.kind >= 0) mix[in.kind] += in.lanes;
  if (in.rsqrt) mix[A_F32_SQRT]--, mix[A_F32_DIV]--;
}

}  // namespace cuemu_exec
