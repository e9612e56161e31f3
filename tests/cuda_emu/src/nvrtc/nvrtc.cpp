// The emulated NVRTC: compiles a CUDA C++ program as host C++ with g++
// (CUEMU_CXX overrides) into a shared object that exports cuemu_module_info
// (see include/cuemu/internal.h), and returns "PTX" text that names that
// object (CUEMU_PTX_OBJECT_TAG) and lists each extern "C" kernel with its
// parameters, as real PTX would.
//
// Compile flags: -std=c++17 -O2 -fPIC -shared -march=x86-64-v3 -fno-fast-math,
// with -ffp-contract=fast for --fmad=true (NVRTC's default: the GPU compiler
// contracts a*b+c into an FMA wherever it likes; the _rn intrinsics stay
// unfused in both cases) and -ffp-contract=off for --fmad=false.
// --use_fast_math is rejected (NVRTC_ERROR_INVALID_OPTION): its approximate
// math is not emulated.
//
// Objects are cached by a content hash (source, headers, options, the device
// headers and this library) under $CUEMU_CACHE_DIR, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/cuemu; written to a temporary name and
// renamed, so parallel processes may compile the same program.
#include "cuemu/internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#define NVRTC_EXPORT extern "C" __attribute__((visibility("default")))

typedef enum {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
  NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
  NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
  NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
  NVRTC_ERROR_TIME_FILE_WRITE_FAILED = 12,
} nvrtcResult;

namespace {

const char* const kEmuVersion = "cuemu-nvrtc 1";

struct Program {
  std::string src, name;
  std::vector<std::pair<std::string, std::string>> headers;  // include name, content
  std::string log;
  std::string ptx;        // text, without the NUL
  bool compiled = false;
  bool cubin = false;     // sm_XY: the "cubin" is the PTX bytes
  std::vector<std::string> name_exprs;
  std::vector<std::string> lowered;
};

std::mutex g_mu;
std::set<Program*> g_programs;  // handles handed out (checked on every call)

bool valid(Program* p) {
  std::lock_guard<std::mutex> g(g_mu);
  return p && g_programs.count(p);
}

// ------------------------------------------------------------- helpers ---

std::string dirname_of(const std::string& p) {
  size_t s = p.rfind('/');
  if (s == std::string::npos) return ".";
  if (s == 0) return "/";
  return p.substr(0, s);
}

bool read_file(const std::string& path, std::string& out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  out.clear();
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return true;
}

bool write_file(const std::string& path, const std::string& data) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = fclose(f) == 0 && ok;
  return ok;
}

bool mkdirs(const std::string& path) {
  if (path.empty()) return true;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  if (!mkdirs(dirname_of(path))) return false;
  return mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
}

void rmtree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      std::string p = path + "/" + e->d_name;
      struct stat st;
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) rmtree(p);
      else unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

// A relative path that stays inside the temp dir ("a/b.cuh" kept; absolute
// or ".." components reduced to the base name).
std::string safe_rel(const std::string& name, const char* fallback) {
  if (name.empty()) return fallback;
  if (name[0] == '/' || name.find("..") != std::string::npos) {
    size_t s = name.rfind('/');
    std::string b = s == std::string::npos ? name : name.substr(s + 1);
    return b.empty() || b == ".." ? fallback : b;
  }
  return name;
}

