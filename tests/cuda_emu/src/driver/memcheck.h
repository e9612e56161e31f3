// The device region and its shadow (memcheck.cpp), shared with memory.cpp
// (allocations mark their bytes), copy.cpp and the library entry point
// (writes mark theirs as initialized) and module.cpp (counters per launch).
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace cuemu {

enum : uint8_t { SH_NONE = 0, SH_UNINIT = 1, SH_INIT = 2 };

extern uintptr_t sh_base;  // the device region: [sh_base, sh_base + sh_len)
extern size_t sh_len;
extern uint8_t* sh_map;    // its shadow, one state byte per byte
extern bool memcheck_on;   // CUEMU_MEMCHECK=0 turns the bounds check off
extern bool initcheck_on;  // CUEMU_INITCHECK=0 turns the initcheck off

// Reserves the region and its shadow once; false when the address space
// cannot hold them.
bool reserve_device_region();
void shadow_set(uintptr_t p, size_t n, uint8_t state);
// Back to SH_NONE for a page-aligned range (a freed mapping).
void shadow_drop(uintptr_t p, size_t n);
// Adds this OS thread's check counts to the process counters.
void flush_check_counters();

}  // namespace cuemu

// The shared-memory side (src/exec/sharedcheck.cpp): an access of the
// running module's __shared__ variables.
extern "C" void cuemu_exec_shared_access(uintptr_t a, size_t n, bool write);
// The shared accesses this OS thread checked since the last call.
extern "C" long long cuemu_exec_take_shared_checks(void);
