// A minimal test harness for the emulated device's own test programs: each
// case prints "PASS <name>" or "FAIL <name>: <why>"; run-tests.sh adds them up.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace harness {

struct Failure {
  std::string why;
};

inline std::vector<std::pair<std::string, std::function<void()>>>& cases() {
  static std::vector<std::pair<std::string, std::function<void()>>> c;
  return c;
}

struct Register {
  Register(const char* name, std::function<void()> f) { cases().emplace_back(name, std::move(f)); }
};

// Runs every case, or only those named on the command line.
inline int run_all(int argc, char** argv) {
  int failed = 0;
  for (auto& [name, f] : cases()) {
    if (argc > 1) {
      bool want = false;
      for (int i = 1; i < argc; i++) want |= name == argv[i];
      if (!want) continue;
    }
    try {
      f();
      std::printf("PASS %s\n", name.c_str());
    } catch (const Failure& e) {
      std::printf("FAIL %s: %s\n", name.c_str(), e.why.c_str());
      failed++;
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}

}  // namespace harness

#define TEST_CASE(name)                                              \
  static void name();                                                \
  static harness::Register name##_reg(#name, name);                  \
  static void name()

#define CHECK_MSG(cond, ...)                                         \
  do {                                                               \
    if (!(cond)) {                                                   \
      char buf_[2048];                                               \
      std::snprintf(buf_, sizeof buf_, __VA_ARGS__);                 \
      throw harness::Failure{std::string(__FILE__ ":") +             \
                             std::to_string(__LINE__) + ": " + buf_}; \
    }                                                                \
  } while (0)

#define CHECK(cond) CHECK_MSG(cond, "%s", #cond)

#define TEST_MAIN \
  int main(int argc, char** argv) { return harness::run_all(argc, argv); }