struct Hash {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void add(const void* p, size_t n) {
    const unsigned char* c = (const unsigned char*)p;
    for (size_t i = 0; i < n; i++) {
      a = (a ^ c[i]) * 0x100000001b3ull;
      b = (b ^ c[i]) * 0x9e3779b97f4a7c15ull;
      b ^= b >> 29;
    }
  }
  void add(const std::string& s) {
    uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
  std::string hex() const {
    char buf[40];
    snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
  }
};

// Runs argv in `cwd`, stdout+stderr into `output`. Returns the exit status
// (-1 if it could not run).
int run_cmd(const std::vector<std::string>& argv, const std::string& cwd, std::string& output) {
  std::string logpath = cwd + "/.cmd-output";
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    output = std::string("fork failed: ") + strerror(errno);
    return -1;
  }
  if (pid == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(127);
    int fd = open(logpath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(127);
    dup2(fd, 1);
    dup2(fd, 2);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, 0);
    execvp(av[0], av.data());
    const char m[] = "cuemu nvrtc: cannot run the host compiler\n";
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      output = "waitpid failed";
      return -1;
    }
  }
  read_file(logpath, output);
  unlink(logpath.c_str());
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// <lib>/.. of this library: <root>/lib/libnvrtc.so -> <root>.
std::string lib_dir() {
  Dl_info info;
  if (dladdr((void*)&lib_dir, &info) && info.dli_fname) {
    char real[PATH_MAX];
    if (realpath(info.dli_fname, real)) return dirname_of(real);
    return dirname_of(info.dli_fname);
  }
  return ".";
}

