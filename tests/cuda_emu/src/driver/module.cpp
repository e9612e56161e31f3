// Modules, functions and kernel launches.
//
// A "module image" is the text the emulated NVRTC returns: it carries a line
// `// cuemu-object: /path/to/kernels.so` naming a shared object with the
// compiled kernels, which is dlopened here. Real PTX and real cubins are
// refused with a message: only code compiled by the emulated NVRTC runs.
//
// cuLaunchKernel validates the launch against the device limits and every
// pointer argument against the allocation map (a launcher that swapped two
// arguments is caught here, not as garbage results), copies the argument
// bytes at once (CUDA semantics) and queues the grid on the stream.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "api_decls.h"
#include "driver.h"
#include "memcheck.h"
#include "profile.h"

using namespace cuemu;

namespace {

// The kernel objects call back into libcuda (cuemu_thread, ...). cudarc
// dlopens libcuda RTLD_LOCAL, so promote it to the global scope once, in case
// an object was not linked against libcuda.so.1 itself.
void promote_self() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info;
    if (dladdr((void*)&promote_self, &info) && info.dli_fname)
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  });
}

const char* kOnlyEmulated =
    "this emulated driver runs only code compiled by the emulated NVRTC (tests/cuda_emu libnvrtc.so)";

int load_image(CUmodule* out, const void* image, const char* call) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  if (!out || !image) return fail(1, "%s: NULL module or image", call);
  const unsigned char* p = (const unsigned char*)image;
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F')
    return fail(200, "%s: the image is an ELF cubin; %s", call, kOnlyEmulated);
  if (p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba)
    return fail(200, "%s: the image is a fatbinary; %s", call, kOnlyEmulated);
  // Find the tag line; stop at the first NUL (text images end with one).
  const char* text = (const char*)image;
  const size_t tag_len = strlen(CUEMU_PTX_OBJECT_TAG);
  std::string path;
  bool looks_ptx = false;
  const size_t kLimit = 256u << 20;
  for (size_t i = 0; i < kLimit && text[i];) {
    size_t j = i;
    while (j < kLimit && text[j] && text[j] != '\n') j++;
    std::string line(text + i, j - i);
    if (line.compare(0, tag_len, CUEMU_PTX_OBJECT_TAG) == 0) {
      path = line.substr(tag_len);
      while (!path.empty() && (path.back() == '\r' || path.back() == ' ')) path.pop_back();
      break;
    }
    if (line.find(".version") != std::string::npos || line.find(".target") != std::string::npos) looks_ptx = true;
    i = text[j] ? j + 1 : j;
  }
  if (path.empty()) {
    if (looks_ptx) return fail(218, "%s: the image is real PTX; %s", call, kOnlyEmulated);
    return fail(200, "%s: the image has no '%s' line; %s", call, CUEMU_PTX_OBJECT_TAG, kOnlyEmulated);
  }
  promote_self();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return fail(303, "%s: cannot load kernel object %s: %s", call, path.c_str(), dlerror());
  auto fn = (cuemu_module_info_fn)dlsym(h, CUEMU_MODULE_INFO_SYMBOL);
  if (!fn) return fail(200, "%s: %s exports no %s", call, path.c_str(), CUEMU_MODULE_INFO_SYMBOL);
  const cuemu_module_info* info = fn();
  if (!info || info->abi_version != CUEMU_ABI_VERSION)
    return fail(200, "%s: %s was built for emulator ABI %d, this driver speaks %d (rebuild it)", call,
                path.c_str(), info ? info->abi_version : -1, CUEMU_ABI_VERSION);
  auto* m = new CUmod_st;
  m->ctx = c;
  m->handle = h;
  m->info = info;
  m->path = path;
  std::lock_guard<std::mutex> lk(g().mu);
  g().modules[m] = true;
  *out = m;
  return 0;
}

bool valid_module_locked(CUmod_st* m) { return g().modules.count(m) && !m->unloaded; }

CUfunc_st* get_func(CUfunction f) {
  std::lock_guard<std::mutex> lk(g().mu);
  if (!g().funcs.count(f) || f->mod->unloaded) return nullptr;
  return f;
}

size_t static_smem(const CUfunc_st* f) {
  const cuemu_module_info* i = f->mod->info;
  return i->shared_end > i->shared_begin ? (size_t)(i->shared_end - i->shared_begin) : 0;
}

