// The profiler's arithmetic counts. Profiled kernels are compiled with a call
// at the start of every basic block (-fsanitize-coverage=trace-pc; the
// callback is in include/device/cuemu_checks.h), which counts the block in
// an array of the running launch indexed by the call's return address. What
// each block does is read once per kernel object from its disassembly
// (objdump), so a launch's counts are its blocks' counts times their
// instruction mix (insn_mix.cpp).
//
// The compiler's blocks are not quite the machine code's: instructions
// scheduled before a block's call, prologues, and branches the back end
// adds (an unsigned conversion's two paths) make pieces of code no call
// counts. Their counts follow from flow conservation: the machine code is
// cut into straight runs (at jump targets and after jumps), a run with a
// call has that call's count, and every run's count is the sum of the edges
// into it and of the edges out of it. Solved once per object, symbolically,
// each run's count is a sum of calls' counts; what stays undetermined (both
// sides of a branch no call tells apart) is taken to fall through, a jump
// forward counting 0.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <array>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "exec_internal.h"
#include "profile_blocks.h"

__attribute__((visibility("default"))) __thread cuemu_prof_blocks cuemu_prof_blocks_tls
    __attribute__((tls_model("initial-exec")));

namespace cuemu_exec {

const char* const kArithNames[A_KINDS] = {"f32_fma",  "f32_add", "f32_mul",  "f32_div",   "f32_sqrt",  "f32_other",
                                          "f64_ops",  "f16_cvt", "special",  "int_div32", "int_div64", "instructions"};

// One launch of an object runs at a time (the module lock): its counters are
// that launch's.
struct ModuleBlocks {
  uintptr_t base = 0, span = 0;
  std::vector<uint64_t> counts;  // by (return address - base) >> 2
  std::vector<uint32_t> slot;    // each call's index into counts
  std::vector<std::array<int64_t, A_KINDS>> mix;  // what one count of each call adds
};

namespace {

// A count as a sum of calls' counts: (call, coefficient), sorted by call.
using Lin = std::vector<std::pair<int32_t, int64_t>>;

Lin combine(const Lin& a, const Lin& b, int64_t sign) {
  Lin r;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].first < b[j].first)) {
      r.push_back(a[i++]);
    } else if (i == a.size() || b[j].first < a[i].first) {
      r.emplace_back(b[j].first, sign * b[j].second);
      j++;
    } else {
      if (int64_t c = a[i].second + sign * b[j].second) r.emplace_back(a[i].first, c);
      i++, j++;
    }
  }
  return r;
}

struct Run {
  size_t first = 0, last = 0;  // instructions [first, last]
  int32_t call = -1;           // the first block call in it
  std::vector<int> in, out;    // edges
};
struct Edge {
  int from, to;  // runs; -1: outside (a caller, a return, an indirect jump)
  bool skip;     // a conditional jump forward (past a loop, an if's body)
};

struct Solver {
  std::vector<Run>& runs;
  std::vector<Edge> edges;
  std::vector<bool> run_known, edge_known;
  std::vector<Lin> run_val, edge_val;
  std::deque<int> work;

  explicit Solver(std::vector<Run>& r) : runs(r) {}

