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
    """{label: (measured us or None, record)} for the GPT's four row kernels,
    one thread a row (df41e02) and one warp a row (today), at its shapes."""
    old = old_kernels(work)
    new = ROOT / "kernels"
    x, stat = ("buf", ROWS * C * 2), ("buf", ROWS * 4)
    att = ("buf", ATT_ROWS * T * 2)
    cases = {
        "layer_norm_forward": ("layer_norm.cu", ROWS,
                               [x, ("buf", C * 4), ("null",), x, stat, stat, ("i64", ROWS), ("i64", C), ("f32", 1e-5)]),
        "layer_norm_backward_dx": ("layer_norm.cu", ROWS,
                                   [x, ("buf", C * 4), stat, stat, x, x, ("i64", ROWS), ("i64", C)]),
        "causal_softmax_forward": ("attention.cu", ATT_ROWS, [att, ("i64", ATT_ROWS), ("i64", T)]),
        "causal_softmax_backward": ("attention.cu", ATT_ROWS, [att, att, ("i64", ATT_ROWS), ("i64", T), ("f32", 0.125)]),
    }
    measured = {("layer_norm_forward", "thread"): 409.0, ("layer_norm_forward", "warp"): 17.0,
                ("causal_softmax_forward", "thread"): 582.0, ("causal_softmax_forward", "warp"): 76.0}
    pts = {}
    for kernel, (file, rows, args) in cases.items():
        for how, inc, threads in (("thread", old, rows), ("warp", new, rows * 32)):
            grid = (min(65535, -(-threads // 256)), 1, 1)
            rec = emu_kernel.launch((inc / file).read_text(), f"{kernel}_f16", grid, (256, 1, 1), args, name=file,
                                    include=inc, l2_bytes=0)
            pts[(kernel, how)] = (measured.get((kernel, how)), rec)
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
    modeled = {key: model.op_time(rec, h100, kernels)[:2] for key, (_, rec) in pts.items()}
    shape = {"layer_norm_forward": "[16384, 384]", "causal_softmax_forward": "[98304, 256]"}
    for (kernel, how), (measured, _) in pts.items():
        if measured is None:
            continue
        t, bound = modeled[(kernel, how)]
        rows.append({"point": f"{kernel} {shape[kernel]}, one {how} a row", "device": "h100", "measured": measured,
                     "modeled": round(t, 1), "unit": "us", "error": t / measured - 1, "bound": bound})
    for kernel in shape:
        m = pts[(kernel, "thread")][0] / pts[(kernel, "warp")][0]
        r = modeled[(kernel, "thread")][0] / modeled[(kernel, "warp")][0]
        rows.append({"point": f"{kernel}: one thread a row / one warp a row", "device": "h100", "measured": round(m, 2),
                     "modeled": round(r, 2), "unit": "x", "error": r / m - 1, "bound": ""})
    # What one thread a row adds to a step's kernel time (the df41e02 build).
    slower = {k: modeled[(k, "thread")][0] - modeled[(k, "warp")][0] for k, _ in pts}
    out = Path(args.profiles)
    for label, config, level, device, measured, unit in STEPS:
        p = step_profile(config, level, device, out)
        rate = p["tokens_per_s"] if "tokens_per_s" in p else p["images_per_s"]
        rows.append({"point": label, "device": device, "measured": measured, "modeled": rate, "unit": unit,
                     "error": rate / measured - 1, "bound": p["bound"],
                     "step_ms": round(p["modeled_step_ms"], 3), "gpu_ms": round(p["gpu_ms"], 3),
                     "host_ms": round(p["host_ms"], 3)})
        if label.startswith("GPT O2"):
            # The H100's ncu sample: 400 consecutive kernels of the O2 run
            # (launches 1500-1899), 11.11 ms at 7464636 (today's row
            # kernels) and 24.36 ms at df41e02 (one thread a row): the
            # step's kernel time scaled to 400 kernels.
            ops = [r for r in p["kernels"] if r["kind"] in ("kernel", "gemm")]
            n = sum(r["launches"] for r in ops)
            now = sum(r["modeled_us"] for r in ops) / 1e3
            then = now + sum(slower[model.family(r["name"])] * r["launches"] for r in ops
                             if model.family(r["name"]) in slower) / 1e3
            for build, ms, measured in (("7464636", now, 11.11), ("df41e02", then, 24.36)):
                sample = ms * 400 / n
                rows.append({"point": f"GPT O2: 400 consecutive kernels (ncu sample), {build}", "device": "h100",
                             "measured": measured, "modeled": round(sample, 2), "unit": "ms",
                             "error": sample / measured - 1, "bound": ""})
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