const size_t kSmemDefault = 48 * 1024, kSmemOptin = 227 * 1024;

}  // namespace

CUEMU_API int cuModuleLoadData(CUmodule* m, const void* image) { return load_image(m, image, "cuModuleLoadData"); }

CUEMU_API int cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned, CUjit_option*, void**) {
  return load_image(m, image, "cuModuleLoadDataEx");
}

CUEMU_API int cuModuleLoad(CUmodule* m, const char* fname) {
  if (!fname) return fail(1, "cuModuleLoad: fname is NULL");
  FILE* f = fopen(fname, "rb");
  if (!f) return fail(301, "cuModuleLoad: cannot open %s", fname);
  std::string data;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  fclose(f);
  return load_image(m, data.c_str(), "cuModuleLoad");
}

// The object stays mapped: launches already queued may still run its code,
// and messages may still name its kernels.
CUEMU_API int cuModuleUnload(CUmodule m) {
  std::lock_guard<std::mutex> lk(g().mu);
  if (!valid_module_locked(m)) return fail(400, "cuModuleUnload: %p is not a loaded module", (void*)m);
  m->unloaded = true;
  g().modules.erase(m);
  for (auto& f : m->funcs) g().funcs.erase(f.get());
  return 0;
}

CUEMU_API int cuModuleGetFunction(CUfunction* pf, CUmodule m, const char* name) {
  if (!pf || !name) return fail(1, "cuModuleGetFunction: NULL argument");
  std::lock_guard<std::mutex> lk(g().mu);
  if (!valid_module_locked(m)) return fail(400, "cuModuleGetFunction: %p is not a loaded module", (void*)m);
  for (auto& f : m->funcs)
    if (strcmp(f->desc->name, name) == 0) {
      *pf = f.get();
      return 0;
    }
  const cuemu_module_info* info = m->info;
  for (int i = 0; i < info->nkernels; i++)
    if (strcmp(info->kernels[i].name, name) == 0) {
      auto f = std::make_unique<CUfunc_st>();
      f->mod = m;
      f->desc = &info->kernels[i];
      *pf = f.get();
      g().funcs[f.get()] = true;
      m->funcs.push_back(std::move(f));
      return 0;
    }
  std::string names;
  for (int i = 0; i < info->nkernels; i++) names += std::string(i ? ", " : "") + info->kernels[i].name;
  return fail(500, "cuModuleGetFunction: no kernel named '%s' in module %s (compiled from %s); it has: %s", name,
              m->path.c_str(), info->source_name ? info->source_name : "?", names.empty() ? "none" : names.c_str());
}

CUEMU_API int cuModuleGetGlobal_v2(CUdeviceptr*, size_t*, CUmodule, const char* name) {
  return fail(500, "cuModuleGetGlobal: __device__ globals are not emulated ('%s')", name ? name : "?");
}

// CUDA 12.4+: a kernel's parameter layout, from its real signature.
CUEMU_API int cuFuncGetParamInfo(CUfunction f, size_t index, size_t* offset, size_t* size) {
  CUfunc_st* fn = get_func(f);
  if (!fn) return fail(400, "cuFuncGetParamInfo: %p is not a function of a loaded module", (void*)f);
  const cuemu_kernel_desc* d = fn->desc;
  if (index >= (size_t)d->nargs)  // the end of the list, which callers probe for: not printed
    return fail_quiet(1, "cuFuncGetParamInfo(%s): parameter %zu out of range (it has %d)", d->name, index, d->nargs);
  if (offset) *offset = d->arg_offsets[index];
  if (size) *size = d->arg_sizes[index];
  return 0;
}

CUEMU_API int cuFuncGetParamCount(CUfunction f, size_t* count) {
  CUfunc_st* fn = get_func(f);
  if (!fn) return fail(400, "cuFuncGetParamCount: %p is not a function of a loaded module", (void*)f);
  if (!count) return fail(1, "cuFuncGetParamCount(%s): paramCount is NULL", fn->desc->name);
  *count = (size_t)fn->desc->nargs;
  return 0;
}

CUEMU_API int cuFuncGetName(const char** name, CUfunction f) {
  CUfunc_st* fn = get_func(f);
  if (!fn || !name) return 400;
  *name = fn->desc->name;
  return 0;
}

