// Kernel discovery in the preprocessed program, and the generated
// translation unit that describes the discovered kernels to the driver.
#include "cuemu/internal.h"
#include "nvrtc_internal.h"

#include <ctype.h>

#include <set>

namespace cuemu_nvrtc {

namespace {

struct Tok {
  std::string s;
  bool ident;
};

std::vector<Tok> tokenize(const std::string& t) {
  std::vector<Tok> out;
  out.reserve(t.size() / 4);
  size_t i = 0, n = t.size();
  while (i < n) {
    char c = t[i];
    if (c == '#') {  // line markers / pragmas left by -E
      while (i < n && t[i] != '\n') i++;
      continue;
    }
    if (isspace((unsigned char)c)) {
      i++;
      continue;
    }
    if (isalpha((unsigned char)c) || c == '_') {
      size_t j = i;
      while (j < n && (isalnum((unsigned char)t[j]) || t[j] == '_')) j++;
      out.push_back({t.substr(i, j - i), true});
      i = j;
      continue;
    }
    if (isdigit((unsigned char)c)) {
      size_t j = i;
      while (j < n && (isalnum((unsigned char)t[j]) || t[j] == '.' || t[j] == '\'')) j++;
      out.push_back({"0", false});
      i = j;
      continue;
    }
    if (c == '"' || c == '\'') {
      // raw strings are rare in kernels; plain escapes handled
      size_t j = i + 1;
      while (j < n && t[j] != c) {
        if (t[j] == '\\') j++;
        j++;
      }
      out.push_back({t.substr(i, j + 1 - i), false});
      i = j + 1;
      continue;
    }
    if (c == ':' && i + 1 < n && t[i + 1] == ':') {
      out.push_back({"::", false});
      i += 2;
      continue;
    }
    out.push_back({std::string(1, c), false});
    i++;
  }
  return out;
}

}  // namespace

// Non-template extern "C" __global__ functions: their qualified names.
std::vector<std::string> discover_kernels(const std::string& pre) {
  std::vector<Tok> tk = tokenize(pre);
  struct Scope {
    int kind;  // 0 other, 1 namespace, 2 extern "C" block
    std::string name;
  };
  std::vector<Scope> scopes;
  std::vector<std::string> names;
  std::set<std::string> seen;
  int pending = -1;  // 1 namespace, 2 extern C, for the next '{'
  std::string pending_name;
  size_t decl_start = 0;  // token index after the last ; { }
  for (size_t i = 0; i < tk.size(); i++) {
    const std::string& s = tk[i].s;
    if (s == "namespace" && tk[i].ident) {
      // namespace a::b { / namespace { / namespace x = y;
      std::string nm;
      size_t j = i + 1;
      while (j < tk.size() && (tk[j].ident || tk[j].s == "::")) {
        if (tk[j].s != "inline") nm += tk[j].s;
        j++;
      }
      if (j < tk.size() && tk[j].s == "{") {
        pending = 1;
        pending_name = nm;
        i = j - 1;
      }
      continue;
    }
    if (s == "extern" && i + 2 < tk.size() && tk[i + 1].s == "\"C\"" && tk[i + 2].s == "{") {
      pending = 2;
      i = i + 1;
      continue;
    }
    if (s == "{") {
      if (pending >= 0) scopes.push_back({pending, pending_name});
      else scopes.push_back({0, ""});
      pending = -1;
      pending_name.clear();
      decl_start = i + 1;
      continue;
    }
    if (s == "}") {
      if (!scopes.empty()) scopes.pop_back();
      decl_start = i + 1;
      continue;
    }
    if (s == ";") {
      decl_start = i + 1;
      continue;
    }
    if (s == "__cuemu_global__") {
      // Only at namespace / extern "C" scope.
      bool ns_scope = true;
      for (auto& sc : scopes) ns_scope &= sc.kind != 0;
      if (!ns_scope) continue;
      bool is_c = false, is_template = false;
      for (size_t j = decl_start; j < i; j++) {
        if (tk[j].s == "extern" && j + 1 < i && tk[j + 1].s == "\"C\"") is_c = true;
        if (tk[j].s == "template") is_template = true;
      }
      for (auto& sc : scopes) is_c |= sc.kind == 2;
      if (!is_c || is_template) continue;
      // the name: the identifier before the first '(' outside __attribute__((...))
      std::string name;
      for (size_t j = i + 1; j < tk.size(); j++) {
        if (tk[j].s == "__attribute__" || tk[j].s == "__declspec" || tk[j].s == "alignas") {
          // skip balanced parens
          size_t k = j + 1;
          int depth = 0;
          for (; k < tk.size(); k++) {
            if (tk[k].s == "(") depth++;
            else if (tk[k].s == ")" && --depth == 0) break;
          }
          j = k;
          continue;
        }
        if (tk[j].s == "(") {
          if (j > 0 && tk[j - 1].ident) name = tk[j - 1].s;
          break;
        }
        if (tk[j].s == ";" || tk[j].s == "{") break;
      }
      if (name.empty()) continue;
      std::string q;
      for (auto& sc : scopes)
        if (sc.kind == 1 && !sc.name.empty()) q += sc.name + "::";
      q += name;
      if (seen.insert(name).second) names.push_back(q);
    }
  }
  return names;
}

std::string base_name(const std::string& q) {
  size_t s = q.rfind("::");
  return s == std::string::npos ? q : q.substr(s + 2);
}

std::string shared_into_one_section(const std::string& asm_text) {
  std::string out;
  out.reserve(asm_text.size());
  size_t pos = 0;
  while (pos < asm_text.size()) {
    size_t end = asm_text.find('\n', pos);
    if (end == std::string::npos) end = asm_text.size();
    const std::string line = asm_text.substr(pos, end - pos);
    // `.section .bss._ZZ...,"awGR",@nobits,_ZZ...,comdat`: a retained COMDAT
    // section, which only a __shared__ variable of a template makes here.
    if (line.rfind("\t.section\t", 0) == 0 && line.find(",\"awGR\",") != std::string::npos)
      out += "\t.section\tcuemu_shared,\"awR\"";
    else
      out += line;
    out += '\n';
    pos = end + 1;
  }
  return out;
}

std::string generated_tu(const std::string& src_rel, const std::vector<std::string>& kernels) {
  std::string g;
  g += "// generated by the emulated NVRTC\n#include \"" + src_rel + "\"\n";
  g += R"CUEMU(
#include <utility>
#include <type_traits>
#include <string>
#undef __shared__
namespace cuemu_gen {
template <class T> const char* type_name_raw() { return __PRETTY_FUNCTION__; }
template <class T> constexpr uint8_t kind_of() {
  if constexpr (std::is_pointer<T>::value)
    return std::is_const<typename std::remove_pointer<T>::type>::value ? CUEMU_ARG_PTR_CONST : CUEMU_ARG_PTR_MUT;
  else
    return CUEMU_ARG_VALUE;
}
inline std::string clean_type(const char* pf) {
  std::string s = pf;
  size_t a = s.find("T = ");
  if (a == std::string::npos) return s;
  a += 4;
  size_t b = s.find_first_of(";]", a);
  return s.substr(a, b == std::string::npos ? std::string::npos : b - a);
}
template <class F> struct sig;
template <class... A> struct sig_base {
  static constexpr int n = (int)sizeof...(A);
  uint32_t sizes[sizeof...(A) + 1] = {(uint32_t)sizeof(A)..., 0};
  uint32_t offsets[sizeof...(A) + 1] = {};
  uint8_t kinds[sizeof...(A) + 1] = {kind_of<A>()..., 0};
  std::string tnames[sizeof...(A) + 1] = {clean_type(type_name_raw<A>())..., ""};
  const char* tptrs[sizeof...(A) + 1] = {};
  sig_base() {
    const uint32_t al[sizeof...(A) + 1] = {(uint32_t)alignof(A)..., 1};
    uint32_t off = 0;
    for (int i = 0; i < n; i++) {
      off = (off + al[i] - 1) / al[i] * al[i];
      offsets[i] = off;
      off += sizes[i];
    }
    for (int i = 0; i < n; i++) tptrs[i] = tnames[i].c_str();
  }
  // The launch's parameter buffer is host memory, read once per CUDA thread:
  // not instrumented (a dozen checker calls a thread for nothing to check).
  // GCC does not inline the instrumented kernel into these, so the kernel's
  // own accesses stay checked.
  template <class Fn, size_t... I>
  __attribute__((no_sanitize_thread)) static void call(Fn f, void* const* args, std::index_sequence<I...>) {
    f(*static_cast<A*>(args[I])...);
  }
  template <class Fn> __attribute__((no_sanitize_thread)) static void invoke(Fn f, void* const* args) {
    call(f, args, std::index_sequence_for<A...>{});
  }
};
template <class... A> struct sig<void (*)(A...)> : sig_base<A...> {};
template <class... A> struct sig<void (*)(A...) noexcept> : sig_base<A...> {};
}  // namespace cuemu_gen
extern "C" char __start_cuemu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_cuemu_shared[] __attribute__((weak, visibility("hidden")));
#ifdef CUEMU_CHECKS
#include "cuemu_checks.h"
#endif
extern "C" __attribute__((visibility("hidden"), noreturn)) void __assert_fail(const char* a, const char* f, unsigned int l, const char*) noexcept {
  cuemu_trap(a, f, (int)l);
}
)CUEMU";
  for (size_t i = 0; i < kernels.size(); i++) {
    g += "__attribute__((no_sanitize_thread)) static void cuemu_entry_" + std::to_string(i) + "(void* const* a) { cuemu_gen::sig<decltype(&" + kernels[i] +
         ")>::invoke(&" + kernels[i] + ", a); }\n";
  }
  // The typedef cuemu_module_info hides a function of that name: asm label.
  g += "extern \"C\" __attribute__((visibility(\"default\"))) const cuemu_module_info* cuemu_module_info_impl(void) "
       "__asm__(\"" CUEMU_MODULE_INFO_SYMBOL "\");\n";
  g += "const cuemu_module_info* cuemu_module_info_impl(void) {\n";
  for (size_t i = 0; i < kernels.size(); i++) {
    g += "  static const cuemu_gen::sig<decltype(&" + kernels[i] + ")> s" + std::to_string(i) + ";\n";
  }
  g += "  static const cuemu_kernel_desc descs[" + std::to_string(kernels.size() + 1) + "] = {\n";
  for (size_t i = 0; i < kernels.size(); i++) {
    std::string si = "s" + std::to_string(i);
    g += "    {\"" + base_name(kernels[i]) + "\", &cuemu_entry_" + std::to_string(i) + ", " + si + ".n, " + si +
         ".sizes, " + si + ".offsets, " + si + ".kinds, " + si + ".tptrs},\n";
  }
  g += "    {nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr}};\n";
  g += "  static const cuemu_module_info info = {CUEMU_ABI_VERSION, " + std::to_string(kernels.size()) +
       ", descs, __start_cuemu_shared, __stop_cuemu_shared, \"" + src_rel + "\"};\n";
  g += "  return &info;\n}\n";
  return g;
}

}  // namespace cuemu_nvrtc
