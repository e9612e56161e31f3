// Included by the module the emulated NVRTC generates around each program:
// the entry points of GCC's ThreadSanitizer instrumentation, which the
// kernels are compiled with so that every load, store and atomic of kernel
// code calls one of them first. No ThreadSanitizer runtime is involved: they
// are defined here, in the module itself (direct calls, no PLT), and filter
// the addresses on the spot. Device memory (one region, libcuda's shadow) and
// this module's __shared__ variables go to libcuda's checkers; anything else
// (the thread's stack, the parameter buffer, host data) is not checked.
// Atomics are a read and a write, then the operation itself.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "cuemu/internal.h"

extern "C" char __start_cuemu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_cuemu_shared[] __attribute__((weak, visibility("hidden")));

#ifdef CUEMU_PROFILE_BLOCKS
// Profiled kernels also call a function at the start of every basic block
// (-fsanitize-coverage=trace-pc): it counts the block for the running launch,
// whose counters libcuda hands over in cuemu_prof_blocks_tls. The checkers
// below are not kernel work: they are left out of those blocks.
#define CUEMU_CHECKER extern "C" __attribute__((visibility("hidden"), no_sanitize_thread, no_sanitize_coverage, noinline))
extern "C" __attribute__((no_sanitize_thread, no_sanitize_coverage, noinline)) void __sanitizer_cov_trace_pc(void) {
  cuemu_prof_blocks* b = &cuemu_prof_blocks_tls;
  const uintptr_t off = (uintptr_t)__builtin_return_address(0) - b->base;
  if (off < b->span) b->counts[off >> 2]++;
}
#else
#define CUEMU_CHECKER extern "C" __attribute__((visibility("hidden"), no_sanitize_thread, noinline))
#endif

namespace cuemu_checks {

struct Region {
  uintptr_t base;
  size_t len;
  Region() { cuemu_device_region(&base, &len); }
};
// Set when the module is loaded (before any kernel of it runs).
static Region g_region;
// Profiled objects are compiled apart (CUEMU_PROFILE_BLOCKS, from the
// emulated NVRTC when CUEMU_PROFILE is set): the checks of an ordinary
// object carry no profiler branch at all.
#ifdef CUEMU_PROFILE_BLOCKS
static constexpr bool g_profile = true;
#else
static constexpr bool g_profile = false;
#endif

// `site` is the instruction that made the access (the return address of the
// entry point below): the profiler's warp-level requests are the lanes'
// accesses at one site, matched by occurrence. `prof` is the access's
// cuemu_prof_kind for global memory (shared ones derive from it), or -1: an
// atomic checks a read and a write, but is one request.
__attribute__((no_sanitize_thread, always_inline)) inline void check(const volatile void* p, size_t n, int write,
                                                                     int prof, const void* site) {
  const uintptr_t a = (uintptr_t)p;
  if (a - g_region.base < g_region.len) {
    if (g_profile && prof >= 0)
      cuemu_profile_device(a, n, write, prof, site);
    else
      cuemu_check_device(a, n, write);
  } else if (a - (uintptr_t)__start_cuemu_shared < (uintptr_t)(__stop_cuemu_shared - __start_cuemu_shared)) {
    if (g_profile && prof >= 0)
      cuemu_profile_shared(a, n, write, prof == CUEMU_PROF_LD ? CUEMU_PROF_SHLD : CUEMU_PROF_SHST, site);
    else
      cuemu_check_shared(a, n, write);
  }
}

}  // namespace cuemu_checks

#define CUEMU_SITE __builtin_return_address(0)
#define CUEMU_LD(p, n) cuemu_checks::check(p, n, 0, CUEMU_PROF_LD, CUEMU_SITE)
#define CUEMU_ST(p, n) cuemu_checks::check(p, n, 1, CUEMU_PROF_ST, CUEMU_SITE)
// An atomic: checked as a read and a write, profiled once.
#define CUEMU_ATOM(p, n)                                                 \
  (cuemu_checks::check(p, n, 0, -1, nullptr), cuemu_checks::check(p, n, 1, CUEMU_PROF_ATOM, CUEMU_SITE))