CUEMU_API int cuFuncGetAttribute(int* v, int attrib, CUfunction f) {
  CUfunc_st* fn = get_func(f);
  if (!fn) return fail(400, "cuFuncGetAttribute: %p is not a function of a loaded module", (void*)f);
  if (!v) return 1;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return 0;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = (int)static_smem(fn); return 0;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = 0; return 0;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = 0; return 0;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; return 0;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = 90; return 0;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; return 0;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *v = fn->max_dynamic_smem - (int)static_smem(fn);
      return 0;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *v = fn->carveout; return 0;
    default:
      if (attrib >= 0 && attrib < CU_FUNC_ATTRIBUTE_MAX) {
        *v = 0;
        return 0;
      }
      return fail(1, "cuFuncGetAttribute: unknown attribute %d", attrib);
  }
}

CUEMU_API int cuFuncSetAttribute(CUfunction f, int attrib, int v) {
  CUfunc_st* fn = get_func(f);
  if (!fn) return fail(400, "cuFuncSetAttribute: %p is not a function of a loaded module", (void*)f);
  if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (v < 0 || (size_t)v + static_smem(fn) > kSmemOptin)
      return fail(1, "cuFuncSetAttribute(%s): %d bytes of dynamic shared memory (+%zu static) exceed the %zu "
                  "bytes a block may have", fn->desc->name, v, static_smem(fn), kSmemOptin);
    fn->max_dynamic_smem = v + (int)static_smem(fn);
    return 0;
  }
  if (attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) {
    if (v < -1 || v > 100) return fail(1, "cuFuncSetAttribute: carveout %d out of range", v);
    fn->carveout = v;
    return 0;
  }
  if (attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX) return fail(1, "cuFuncSetAttribute: unknown attribute %d", attrib);
  return 0;  // cluster hints: accepted, meaningless here
}

CUEMU_API int cuFuncSetCacheConfig(CUfunction f, int) {
  return get_func(f) ? 0 : fail(400, "cuFuncSetCacheConfig: %p is not a function", (void*)f);
}

// One block per SM-thread budget, as a 2048-thread SM would schedule it.
CUEMU_API int cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, CUfunction f, int block, size_t, unsigned) {
  if (!get_func(f)) return 400;
  if (!n || block <= 0) return 1;
  *n = block > 1024 ? 0 : std::min(32, 2048 / block);
  return 0;
}
CUEMU_API int cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int block, size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0);
}
CUEMU_API int cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block, CUfunction f, void*, size_t,
                                                        int limit, unsigned) {
  if (!get_func(f)) return 400;
  int b = (limit > 0 && limit < 1024) ? limit : 1024;
  if (block) *block = b;
  if (min_grid) *min_grid = 132 * (2048 / b);
  return 0;
}
CUEMU_API int cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block, CUfunction f, void* cb, size_t smem,
                                               int limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, f, cb, smem, limit, 0);
}

// ------------------------------------------------------------- launch ------

namespace {
struct LaunchData {
  const cuemu_module_info* module;
  const cuemu_kernel_desc* k;
  cuemu_dim3 grid, block;
  size_t smem;
  std::vector<uint64_t> storage;  // the packed parameter buffer (8-aligned)
  std::vector<void*> argv;
};
}  // namespace

