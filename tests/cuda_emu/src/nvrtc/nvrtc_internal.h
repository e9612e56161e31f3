// What the emulated NVRTC's files share: the program object, the helpers
// for files and the host compiler, option parsing, kernel discovery, and the
// compile step. nvrtc.cpp holds the API entry points, compile.cpp the
// pipeline and its cache.
#pragma once
#include <string>
#include <utility>
#include <vector>

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

namespace cuemu_nvrtc {

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

// ------------------------------------------------------------- sys.cpp ---

std::string dirname_of(const std::string& p);
bool read_file(const std::string& path, std::string& out);
bool write_file(const std::string& path, const std::string& data);
bool mkdirs(const std::string& path);
void rmtree(const std::string& path);
std::string safe_rel(const std::string& name, const char* fallback);
int run_cmd(const std::vector<std::string>& argv, const std::string& cwd, std::string& output);
std::string lib_dir();
std::string cache_dir();

// --------------------------------------------------------- options.cpp ---

struct Options {
  std::string arch = "compute_52";
  std::string std_flag = "-std=c++17";
  bool fmad = true;
  bool lineinfo = false;
  std::vector<std::string> includes, defines, undefs;
};

bool parse_options(int n, const char* const* opts, Options& o, std::string& log);

// -------------------------------------------------------- discover.cpp ---

std::vector<std::string> discover_kernels(const std::string& pre);
std::string base_name(const std::string& q);
std::string generated_tu(const std::string& src_rel, const std::vector<std::string>& kernels);
// The assembly of a module with the COMDAT sections of templates' __shared__
// variables (flagged "awGR") replaced by the shared section.
std::string shared_into_one_section(const std::string& asm_text);

// --------------------------------------------------------- compile.cpp ---

nvrtcResult compile(Program* p, int nopts, const char* const* opts);

}  // namespace cuemu_nvrtc