std::string cache_dir() {
  if (const char* d = getenv("CUEMU_CACHE_DIR"); d && *d) return d;
  if (const char* d = getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/cuemu";
  if (const char* d = getenv("HOME"); d && *d) return std::string(d) + "/.cache/cuemu";
  return "/tmp/cuemu-cache";
}

// ---------------------------------------------------------------- options ---

struct Options {
  std::string arch = "compute_52";
  std::string std_flag = "-std=c++17";
  bool fmad = true;
  bool lineinfo = false;
  std::vector<std::string> includes, defines, undefs;
};

bool parse_options(int n, const char* const* opts, Options& o, std::string& log) {
  auto value_of = [&](int& i, const std::string& a, const char* lng, const char* shrt, std::string& v) -> bool {
    // --long=V, --long V, -short=V, -short V
    for (const char* key : {lng, shrt}) {
      if (!key) continue;
      std::string k = key;
      if (a == k) {
        if (i + 1 >= n || !opts[i + 1]) return false;
        v = opts[++i];
        return true;
      }
      if (a.compare(0, k.size() + 1, k + "=") == 0) {
        v = a.substr(k.size() + 1);
        return true;
      }
    }
    return false;
  };
  for (int i = 0; i < n; i++) {
    if (!opts[i]) {
      log += "error: null option\n";
      return false;
    }
    const std::string a = opts[i];
    std::string v;
    if (value_of(i, a, "--gpu-architecture", "-arch", v)) {
      if ((v.rfind("compute_", 0) != 0 && v.rfind("sm_", 0) != 0) || v.size() < 5) {
        log += "error: invalid value for --gpu-architecture: '" + v + "'\n";
        return false;
      }
      o.arch = v;
    } else if (value_of(i, a, "--std", "-std", v)) {
      if (v == "c++03" || v == "c++11" || v == "c++14" || v == "c++17" || v == "c++20") {
        o.std_flag = "-std=" + v;
      } else {
        log += "error: invalid value for --std: '" + v + "'\n";
        return false;
      }
    } else if (value_of(i, a, "--fmad", "-fmad", v)) {
      if (v == "true") o.fmad = true;
      else if (v == "false") o.fmad = false;
      else {
        log += "error: invalid value for --fmad: '" + v + "'\n";
        return false;
      }
    } else if (value_of(i, a, "--include-path", "-I", v)) {
      o.includes.push_back(v);
    } else if (a.size() > 2 && a.compare(0, 2, "-I") == 0) {
      o.includes.push_back(a.substr(2));
    } else if (value_of(i, a, "--define-macro", "-D", v)) {
      o.defines.push_back(v);
    } else if (a.size() > 2 && a.compare(0, 2, "-D") == 0) {
      o.defines.push_back(a.substr(2));
    } else if (value_of(i, a, "--undefine-macro", "-U", v)) {
      o.undefs.push_back(v);
    } else if (a.size() > 2 && a.compare(0, 2, "-U") == 0) {
      o.undefs.push_back(a.substr(2));
    } else if (a == "-default-device" || a == "--device-as-default-execution-space" || a == "-dw" ||
               a == "--disable-warnings" || a == "-w" || a == "--device-debug" || a == "-G" ||
               a == "-rdc=false" || a == "--relocatable-device-code=false" || a == "--extensible-whole-program=false" ||
               a == "-restrict" || a == "--restrict" || a == "-ewp" || a == "--no-source-include" ||
               a == "-no-source-include" || a == "--ftz=false" || a == "-ftz=false" || a == "--prec-div=true" ||
               a == "-prec-div=true" || a == "--prec-sqrt=true" || a == "-prec-sqrt=true" || a == "-builtin-move-forward=true" ||
               a == "-builtin-initializer-list=true" || a == "--builtin-move-forward=true" ||
               a == "--builtin-initializer-list=true") {
      // accepted; no effect on the emulated device
    } else if (a == "-lineinfo" || a == "--generate-line-info") {
      o.lineinfo = true;
    } else if (a == "--use_fast_math" || a == "-use_fast_math" || a.rfind("--ftz", 0) == 0 || a.rfind("-ftz", 0) == 0 ||
               a.rfind("--prec-div", 0) == 0 || a.rfind("-prec-div", 0) == 0 || a.rfind("--prec-sqrt", 0) == 0 ||
               a.rfind("-prec-sqrt", 0) == 0) {
      log += "error: option '" + a + "' is not supported by the emulated device (approximate math is not emulated)\n";
      return false;
    } else {
      log += "error: unrecognized option '" + a + "'\n";
      return false;
    }
  }
  return true;
}

// ------------------------------------------------------ kernel discovery ---

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
  template <class Fn, size_t... I> static void call(Fn f, void* const* args, std::index_sequence<I...>) {
    f(*static_cast<A*>(args[I])...);
  }
  template <class Fn> static void invoke(Fn f, void* const* args) { call(f, args, std::index_sequence_for<A...>{}); }
};
template <class... A> struct sig<void (*)(A...)> : sig_base<A...> {};
template <class... A> struct sig<void (*)(A...) noexcept> : sig_base<A...> {};
}  // namespace cuemu_gen
extern "C" char __start_cuemu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_cuemu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" __attribute__((visibility("hidden"), noreturn)) void __assert_fail(const char* a, const char* f, unsigned int l, const char*) noexcept {
  cuemu_trap(a, f, (int)l);
}
)CUEMU";
  for (size_t i = 0; i < kernels.size(); i++) {
    g += "static void cuemu_entry_" + std::to_string(i) + "(void* const* a) { cuemu_gen::sig<decltype(&" + kernels[i] +
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

// The PTX text for the compiled object at `so_path`.
bool make_ptx(const std::string& so_path, const std::string& arch, std::string& ptx, std::string& err) {
  void* h = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    err = std::string("cannot load the compiled object: ") + dlerror();
    return false;
  }
  auto fn = (cuemu_module_info_fn)dlsym(h, CUEMU_MODULE_INFO_SYMBOL);
  if (!fn) {
    err = "the compiled object has no cuemu_module_info";
    dlclose(h);
    return false;
  }
  const cuemu_module_info* mi = fn();
  std::string digits = arch.substr(arch.find('_') + 1);
  ptx = "//\n// Generated by the emulated NVRTC (" + std::string(kEmuVersion) + ")\n//\n";
  ptx += CUEMU_PTX_OBJECT_TAG + so_path + "\n\n";
  ptx += ".version 9.0\n.target sm_" + digits + "\n.address_size 64\n\n";
  for (int i = 0; i < mi->nkernels; i++) {
    const cuemu_kernel_desc& k = mi->kernels[i];
    ptx += "\t// .globl\t" + std::string(k.name) + "\n";
    ptx += ".visible .entry " + std::string(k.name) + "(\n";
    for (int a = 0; a < k.nargs; a++) {
      char line[256];
      const uint32_t sz = k.arg_sizes[a];
      const char* ty = sz == 8 ? ".u64" : sz == 4 ? ".u32" : sz == 2 ? ".u16" : sz == 1 ? ".u8" : nullptr;
      if (ty)
        snprintf(line, sizeof line, "\t.param %s %s_param_%d", ty, k.name, a);
      else
        snprintf(line, sizeof line, "\t.param .align %u .b8 %s_param_%d[%u]",
                 (sz & 15u) == 0 ? 16u : (sz & 7u) == 0 ? 8u : (sz & 3u) == 0 ? 4u : (sz & 1u) == 0 ? 2u : 1u,
                 k.name, a, sz);
      ptx += line;
      ptx += a + 1 < k.nargs ? ",\n" : "\n";
    }
    ptx += ")\n{\n\tret;\n}\n\n";
  }
  dlclose(h);
  return true;
}

