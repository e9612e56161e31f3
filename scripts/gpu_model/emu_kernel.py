"""One kernel launch on the emulated device, profiled: the record the
emulator's profiler writes for it (tests/cuda_emu, CUEMU_PROFILE).

For the time model's calibration points, which are single kernels measured
on a GPU (layer_norm's forward one thread a row and one warp a row, the
causal softmax): the kernel source is compiled by the emulated NVRTC as
ddptrain compiles it (kernels/*.cuh beside it on the include path) and
launched through the emulated driver on zero-filled buffers of the sizes
given. The profiler's switch is read once per process, so each launch runs
in a child process of its own.
"""

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def emulator_lib():
    """The emulated device's libraries, built when missing or stale
    (CUEMU_LIB_DIR: a build of them elsewhere)."""
    if os.environ.get("CUEMU_LIB_DIR"):
        return Path(os.environ["CUEMU_LIB_DIR"])
    out = subprocess.run([str(ROOT / "scripts/emulated-gpu.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def _child(spec):
    lib = Path(spec["lib"])
    cuda = ctypes.CDLL(str(lib / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(str(lib / "libnvrtc.so"))
    _check(cuda.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    prog = ctypes.c_void_p()
    src = spec["source"].encode()
    _check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, spec["name"].encode(), 0, None, None), "nvrtcCreateProgram")
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"-default-device", b"--fmad=true",
            f"--include-path={spec['include']}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    if rc != 0:
        n = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value + 1)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"compile of {spec['name']} failed: {log.value.decode()}")
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value + 1)
    nvrtc.nvrtcGetPTX(prog, ptx)
    mod = ctypes.c_void_p()
    _check(cuda.cuModuleLoadData(ctypes.byref(mod), ptx), "cuModuleLoadData")
    fn = ctypes.c_void_p()
    _check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, spec["kernel"].encode()), "cuModuleGetFunction")
    holders = []
    for a in spec["args"]:
        if a[0] == "buf":
            p = ctypes.c_uint64()
            _check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(a[1])), "cuMemAlloc")
            _check(cuda.cuMemsetD8_v2(p, ctypes.c_ubyte(0), ctypes.c_size_t(a[1])), "cuMemsetD8")
            holders.append(p)
        elif a[0] == "null":
            holders.append(ctypes.c_uint64(0))
        elif a[0] == "i64":
            holders.append(ctypes.c_int64(a[1]))
        elif a[0] == "i32":
            holders.append(ctypes.c_int32(a[1]))
        elif a[0] == "f32":
            holders.append(ctypes.c_float(a[1]))
        else:
            raise ValueError(f"argument kind {a[0]}")
    params = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    g, b = spec["grid"], spec["block"]
    _check(cuda.cuLaunchKernel(fn, g[0], g[1], g[2], b[0], b[1], b[2], 0, None, params, None), "cuLaunchKernel")
    _check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")


def launch(source, kernel, grid, block, args, name="kernel.cu", include=None, l2_bytes=None):
    """The profile record of one launch. `args`: ("buf", bytes) for a zeroed
    device buffer, ("null",), ("i64", v), ("i32", v) or ("f32", v)."""
    lib = emulator_lib()
    with tempfile.TemporaryDirectory() as d:
        prof = Path(d) / "profile.jsonl"
        spec = {"lib": str(lib), "source": source, "kernel": kernel, "grid": list(grid), "block": list(block),
                "args": [list(a) for a in args], "name": name, "include": str(include or ROOT / "kernels")}
        env = dict(os.environ, CUEMU_PROFILE=str(prof))
        if l2_bytes is not None:
            env["CUEMU_L2_BYTES"] = str(l2_bytes)
        subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), text=True, env=env, check=True)
        recs = [json.loads(line) for line in prof.read_text().splitlines() if line.strip()]
    kernels = [r for r in recs if r["kind"] == "kernel" and r["name"] == kernel]
    if not kernels:
        raise RuntimeError(f"no profile record of {kernel}")
    return kernels[-1]


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child(json.loads(sys.stdin.read()))
