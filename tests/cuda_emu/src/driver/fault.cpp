// The SIGSEGV/SIGBUS handler. Device memory is host memory with guard pages,
// so a kernel that reads past an allocation, before it, or after its free
// faults here. When the faulting thread is running kernel code (the executor
// says so), the address is classified against the allocation map and the
// launch ends with CUDA_ERROR_ILLEGAL_ADDRESS (sticky, like a real device
// fault). Any other fault is not ours: the previous handler (Rust's) is put
// back and the handler returns, so the instruction faults again and the
// process dies exactly as it would have without the emulator. A fault on a
// guarded pinned buffer (hostcheck.cpp) is the host-access check's, which
// reports it and lets the access run again.
#include <signal.h>
#include <ucontext.h>
#include <stdio.h>

#include "driver.h"
#include "hostcheck.h"

namespace cuemu {

static struct sigaction g_old_segv, g_old_bus;

// Set while this thread checks a host access. A fault inside that check
// (the handler runs on the thread's alternate stack, which on a test thread
// is Rust's 8 KB, half of it the kernel's signal frame) would wait forever
// on the lock its outer frame holds: the program dies of it instead, as it
// would without the emulator.
static thread_local bool t_in_handler = false;

// A fault in kernel code: ends the launch (workers have large alternate
// stacks; out of line, so its buffers are not on a test thread's).
__attribute__((noinline)) static void kernel_fault(int sig, siginfo_t* si) {
  char desc[512], where[256], msg[1024];
  {
    // The worker does not hold the lock while kernel code runs.
    std::lock_guard<std::mutex> lk(g().mu);
    describe_addr_locked((uintptr_t)si->si_addr, desc, sizeof desc);
  }
  where[0] = 0;
  cuemu_exec_where(where, sizeof where);
  snprintf(msg, sizeof msg, "illegal memory access (%s) in %s: %s", sig == SIGSEGV ? "SIGSEGV" : "SIGBUS",
           where[0] ? where : "a kernel", desc);
  cuemu_exec_fault(msg, 700);  // does not return
}

static void on_fault(int sig, siginfo_t* si, void* uctx) {
  if (t_in_handler) {
    sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
    return;
  }
  if (cuemu_exec_in_kernel()) kernel_fault(sig, si);
  // x86-64: bit 1 of the page-fault error code is set for a write.
  const bool write = (((ucontext_t*)uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  t_in_handler = true;
  const bool guarded = host_guard_fault((uintptr_t)si->si_addr, write);
  t_in_handler = false;
  if (guarded) return;  // the access runs again, now allowed
  sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa = {};
    sa.sa_sigaction = on_fault;
    // ONSTACK: a fiber's stack overflow must still reach us (workers have an
    // alternate stack). NODEFER: cuemu_exec_fault leaves by siglongjmp, and
    // the signal must not stay blocked on that thread afterwards.
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

}  // namespace cuemu
