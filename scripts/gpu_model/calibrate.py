#!/usr/bin/env python3
"""The time model against every GPU figure ddptrain has measured: each
point's measured value, the modeled one and the error, for BENCHMARKS.md.

    python3 scripts/gpu_model/calibrate.py [--profiles DIR] [--json]

Single-kernel points run the kernel on the emulated device at the measured
shape (scripts/gpu_model/emu_kernel.py), with an L2 that holds nothing
across launches (the measured launches read inputs the previous kernels had
long evicted or never had: 25 MB and 50 MB operands). The one-thread-a-row
kernels are the ones of commit df41e02, which the H100 measured; their
source comes from git. Step points read the JSON of scripts/gpu-profile.sh
from DIR (default target/gpu-model/profiles), made when missing.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import emu_kernel  # noqa: E402
import model  # noqa: E402
import resources  # noqa: E402

OLD = "df41e02"  # the build the H100 measured one thread a row

ROWS = 16384
C = 384
ATT_ROWS, T = 64 * 6 * 256, 256

# Every measured step figure: config, opt level, device, measured rate, unit.
STEPS = [
    ("GPT O2 (gpt_sotu_gpu_o2, batch 64)", "configs/gpt_sotu_gpu_o2.toml", "O2", "h100", 795_302, "tokens/s"),
    ("GPT O0 (gpt_sotu_gpu_o2, batch 64)", "configs/gpt_sotu_gpu_o2.toml", "O0", "h100", 368_623, "tokens/s"),
    ("ResNet-20 O2 (batch 128)", "configs/resnet20_fashion_o2.toml", "O2", "h200", 14_152, "images/s"),
    ("seed ConvNet O2 (batch 100)", "configs/mnist_o2.toml", "O2", "h200", 43_050, "images/s"),
    ("seed ConvNet O0 (batch 100)", "configs/mnist_o0.toml", "O0", "h200", 38_016, "images/s"),
]


def old_kernels(work):
    d = Path(work) / "old"
    d.mkdir()
    for f in ("layer_norm.cu", "attention.cu", "common.cuh"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD}:kernels/{f}"], check=True, capture_output=True,
                             text=True).stdout
        (d / f).write_text(src)
    return d


def kernel_points(work):
    """(label, measured us, record)."""
    old = old_kernels(work)
    new = ROOT / "kernels"
    ln_args = [("buf", ROWS * C * 2), ("buf", C * 4), ("null",), ("buf", ROWS * C * 2), ("buf", ROWS * 4),
               ("buf", ROWS * 4), ("i64", ROWS), ("i64", C), ("f32", 1e-5)]
    sm_args = [("buf", ATT_ROWS * T * 2), ("i64", ATT_ROWS), ("i64", T)]

    def grid(threads):
        return (min(65535, -(-threads // 256)), 1, 1)

    pts = []
    for label, inc, threads, measured in (("layer_norm forward [16384, 384], one thread a row", old, ROWS, 409.0),
                                          ("layer_norm forward [16384, 384], one warp a row", new, ROWS * 32, 17.0)):
        rec = emu_kernel.launch((inc / "layer_norm.cu").read_text(), "layer_norm_forward_f16", grid(threads),
                                (256, 1, 1), ln_args, name="layer_norm.cu", include=inc, l2_bytes=0)
        pts.append((label, measured, rec))
    for label, inc, threads, measured in (("causal softmax forward [98304, 256], one thread a row", old, ATT_ROWS, 582.0),
                                          ("causal softmax forward [98304, 256], one warp a row", new, ATT_ROWS * 32, 76.0)):
        rec = emu_kernel.launch((inc / "attention.cu").read_text(), "causal_softmax_forward_f16", grid(threads),
                                (256, 1, 1), sm_args, name="attention.cu", include=inc, l2_bytes=0)
        pts.append((label, measured, rec))
    return pts


def step_profile(config, level, device, out):
    path = out / f"{Path(config).stem}-{level.lower()}-{device}.json"
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([str(ROOT / "scripts/gpu-profile.sh"), "--config", config, "--set",
                            f'amp.opt_level="{level}"', "--device", device, "--json"], check=True,
                           capture_output=True, text=True)
        path.write_text(r.stdout)
    return json.loads(path.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default=str(ROOT / "target/gpu-model/profiles"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kernels = resources.collect()["kernels"]
    h100 = model.load_spec("h100")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        pts = kernel_points(work)
    modeled = {}
    for label, measured, rec in pts:
        t, bound, occ, _ = model.op_time(rec, h100, kernels)
        modeled[label] = t
        rows.append({"point": label, "device": "h100", "measured": measured, "modeled": round(t, 1), "unit": "us",
                     "error": t / measured - 1, "bound": bound})
    for a, b, measured in (("layer_norm forward [16384, 384], one thread a row",
                            "layer_norm forward [16384, 384], one warp a row", 409.0 / 17.0),
                           ("causal softmax forward [98304, 256], one thread a row",
                            "causal softmax forward [98304, 256], one warp a row", 582.0 / 76.0)):
        ratio = modeled[a] / modeled[b]
        rows.append({"point": f"ratio: {a.split(',')[0]}, thread / warp", "device": "h100", "measured": round(measured, 2),
                     "modeled": round(ratio, 2), "unit": "x", "error": ratio / measured - 1, "bound": ""})
    out = Path(args.profiles)
    for label, config, level, device, measured, unit in STEPS:
        p = step_profile(config, level, device, out)
        rate = p["tokens_per_s"] if "tokens_per_s" in p else p["images_per_s"]
        rows.append({"point": label, "device": device, "measured": measured, "modeled": rate, "unit": unit,
                     "error": rate / measured - 1, "bound": p["bound"],
                     "step_ms": round(p["modeled_step_ms"], 3), "gpu_ms": round(p["gpu_ms"], 3),
                     "host_ms": round(p["host_ms"], 3)})
        if label.startswith("GPT O2"):
            # The H100's 400-launch ncu sample: 400 consecutive kernels of the
            # O2 run, 11.11 ms at 7464636 (today's row kernels).
            kern = sum(r["launches"] for r in p["kernels"] if r["kind"] in ("kernel", "gemm"))
            gpu_kernels_ms = sum(r["modeled_us"] for r in p["kernels"] if r["kind"] in ("kernel", "gemm")) / 1e3
            sample = gpu_kernels_ms * 400 / kern
            rows.append({"point": "GPT O2: 400 consecutive kernels (ncu sample)", "device": "h100", "measured": 11.11,
                         "modeled": round(sample, 2), "unit": "ms", "error": sample / 11.11 - 1, "bound": ""})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| point | GPU | measured | modeled | error | bound |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['point']} | {r['device'].upper()} | {r['measured']:,} {r['unit']} | {r['modeled']:,} {r['unit']} | "
              f"{r['error']:+.0%} | {r['bound']} |")


if __name__ == "__main__":
    main()
