// Pinned host buffers and the host-access check on them (hostcheck.cpp).
// Lock order: G.mu, then the pinned buffers' own lock.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <string>

namespace cuemu {

struct Stream;

// A pinned buffer of at least `bytes`, owned by ctx; a CUresult on failure.
int pinned_alloc(size_t bytes, CUctx_st* ctx, void** out);
// False when p is not the start of a pinned buffer.
bool pinned_free(void* p);
bool is_pinned(const void* p, size_t bytes);
// Where the emulator itself reads or writes [p, p + bytes): the alias of a
// pinned buffer (never guarded), or p itself for any other host memory.
void* host_view(const void* p, size_t bytes);
// Guards [p, p + n) of a pinned buffer against the host until it has
// synchronized with the copy just enqueued on `s` (its last op).
void guard_host_copy(const void* p, size_t n, bool device_writes, const Stream& s, const std::string& call);
// After the host's clock advanced (G.mu held): drops the guards it covers.
void release_host_guards_locked();
// From the SIGSEGV handler: true when addr lies in a pinned buffer (the
// fault was a guard: reported if it was an error, the access may resume).
bool host_guard_fault(uintptr_t addr, bool write);
// On every call (G.mu held): makes a reported host access sticky.
void take_host_fault_locked();

}  // namespace cuemu