#define CUEMU_ACCESS_ENTRY(n)                                                                              \
  CUEMU_CHECKER void __tsan_read##n(void* p) { CUEMU_LD(p, n); }                                           \
  CUEMU_CHECKER void __tsan_write##n(void* p) { CUEMU_ST(p, n); }                                          \
  CUEMU_CHECKER void __tsan_unaligned_read##n(void* p) { CUEMU_LD(p, n); }                                 \
  CUEMU_CHECKER void __tsan_unaligned_write##n(void* p) { CUEMU_ST(p, n); }
CUEMU_ACCESS_ENTRY(1)
CUEMU_ACCESS_ENTRY(2)
CUEMU_ACCESS_ENTRY(4)
CUEMU_ACCESS_ENTRY(8)
CUEMU_ACCESS_ENTRY(16)
#undef CUEMU_ACCESS_ENTRY
CUEMU_CHECKER void __tsan_read_range(void* p, size_t n) { CUEMU_LD(p, n); }
CUEMU_CHECKER void __tsan_write_range(void* p, size_t n) { CUEMU_ST(p, n); }
CUEMU_CHECKER void __tsan_init(void) {}
CUEMU_CHECKER void __tsan_func_entry(void*) {}
CUEMU_CHECKER void __tsan_func_exit(void) {}
CUEMU_CHECKER void __tsan_vptr_update(void** p, void*) { CUEMU_ST(p, sizeof(void*)); }
CUEMU_CHECKER void __tsan_vptr_read(void** p) { CUEMU_LD(p, sizeof(void*)); }
CUEMU_CHECKER void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
CUEMU_CHECKER void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// Every atomic runs sequentially consistent (at least as strong as asked).
#define CUEMU_ATOMIC_RMW(bits, T, op)                                                                      \
  CUEMU_CHECKER T __tsan_atomic##bits##_##op(volatile T* p, T v, int) {                                      \
    CUEMU_ATOM(p, sizeof(T));                                                                              \
    return __atomic_##op(p, v, __ATOMIC_SEQ_CST);                                                          \
  }
#define CUEMU_ATOMIC_ALL(bits, T)                                                                          \
  CUEMU_CHECKER T __tsan_atomic##bits##_load(const volatile T* p, int) {                                   \
    CUEMU_LD(p, sizeof(T));                                                                                \
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                           \
  }                                                                                                        \
  CUEMU_CHECKER void __tsan_atomic##bits##_store(volatile T* p, T v, int) {                                \
    CUEMU_ST(p, sizeof(T));                                                                                \
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                        \
  CUEMU_CHECKER T __tsan_atomic##bits##_exchange(volatile T* p, T v, int) {                                \
    CUEMU_ATOM(p, sizeof(T));                                                                              \
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);                                                    \
  }                                                                                                        \
  CUEMU_ATOMIC_RMW(bits, T, fetch_add)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_sub)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_and)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_or)                                                                      \
  CUEMU_ATOMIC_RMW(bits, T, fetch_xor)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_nand)                                                                    \
  CUEMU_CHECKER int __tsan_atomic##bits##_compare_exchange_strong(volatile T* p, T* expected, T v, int, int) { \
    CUEMU_ATOM(p, sizeof(T));                                                                              \
    return __atomic_compare_exchange_n(p, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);          \
  }                                                                                                        \
  CUEMU_CHECKER int __tsan_atomic##bits##_compare_exchange_weak(volatile T* p, T* expected, T v, int, int) {   \
    CUEMU_ATOM(p, sizeof(T));                                                                              \
    return __atomic_compare_exchange_n(p, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                                        \
  CUEMU_CHECKER T __tsan_atomic##bits##_compare_exchange_val(volatile T* p, T expected, T v, int, int) {     \
    CUEMU_ATOM(p, sizeof(T));                                                                              \
    __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
    return expected;                                                                                       \
  }
CUEMU_ATOMIC_ALL(8, uint8_t)
CUEMU_ATOMIC_ALL(16, uint16_t)
CUEMU_ATOMIC_ALL(32, uint32_t)
CUEMU_ATOMIC_ALL(64, uint64_t)
#undef CUEMU_ATOMIC_ALL
#undef CUEMU_ATOMIC_RMW
#undef CUEMU_CHECKER
#undef CUEMU_LD
#undef CUEMU_ST
#undef CUEMU_ATOM
#undef CUEMU_SITE