  void add_edge(int from, int to, bool skip) {
    edges.push_back({from, to, skip});
    const int e = (int)edges.size() - 1;
    if (from >= 0) runs[from].out.push_back(e);
    if (to >= 0) runs[to].in.push_back(e);
  }
  void set_edge(int e, Lin v) {
    edge_known[e] = true;
    edge_val[e] = std::move(v);
    if (edges[e].from >= 0) work.push_back(edges[e].from);
    if (edges[e].to >= 0) work.push_back(edges[e].to);
  }
  // One side of run r's conservation: its count is the sum of `side`.
  void balance(int r, const std::vector<int>& side) {
    if (side.empty()) return;
    int unknown = -1, nunknown = 0;
    Lin sum;
    for (int e : side) {
      if (edge_known[e])
        sum = combine(sum, edge_val[e], 1);
      else
        unknown = e, nunknown++;
    }
    if (run_known[r] && nunknown == 1) {
      set_edge(unknown, combine(run_val[r], sum, -1));
    } else if (!run_known[r] && nunknown == 0) {
      run_known[r] = true;
      run_val[r] = std::move(sum);
      work.push_back(r);
    }
  }
  void propagate() {
    while (!work.empty()) {
      const int r = work.front();
      work.pop_front();
      balance(r, runs[r].in);
      balance(r, runs[r].out);
    }
  }
  void solve() {
    run_known.assign(runs.size(), false);
    run_val.assign(runs.size(), {});
    edge_known.assign(edges.size(), false);
    edge_val.assign(edges.size(), {});
    for (size_t r = 0; r < runs.size(); r++) {
      if (runs[r].call >= 0) {
        run_known[r] = true;
        run_val[r] = {{runs[r].call, 1}};
      }
      work.push_back((int)r);
    }
    propagate();
    // Undetermined, each set to 0 in turn: entries of code nothing reaches
    // (padding, code after a call that does not return), then conditional
    // jumps forward (a loop is entered, an if's body runs: the back end's
    // preheaders and branches of its own have no call), then the rest.
    for (int pass = 0; pass < 3; pass++) {
      for (size_t e = 0; e < edges.size(); e++) {
        if (edge_known[e]) continue;
        const Edge& ed = edges[e];
        const bool pick = pass == 2 || (pass == 0 ? ed.from < 0 && !run_known[ed.to] : ed.skip);
        if (!pick) continue;
        set_edge((int)e, {});
        propagate();
      }
    }
  }
};

bool read_disassembly(const std::string& path, std::vector<Insn>& ins, std::vector<uint64_t>& func_starts) {
  std::string quoted;
  for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string cmd = "LC_ALL=C objdump -d --no-show-raw-insn -w '" + quoted + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return false;
  char line[4096];
  bool text = false;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "Disassembly of section ", 23) == 0) {
      text = strncmp(line + 23, ".text", 5) == 0;
      continue;
    }
    if (!text) continue;
    char* end = nullptr;
    const char* s = line;
    while (*s == ' ') s++;
    const unsigned long long addr = strtoull(s, &end, 16);
    if (end == s) continue;
    if (end[0] == ':' && end[1] == '\t') {
      Insn in;
      in.addr = addr;
      std::string t = end + 2;
      while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
      classify(t, in);
      ins.push_back(in);
    } else if (end[0] == ' ' && end[1] == '<' && strstr(end, ">:")) {
      // A function's cold part (foo.cold) is entered only by its jumps.
      if (!strstr(end, ".cold")) func_starts.push_back(addr);
    }
  }
  return pclose(f) == 0 && !ins.empty();
}

