#!/usr/bin/env python3
"""Registers, static shared memory, local memory and launch bounds of every
kernel in kernels/*.cu, as the real NVIDIA compiler builds them for a GPU.

Each file is compiled the way ddptrain compiles it at run time
(src/cuda/nvrtc.rs: the same options, kernels/*.cuh handed to NVRTC in
memory, the CUDA headers from disk) into the cubin a GPU of that arch loads,
and the numbers are read from that cubin's ELF. cuobjdump, where present,
cross-checks the reading. Results are cached in target/gpu-model/.

    python3 scripts/gpu_model/resources.py [--json] [--arch sm_90]
"""

import argparse
import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CACHE_DIR = ROOT / "target" / "gpu-model"
NVRTC_PIP = "pip install 'nvidia-cuda-nvrtc==13.5.37' 'nvidia-cuda-runtime==13.5.37'"
CUOBJDUMP_PIP = f"pip install --target {ROOT / '.venv-tools'} 'nvidia-cuda-cuobjdump==13.5.37'"


def _wheel_roots():
    # scripts/test.sh's venv, then a `pip install --target .venv-tools`.
    yield from sorted(ROOT.glob(".venv/lib/python3*/site-packages"))
    yield ROOT / ".venv-tools"


def find_nvrtc():
    for root in _wheel_roots():
        lib = root / "nvidia/cu13/lib/libnvrtc.so.13"
        if lib.is_file():
            return lib
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d and (Path(d) / "libnvrtc.so.13").is_file():
            return Path(d) / "libnvrtc.so.13"
    return None


def find_cuobjdump():
    return next((r / "nvidia/cu13/bin/cuobjdump" for r in _wheel_roots() if (r / "nvidia/cu13/bin/cuobjdump").is_file()), None)


