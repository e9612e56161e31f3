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

#define CUEMU_CHECKER extern "C" __attribute__((visibility("hidden"), no_sanitize_thread, noinline))

namespace cuemu_checks {

struct Region {
  uintptr_t base;
  size_t len;
  Region() { cuemu_device_region(&base, &len); }
};
// Set when the module is loaded (before any kernel of it runs).
static Region g_region;

__attribute__((no_sanitize_thread, always_inline)) inline void check(const volatile void* p, size_t n, int write) {
  const uintptr_t a = (uintptr_t)p;
  if (a - g_region.base < g_region.len)
    cuemu_check_device(a, n, write);
  else if (a - (uintptr_t)__start_cuemu_shared < (uintptr_t)(__stop_cuemu_shared - __start_cuemu_shared))
    cuemu_check_shared(a, n, write);
}

}  // namespace cuemu_checks

#define CUEMU_ACCESS_ENTRY(n)                                                                              \
  CUEMU_CHECKER void __tsan_read##n(void* p) { cuemu_checks::check(p, n, 0); }                             \
  CUEMU_CHECKER void __tsan_write##n(void* p) { cuemu_checks::check(p, n, 1); }                            \
  CUEMU_CHECKER void __tsan_unaligned_read##n(void* p) { cuemu_checks::check(p, n, 0); }                   \
  CUEMU_CHECKER void __tsan_unaligned_write##n(void* p) { cuemu_checks::check(p, n, 1); }
CUEMU_ACCESS_ENTRY(1)
CUEMU_ACCESS_ENTRY(2)
CUEMU_ACCESS_ENTRY(4)
CUEMU_ACCESS_ENTRY(8)
CUEMU_ACCESS_ENTRY(16)
#undef CUEMU_ACCESS_ENTRY
CUEMU_CHECKER void __tsan_read_range(void* p, size_t n) { cuemu_checks::check(p, n, 0); }
CUEMU_CHECKER void __tsan_write_range(void* p, size_t n) { cuemu_checks::check(p, n, 1); }
CUEMU_CHECKER void __tsan_init(void) {}
CUEMU_CHECKER void __tsan_func_entry(void*) {}
CUEMU_CHECKER void __tsan_func_exit(void) {}
CUEMU_CHECKER void __tsan_vptr_update(void** p, void*) { cuemu_checks::check(p, sizeof(void*), 1); }
CUEMU_CHECKER void __tsan_vptr_read(void** p) { cuemu_checks::check(p, sizeof(void*), 0); }
CUEMU_CHECKER void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
CUEMU_CHECKER void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// Every atomic runs sequentially consistent (at least as strong as asked).
#define CUEMU_ATOMIC_RMW(bits, T, op)                                                                      \
  CUEMU_CHECKER T __tsan_atomic##bits##_##op(volatile T* p, T v, int) {                                      \
    cuemu_checks::check(p, sizeof(T), 0);                                                                  \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
    return __atomic_##op(p, v, __ATOMIC_SEQ_CST);                                                          \
  }
#define CUEMU_ATOMIC_ALL(bits, T)                                                                          \
  CUEMU_CHECKER T __tsan_atomic##bits##_load(const volatile T* p, int) {                                   \
    cuemu_checks::check(p, sizeof(T), 0);                                                                  \
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                           \
  }                                                                                                        \
  CUEMU_CHECKER void __tsan_atomic##bits##_store(volatile T* p, T v, int) {                                \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                        \
  CUEMU_CHECKER T __tsan_atomic##bits##_exchange(volatile T* p, T v, int) {                                \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);                                                    \
  }                                                                                                        \
  CUEMU_ATOMIC_RMW(bits, T, fetch_add)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_sub)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_and)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_or)                                                                      \
  CUEMU_ATOMIC_RMW(bits, T, fetch_xor)                                                                     \
  CUEMU_ATOMIC_RMW(bits, T, fetch_nand)                                                                    \
  CUEMU_CHECKER int __tsan_atomic##bits##_compare_exchange_strong(volatile T* p, T* expected, T v, int, int) { \
    cuemu_checks::check(p, sizeof(T), 0);                                                                  \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
    return __atomic_compare_exchange_n(p, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);          \
  }                                                                                                        \
  CUEMU_CHECKER int __tsan_atomic##bits##_compare_exchange_weak(volatile T* p, T* expected, T v, int, int) {   \
    cuemu_checks::check(p, sizeof(T), 0);                                                                  \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
    return __atomic_compare_exchange_n(p, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                                        \
  CUEMU_CHECKER T __tsan_atomic##bits##_compare_exchange_val(volatile T* p, T expected, T v, int, int) {     \
    cuemu_checks::check(p, sizeof(T), 0);                                                                  \
    cuemu_checks::check(p, sizeof(T), 1);                                                                  \
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
