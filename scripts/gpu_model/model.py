"""The time model: what one device operation, profiled on the emulated device
(tests/cuda_emu, CUEMU_PROFILE), would take on a GPU of devices.toml.

A kernel launch costs the GPU's launch floor plus the largest of
  dram     its DRAM bytes (the profiler's L2 model) at the share of HBM
           bandwidth its requests' width allows (stream_efficiency),
  l2       the sectors its requests move between L2 and the SMs,
  lsu      its L1 wavefronts (a request costs one per 128-byte line it
           touches) and shared-memory wavefronts, one per SM per cycle,
  alu      its f32 lanes, special functions and issue slots (integer
           divisions as the instruction sequences the GPU runs for them),
           when the profiler counted arithmetic,
  latency  Little's law per warp: the mean (and the longest) warp's chain of
           global requests, `warp_mlp` in flight at a time, each waiting
           `memory_latency_us`, once per wave of resident blocks,
over the SMs its blocks occupy (occupancy from the real compiler's registers
and shared memory: resources.py). A cuBLAS GEMM costs a floor plus the larger
of its tiles' tensor-core (or f32) time in waves over the SMs (k split
when the tiles are too few) and its DRAM bytes. The host issues operations one by one; the step takes whichever is
longer, the GPU's sum or the host's.
"""

import math
import tomllib
from pathlib import Path

from occupancy import SM90, occupancy

HERE = Path(__file__).resolve().parent

# cudaDataType values in GEMM records.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F_FAST_TF32 = 77


def load_spec(device):
    specs = tomllib.loads((HERE / "devices.toml").read_text())
    if device not in specs or device == "calibrated":
        known = ", ".join(k for k in specs if k != "calibrated")
        raise SystemExit(f"unknown device {device!r}: devices.toml knows {known}")
    return {**specs[device], **specs["calibrated"], "device": device}


def _global(rec, key):
    return sum(rec.get(f"{k}_{key}", 0) for k in ("ld", "st", "atom"))


def stream_efficiency(rec, spec):
    """The fraction of HBM bandwidth a kernel's requests can draw: the full
    `dram_efficiency` from `full_request_bytes` a warp-level request up, in
    proportion below (a warp of 2-byte loads keeps half the bytes in flight
    that a warp of 4-byte ones does)."""
    req = _global(rec, "requests")
    if not req:
        return spec["dram_efficiency"]
    per = (rec.get("ld_bytes", 0) + rec.get("st_bytes", 0)) / req
    return spec["dram_efficiency"] * min(1.0, per / spec["full_request_bytes"])


def kernel_terms(rec, spec, resources):
    grid, block = rec["grid"], rec["block"]
    blocks = grid[0] * grid[1] * grid[2]
    bt = block[0] * block[1] * block[2]
    res = resources.get(rec["name"], {})
    regs = res.get("registers") or 32
    smem = (res.get("shared_static") or 0) + rec.get("dynamic_smem", 0)
    occ = occupancy(bt, regs, smem, SM90)
    per_sm = max(1, occ.blocks)
    active = min(spec["sms"], blocks)
    waves = math.ceil(blocks / (spec["sms"] * per_sm))
    hz = spec["clock_ghz"] * 1e9
    us = 1e6
    dram = (rec.get("dram_read", 0) + rec.get("dram_write", 0)) / (spec["hbm_tb_s"] * 1e12 * stream_efficiency(rec, spec))
    l2 = _global(rec, "sectors") * 32 / (spec["l2_tb_s"] * 1e12)
    lsu = (_global(rec, "wavefronts") + rec.get("shared_wavefronts", 0)) / (active * spec["l1_wavefronts_per_sm_cycle"] * hz)
    lanes = rec.get("f32_fma", 0) + rec.get("f32_add", 0) + rec.get("f32_mul", 0) + rec.get("f32_other", 0)
    # Issue slots: the kernel's own instructions (the profiler counts them
    # on the host; less what the host spends beyond the GPU on each half
    # conversion, software there, and on each thread's entry), plus what the GPU
    # runs for an integer division (no divide instruction: a reciprocal and
    # a few multiply-adds, a long subroutine for 64 bits) and for a math
    # library call (the profiler counts the call as one instruction).
    own = (rec.get("instructions", 0) - spec["f16_cvt_host_extra"] * rec.get("f16_cvt", 0)
           - spec["thread_host_extra"] * rec.get("threads", 0))
    issue = (max(0.0, own) + spec["int_div32_issue"] * rec.get("int_div32", 0)
             + spec["int_div64_issue"] * rec.get("int_div64", 0) + spec["special_issue"] * rec.get("special", 0))
    alu = max(lanes / (spec["fp32_lanes_per_sm"] * active * hz),
              rec.get("special", 0) / (spec["sfu_per_sm_cycle"] * active * hz),
              issue / (32 * spec["issue_per_sm_cycle"] * active * hz))
    warps = max(1, rec.get("warps", 1))
    chain_mean = _global(rec, "requests") / warps
    chain = max(waves * chain_mean, rec.get("max_warp_requests", 0))
    latency = chain * spec["memory_latency_us"] / us / spec["warp_mlp"]
    terms = {"dram": dram * us, "l2": l2 * us, "lsu": lsu * us, "alu": alu * us, "latency": latency * us}
    return terms, occ.fraction


