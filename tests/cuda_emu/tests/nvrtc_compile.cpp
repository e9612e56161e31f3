// The emulated NVRTC: options, errors, logs, PTX/cubin, caching, and every
// kernel file of the project compiling with its in-memory header.
#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "exec_util.h"

static std::string read_text(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static std::string kernels_dir() {
  std::vector<std::string> cands;
  if (const char* d = getenv("CUEMU_TEST_DIR")) cands.push_back(std::string(d) + "/../../../kernels");
  std::string f = __FILE__;
  size_t s = f.rfind('/');
  cands.push_back((s == std::string::npos ? std::string(".") : f.substr(0, s)) + "/../../../kernels");
  cands.push_back("../../kernels");
  cands.push_back("/work/main/kernels");
  for (auto& c : cands) {
    struct stat st;
    if (stat((c + "/common.cuh").c_str(), &st) == 0) return c;
  }
  CHECK_MSG(false, "cannot find the project's kernels/ folder");
  return "";
}

TEST_CASE(version_and_error_strings) {
  int a = 0, b = 0;
  CHECK(nvrtcVersion(&a, &b) == 0 && a == 13 && b == 0);
  CHECK(!strcmp(nvrtcGetErrorString(6), "NVRTC_ERROR_COMPILATION"));
  CHECK(!strcmp(nvrtcGetErrorString(5), "NVRTC_ERROR_INVALID_OPTION"));
}

TEST_CASE(compile_error_has_gcc_log) {
  emu::Compiled c = emu::compile("extern \"C\" __global__ void k(float* p) { p[0] = undeclared_thing; }\n", "broken.cu");
  CHECK_MSG(c.rc == 6, "rc %d", c.rc);
  CHECK_MSG(c.log.find("broken.cu:1") != std::string::npos && c.log.find("undeclared_thing") != std::string::npos,
            "log: %s", c.log.c_str());
}

TEST_CASE(options) {
  const char* src = "extern \"C\" __global__ void k(float* p) { p[0] = 1.f; }\n";
  emu::Compiled c = emu::compile(src, "o.cu", {}, {"--use_fast_math"});
  CHECK_MSG(c.rc == 5 && c.log.find("use_fast_math") != std::string::npos, "rc %d log %s", c.rc, c.log.c_str());
  c = emu::compile(src, "o.cu", {}, {"--no-such-option"});
  CHECK_MSG(c.rc == 5 && c.log.find("no-such-option") != std::string::npos, "rc %d log %s", c.rc, c.log.c_str());
  c = emu::compile(src, "o.cu", {}, {"--gpu-architecture=sm_90", "-DFOO=1", "-I/nonexistent", "--fmad=false", "-lineinfo"});
  CHECK_MSG(c.rc == 0, "rc %d log %s", c.rc, c.log.c_str());
  c = emu::compile("#if FOO != 7\n#error FOO\n#endif\nextern \"C\" __global__ void k(){}\n", "d.cu", {}, {"-D", "FOO=7", "-arch=compute_80"});
  CHECK_MSG(c.rc == 0, "rc %d log %s", c.rc, c.log.c_str());
}

TEST_CASE(cubin_is_ptx_bytes_for_sm) {
  const char* src = "extern \"C\" __global__ void k(float* p, int n, double d, char c) { p[0] = n + d + c; }\n";
  std::vector<const char*> opts = {"--gpu-architecture=sm_90"};
  nvrtcProgram p;
  CHECK(nvrtcCreateProgram(&p, src, "c.cu", 0, nullptr, nullptr) == 0);
  CHECK(nvrtcCompileProgram(p, 1, opts.data()) == 0);
  size_t n = 0, m = 0;
  CHECK(nvrtcGetCUBINSize(p, &n) == 0 && n > 1);
  CHECK(nvrtcGetPTXSize(p, &m) == 0 && m == n);
  std::vector<char> a(n), b(m);
  CHECK(nvrtcGetCUBIN(p, a.data()) == 0 && nvrtcGetPTX(p, b.data()) == 0 && a == b);
  std::string ptx(b.data());
  CHECK_MSG(ptx.find(".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u32 k_param_1,\n\t.param .u64 k_param_2,\n\t.param .u8 k_param_3\n)") != std::string::npos, "%s", ptx.c_str());
  CHECK(ptx.find(".target sm_90") != std::string::npos);
  nvrtcDestroyProgram(&p);
}

TEST_CASE(descriptors_deduced_from_types) {
  emu::Module m = emu::build(R"(
namespace outer { namespace inner {
extern "C" __global__ void deep(const float* a, float* b, long long n, __half h, int i) {}
} }
extern "C" { __global__ void in_block(double2 v, const __half* p) {} }
template <class T> __global__ void not_a_c_kernel(T* p) {}
__global__ void cpp_kernel(int*) {}
)", "desc.cu");
  CHECK_MSG(m.info->nkernels == 2, "%d kernels", m.info->nkernels);
  const cuemu_kernel_desc* k = m.kernel("deep");
  CHECK(k->nargs == 5);
  const uint32_t sizes[] = {8, 8, 8, 2, 4}, offs[] = {0, 8, 16, 24, 28};
  const uint8_t kinds[] = {CUEMU_ARG_PTR_CONST, CUEMU_ARG_PTR_MUT, CUEMU_ARG_VALUE, CUEMU_ARG_VALUE, CUEMU_ARG_VALUE};
  for (int i = 0; i < 5; i++) {
    CHECK_MSG(k->arg_sizes[i] == sizes[i] && k->arg_offsets[i] == offs[i] && k->arg_kinds[i] == kinds[i],
              "arg %d: size %u off %u kind %u", i, k->arg_sizes[i], k->arg_offsets[i], k->arg_kinds[i]);
  }
  CHECK_MSG(!strcmp(k->arg_types[0], "const float*") && !strcmp(k->arg_types[3], "__half"), "%s / %s", k->arg_types[0], k->arg_types[3]);
  k = m.kernel("in_block");
  CHECK(k->nargs == 2 && k->arg_sizes[0] == 16 && k->arg_offsets[1] == 16 && k->arg_kinds[1] == CUEMU_ARG_PTR_CONST);
  CHECK(!strcmp(m.info->source_name, "desc.cu"));
}

// Every kernels/*.cu compiles as the Rust code does it (common.cuh in memory,
// the same options) and its PTX lists each extern "C" kernel with the number
// of parameters its source declares.
TEST_CASE(project_kernels_compile) {
  const std::string dir = kernels_dir();
  const std::string common = read_text(dir + "/common.cuh");
  DIR* d = opendir(dir.c_str());
  CHECK(d);
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 3 && n.substr(n.size() - 3) == ".cu") files.push_back(n);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  CHECK(files.size() >= 10);
  int total = 0;
  for (auto& f : files) {
    const std::string src = read_text(dir + "/" + f);
    // expected kernels and parameter counts from the source text
    std::map<std::string, int> want;
    auto count_params = [](const std::string& p) {
      std::string t = std::regex_replace(p, std::regex("\\s+"), " ");
      if (t.find_first_not_of(" ") == std::string::npos) return 0;
      return (int)std::count(t.begin(), t.end(), ',') + 1;
    };
    std::regex direct("extern \"C\" __global__ void (\\w+)\\(([^)]*)\\)");
    for (std::sregex_iterator it(src.begin(), src.end(), direct), end; it != end; ++it)
      want[(*it)[1]] = count_params((*it)[2]);
    std::regex inst("DDP_INSTANTIATE\\(\\s*(\\w+),\\s*\\(([^)]*)\\)");
    for (std::sregex_iterator it(src.begin(), src.end(), inst), end; it != end; ++it) {
      want[(*it)[1].str() + "_f32"] = count_params((*it)[2]);
      want[(*it)[1].str() + "_f16"] = count_params((*it)[2]);
    }
    double t0 = emu::now_s();
    emu::Compiled c = emu::compile(src, f.c_str(), {{"common.cuh", common}},
                                   {"--gpu-architecture=compute_90", "--std=c++17", "-default-device", "--fmad=true"});
    CHECK_MSG(c.rc == 0, "%s: rc %d\n%s", f.c_str(), c.rc, c.log.c_str());
    std::printf("# %s: %zu kernels, %.2f s\n", f.c_str(), want.size(), emu::now_s() - t0);
    std::map<std::string, int> got;
    std::regex entry("\\.visible \\.entry (\\w+)\\(\\n((?:\\t\\.param [^\\n]*\\n)*)\\)");
    for (std::sregex_iterator it(c.ptx.begin(), c.ptx.end(), entry), end; it != end; ++it) {
      std::string ps = (*it)[2];
      got[(*it)[1]] = (int)std::count(ps.begin(), ps.end(), '\n');
    }
    CHECK_MSG(!want.empty(), "%s: no kernels found in the source", f.c_str());
    CHECK_MSG(got == want, "%s: PTX kernels differ from the source (%zu vs %zu)", f.c_str(), got.size(), want.size());
    emu::Module m = emu::load(c.ptx);
    CHECK(m.info->nkernels == (int)want.size());
    total += (int)want.size();
  }
  std::printf("# %d kernels in %zu files\n", total, files.size());
}

TEST_MAIN
