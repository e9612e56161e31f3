#!/usr/bin/env python3
"""The modeled GPU step against the measured one, kernel by kernel: run on a
GPU machine by scripts/gpu-check.sh, so every lending of a GPU recalibrates
the model (scripts/gpu_model/devices.toml).

    measured.py --config configs/gpt_sotu_gpu_o2.toml --bin gpu-bundle/ddptrain \
        --modeled gpu-bundle/modeled/gpt_sotu_gpu_o2.json [--ncu ncu] [--json OUT]

How: ddptrain trains the config on the GPU under Nsight Compute
(`ncu --clock-control none --metrics gpu__time_duration.sum`), with the
arguments scripts/gpu_profile.py gives the emulated device (synthetic images
or the config's text, a fixed epoch, amp.init_scale 1), for k and k + 1
steps (k = 2); one training step is what the second run has beyond the
first, per kernel name, as on the emulated device. --modeled is
scripts/gpu-profile.sh's --json for the same config, batch and device
(gpu-bundle.sh writes it). Our kernels are matched by name; the kernels ncu
sees that are not ours are cuBLAS's, compared in one row against the
modeled GEMMs. Copies and memsets are not kernels to ncu and are left out
on both sides. ncu serializes the kernels, so the measured sum is the GPU
time with no overlap and no host gaps: compare it with the model's GPU
time, not its step.
"""

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_profile  # noqa: E402  (the emulated device's run arguments, the same here)

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
CUBLAS = "cuBLAS (every kernel not ours)"


def read_ncu_csv(text):
    """{kernel name: (launches, total us)} from `ncu --import R --csv
    --page raw --print-kernel-base function` output: a header row naming
    "Kernel Name" and gpu__time_duration.sum, a row of units, then a row a
    launch."""
    rows = list(csv.reader(io.StringIO(text)))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "gpu__time_duration.sum" in r), None)
    if head is None:
        raise SystemExit("ncu's CSV has no 'Kernel Name' and 'gpu__time_duration.sum' columns:\n" + text[:2000])
    name_col, time_col = rows[head].index("Kernel Name"), rows[head].index("gpu__time_duration.sum")
    scale = 1e-3  # ncu's default unit for durations is nanoseconds
    out = {}
    for r in rows[head + 1:]:
        if len(r) <= max(name_col, time_col):
            continue
        if r[time_col] in UNITS:  # the units row
            scale = UNITS[r[time_col]]
            continue
        try:
            us = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        n, t = out.get(r[name_col], (0, 0.0))
        out[r[name_col]] = (n + 1, t + us)
    return out


def one_step(short, long):
    """{name: (launches, us)} that `long` has beyond `short`."""
    step = {}
    for name, (n, t) in long.items():
        n0, t0 = short.get(name, (0, 0.0))
        if n > n0:
            step[name] = (n - n0, max(0.0, t - t0))
    return step


def compare(step, modeled):
    """Rows (name, measured launches, measured us, modeled launches,
    modeled us) for our kernels by name and cuBLAS's in one row."""
    ours = {k["name"]: k for k in modeled["kernels"] if k["kind"] == "kernel"}
    gemms = [k for k in modeled["kernels"] if k["kind"] == "gemm"]
    rows, blas = [], [0, 0.0]
    for name, (n, t) in step.items():
        if name in ours:
            rows.append((name, n, t, ours[name]["launches"], ours[name]["modeled_us"]))
        else:
            blas[0] += n
            blas[1] += t
    for name, k in ours.items():
        if name not in step:
            rows.append((name, 0, 0.0, k["launches"], k["modeled_us"]))
    rows.sort(key=lambda r: -max(r[2], r[4]))
    if gemms or blas[0]:
        rows.append((CUBLAS, blas[0], blas[1], sum(g["launches"] for g in gemms), sum(g["modeled_us"] for g in gemms)))
    return rows


def ncu_profile(ncu, binary, args, work, tag):
    rep = Path(work) / f"{tag}.ncu-rep"
    cmd = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--export", str(rep), "--force-overwrite",
           binary, *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not rep.is_file():
        raise SystemExit(f"ncu failed ({r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
    r = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-kernel-base", "function"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ncu --import failed ({r.returncode}): {r.stderr[-2000:]}")
    return read_ncu_csv(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--modeled", required=True, help="scripts/gpu-profile.sh --json for this config and device")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--json", help="write the rows and totals here too")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="after the modeled run's own --set (this machine's data.path, say)")
    a = ap.parse_args()
    modeled = json.loads(Path(a.modeled).read_text())
    batch = modeled["batch"]
    sets = modeled.get("sets", []) + a.sets
    _, text, _, dynamic = gpu_profile.config_facts(a.config, sets)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for k in (gpu_profile.STEPS, gpu_profile.STEPS + 1):
            args = gpu_profile.run_args(a.config, sets, batch, k, (text, dynamic),
                                        Path(work) / f"run-k{k}")
            runs.append(ncu_profile(a.ncu, a.bin, args, work, f"k{k}"))
    rows = compare(one_step(*runs), modeled)
    measured = sum(r[2] for r in rows)
    model_gpu = sum(r[4] for r in rows)
    print(f"# {a.config}, batch {batch}, on this GPU (ncu, serialized) against a modeled {modeled.get('device_name', modeled['device'])}")
    print(f"{'measured us':>11} {'modeled us':>10} {'model/meas':>10} {'launches':>9}  name")
    for name, n, t, mn, mt in rows:
        ratio = f"{mt / t:.2f}" if t > 0 else "-"
        print(f"{t:>11.1f} {mt:>10.1f} {ratio:>10} {n:>4}/{mn:<4}  {name}")
    print(f"kernels: measured {measured / 1e3:.3f} ms a step, modeled {model_gpu / 1e3:.3f} ms "
          f"({model_gpu / measured - 1:+.0%}); the model's whole step {modeled['modeled_step_ms']:.3f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "config": a.config, "batch": batch, "measured_kernel_ms": measured / 1e3, "modeled_kernel_ms": model_gpu / 1e3,
            "rows": [dict(zip(("name", "launches", "measured_us", "modeled_launches", "modeled_us"), r)) for r in rows],
        }, indent=1) + "\n")
    # Launch counts must agree: the model's step is the same operations.
    off = [r[0] for r in rows if r[0] != CUBLAS and r[1] != r[3]]
    if off:
        sys.exit(f"launch counts differ from the model's in: {', '.join(off[:10])}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