nvrtcResult compile(Program* p, int nopts, const char* const* opts) {
  p->log.clear();
  p->ptx.clear();
  p->compiled = false;
  Options o;
  if (!parse_options(nopts, opts, o, p->log)) return NVRTC_ERROR_INVALID_OPTION;
  p->cubin = o.arch.rfind("sm_", 0) == 0;

  const std::string libdir = lib_dir();
  std::string incdir = dirname_of(libdir) + "/include";
  if (const char* e = getenv("CUEMU_INCLUDE_DIR"); e && *e) incdir = e;
  const char* cxx_env = getenv("CUEMU_CXX");
  const std::string cxx = cxx_env && *cxx_env ? cxx_env : "g++";
  std::string arch_num = o.arch.substr(o.arch.find('_') + 1);
  while (!arch_num.empty() && !isdigit((unsigned char)arch_num.back())) arch_num.pop_back();  // sm_90a

  std::vector<std::string> common = {o.std_flag, "-O2", "-fPIC", "-march=x86-64-v3", "-fno-fast-math",
                                     o.fmad ? "-ffp-contract=fast" : "-ffp-contract=off", "-fno-math-errno",
                                     "-fvisibility=hidden", "-fno-gnu-unique", "-include", "cuemu_device.h",
                                     "-I" + incdir, "-I."};
  for (auto& i : o.includes) common.push_back("-I" + i);
  common.push_back("-D__CUDA_ARCH__=" + arch_num + "0");
  for (auto& d : o.defines) common.push_back("-D" + d);
  for (auto& u : o.undefs) common.push_back("-U" + u);
  if (o.lineinfo) common.push_back("-g1");

  // The cache key.
  Hash h;
  h.add(kEmuVersion);
  h.add(p->src);
  h.add(p->name);
  for (auto& hd : p->headers) {
    h.add(hd.first);
    h.add(hd.second);
  }
  h.add(cxx);
  h.add(libdir);
  for (auto& c : common) h.add(c);
  for (const char* f : {"cuemu_device.h", "cuda_fp16.h", "cuemu/internal.h"}) {
    std::string c;
    read_file(incdir + "/" + f, c);
    h.add(c);
  }
  {
    Dl_info info;
    struct stat st;
    if (dladdr((void*)&compile, &info) && info.dli_fname && stat(info.dli_fname, &st) == 0) {
      h.add(&st.st_mtime, sizeof st.st_mtime);
      h.add(&st.st_size, sizeof st.st_size);
    }
  }
  const std::string cdir = cache_dir();
  const std::string key = h.hex();
  const std::string so_path = cdir + "/" + key + ".so";
  const std::string ptx_path = cdir + "/" + key + ".ptx";
  if (!getenv("CUEMU_NO_CACHE")) {
    std::string cached;
    struct stat st;
    if (read_file(ptx_path, cached) && stat(so_path.c_str(), &st) == 0) {
      p->ptx = cached;
      p->compiled = true;
      return NVRTC_SUCCESS;
    }
  }
  if (!mkdirs(cdir)) {
    p->log = "error: cannot create the cache directory " + cdir + ": " + strerror(errno) + "\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }

  // Work dir with the source and the in-memory headers.
  std::string tmpl = cdir + "/tmp-XXXXXX";
  std::vector<char> tb(tmpl.begin(), tmpl.end());
  tb.push_back(0);
  if (!mkdtemp(tb.data())) {
    p->log = std::string("error: cannot create a temporary directory: ") + strerror(errno) + "\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }
  const std::string work = tb.data();
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      if (!getenv("CUEMU_KEEP_TEMPS")) rmtree(d);
    }
  } cleanup{work};

  const std::string src_rel = safe_rel(p->name, "default_program.cu");
  bool ok = mkdirs(dirname_of(work + "/" + src_rel)) && write_file(work + "/" + src_rel, p->src);
  for (auto& hd : p->headers) {
    std::string rel = safe_rel(hd.first, "header.h");
    ok = ok && mkdirs(dirname_of(work + "/" + rel)) && write_file(work + "/" + rel, hd.second);
  }
  if (!ok) {
    p->log = "error: cannot write the program to " + work + "\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }

  // 1. Discovery: preprocess with __global__ as a marker token.
  std::vector<std::string> pre = {cxx, "-E", "-P", "-DCUEMU_DISCOVER"};
  pre.insert(pre.end(), common.begin(), common.end());
  pre.push_back("-x");
  pre.push_back("c++");
  pre.push_back(src_rel);
  pre.push_back("-o");
  pre.push_back(".pre.ii");
  std::string out;
  int rc = run_cmd(pre, work, out);
  if (rc != 0) {
    p->log = out.empty() ? "error: the host compiler (" + cxx + ") failed to run\n" : out;
    return NVRTC_ERROR_COMPILATION;
  }
  std::string pretext;
  read_file(work + "/.pre.ii", pretext);
  std::vector<std::string> kernels = discover_kernels(pretext);

  // 2. The module.
  if (!write_file(work + "/.cuemu_module.cpp", generated_tu(src_rel, kernels))) {
    p->log = "error: cannot write the generated module\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }
  std::vector<std::string> cc = {cxx, "-shared"};
  cc.insert(cc.end(), common.begin(), common.end());
  cc.push_back(".cuemu_module.cpp");
  cc.push_back("-o");
  cc.push_back("out.so");
  cc.push_back("-L" + libdir);
  cc.push_back("-lcuda");
  cc.push_back("-Wl,-rpath," + libdir);
  cc.push_back("-Wl,--no-undefined");
  rc = run_cmd(cc, work, out);
  p->log = out;
  if (rc != 0) {
    if (p->log.empty()) p->log = "error: the host compiler (" + cxx + ") failed\n";
    return NVRTC_ERROR_COMPILATION;
  }
  // Publish: object first, then its PTX (a PTX in the cache implies its object).
  const std::string tmp_so = work + "/publish.so";
  if (rename((work + "/out.so").c_str(), so_path.c_str()) != 0) {
    p->log += "error: cannot store " + so_path + ": " + strerror(errno) + "\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }
  (void)tmp_so;
  std::string ptx, err;
  if (!make_ptx(so_path, o.arch, ptx, err)) {
    p->log += "error: " + err + "\n";
    return NVRTC_ERROR_INTERNAL_ERROR;
  }
  const std::string tmp_ptx = work + "/out.ptx";
  if (write_file(tmp_ptx, ptx)) {
    if (rename(tmp_ptx.c_str(), ptx_path.c_str()) != 0) unlink(tmp_ptx.c_str());
  }
  p->ptx = ptx;
  p->compiled = true;
  return NVRTC_SUCCESS;
}

}  // namespace

// ------------------------------------------------------------------ API ---

NVRTC_EXPORT const char* nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION: return "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
    case NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: return "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
    case NVRTC_ERROR_TIME_FILE_WRITE_FAILED: return "NVRTC_ERROR_TIME_FILE_WRITE_FAILED";
  }
  return "NVRTC_ERROR unknown";
}

