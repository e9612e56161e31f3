// The emulated NVRTC: compiles a CUDA C++ program as host C++ with g++
// (CUEMU_CXX overrides) into a shared object that exports cuemu_module_info
// (see include/cuemu/internal.h), and returns "PTX" text that names that
// object (CUEMU_PTX_OBJECT_TAG) and lists each extern "C" kernel with its
// parameters, as real PTX would.
//
// The pipeline is in compile.cpp; what the files share, in nvrtc_internal.h.
#include "nvrtc_internal.h"

#include <string.h>

#include <mutex>
#include <new>
#include <set>
#include <string>

#define NVRTC_EXPORT extern "C" __attribute__((visibility("default")))

namespace cuemu_nvrtc {
namespace {

std::mutex g_mu;
std::set<Program*> g_programs;  // handles handed out (checked on every call)

bool valid(Program* p) {
  std::lock_guard<std::mutex> g(g_mu);
  return p && g_programs.count(p);
}

}  // namespace
}  // namespace cuemu_nvrtc

using namespace cuemu_nvrtc;

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
