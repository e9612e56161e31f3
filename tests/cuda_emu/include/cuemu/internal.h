// The ABI between the emulated device's four libraries and the kernels it
// compiles. libcuda.so (src/driver + src/exec) owns contexts, memory, streams,
// the race checker and the block executor; libnvrtc.so (src/nvrtc) compiles
// .cu files into kernel objects that export `cuemu_module_info`;
// libcublas.so and libnccl.so (src/cublas, src/nccl) link against libcuda.so
// and run their work as stream operations through `cuemu_enqueue`.
//
// Device pointers are host virtual addresses (every allocation is its own
// mapping in one reserved region, between guard pages), so the libraries read and write
// device memory directly, but only from inside an operation that runs on a
// stream worker and that declared the ranges it touches.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CUEMU_ABI_VERSION 2

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- kernels ---

// How a kernel parameter is used, from its C++ type: a pointer to const is
// read, a pointer to non-const is read and written (the race checker's
// granularity), anything else is a value copied at launch.
enum cuemu_arg_kind { CUEMU_ARG_VALUE = 0, CUEMU_ARG_PTR_CONST = 1, CUEMU_ARG_PTR_MUT = 2 };

typedef struct cuemu_kernel_desc {
  const char* name;                 // the extern "C" entry point
  void (*entry)(void* const* args); // runs ONE CUDA thread: unpacks args by the real signature
  int nargs;
  const uint32_t* arg_sizes;        // sizeof each parameter
  const uint32_t* arg_offsets;      // its offset in a packed parameter buffer (CUDA's layout)
  const uint8_t* arg_kinds;         // cuemu_arg_kind
  const char* const* arg_types;     // spelled C++ types, for messages ("const float*")
} cuemu_kernel_desc;

typedef struct cuemu_module_info {
  int abi_version;                  // CUEMU_ABI_VERSION
  int nkernels;
  const cuemu_kernel_desc* kernels;
  char* shared_begin;               // the module's static __shared__ variables
  char* shared_end;                 // (one block of this module runs at a time)
  const char* source_name;          // the file name given to nvrtcCreateProgram
} cuemu_module_info;

// Exported by every object the emulated NVRTC builds.
typedef const cuemu_module_info* (*cuemu_module_info_fn)(void);
#define CUEMU_MODULE_INFO_SYMBOL "cuemu_module_info"

// The PTX text the emulated NVRTC returns (and the "cubin" for sm_XY: the
// same bytes) carries this line; cuModuleLoadData dlopens the object it names.
#define CUEMU_PTX_OBJECT_TAG "// cuemu-object: "

typedef struct cuemu_dim3 { uint32_t x, y, z; } cuemu_dim3;

// What a CUDA thread sees, returned by cuemu_thread() (valid only inside a kernel).
typedef struct cuemu_thread_ctx {
  cuemu_dim3 thread_idx, block_idx, block_dim, grid_dim;
  uint32_t lane;                    // threadIdx linearized % 32
  uint32_t linear_tid;              // threadIdx linearized
} cuemu_thread_ctx;

// Called by kernel code (include/device/cuemu_device.h), implemented by src/exec.
const cuemu_thread_ctx* cuemu_thread(void);
void cuemu_syncthreads(const char* file, int line);
void cuemu_syncwarp(uint32_t mask, const char* file, int line);
// kind: 0 idx, 1 up, 2 down, 3 xor. `value` holds `bytes` (4 or 8) bytes.
// Returns the source lane's value, or the caller's own when the source lane
// is outside [0, width) of the caller's segment (CUDA's rule).
uint64_t cuemu_shfl(int kind, uint32_t mask, uint64_t value, int lane_arg, int width, int bytes,
                    const char* file, int line);
// A device-side failure (assert, __trap): ends the launch with an error.
void cuemu_trap(const char* what, const char* file, int line);

// The device checks (include/device/cuemu_checks.h calls them from kernel
// code). Device memory is one region: [*base, *base + *len).
void cuemu_device_region(uintptr_t* base, size_t* len);
// An access of n bytes of device memory (write: 1) by the running thread:
// returns, or ends the launch with an error naming the fault.
void cuemu_check_device(uintptr_t a, size_t n, int write);
// The same for the running module's __shared__ variables.
void cuemu_check_shared(uintptr_t a, size_t n, int write);

// Result of running a grid. ok == 0: `message` says what failed, naming the
// kernel, block, thread and source line where known.
typedef struct cuemu_exec_result {
  int ok;
  int cuda_error;                   // CUresult to make sticky (700 illegal address, 710 assert, 719 launch failure, ...)
  char message[1024];
} cuemu_exec_result;

// Runs every block of a grid on the calling (stream worker) thread, in block
// order, each block's threads as fibers. `args` points at each parameter's
// value (already copied at launch time). Memory faults inside the kernel are
// reported through cuemu_exec_fault (the driver's SIGSEGV handler calls it).
void cuemu_exec_grid(const cuemu_module_info* module, const cuemu_kernel_desc* k, cuemu_dim3 grid,
                     cuemu_dim3 block, size_t dynamic_smem, void* const* args, cuemu_exec_result* out);
// True while the calling OS thread is running kernel code (for the SIGSEGV handler).
int cuemu_exec_in_kernel(void);
// From the SIGSEGV handler: record `message` as the launch's error and leave the
// grid at once (siglongjmp back into cuemu_exec_grid). Does not return.
void cuemu_exec_fault(const char* message, int cuda_error);
// "kernel K, block (x,y,z), thread (x,y,z)" of the thread running now, for messages.
void cuemu_exec_where(char* buf, size_t len);

