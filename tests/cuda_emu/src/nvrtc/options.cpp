// NVRTC's command-line options, as far as the emulated device honours them.
// --use_fast_math is rejected (NVRTC_ERROR_INVALID_OPTION): its approximate
// math is not emulated.
#include "nvrtc_internal.h"

namespace cuemu_nvrtc {

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

}  // namespace cuemu_nvrtc
