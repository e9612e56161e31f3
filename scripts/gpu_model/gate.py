#!/usr/bin/env python3
"""The modeled-GPU regression gate: a config's profile (scripts/gpu_profile.py)
against its committed baseline in tests/gpu_profile/.

    python3 scripts/gpu_model/gate.py --config configs/mnist_o2.toml [--update]

Fails, naming what regressed, when the modeled step time or the GPU's share
of it grew by more than 3% or a kernel's sectors per request grew (worse coalescing). The counts are
deterministic, so the gate is exact: any other change in launches or DRAM
bytes is printed but does not fail. --update writes the profile as the new
baseline (after a deliberate change; a step more than 3% faster asks for
it, so the next regression is measured from the better figure).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "tests/gpu_profile"
STEP_TOLERANCE = 0.03
# Sectors per request are ratios of exact counts; this only absorbs rounding
# of the figures written to the baseline.
SECTOR_TOLERANCE = 1e-3


def baseline_path(config):
    return BASELINES / f"{Path(config).stem}.json"


def families(profile):
    """Per kernel: launches, DRAM bytes, sectors per request, modeled us."""
    return {k["name"]: k for k in profile["kernels"]}


def compare(base, cur):
    failures, notes = [], []
    # The GPU's time is gated as well as the step's: a host-bound step hides
    # a slower kernel that one CUDA graph a step would expose.
    for key, what in (("modeled_step_ms", "modeled step"), ("gpu_ms", "modeled GPU time")):
        b, c = base[key], cur[key]
        if c > b * (1 + STEP_TOLERANCE):
            worst = sorted(((k["modeled_us"] - families(base).get(n, {}).get("modeled_us", 0.0), n)
                            for n, k in families(cur).items()), reverse=True)[:3]
            grew = ", ".join(f"{n} +{d:.1f} us" for d, n in worst if d >= 0.05)
            failures.append(f"{what} {c:.3f} ms against the baseline's {b:.3f} ms (+{c / b - 1:.1%}, over "
                            f"{STEP_TOLERANCE:.0%}); grew most: {grew}")
        elif c < b * (1 - STEP_TOLERANCE):
            notes.append(f"{what} {c:.3f} ms, {1 - c / b:.1%} less than the baseline's {b:.3f} ms: "
                         "update the baseline (--update) so the gate holds the gain")
    bk, ck = families(base), families(cur)
    for name, k in sorted(ck.items()):
        old = bk.get(name)
        if old is None:
            notes.append(f"new operation {name}: {k['launches']} launches, {k['modeled_us']:.1f} us")
            continue
        if k["sectors_per_request"] is not None and old["sectors_per_request"] is not None and \
                k["sectors_per_request"] > old["sectors_per_request"] + SECTOR_TOLERANCE:
            failures.append(f"{name}: {k['sectors_per_request']:.3f} sectors per request against the baseline's "
                            f"{old['sectors_per_request']:.3f} (worse coalescing)")
        if k["launches"] != old["launches"] or k["dram_bytes"] != old["dram_bytes"]:
            notes.append(f"{name}: {old['launches']} -> {k['launches']} launches, "
                         f"{old['dram_bytes'] / 1e6:.2f} -> {k['dram_bytes'] / 1e6:.2f} MB DRAM")
    for name in sorted(set(bk) - set(ck)):
        notes.append(f"{name} is gone ({bk[name]['launches']} launches in the baseline)")
    return failures, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--update", action="store_true")
    ap.add_argument("--device", default="h100")
    args = ap.parse_args()
    cmd = [str(ROOT / "scripts/gpu-profile.sh"), "--config", args.config, "--device", args.device, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpu-profile failed ({r.returncode}): {r.stderr[-3000:]}")
    cur = json.loads(r.stdout)
    path = baseline_path(args.config)
    if args.update:
        path.parent.mkdir(parents=True, exist_ok=True)
        keep = {k: cur[k] for k in ("config", "device", "batch", "probe_batches", "modeled_step_ms", "gpu_ms",
                                    "host_ms", "launches", "dram_bytes")}
        keep["kernels"] = [{k: v for k, v in row.items() if k in ("name", "kind", "launches", "modeled_us",
                                                                   "dram_bytes", "sectors_per_request")}
                           for row in cur["kernels"]]
        path.write_text(json.dumps(keep, indent=1) + "\n")
        print(f"{path.relative_to(ROOT)}: modeled step {cur['modeled_step_ms']:.3f} ms, {cur['launches']} operations")
        return
    if not path.is_file():
        sys.exit(f"no baseline {path.relative_to(ROOT)}: make one with {Path(__file__).name} --config {args.config} --update")
    base = json.loads(path.read_text())
    failures, notes = compare(base, cur)
    print(f"{args.config}: modeled step {cur['modeled_step_ms']:.3f} ms (baseline {base['modeled_step_ms']:.3f} ms), "
          f"GPU {cur['gpu_ms']:.3f} ms (baseline {base['gpu_ms']:.3f} ms), {cur['launches']} operations")
    for n in notes:
        print(f"  note: {n}")
    for f in failures:
        print(f"  REGRESSION: {f}")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
