// The profiler's x86 instruction classifier: what one instruction of a
// kernel's disassembly is, in the terms Nsight Compute's instruction mix
// uses for the GPU's, per thread-operation (a SIMD instruction is as many
// operations as it has lanes).
//
//  * f32 / f64: the SSE/AVX arithmetic on ss/ps (sd/pd) elements; minimum,
//    maximum, compares, rounding, abs and negation (bitwise on a float, not
//    the zeroing idioms), selects and int<->float conversions are f32_other,
//    and every operation on doubles is f64_ops.
//  * special: calls of the math library's transcendental functions (expf,
//    __expf, tanhf, erff, powf, ... and the double ones), rcp/rsqrt.
//  * int_div32 / int_div64: div and idiv, which the compiler emits only for
//    a runtime divisor (a constant one becomes a multiply, as on the GPU).
//  * f16_cvt: the device headers' markers (the emulated conversions are
//    integer code) and F16C conversions.
// Calls of the checkers and of the block callback are instrumentation, not
// the kernel's instructions, and so are the setup of a checker's arguments
// (profile_blocks.cpp) and register spills.
#include <stdlib.h>
#include <string.h>

#include "profile_blocks.h"

namespace cuemu_exec {

namespace {

bool starts(const std::string& s, const char* p) { return s.compare(0, strlen(p), p) == 0; }

bool is_prefix(const std::string& t) {
  static const char* const kPrefixes[] = {"rep", "repz", "repe", "repnz", "repne", "lock", "notrack", "bnd",
                                          "data16", "addr32", "cs", "ds", "es", "ss", "fs", "gs"};
  for (const char* p : kPrefixes)
    if (t == p) return true;
  return starts(t, "rex");
}

// The math library's functions by their double name; the float one is the
// same with an `f`. `n` operations a call (sincos is two).
struct MathFn {
  const char* name;
  int8_t f32_kind;  // the double version of a special function is special too, else f64_ops
  int8_t n;
};
const MathFn kMath[] = {
    {"exp", A_SPECIAL, 1},    {"exp2", A_SPECIAL, 1},   {"exp10", A_SPECIAL, 1},  {"expm1", A_SPECIAL, 1},
    {"log", A_SPECIAL, 1},    {"log2", A_SPECIAL, 1},   {"log10", A_SPECIAL, 1},  {"log1p", A_SPECIAL, 1},
    {"logb", A_SPECIAL, 1},   {"pow", A_SPECIAL, 1},    {"sin", A_SPECIAL, 1},    {"cos", A_SPECIAL, 1},
    {"tan", A_SPECIAL, 1},    {"sincos", A_SPECIAL, 2}, {"asin", A_SPECIAL, 1},   {"acos", A_SPECIAL, 1},
    {"atan", A_SPECIAL, 1},   {"atan2", A_SPECIAL, 1},  {"sinh", A_SPECIAL, 1},   {"cosh", A_SPECIAL, 1},
    {"tanh", A_SPECIAL, 1},   {"asinh", A_SPECIAL, 1},  {"acosh", A_SPECIAL, 1},  {"atanh", A_SPECIAL, 1},
    {"erf", A_SPECIAL, 1},    {"erfc", A_SPECIAL, 1},   {"lgamma", A_SPECIAL, 1}, {"tgamma", A_SPECIAL, 1},
    {"cbrt", A_SPECIAL, 1},   {"hypot", A_SPECIAL, 1},  {"sqrt", A_F32_SQRT, 1},  {"fma", A_F32_FMA, 1},
    {"fmin", A_F32_OTHER, 1}, {"fmax", A_F32_OTHER, 1}, {"fabs", A_F32_OTHER, 1}, {"floor", A_F32_OTHER, 1},
    {"ceil", A_F32_OTHER, 1}, {"trunc", A_F32_OTHER, 1}, {"round", A_F32_OTHER, 1}, {"rint", A_F32_OTHER, 1},
    {"nearbyint", A_F32_OTHER, 1}, {"lrint", A_F32_OTHER, 1}, {"llrint", A_F32_OTHER, 1},
    {"lround", A_F32_OTHER, 1}, {"llround", A_F32_OTHER, 1}, {"copysign", A_F32_OTHER, 1},
    {"fdim", A_F32_OTHER, 1}, {"fmod", A_F32_OTHER, 1}, {"remainder", A_F32_OTHER, 1},
    {"ldexp", A_F32_OTHER, 1}, {"frexp", A_F32_OTHER, 1}, {"scalbn", A_F32_OTHER, 1}, {"modf", A_F32_OTHER, 1}};

const MathFn* math_fn(const std::string& n, bool* f32) {
  for (const MathFn& m : kMath) {
    if (n == m.name) {
      *f32 = false;
      return &m;
    }
    if (n.size() == strlen(m.name) + 1 && n.back() == 'f' && n.compare(0, n.size() - 1, m.name) == 0) {
      *f32 = true;
      return &m;
    }
  }
  return nullptr;
}

// A call of `sym` (objdump's name for the target, "expf@plt", "__expf@plt").
void classify_call(std::string sym, Insn& in) {
  if (size_t at = sym.find_first_of("@+"); at != std::string::npos) sym.resize(at);
  if (sym == "__sanitizer_cov_trace_pc") {
    in.site = true;
    in.work = false;
    return;
  }
  if (starts(sym, "__tsan_")) {
    in.work = false;
    in.checker_args = sym.size() > 6 && sym.compare(sym.size() - 6, 6, "_range") == 0 ? 3 : 1;
    return;
  }
  int lanes = 1;
  if (starts(sym, "_ZGV") && sym.size() > 6) {  // libmvec: _ZGV<isa><mask><lanes><params>_<name>
    lanes = atoi(sym.c_str() + 6);
    const size_t u = sym.find('_', 4);
    sym = u == std::string::npos ? "" : sym.substr(u + 1);
  }
  size_t lead = 0;
  while (lead < sym.size() && sym[lead] == '_') lead++;  // __expf, __powisf2
  sym.erase(0, lead);
  if (sym == "powisf2" || sym == "powidf2") {
    in.kind = A_SPECIAL;
    in.lanes = 1;
    return;
  }
  bool f32 = false;
  if (const MathFn* m = math_fn(sym, &f32)) {
    in.kind = (int8_t)(f32 || m->f32_kind == A_SPECIAL ? m->f32_kind : (int8_t)A_F64);
    in.lanes = (int16_t)(m->n * lanes);
  }
}

// A register moved to or from a fixed stack slot. Most are spills and
// reloads the instrumentation's calls force on the kernel (every xmm register
// is caller-saved), which its code without them keeps in registers, as the
// GPU's register file does.
bool spill_or_reload(const std::string& ops) {
  const size_t c = ops.find(',');
  if (c == std::string::npos || ops.find(',', c + 1) != std::string::npos) return false;
  const std::string a = ops.substr(0, c), b = ops.substr(c + 1);
  auto slot = [](const std::string& o) { return o.size() >= 6 && o.compare(o.size() - 6, 6, "(%rsp)") == 0; };
  return (slot(a) && b[0] == '%') || (slot(b) && a[0] == '%');
}

int64_t hex(const std::string& s) { return (int64_t)strtoull(s.c_str(), nullptr, 16); }

bool is_gpr64(const std::string& r) {
  static const char* const k64[] = {"%rax", "%rbx", "%rcx", "%rdx", "%rsi", "%rdi", "%rbp", "%rsp",
                                    "%r8",  "%r9",  "%r10", "%r11", "%r12", "%r13", "%r14", "%r15"};
  for (const char* g : k64)
    if (r == g) return true;
  return false;
}

// A conversion: cvt[t]<from>2<to>[x|y|l|q], ss/sd/ps/pd, ph, si/dq/qq.
void classify_cvt(std::string m, int width, Insn& in) {
  m.erase(0, 3);
  if (!m.empty() && m[0] == 't') m.erase(0, 1);
  const size_t two = m.find('2');
  if (two == std::string::npos) return;
  std::string from = m.substr(0, two), to = m.substr(two + 1);
  if (to.size() == 3 && strchr("xylq", to.back())) {
    if (to.back() == 'y') width = 256;
    to.pop_back();
  }
  auto any = [&](std::initializer_list<const char*> l) {
    for (const char* t : l)
      if (from == t || to == t) return true;
    return false;
  };
  const bool f16 = any({"ph", "sh"}), f64 = any({"sd", "pd"}), f32 = any({"ss", "ps"});
  const bool packed = any({"ps", "pd", "ph", "dq", "udq", "qq", "uqq"});
  if (!f16 && !f64 && !f32) return;
  in.kind = (int8_t)(f16 ? A_F16_CVT : f64 ? A_F64 : A_F32_OTHER);
  in.lanes = (int16_t)(packed ? width / (any({"pd", "qq", "uqq"}) ? 64 : 32) : 1);
}

void classify_float(std::string m, const std::string& ops, Insn& in) {
  const int width = ops.find("%zmm") != std::string::npos ? 512 : ops.find("%ymm") != std::string::npos ? 256 : 128;
  if (m[0] == 'v') m.erase(0, 1);
  if (starts(m, "cvt")) return classify_cvt(m, width, in);
  if (m.size() < 3) return;
  const std::string sfx = m.substr(m.size() - 2), base = m.substr(0, m.size() - 2);
  if (sfx != "ss" && sfx != "ps" && sfx != "sd" && sfx != "pd") return;
  int kind;
  if (starts(base, "fmadd") || starts(base, "fmsub") || starts(base, "fnmadd") || starts(base, "fnmsub"))
    kind = A_F32_FMA;
  else if (base == "add" || base == "sub" || base == "addsub" || base == "hadd" || base == "hsub")
    kind = A_F32_ADD;
  else if (base == "mul")
    kind = A_F32_MUL;
  else if (base == "div")
    kind = A_F32_DIV;
  else if (base == "sqrt")
    kind = A_F32_SQRT;
  else if (base == "rcp" || base == "rsqrt")
    kind = A_SPECIAL;
  else if (base == "and" || base == "andn" || base == "or" || base == "xor") {
    // Bitwise on floats is abs, negation or copysign, unless both sources
    // are one register: zeroing (xor, andn) or a move (and, or).
    const size_t c = ops.find(',');
    if (c != std::string::npos && ops.compare(c + 1, c, ops, 0, c) == 0 &&
        (ops.size() == 2 * c + 1 || ops[2 * c + 1] == ','))
      return;
    kind = A_F32_OTHER;
  } else if (base == "min" || base == "max" || base == "comi" || base == "ucomi" || base == "round" ||
             base == "blendv" || starts(base, "cmp"))
    kind = A_F32_OTHER;
  else
    return;
  const bool dbl = sfx[1] == 'd';
  // Bitwise ops and selects have no scalar form: a scalar's abs, negation
  // or select is the packed instruction on an xmm register, which the
  // vectorizer (256-bit vectors here) rarely uses.
  const bool scalar = sfx[0] == 's' || (width == 128 && (starts(base, "and") || base == "or" || base == "xor" ||
                                                          base == "blendv"));
  in.kind = (int8_t)(dbl ? A_F64 : kind);
  in.lanes = (int16_t)(scalar ? 1 : width / (dbl ? 64 : 32));
}

}  // namespace

void classify(const std::string& text, Insn& in) {
  std::string t = text.substr(0, text.find('#'));
  size_t p = 0;
  std::string mn;
  for (;;) {
    while (p < t.size() && (t[p] == ' ' || t[p] == '\t')) p++;
    const size_t e = t.find_first_of(" \t", p);
    mn = t.substr(p, e == std::string::npos ? std::string::npos : e - p);
    p = e == std::string::npos ? t.size() : e;
    if (!is_prefix(mn)) break;
  }
  while (p < t.size() && (t[p] == ' ' || t[p] == '\t')) p++;
  std::string ops = t.substr(p);
  while (!ops.empty() && (ops.back() == ' ' || ops.back() == '\t')) ops.pop_back();
  if (mn.empty()) return;

  if (starts(mn, "ret") || starts(mn, "iret") || mn == "ud2" || mn == "hlt") {
    in.flow = FL_EXIT;
    return;
  }
  if (mn[0] == 'j' || starts(mn, "loop")) {
    const bool jmp = starts(mn, "jmp");
    if (ops.empty() || ops[0] == '*') {
      in.flow = FL_EXIT;
      return;
    }
    in.flow = jmp ? FL_JMP : FL_JCC;
    in.target = (uint64_t)hex(ops);
    return;
  }
  if (starts(mn, "call")) {
    in.call = true;
    const size_t a = ops.find('<'), b = ops.rfind('>');
    if (a != std::string::npos && b != std::string::npos && b > a) classify_call(ops.substr(a + 1, b - a - 1), in);
    return;
  }
  if ((starts(mn, "mov") || starts(mn, "vmov")) && spill_or_reload(ops)) {
    in.work = false;
    return;
  }
  if (starts(mn, "mov") || starts(mn, "lea")) {
    const size_t c = ops.rfind(',');
    const std::string dst = c == std::string::npos ? "" : ops.substr(c + 1);
    in.sets_arg = dst == "%rdi" || dst == "%edi" ? 1 : dst == "%rsi" || dst == "%esi" ? 2 : 0;
    return;
  }
  if (starts(mn, "nop") && starts(ops, "0x") && (hex(ops) & ~0xffll) == CUEMU_PROF_MARK_BASE) {
    in.work = false;
    switch (hex(ops) & 0xff) {
      case CUEMU_PROF_MARK_F16_CVT: in.kind = A_F16_CVT, in.lanes = 1; break;
      case CUEMU_PROF_MARK_RSQRT: in.kind = A_SPECIAL, in.lanes = 1, in.rsqrt = true; break;
    }
    return;
  }
  // div, idiv and their sized forms (divl, idivq), not divss.
  if (starts(mn, "div") ? mn.size() <= 4 : starts(mn, "idiv") && mn.size() <= 5) {
    const bool q = mn.back() == 'q' || is_gpr64(ops);
    in.kind = (int8_t)(q ? A_INT_DIV64 : A_INT_DIV32);
    in.lanes = 1;
    return;
  }
  if (ops.find("%xmm") != std::string::npos || ops.find("%ymm") != std::string::npos ||
      ops.find("%zmm") != std::string::npos)
    classify_float(mn, ops, in);
}

}  // namespace cuemu_exec