CUEMU_API int cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned smem, CUstream h, void** params, void** extra) {
  CUctx_st* c;
  if (int r = call_ctx(&c)) return r;
  CUfunc_st* fn = get_func(f);
  if (!fn) return fail(400, "cuLaunchKernel: %p is not a function of a loaded module", (void*)f);
  const cuemu_kernel_desc* k = fn->desc;
  const char* kn = k->name;
  if (extra) return fail(801, "cuLaunchKernel(%s): the 'extra' parameter form is not emulated (pass kernelParams)", kn);
  if (!gx || !gy || !gz || !bx || !by || !bz)
    return fail(1, "cuLaunchKernel(%s): zero dimension in grid (%u,%u,%u) block (%u,%u,%u)", kn, gx, gy, gz, bx, by, bz);
  if (bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024)
    return fail(1, "cuLaunchKernel(%s): block (%u,%u,%u) exceeds the device limits (1024,1024,64; 1024 threads)", kn,
                bx, by, bz);
  if (gx > 2147483647u || gy > 65535 || gz > 65535)
    return fail(1, "cuLaunchKernel(%s): grid (%u,%u,%u) exceeds the device limits (2^31-1,65535,65535)", kn, gx, gy, gz);
  size_t st = static_smem(fn);
  if (st > kSmemDefault)
    return fail(701, "cuLaunchKernel(%s): %zu bytes of static shared memory exceed 48 KiB", kn, st);
  if (st + smem > (size_t)fn->max_dynamic_smem)
    return fail(1, "cuLaunchKernel(%s): %u bytes of dynamic shared memory (+%zu static) exceed the %d-byte limit%s",
                kn, smem, st, fn->max_dynamic_smem,
                fn->max_dynamic_smem <= (int)kSmemDefault
                    ? " (raise it with cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES))" : "");
  if (k->nargs > 0 && !params) return fail(1, "cuLaunchKernel(%s): kernelParams is NULL but it takes %d", kn, k->nargs);

  auto ld = std::make_shared<LaunchData>();
  ld->module = fn->mod->info;
  ld->k = k;
  ld->grid = {gx, gy, gz};
  ld->block = {bx, by, bz};
  ld->smem = smem;
  size_t total = 0;
  for (int i = 0; i < k->nargs; i++) total = std::max(total, (size_t)k->arg_offsets[i] + k->arg_sizes[i]);
  ld->storage.assign(total / 8 + 1, 0);
  char* buf = (char*)ld->storage.data();
  std::vector<Access> acc;
  std::unique_lock<std::mutex> lk(g().mu);
  for (int i = 0; i < k->nargs; i++) {
    if (!params[i]) {
      lk.unlock();
      return fail(1, "cuLaunchKernel(%s): kernelParams[%d] is NULL", kn, i);
    }
    memcpy(buf + k->arg_offsets[i], params[i], k->arg_sizes[i]);
    if (k->arg_kinds[i] == CUEMU_ARG_VALUE || k->arg_sizes[i] != 8) continue;
    uint64_t v;
    memcpy(&v, params[i], 8);
    if (v == 0) continue;  // NULL is a valid pointer argument (optional buffers)
    Alloc* a = find_alloc_locked(v);
    // One past the end of an allocation is valid too (an empty view at its end).
    if (!a && (a = find_alloc_locked(v - 1)) && v != a->start + a->size) a = nullptr;
    if (!a || !a->live) {
      char desc[512];
      describe_addr_locked(v, desc, sizeof desc);
      lk.unlock();
      return fail(1, "cuLaunchKernel(%s): argument %d (%s) is 0x%llx, not a device pointer: %s", kn, i,
                  k->arg_types ? k->arg_types[i] : "pointer", (unsigned long long)v, desc);
    }
    acc.push_back({(uintptr_t)v, (size_t)(a->start + a->size - v), k->arg_kinds[i] == CUEMU_ARG_PTR_MUT});
  }
  for (int i = 0; i < k->nargs; i++) ld->argv.push_back(buf + k->arg_offsets[i]);
  auto s = resolve_stream_locked(h, c);
  if (!s) {
    lk.unlock();
    return fail(400, "cuLaunchKernel(%s): %p is not a live stream handle", kn, (void*)h);
  }
  Op op;
  op.name = std::string("kernel ") + kn;
  const unsigned long long ticket = cuemu_profile_enabled() ? profile_ticket() : 0;
  op.run = [ld, ticket](char* err, size_t len) {
    cuemu_exec_result res;
    memset(&res, 0, sizeof res);
    cuemu_exec_grid(ld->module, ld->k, ld->grid, ld->block, ld->smem, ld->argv.data(), &res);
    flush_check_counters();
    count(C_SHARED_CHECKS, cuemu_exec_take_shared_checks());
    if (res.ok && cuemu_profile_enabled()) profile_kernel(ticket, ld->k->name, ld->grid, ld->block, ld->smem);
    if (res.ok) return 0;
    snprintf(err, len, "%s", res.message[0] ? res.message : "kernel launch failed");
    return res.cuda_error ? res.cuda_error : 719;
  };
  if (int r = enqueue_locked(s, std::move(op), acc, (std::string("cuLaunchKernel(") + kn + ")").c_str())) return r;
  count(C_LAUNCHES);
  return 0;
}