NVRTC_EXPORT nvrtcResult nvrtcVersion(int* major, int* minor) {
  if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
  *major = 13;
  *minor = 0;
  return NVRTC_SUCCESS;
}

static const int kArchs[] = {75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121};

NVRTC_EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int* n) {
  if (!n) return NVRTC_ERROR_INVALID_INPUT;
  *n = (int)(sizeof kArchs / sizeof kArchs[0]);
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetSupportedArchs(int* archs) {
  if (!archs) return NVRTC_ERROR_INVALID_INPUT;
  memcpy(archs, kArchs, sizeof kArchs);
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcCreateProgram(Program** prog, const char* src, const char* name, int numHeaders,
                                            const char* const* headers, const char* const* includeNames) {
  if (!prog || !src || numHeaders < 0 || (numHeaders > 0 && (!headers || !includeNames)))
    return NVRTC_ERROR_INVALID_INPUT;
  Program* p = new (std::nothrow) Program();
  if (!p) return NVRTC_ERROR_OUT_OF_MEMORY;
  p->src = src;
  p->name = name && *name ? name : "default_program";
  for (int i = 0; i < numHeaders; i++) {
    if (!includeNames[i]) {
      delete p;
      return NVRTC_ERROR_INVALID_INPUT;
    }
    p->headers.emplace_back(includeNames[i], headers[i] ? headers[i] : "");
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_programs.insert(p);
  }
  *prog = p;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcDestroyProgram(Program** prog) {
  if (!prog || !valid(*prog)) return NVRTC_ERROR_INVALID_PROGRAM;
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_programs.erase(*prog);
  }
  delete *prog;
  *prog = nullptr;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcCompileProgram(Program* p, int numOptions, const char* const* options) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (numOptions < 0 || (numOptions > 0 && !options)) return NVRTC_ERROR_INVALID_INPUT;
  try {
    return compile(p, numOptions, options);
  } catch (const std::bad_alloc&) {
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
}

NVRTC_EXPORT nvrtcResult nvrtcGetPTXSize(Program* p, size_t* size) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  *size = p->ptx.size() + 1;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetPTX(Program* p, char* ptx) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!ptx) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(ptx, p->ptx.c_str(), p->ptx.size() + 1);
  return NVRTC_SUCCESS;
}

// For sm_XY the "cubin" is the PTX text's bytes (with its NUL); for a virtual
// architecture there is none (size 0), as with the real NVRTC.
NVRTC_EXPORT nvrtcResult nvrtcGetCUBINSize(Program* p, size_t* size) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  *size = p->cubin ? p->ptx.size() + 1 : 0;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetCUBIN(Program* p, char* cubin) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!cubin) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!p->cubin) return NVRTC_ERROR_INVALID_INPUT;
  memcpy(cubin, p->ptx.c_str(), p->ptx.size() + 1);
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetLTOIRSize(Program* p, size_t* size) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size) return NVRTC_ERROR_INVALID_INPUT;
  *size = 0;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetLTOIR(Program* p, char*) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  return NVRTC_ERROR_INVALID_INPUT;
}

