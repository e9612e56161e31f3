// Helpers for the driver-level tests: the primary context of device 0 made
// current, and substring checks for messages.
#pragma once
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

}  // namespace drv