def op_time(rec, spec, resources):
    """(modeled microseconds, bound, occupancy or None, roofline microseconds)."""
    kind = rec["kind"]
    hbm = spec["hbm_tb_s"] * 1e12
    dram_bytes = rec.get("dram_read", 0) + rec.get("dram_write", 0)
    if kind == "kernel":
        terms, occ = kernel_terms(rec, spec, resources)
        bound = max(terms, key=terms.get)
        t = spec["launch_us"] + terms[bound]
        if spec["launch_us"] > terms[bound]:
            bound = "launch"
        return t, bound, occ, dram_bytes / hbm * 1e6
    if kind == "gemm":
        tile = spec["gemm_tile"]
        tiles = math.ceil(rec["m"] / tile) * math.ceil(rec["n"] / tile) * rec["batch"]
        # Too few tiles to fill the SMs: cuBLAS splits k (at least
        # `gemm_split_k_min` of it a slice) and sums the slices.
        splits = 1
        if tiles < spec["sms"]:
            splits = max(1, min(spec["sms"] // tiles, rec["k"] // spec["gemm_split_k_min"]))
        waves = math.ceil(tiles * splits / spec["sms"])
        if rec["atype"] in (CUDA_R_16F, CUDA_R_16BF):
            peak = spec["fp16_tensor_tflops"]
        elif rec["compute"] == CUBLAS_COMPUTE_32F_FAST_TF32:
            peak = spec["tf32_tensor_tflops"]
        else:
            peak = spec["fp32_tflops"]
        per_sm = peak * 1e12 / spec["sms"] * spec["gemm_efficiency"]
        compute = waves * 2 * tile * tile * math.ceil(rec["k"] / splits) / per_sm * 1e6
        mem = dram_bytes / (hbm * spec["dram_efficiency"]) * 1e6
        bound = "tensor" if compute >= mem else "dram"
        roof = max(rec["flops"] / (peak * 1e12), dram_bytes / hbm) * 1e6
        return spec["gemm_floor_us"] + max(compute, mem), bound, None, roof
    if kind in ("memcpy_dtod", "memset"):
        return spec["launch_us"] + dram_bytes / (hbm * spec["dram_efficiency"]) * 1e6, "dram", None, dram_bytes / hbm * 1e6
    # Host <-> device: PCIe Gen5 x16, about 50 GB/s a direction in practice.
    return spec["launch_us"] + rec.get("bytes", 0) / 50e9 * 1e6, "pcie", None, 0.0


def host_time(rec, spec):
    return spec["host_gemm_us"] if rec["kind"] == "gemm" else spec["host_launch_us"]


def family(name):
    """A kernel's family: its name without the dtype suffix (layer_norm_forward_f16 -> layer_norm_forward)."""
    for sfx in ("_f16", "_f32", "_bf16"):
        if name.endswith(sfx):
            return name[: -len(sfx)]
    return name


def summarize(records, spec, resources):
    """Per-kernel rows and the step's totals for a list of records (one step)."""
    rows = {}
    gpu_us = host_us = 0.0
    dram = 0
    for rec in records:
        t, bound, occ, roof = op_time(rec, spec, resources)
        gpu_us += t
        host_us += host_time(rec, spec)
        d = rec.get("dram_read", 0) + rec.get("dram_write", 0)
        dram += d
        name = rec["name"] if rec["kind"] != "gemm" else gemm_name(rec)
        r = rows.setdefault(name, {"name": name, "kind": rec["kind"], "launches": 0, "modeled_us": 0.0,
                                   "dram_bytes": 0, "requests": 0, "sectors": 0, "occupancy_sum": 0.0,
                                   "bounds": {}, "roofline_us": 0.0, "flops": 0})
        r["launches"] += 1
        r["modeled_us"] += t
        r["dram_bytes"] += d
        r["requests"] += _global(rec, "requests")
        r["sectors"] += _global(rec, "sectors")
        r["occupancy_sum"] += occ or 0.0
        r["bounds"][bound] = r["bounds"].get(bound, 0.0) + t
        r["roofline_us"] += roof
        r["flops"] += rec.get("flops", 0)
    out = []
    step_us = max(gpu_us, host_us)
    for r in rows.values():
        out.append({
            "name": r["name"], "kind": r["kind"], "launches": r["launches"],
            "modeled_us": round(r["modeled_us"], 3),
            "share": round(r["modeled_us"] / gpu_us, 4) if gpu_us else 0.0,
            "dram_bytes": int(r["dram_bytes"]),
            "sectors_per_request": round(r["sectors"] / r["requests"], 3) if r["requests"] else None,
            "occupancy": round(r["occupancy_sum"] / r["launches"], 3) if r["kind"] == "kernel" else None,
            "bound": max(r["bounds"], key=r["bounds"].get),
            "roofline_fraction": round(r["roofline_us"] / r["modeled_us"], 3) if r["modeled_us"] else None,
            "flops": int(r["flops"]),
        })
    out.sort(key=lambda r: -r["modeled_us"])
    return out, {"gpu_ms": gpu_us / 1e3, "host_ms": host_us / 1e3, "modeled_step_ms": step_us / 1e3,
                 "launches": len(records), "dram_bytes": int(dram),
                 "bound": "host" if host_us > gpu_us else "gpu"}


def gemm_name(rec):
    dt = {CUDA_R_32F: "f32", CUDA_R_16F: "f16", CUDA_R_16BF: "bf16"}.get(rec["atype"], str(rec["atype"]))
    batched = " batched" if rec["batch"] > 1 else ""
    return f"cublas gemm {dt}{batched} {rec['transa']}{rec['transb']}"
