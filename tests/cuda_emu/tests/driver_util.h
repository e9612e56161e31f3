// Helpers for the driver-level tests: the primary context of device 0 made
// current, substring checks for messages, and the same program run again
// with other environment variables.
#pragma once
#include <stdio.h>
#include <unistd.h>

#include <string>

#include "../src/driver/api_decls.h"
#include "harness.h"

namespace drv {

inline CUcontext ctx() {
  static CUcontext c = [] {
    CHECK(cuInit(0) == 0);
    CUcontext c;
    CHECK(cuDevicePrimaryCtxRetain(&c, 0) == 0);
    return c;
  }();
  CHECK(cuCtxSetCurrent(c) == 0);
  return c;
}

inline bool contains(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

// The first line this test program prints when run again as `env ... self
// test_case` (the case runs its child part when it sees the environment).
inline std::string run_child(const std::string& env, const char* test_case) {
  std::string cmd = env + " /proc/" + std::to_string(getpid()) + "/exe " + test_case + " 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  CHECK(f);
  char line[256] = {};
  const bool got = fgets(line, sizeof line, f) != nullptr;
  pclose(f);
  CHECK_MSG(got, "%s printed nothing", cmd.c_str());
  return line;
}

}  // namespace drv
