// The profiler's driver side (profile.cpp), for the launch and copy paths.
#pragma once
#include <stddef.h>

#include "cuemu/internal.h"

namespace cuemu {

// The next ticket in host enqueue order (take it where the op is enqueued).
unsigned long long profile_ticket();
// The launch that just ran on this worker succeeded: its record.
void profile_kernel(unsigned long long ticket, const char* name, cuemu_dim3 grid, cuemu_dim3 block, size_t smem);

// A copy or memset of `bytes` ran: its record.
void profile_op_bytes(unsigned long long ticket, const char* kind, const char* call, size_t bytes,
                      const cuemu_prof_span* spans, int nspans);

}  // namespace cuemu