void analyze(ModuleBlocks& mb, const std::string& path) {
  std::vector<Insn> ins;
  std::vector<uint64_t> funcs;
  if (!read_disassembly(path, ins, funcs)) {
    fprintf(stderr, "cuemu: profiler: cannot disassemble %s (objdump); its arithmetic counts are 0\n", path.c_str());
    return;
  }
  std::unordered_map<uint64_t, size_t> at;  // address -> instruction
  for (size_t i = 0; i < ins.size(); i++) at[ins[i].addr] = i;
  std::vector<bool> label(ins.size(), false), func(ins.size(), false);
  for (uint64_t a : funcs)
    if (auto it = at.find(a); it != at.end()) func[it->second] = label[it->second] = true;
  for (Insn& in : ins) {
    if (in.flow != FL_JCC && in.flow != FL_JMP) continue;
    if (auto it = at.find(in.target); it != at.end())
      label[it->second] = true;
    else if (in.flow == FL_JMP)
      in.flow = FL_EXIT;  // out of the object's code: a tail call
    else
      in.target = 0;
  }

  // A checker's arguments exist for the check only: the last mov or lea into
  // each of its argument registers since the previous call is not the
  // kernel's work either (the kernel's own access folds the address in).
  for (size_t i = 0; i < ins.size(); i++) {
    uint8_t need = ins[i].checker_args;
    for (size_t j = i; need && j-- > 0;) {
      if (ins[j].flow != FL_NONE || ins[j].call) break;
      if (ins[j].sets_arg & need) {
        ins[j].work = false;
        need &= (uint8_t)~ins[j].sets_arg;
      }
      if (label[j]) break;
    }
  }

  // The calls: their counters, by the return address (the next instruction).
  std::vector<int32_t> call_of(ins.size(), -1);
  uint64_t top = 0;
  for (size_t i = 0; i < ins.size(); i++) {
    top = std::max(top, ins[i].addr + 16);
    if (!ins[i].site) continue;
    const uint64_t ret = i + 1 < ins.size() ? ins[i + 1].addr : ins[i].addr + 5;
    call_of[i] = (int32_t)mb.slot.size();
    mb.slot.push_back((uint32_t)(ret >> 2));
  }
  mb.span = top;
  mb.counts.assign((top >> 2) + 1, 0);
  mb.mix.assign(mb.slot.size(), {});

  // Straight runs.
  std::vector<Run> runs;
  std::vector<int> run_of(ins.size());
  for (size_t i = 0; i < ins.size(); i++) {
    const bool cut = i == 0 || label[i] || ins[i - 1].flow != FL_NONE;
    if (cut) {
      runs.emplace_back();
      runs.back().first = i;
    }
    Run& r = runs.back();
    r.last = i;
    run_of[i] = (int)runs.size() - 1;
    if (r.call < 0 && call_of[i] >= 0) r.call = call_of[i];
  }
  Solver s(runs);
  for (size_t r = 0; r < runs.size(); r++) {
    const Insn& last = ins[runs[r].last];
    const size_t next = runs[r].last + 1;
    const bool falls = next < ins.size() && !func[next];
    switch (last.flow) {
      case FL_JCC:
        s.add_edge((int)r, last.target ? run_of[at[last.target]] : -1, last.target > last.addr);
        s.add_edge((int)r, falls ? run_of[next] : -1, false);
        break;
      case FL_JMP: s.add_edge((int)r, run_of[at[last.target]], false); break;
      case FL_EXIT: s.add_edge((int)r, -1, false); break;
      case FL_NONE: s.add_edge((int)r, falls ? run_of[next] : -1, false); break;
    }
  }
  // Entered from outside: a function's start, and code no jump here reaches
  // (a jump table's targets).
  for (size_t r = 0; r < runs.size(); r++)
    if (func[runs[r].first] || runs[r].in.empty()) s.add_edge(-1, (int)r, false);
  s.solve();

  for (size_t r = 0; r < runs.size(); r++) {
    if (s.run_val[r].empty()) continue;
    int64_t mix[A_KINDS] = {};
    for (size_t i = runs[r].first; i <= runs[r].last; i++) add_mix(ins[i], mix);
    for (auto [call, coef] : s.run_val[r])
      for (int k = 0; k < A_KINDS; k++) mb.mix[call][k] += coef * mix[k];
  }
}

std::mutex g_mu;
std::unordered_map<const void*, ModuleBlocks*>* g_modules;

// The analysis of the object holding `k`, made on its first launch.
ModuleBlocks* module_blocks(const void* key, const cuemu_kernel_desc* k) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_modules) g_modules = new std::unordered_map<const void*, ModuleBlocks*>();
  ModuleBlocks*& mb = (*g_modules)[key];
  if (mb) return mb;
  mb = new ModuleBlocks();
  Dl_info info;
  if (dladdr((void*)k->entry, &info) && info.dli_fname && info.dli_fbase) {
    mb->base = (uintptr_t)info.dli_fbase;
    analyze(*mb, info.dli_fname);
  }
  return mb;
}

}  // namespace

void prof_blocks_start(Worker* w) {
  ModuleBlocks* mb = module_blocks(w->mod ? (const void*)w->mod : (const void*)w->k, w->k);
  w->prof->blocks = mb;
  cuemu_prof_blocks_tls = cuemu_prof_blocks{mb->base, mb->span, mb->counts.data()};
}

void prof_launch_end(Worker* w) {
  cuemu_prof_blocks_tls = cuemu_prof_blocks{0, 0, nullptr};
  ModuleBlocks* mb = w->prof->blocks;
  int64_t sum[A_KINDS] = {};
  for (size_t c = 0; c < mb->slot.size(); c++) {
    uint64_t& n = mb->counts[mb->slot[c]];
    if (!n) continue;
    for (int k = 0; k < A_KINDS; k++) sum[k] += (int64_t)n * mb->mix[c][k];
    n = 0;
  }
  for (int k = 0; k < A_KINDS; k++) w->prof->arith[k] = (uint64_t)std::max<int64_t>(0, sum[k]);
}

}  // namespace cuemu_exec