NVRTC_EXPORT nvrtcResult nvrtcGetProgramLogSize(Program* p, size_t* size) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size) return NVRTC_ERROR_INVALID_INPUT;
  *size = p->log.size() + 1;
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetProgramLog(Program* p, char* log) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!log) return NVRTC_ERROR_INVALID_INPUT;
  memcpy(log, p->log.c_str(), p->log.size() + 1);
  return NVRTC_SUCCESS;
}

// Name expressions: only plain (extern "C" or unqualified) names are
// supported; the lowered name is the name itself.
NVRTC_EXPORT nvrtcResult nvrtcAddNameExpression(Program* p, const char* expr) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!expr) return NVRTC_ERROR_INVALID_INPUT;
  if (p->compiled) return NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION;
  std::string e = expr, l = e;
  while (!l.empty() && (l[0] == '&' || l[0] == ' ')) l.erase(0, 1);
  if (l.rfind("::", 0) == 0) l.erase(0, 2);
  p->name_exprs.push_back(e);
  p->lowered.push_back(base_name(l));
  return NVRTC_SUCCESS;
}

NVRTC_EXPORT nvrtcResult nvrtcGetLoweredName(Program* p, const char* expr, const char** lowered) {
  if (!valid(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!expr || !lowered) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION;
  for (size_t i = 0; i < p->name_exprs.size(); i++)
    if (p->name_exprs[i] == expr) {
      *lowered = p->lowered[i].c_str();
      return NVRTC_SUCCESS;
    }
  return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
}