def cuda_include_dir(nvrtc_lib):
    """The folder with cuda_fp16.h, searched in the order of
    src/cuda/nvrtc.rs's cuda_include_dirs, so both compile against the same
    headers (the include beside libnvrtc standing for its LD_LIBRARY_PATH
    search, which scripts/test.sh points at this same wheel)."""
    candidates = [Path(p) for p in os.environ.get("DDPTRAIN_CUDA_INCLUDE", "").split(os.pathsep) if p]
    candidates += [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    candidates += [nvrtc_lib.parent.parent / "include", Path("/usr/local/cuda/include")]
    return next((d for d in candidates if (d / "cuda_fp16.h").is_file()), None)


def nvrtc_options(arch, include):
    # Those of compile_source in src/cuda/nvrtc.rs, so that the cubin is the
    # one a GPU runs (test_occupancy.py checks that the two lists agree).
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device", "--fmad=true"]
    return opts + ([f"--include-path={include}"] if include else [])


class Nvrtc:
    def __init__(self, lib_path):
        lib = ctypes.CDLL(str(lib_path))
        p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        strs = ctypes.POINTER(ctypes.c_char_p)
        for fn, args in {
            "nvrtcVersion": [ctypes.POINTER(i), ctypes.POINTER(i)],
            "nvrtcCreateProgram": [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p, i, strs, strs],
            "nvrtcCompileProgram": [p, i, strs],
            "nvrtcGetProgramLogSize": [p, ctypes.POINTER(sz)],
            "nvrtcGetProgramLog": [p, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [p, ctypes.POINTER(sz)],
            "nvrtcGetCUBIN": [p, ctypes.c_char_p],
            "nvrtcDestroyProgram": [ctypes.POINTER(p)],
        }.items():
            getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, i
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [i], ctypes.c_char_p
        self.lib = lib
        major, minor = i(), i()
        self._check("nvrtcVersion", lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        # The wheel's own version (13.5.37) tells builds of one 13.5 apart.
        site = lib_path.parent.parent.parent.parent
        dist = sorted(site.glob("nvidia_cuda_nvrtc-*.dist-info"))
        self.version = dist[-1].name[len("nvidia_cuda_nvrtc-") : -len(".dist-info")] if dist else f"{major.value}.{minor.value}"

    def _check(self, what, rc):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def cubin(self, name, source, headers, options):
        """The cubin of `source`; `headers` maps include names to sources.
        Safe from several threads at once (NVRTC is thread-safe for distinct
        programs, and ctypes drops the GIL during each call)."""
        arr = lambda xs: (ctypes.c_char_p * max(len(xs), 1))(*[x.encode() for x in xs])
        prog = ctypes.c_void_p()
        self._check("nvrtcCreateProgram", self.lib.nvrtcCreateProgram(
            ctypes.byref(prog), source.encode(), name.encode(), len(headers), arr(list(headers.values())), arr(list(headers))))
        try:
            rc = self.lib.nvrtcCompileProgram(prog, len(options), arr(options))
            if rc != 0:
                size = ctypes.c_size_t()
                self._check("nvrtcGetProgramLogSize", self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
                log = ctypes.create_string_buffer(size.value)
                self._check("nvrtcGetProgramLog", self.lib.nvrtcGetProgramLog(prog, log))
                raise RuntimeError(f"NVRTC could not compile kernels/{name}:\n{log.value.decode(errors='replace')}")
            size = ctypes.c_size_t()
            self._check("nvrtcGetCUBINSize", self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            buf = ctypes.create_string_buffer(size.value)
            self._check("nvrtcGetCUBIN", self.lib.nvrtcGetCUBIN(prog, buf))
            return buf.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ELF and .nv.info layout as cuobjdump --dump-elf decodes it: an .nv.info
# section is a run of (format u8, attribute u8) records; format EIFMT_SVAL
# has a u16 length and that many bytes, the others a 2-byte value.
EM_CUDA = 190
SHT_SYMTAB = 2
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10  # st_other bit of a __global__ function
EIFMT_SVAL = 4
EIATTR_MAX_THREADS = 0x05  # per kernel: __launch_bounds__ as (x, y, z)
EIATTR_MIN_STACK_SIZE = 0x12  # in .nv.info: (symbol, bytes), callees' frames included
EIATTR_REGCOUNT = 0x2F  # in .nv.info: (symbol, registers)
# On sm_90 the cubin has .nv.shared.reserved.* and every .nv.shared.<kernel>
# starts with the 1 KB the driver reserves per block, the kernel's own
# variables after it (sm_80 cubins have neither), so cuobjdump's SHARED is
# 1 KB over ptxas -v's "bytes smem". The kernel's own bytes are what counts:
# cuda_occupancy.h adds the reserved KB to CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
# itself, and that attribute leaves it out on an H200 (NVIDIA/Fuser's
# UseAllSharedMemory test reads 16 B there, its 4 B variable padded to 16,
# not 1040).
RESERVED_SMEM_SECTION = ".nv.shared.reserved."
RESERVED_SMEM = 1024


class Cubin:
    def __init__(self, data):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 or struct.unpack_from("<H", data, 18)[0] != EM_CUDA:
            raise ValueError("not a 64-bit little-endian CUDA ELF")
        self.data = data
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
        # (name offset, type, offset, size, link) of each section header
        heads = [struct.unpack_from("<II16xQQI", data, shoff + 64 * k) for k in range(shnum)]
        names = [self._str(heads[shstrndx][2], h[0]) for h in heads]
        self.sections = {n: (h[1], h[2], h[3], h[4]) for n, h in zip(names, heads)}
        self.symbols = []  # (name, info, other) by symbol index
        for kind, off, size, link in self.sections.values():
            if kind == SHT_SYMTAB:
                strtab = heads[link][2]
                for pos in range(off, off + size, 24):
                    name, info, other = struct.unpack_from("<IBB", data, pos)
                    self.symbols.append((self._str(strtab, name), info, other))

    def _str(self, table, off):
        start = table + off
        return self.data[start : self.data.index(b"\0", start)].decode()

    def size(self, section):
        return self.sections.get(section, (0, 0, 0, 0))[2]

    def attributes(self, section):
        _, off, size, _ = self.sections.get(section, (0, 0, 0, 0))
        pos, end = off, off + size
        while pos < end:
            fmt, attr = self.data[pos], self.data[pos + 1]
            if fmt == EIFMT_SVAL:
                length, = struct.unpack_from("<H", self.data, pos + 2)
                yield attr, self.data[pos + 4 : pos + 4 + length]
                pos += 4 + length
            else:
                pos += 4
        if pos != end:
            raise ValueError(f"{section}: records overrun the section")

    def kernels(self):
        """{kernel name, as in the cubin (mangled if it is not extern "C"):
        {"registers", "shared_static", "local", "max_threads"}}."""
        per_symbol = {EIATTR_REGCOUNT: {}, EIATTR_MIN_STACK_SIZE: {}}
        for attr, payload in self.attributes(".nv.info"):
            if attr in per_symbol:
                sym, value = struct.unpack_from("<II", payload)
                per_symbol[attr][sym] = value
        reserved = RESERVED_SMEM if any(n.startswith(RESERVED_SMEM_SECTION) for n in self.sections) else 0
        out = {}
        for index, (name, info, other) in enumerate(self.symbols):
            if info & 0xF != STT_FUNC or not other & STO_CUDA_ENTRY:
                continue
            shared = self.size(f".nv.shared.{name}")
            if shared and shared < reserved:
                raise ValueError(f"{name}: .nv.shared is {shared} B, less than the {reserved} B reserved")
            bounds = [struct.unpack_from("<III", p) for a, p in self.attributes(f".nv.info.{name}") if a == EIATTR_MAX_THREADS]
            out[name] = {
                "registers": per_symbol[EIATTR_REGCOUNT].get(index, 0),
                "shared_static": max(shared - reserved, 0),
                # Spills and local arrays live in the ABI stack; .nv.local
                # holds what non-ABI code would put there.
                "local": per_symbol[EIATTR_MIN_STACK_SIZE].get(index, 0) + self.size(f".nv.local.{name}"),
                "max_threads": bounds[0][0] * bounds[0][1] * bounds[0][2] if bounds else None,
            }
        return out


def cross_check(cuobjdump, cubins):
    """Raises unless cuobjdump --dump-resource-usage agrees with the ELF
    reading of every kernel of `cubins` ({file: cubin bytes})."""
    with tempfile.TemporaryDirectory() as tmp:
        for file, data in cubins.items():
            path = Path(tmp) / f"{file}.cubin"
            path.write_bytes(data)
            text = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], check=True, capture_output=True, text=True).stdout
            cubin, theirs, name = Cubin(data), {}, None
            for line in text.splitlines():
                line = line.strip()
                if line.startswith("Function ") and line.endswith(":"):
                    name = line[len("Function ") : -1]
                elif name and line.startswith("REG:"):
                    theirs[name] = dict(kv.split(":", 1) for kv in line.split())
                    name = None
            ours = cubin.kernels()
            if set(theirs) - set(ours):
                raise RuntimeError(f"{file}: cuobjdump lists kernels the ELF reading missed: {sorted(set(theirs) - set(ours))}")
            for k, r in ours.items():
                t = theirs.get(k)
                want = (r["registers"], r["local"], cubin.size(f".nv.shared.{k}"))
                got = t and (int(t["REG"]), int(t["STACK"]) + int(t["LOCAL"]), int(t["SHARED"]))
                if want != got:
                    raise RuntimeError(f"{file} {k}: ELF says (registers, local, .nv.shared) = {want}, cuobjdump {got}")


def collect(arch="sm_90", log=sys.stderr):
    """The --json object for `arch`, from the cache when kernels/*, the
    options, the NVRTC and this script are all unchanged."""
    lib = find_nvrtc()
    if lib is None:
        raise SystemExit(f"NVRTC not found in .venv/ or .venv-tools/ (scripts/test.sh installs it): {NVRTC_PIP}")
    nvrtc = Nvrtc(lib)
    options = nvrtc_options(arch, cuda_include_dir(lib))
    files = sorted(KERNELS.glob("*.cu"))
    headers = {p.name: p.read_text() for p in sorted(KERNELS.glob("*.cuh"))}
    key = hashlib.sha256()
    # This script is in the key so that a fix to its reading retires old results.
    for part in [nvrtc.version, *options, Path(__file__).read_text()]:
        key.update(part.encode() + b"\0")
    for p in sorted(KERNELS.iterdir()):
        key.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    cache = CACHE_DIR / f"resources-{key.hexdigest()[:16]}.json"
    if cache.is_file():
        return json.loads(cache.read_text())

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        cubins = dict(zip((p.name for p in files), pool.map(lambda p: nvrtc.cubin(p.name, p.read_text(), headers, options), files)))
    print(f"compiled {len(files)} files for {arch} with NVRTC {nvrtc.version} in {time.monotonic() - start:.1f} s", file=log)
    cuobjdump = find_cuobjdump()
    if cuobjdump:
        cross_check(cuobjdump, cubins)
    else:
        print(f"cuobjdump not found, the ELF reading is not cross-checked: {CUOBJDUMP_PIP}", file=log)

    kernels = {}
    for file, data in cubins.items():
        for name, r in Cubin(data).kernels().items():
            if name in kernels:
                raise RuntimeError(f"kernel {name} is in both {kernels[name]['file']} and {file}; the report keys kernels by name")
            kernels[name] = {"file": file, **r}
    result = {"arch": arch, "nvrtc": nvrtc.version, "kernels": dict(sorted(kernels.items()))}
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(cache)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the JSON object instead of a table")
    ap.add_argument("--arch", default="sm_90", help="a real architecture, sm_XY (default sm_90)")
    args = ap.parse_args()
    if not args.arch.startswith("sm_"):
        ap.error("--arch must be a real architecture (sm_XY): only those give a cubin")
    try:
        result = collect(args.arch)
    except RuntimeError as e:
        raise SystemExit(str(e))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"# {result['arch']}, NVRTC {result['nvrtc']}: registers per thread, static shared bytes per block "
          "(without the driver's reserved 1 KB), local bytes per thread, __launch_bounds__ threads")
    print(f"{'file':<18} {'kernel':<34} {'regs':>4} {'shared':>7} {'local':>6} {'bounds':>6}")
    for name, r in sorted(result["kernels"].items(), key=lambda kv: (kv[1]["file"], kv[0])):
        bounds = "-" if r["max_threads"] is None else r["max_threads"]
        print(f"{r['file']:<18} {name:<34} {r['registers']:>4} {r['shared_static']:>7} {r['local']:>6} {bounds:>6}")


if __name__ == "__main__":
    main()
