// Helpers for the executor / NVRTC tests (exec_*.cpp, nvrtc_*.cpp): compile a
// kernel source with the emulated NVRTC, dlopen the object its PTX names and
// run a grid through cuemu_exec_grid directly on host buffers (no driver).
#pragma once
#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../include/cuemu/internal.h"
#include "harness.h"

extern "C" {
typedef struct _nvrtcProgram* nvrtcProgram;
int nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
int nvrtcCompileProgram(nvrtcProgram, int, const char* const*);
int nvrtcGetPTXSize(nvrtcProgram, size_t*);
int nvrtcGetPTX(nvrtcProgram, char*);
int nvrtcGetCUBINSize(nvrtcProgram, size_t*);
int nvrtcGetCUBIN(nvrtcProgram, char*);
int nvrtcGetProgramLogSize(nvrtcProgram, size_t*);
int nvrtcGetProgramLog(nvrtcProgram, char*);
int nvrtcDestroyProgram(nvrtcProgram*);
int nvrtcVersion(int*, int*);
const char* nvrtcGetErrorString(int);
}

namespace emu {

struct Compiled {
  int rc = -1;
  std::string log, ptx;
};

inline Compiled compile(const std::string& src, const char* name = "test.cu",
                        std::vector<std::pair<std::string, std::string>> headers = {},
                        std::vector<std::string> opts = {"--gpu-architecture=compute_90", "--std=c++17",
                                                         "-default-device", "--fmad=true"}) {
  Compiled c;
  std::vector<const char*> hs, hn, os;
  for (auto& h : headers) {
    hs.push_back(h.second.c_str());
    hn.push_back(h.first.c_str());
  }
  for (auto& o : opts) os.push_back(o.c_str());
  nvrtcProgram p = nullptr;
  int r = nvrtcCreateProgram(&p, src.c_str(), name, (int)hs.size(), hs.data(), hn.data());
  CHECK_MSG(r == 0, "nvrtcCreateProgram: %d", r);
  c.rc = nvrtcCompileProgram(p, (int)os.size(), os.data());
  size_t n = 0;
  nvrtcGetProgramLogSize(p, &n);
  std::vector<char> b(n + 1);
  nvrtcGetProgramLog(p, b.data());
  c.log = b.data();
  if (c.rc == 0) {
    nvrtcGetPTXSize(p, &n);
    b.assign(n + 1, 0);
    nvrtcGetPTX(p, b.data());
    c.ptx = b.data();
  }
  nvrtcDestroyProgram(&p);
  return c;
}

struct Module {
  void* handle = nullptr;
  const cuemu_module_info* info = nullptr;
  const cuemu_kernel_desc* kernel(const char* name) const {
    for (int i = 0; i < info->nkernels; i++)
      if (!strcmp(info->kernels[i].name, name)) return &info->kernels[i];
    CHECK_MSG(false, "no kernel %s in the module", name);
    return nullptr;
  }
};

inline Module load(const std::string& ptx) {
  size_t a = ptx.find(CUEMU_PTX_OBJECT_TAG);
  CHECK_MSG(a != std::string::npos, "no object tag in PTX");
  a += strlen(CUEMU_PTX_OBJECT_TAG);
  std::string path = ptx.substr(a, ptx.find('\n', a) - a);
  Module m;
  m.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  CHECK_MSG(m.handle, "dlopen %s: %s", path.c_str(), dlerror());
  auto fn = (cuemu_module_info_fn)dlsym(m.handle, CUEMU_MODULE_INFO_SYMBOL);
  CHECK_MSG(fn, "no cuemu_module_info");
  m.info = fn();
  return m;
}

inline Module build(const std::string& src, const char* name = "test.cu") {
  Compiled c = compile(src, name);
  CHECK_MSG(c.rc == 0, "compile failed (%d): %s", c.rc, c.log.c_str());
  return load(c.ptx);
}

// Runs kernel `k` with arguments given as pointers to their values.
inline cuemu_exec_result launch(const Module& m, const char* kernel, cuemu_dim3 grid, cuemu_dim3 block,
                                std::vector<void*> args) {
  cuemu_exec_result r;
  cuemu_exec_grid(m.info, m.kernel(kernel), grid, block, 0, args.data(), &r);
  return r;
}

inline void expect_ok(const cuemu_exec_result& r) { CHECK_MSG(r.ok, "launch failed (%d): %s", r.cuda_error, r.message); }

inline void expect_error(const cuemu_exec_result& r, int code, const char* needle) {
  CHECK_MSG(!r.ok, "launch succeeded, expected an error containing '%s'", needle);
  CHECK_MSG(r.cuda_error == code, "error %d, expected %d: %s", r.cuda_error, code, r.message);
  CHECK_MSG(strstr(r.message, needle), "message '%s' lacks '%s'", r.message, needle);
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace emu
