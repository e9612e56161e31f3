#!/usr/bin/env python3
"""A training step of a config on the emulated device, profiled and timed on
a modeled H100 or H200: the table `nsys stats` and Nsight Compute's summary
would give, with no GPU.

    scripts/gpu-profile.sh --config configs/gpt_sotu_gpu_o2.toml [--set k=v ...]
        [--device h100|h200] [--json] [--batch B] [--probe 2,4] [--verify 8]

How: ddptrain trains the config on the emulated device (tests/cuda_emu) with
its profiler on, for `k` and then `k + 1` steps (k = 2): the operations the
second run has beyond the first, where the two runs' host-ordered records
part and meet again, are one ordinary training step. That is done at two
small batches (--probe, default 2 and 4); every count of every operation in
the step (grid, sectors, DRAM bytes, GEMM shapes, FLOPs) is then taken as
affine in the batch and carried to the config's batch (or --batch). That is
exact for counts that grow linearly with the batch, which every per-sample
kernel's and GEMM's do; --verify B profiles a third batch and prints how far
the carried counts miss it. The L2 model's capacity is scaled by
probe / batch in each probe run, so the part of the footprint that fits in
L2 is the same as at the full batch.

Each operation is then timed by scripts/gpu_model/model.py on the device's
figures (scripts/gpu_model/devices.toml), with occupancy from the real
compiler's registers (scripts/gpu_model/resources.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts/gpu_model"))

import model  # noqa: E402
import resources  # noqa: E402  (the real compiler's registers, for occupancy)

STEPS = 2
L2_BYTES = 50 * 2**20
# Fields that are labels, not counts: kept from the larger probe.
LABELS = {"seq", "kind", "name", "transa", "transb", "atype", "ctype", "compute", "beta_nonzero", "block"}


def config_facts(path, sets):
    cfg = tomllib.loads(Path(path).read_text())
    data = cfg.get("data", {})
    batch = data.get("batch_size")
    text = data.get("dataset") == "text"
    for s in sets:
        key, _, value = s.partition("=")
        if key == "data.batch_size":
            batch = int(value)
        if key == "data.dataset":
            text = value.strip("'\"") == "text"
    amp = cfg.get("amp", {})
    level, scale = amp.get("opt_level", "O0"), amp.get("loss_scale", "dynamic")
    for s in sets:
        key, _, value = s.partition("=")
        if key == "amp.opt_level":
            level = value.strip("'\"")
        if key == "amp.loss_scale":
            scale = value.strip("'\"")
    dynamic = level.upper() != "O0" and scale == "dynamic"
    shape = cfg.get("model", {}).get("input_shape", [])
    tokens = shape[0] if text and shape else None
    return batch, text, tokens, dynamic


def run_args(config, sets, batch, steps, facts, out_dir):
    text, dynamic = facts
    args = ["--config", config, "--set", 'run.device="cuda"', "--set", f"data.batch_size={batch}",
            "--set", f"train.max_steps={steps}", "--set", "logging.every_steps=1000",
            "--set", 'logging.progress="never"', "--set", "logging.tensorboard=false",
            "--set", f'run.out_dir="{out_dir}"']
    if text:
        args += ["--set", f"data.eval_batch_size={batch}", "--set", "train.eval_iters=1",
                 "--set", "expect.max_val_loss=100.0"]
    else:
        # A fixed epoch, the same in both runs: no epoch boundary inside the step.
        args += ["--set", 'data.dataset="synthetic"', "--set", f"data.synthetic_train_size={16 * batch}",
                 "--set", f"data.synthetic_test_size={batch}", "--set", "expect.min_test_accuracy=0.0"]
    if dynamic and not any(s.startswith("amp.init_scale=") for s in sets):
        # A first scale of 2^16 overflows in the first steps, and a skipped
        # step at one probe batch but not the other is not the same step.
        args += ["--set", "amp.init_scale=1.0"]
    for s in sets:
        args += ["--set", s]
    return args


def profile_run(binary, lib, args, l2_bytes, work, name):
    prof = Path(work) / f"profile-{name}.jsonl"
    env = dict(os.environ, CUEMU_PROFILE=str(prof), CUEMU_L2_BYTES=str(int(l2_bytes)),
               LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}",
               # The counts do not depend on the checks: off, for speed.
               CUEMU_MEMCHECK="0", CUEMU_INITCHECK="0", CUEMU_SHAREDCHECK="0")
    r = subprocess.run([binary, *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ddptrain failed ({r.returncode}):\n{r.stderr[-4000:]}")
    recs = [json.loads(line) for line in prof.read_text().splitlines() if line.strip()]
    recs.sort(key=lambda r: r["seq"])
    return recs


def signature(r):
    return (r["kind"], r["name"], tuple(r.get("grid", ())), tuple(r.get("block", ())), r.get("m"), r.get("n"),
            r.get("k"), r.get("bytes"))


def one_step(short, long):
    """The records of the step `long` has beyond `short`."""
    a, b = [signature(r) for r in short], [signature(r) for r in long]
    d = len(b) - len(a)
    if d <= 0:
        raise SystemExit(f"the {len(long)}-record run is not longer than the {len(short)}-record one")
    p = 0
    while p < len(a) and a[p] == b[p]:
        p += 1
    # The step starts where the runs part, or earlier when the step's first
    # operations repeat the run's end (an evaluation's forward).
    for start in range(p, -1, -1):
        if a[start:] == b[start + d:] and a[:start] == b[:start]:
            return long[start:start + d]
    raise SystemExit("the two runs differ in more than one step: is the step deterministic?")


def carry(lo, hi, b_lo, b_hi, batch):
    """Records at `batch` from the same step at two probe batches."""
    if [(r["kind"], r["name"]) for r in lo] != [(r["kind"], r["name"]) for r in hi]:
        raise SystemExit("the step's operations differ between the probe batches: the counts cannot be carried")
    f = (batch - b_lo) / (b_hi - b_lo)
    out = []
    for x, y in zip(lo, hi):
        r = {}
        for key, v in y.items():
            if key in LABELS or not isinstance(v, (int, float, list)) or isinstance(v, bool):
                r[key] = v
            elif isinstance(v, list):
                r[key] = [max(1, round(p + (q - p) * f)) for p, q in zip(x[key], v)]
            else:
                r[key] = max(0, x[key] + (v - x[key]) * f)
        out.append(r)
    return out


def steps_at(binary, lib, config, sets, batches, target, facts, work):
    """One step's records at each of `batches`. The runs (k and k + 1 steps
    at each batch) are independent processes, so they run side by side,
    one per core: their records do not depend on the order."""
    jobs = []
    for batch in batches:
        l2 = L2_BYTES * batch / target
        for k in (STEPS, STEPS + 1):
            name = f"b{batch}-k{k}"
            args = run_args(config, sets, batch, k, facts, Path(work) / f"run-{name}")
            jobs.append((binary, lib, args, l2, work, name))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        runs = list(pool.map(lambda j: profile_run(*j), jobs))
    return [one_step(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]


def table(rows, totals, head):
    lines = [head, ""]
    lines.append(f"{'modeled us':>11} {'share':>6} {'launches':>8} {'DRAM MB':>9} {'sect/req':>8} {'occ':>5} "
                 f"{'bound':>8} {'roofline':>8}  name")
    for r in rows:
        spr = "-" if r["sectors_per_request"] is None else f"{r['sectors_per_request']:.2f}"
        occ = "-" if r["occupancy"] is None else f"{r['occupancy']:.2f}"
        roof = "-" if r["roofline_fraction"] is None else f"{r['roofline_fraction']:.2f}"
        lines.append(f"{r['modeled_us']:>11.1f} {r['share'] * 100:>5.1f}% {r['launches']:>8} "
                     f"{r['dram_bytes'] / 1e6:>9.2f} {spr:>8} {occ:>5} {r['bound']:>8} {roof:>8}  {r['name']}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--device", default="h100")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--batch", type=int, help="the batch to model (default: the config's data.batch_size)")
    ap.add_argument("--probe", default="2,4", help="the two small batches run on the emulated device")
    ap.add_argument("--verify", type=int, help="profile this batch too and print how far the carried counts miss it")
    ap.add_argument("--records", help="write the step's carried records here (JSON lines), one per operation")
    ap.add_argument("--from-records", help="model these records (a --records file) instead of profiling")
    ap.add_argument("--bin", default=os.environ.get("DDPTRAIN_BIN"))
    ap.add_argument("--emu-lib", default=os.environ.get("CUEMU_LIB_DIR"))
    args = ap.parse_args()

    spec = model.load_spec(args.device)
    config_batch, text, tokens, dynamic = config_facts(args.config, args.sets)
    facts = (text, dynamic)
    batch = args.batch or config_batch
    if not batch:
        ap.error("the config sets no data.batch_size: give --batch")
    b_lo, b_hi = (int(x) for x in args.probe.split(","))
    if not 0 < b_lo < b_hi:
        ap.error("--probe wants two batches, the smaller first")
    binary = args.bin or str(ROOT / "target/release/ddptrain")
    if not Path(binary).is_file():
        ap.error(f"no ddptrain at {binary}: cargo build --release, or give --bin")
    kernels = resources.collect()["kernels"]
    check = None
    if args.from_records:
        recs = [json.loads(line) for line in Path(args.from_records).read_text().splitlines() if line.strip()]
        report(args, spec, kernels, recs, batch, b_lo, b_hi, tokens, check)
        return
    with tempfile.TemporaryDirectory() as work:
        probes = [b_lo, b_hi] + ([args.verify] if args.verify else [])
        lo, hi, *seen = steps_at(binary, args.emu_lib, args.config, args.sets, probes, batch, facts, work)
        recs = carry(lo, hi, b_lo, b_hi, batch)
        if args.verify:
            seen = seen[0]
            guess = carry(lo, hi, b_lo, b_hi, args.verify)
            check = verify(guess, seen, spec, kernels, args.verify)
    if args.records:
        Path(args.records).write_text("".join(json.dumps(r) + "\n" for r in recs))
    report(args, spec, kernels, recs, batch, b_lo, b_hi, tokens, check)


def report(args, spec, kernels, recs, batch, b_lo, b_hi, tokens, check):
    rows, totals = model.summarize(recs, spec, kernels)
    per_step = batch * (tokens or 1)
    rate = per_step / (totals["modeled_step_ms"] / 1e3)
    unit = "tokens_per_s" if tokens else "images_per_s"
    result = {"config": args.config, "sets": args.sets, "device": args.device, "device_name": spec["name"],
              "batch": batch, "probe_batches": [b_lo, b_hi], **totals, unit: round(rate), "kernels": rows}
    if check:
        result["verify"] = check
    if args.json:
        print(json.dumps(result, indent=1))
        return
    head = (f"# {args.config} on a modeled {spec['name']}, batch {batch} (carried from the emulated device's "
            f"steps at batches {b_lo} and {b_hi})")
    print(table(rows, totals, head))
    print()
    print(f"modeled step: {totals['modeled_step_ms']:.3f} ms ({totals['bound']}-bound: GPU {totals['gpu_ms']:.3f} ms, "
          f"host {totals['host_ms']:.3f} ms), {totals['launches']} operations, "
          f"{totals['dram_bytes'] / 1e9:.3f} GB DRAM; {rate:,.0f} {unit.replace('_per_s', '/s')}")
    if check:
        print(f"verify at batch {args.verify}: modeled step {check['carried_step_ms']:.3f} ms carried, "
              f"{check['profiled_step_ms']:.3f} ms profiled ({check['step_error']:+.2%}); "
              f"largest count error {check['worst']}")


def verify(guess, seen, spec, kernels, batch):
    if [(r["kind"], r["name"]) for r in guess] != [(r["kind"], r["name"]) for r in seen]:
        raise SystemExit(f"the step at batch {batch} has other operations than the probes'")
    worst = (0.0, "")
    for g, s in zip(guess, seen):
        for key in ("dram_read", "dram_write", "ld_sectors", "st_sectors", "ld_requests", "st_requests", "flops"):
            if key in s and s[key]:
                e = abs(g[key] - s[key]) / s[key]
                if e > worst[0]:
                    worst = (e, f"{e:.2%} in {key} of {s['name']}")
    _, tg = model.summarize(guess, spec, kernels)
    _, ts = model.summarize(seen, spec, kernels)
    return {"batch": batch, "carried_step_ms": tg["modeled_step_ms"], "profiled_step_ms": ts["modeled_step_ms"],
            "step_error": tg["modeled_step_ms"] / ts["modeled_step_ms"] - 1, "worst": worst[1] or "none"}


if __name__ == "__main__":
    main()