// ---------------------------------------------------------------- profiler ---
// CUEMU_PROFILE=<file> ("%p" in it becomes the process id): one JSON line per
// device operation (kernel, GEMM, copy, memset) with what Nsight Compute
// counts: global requests per warp-level instruction and the 32-byte sectors
// they touch, shared-memory wavefronts, and DRAM bytes through an L2 model
// of CUEMU_L2_BYTES (default 50 MiB), and the kernels' arithmetic (per
// thread-operation: FMAs, adds, divides, special functions, integer divides,
// instructions). Off by default; src/driver/profile.cpp.

// Kinds of a profiled access.
enum cuemu_prof_kind { CUEMU_PROF_LD = 0, CUEMU_PROF_ST = 1, CUEMU_PROF_ATOM = 2, CUEMU_PROF_SHLD = 3,
                       CUEMU_PROF_SHST = 4, CUEMU_PROF_KINDS = 5 };
int cuemu_profile_enabled(void);
// From profiled kernel code (include/device/cuemu_checks.h): an access of n
// bytes at a by the running CUDA thread, made by the instruction at `site`,
// checked as cuemu_check_device (cuemu_check_shared) checks it and recorded:
// one call per access.
void cuemu_profile_device(uintptr_t a, size_t n, int write, int kind, const void* site);
void cuemu_profile_shared(uintptr_t a, size_t n, int write, int kind, const void* site);
// The running launch's basic-block counters, for the callback profiled
// kernels call at the start of every block (include/device/cuemu_checks.h):
// the block whose call returns to `base + off` is counts[off >> 2] (two call
// instructions end at least 5 bytes apart). span is 0 outside a launch.
typedef struct cuemu_prof_blocks {
  uintptr_t base;
  uintptr_t span;
  uint64_t* counts;
} cuemu_prof_blocks;
extern __thread cuemu_prof_blocks cuemu_prof_blocks_tls __attribute__((tls_model("initial-exec")));
// Where the x86 code does not show the GPU's operation (a half conversion
// done in software, rsqrtf as a square root and a divide), the device
// headers put a marker next to it in profiled kernels: `nopl BASE+kind(%rax)`,
// a no-op the profiler finds in the disassembly.
#define CUEMU_PROF_MARK_BASE 0x43554d00
enum cuemu_prof_mark { CUEMU_PROF_MARK_F16_CVT = 1, CUEMU_PROF_MARK_RSQRT = 2 };
// The next number in host enqueue order: records are written when an
// operation runs on its stream's worker, and carry this to be sorted back.
unsigned long long cuemu_profile_ticket(void);
// A strided set of byte runs one operation reads or writes: `count` runs of
// `run_bytes`, `stride` bytes apart, starting at `ptr` (a matrix's columns).
typedef struct cuemu_prof_span {
  uintptr_t ptr;
  size_t run_bytes;
  size_t count;
  long long stride;
  int write;
} cuemu_prof_span;
// A host-implemented operation ran: its record, with `fields` (JSON members
// without braces, may be "") and the DRAM bytes of `spans` through the L2
// model. Call on the stream worker, in execution order.
void cuemu_profile_op(unsigned long long ticket, const char* kind, const char* name, const char* fields,
                      const cuemu_prof_span* spans, int nspans);

// ------------------------------------------------------ stream operations ---

typedef struct cuemu_access {
  const void* ptr;                  // device address (must lie in one live allocation)
  size_t bytes;
  int write;                        // 0 read, 1 write (a write is also a read)
} cuemu_access;

// Runs on the stream's worker thread. Returns 0 (CUDA_SUCCESS) or a CUresult;
// on failure writes a message into err (naming the call) and the context's
// error becomes sticky.
typedef int (*cuemu_op_fn)(void* user, char* err, size_t err_len);

// Enqueues a host-implemented operation on `stream` (a CUstream; NULL is the
// legacy default stream) of the current context. The accesses are checked at
// enqueue time (ranges inside live allocations; stream-order races against
// other streams' unfinished accesses, from the happens-before graph) and the
// call returns that error without enqueuing. `destroy(user)` is called once
// after the op ran or was dropped (it may be NULL). `name` is used in messages.
int cuemu_enqueue(void* stream, const char* name, const cuemu_access* accesses, int naccesses,
                  cuemu_op_fn fn, void* user, void (*destroy)(void*));

// The allocation holding [ptr, ptr+bytes): 0 when it is a live device
// allocation, else a CUresult with a message (not an allocation, freed,
// out of bounds) written to err.
int cuemu_check_range(const void* ptr, size_t bytes, char* err, size_t err_len);

// Counters for tests. Names: "host_syncs", "launches", "bytes_htod",
// "bytes_dtoh", "bytes_dtod", "allocations", "frees", "races", "errors",
// "blas_calls" (GEMM calls), "allreduce_calls", "allreduce_bytes" (per rank).
// Returns -1 for an unknown name.
long long cuemuGetCounter(const char* name);
// For libcublas and libnccl: adds n to "blas_calls", "allreduce_calls" or
// "allreduce_bytes" (other names are ignored).
void cuemuAddCounter(const char* name, long long n);
void cuemuResetCounters(void);
// The last error message the device reported (check failures), "" if none.
const char* cuemuLastErrorMessage(void);

#ifdef __cplusplus
}
#endif
