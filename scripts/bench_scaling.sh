#!/usr/bin/env bash
# Benchmark, not a test: how the training cost of the seed ConvNet in fp32
# (configs/mnist_o0.toml, synthetic data) grows with the batch and with the
# parallelism on the CPU, ddptrain O0 against PyTorch, as a markdown table.
#
# Cells: each batch of BATCHES (default "32 100 256", the global batch) in
# three configurations:
#   world 1, 1 thread    one process on one thread
#   world 1, 2 threads   one process on two threads
#   world 2, 1 thread    two ranks of batch/2 each (same global batch), one
#                        thread each: `ddptrain launch --nproc-per-node 2`
#                        (TCP on loopback, 16 KB / 64 KB buckets, as
#                        scripts/bench.sh) and PyTorch DistributedDataParallel
#                        over gloo (scripts/bench_torch.py --world 2, 64 KB
#                        buckets), each rank with RAYON_NUM_THREADS=1 or
#                        torch.set_num_threads(1)
# PyTorch runs in eager NCHW and eager channels_last; per cell the one with
# the higher median is reported, and named.
#
# REPS rounds (default 5); each runs every cell's trainers once, cell after
# cell: ddptrain, then one PyTorch process that measures both layouts (one
# torch start-up instead of two; which layout goes first alternates from round
# to round), so load from other processes hits them alike. Per cell: median images/s of each trainer, the
# speed-up over the same trainer's world 1 / 1 thread cell (ratio of medians),
# and ddptrain / PyTorch as the median of the per-round ratios.
#
# Every run trains on the same STEPS x 100 images, whatever its batch: STEPS
# (default 100) is the step count of a batch-100 run and a batch-B run takes
# STEPS x 100 / B steps, so each run lasts a few seconds. ddptrain's images/s
# is its summary.json `images_per_s` (every training step, start-up and
# evaluation left out); PyTorch's is timed after untimed warmup steps on 640
# images (20 steps at batch 32, at least 3).
# The full grid (STEPS=100 REPS=5) should take about 11 minutes on an idle
# 2-core VM: per round ~65 s of start-ups (torch's import, warmups) plus
# 10,000 images x 9 cells at ~9,000 images/s for ddptrain and ~4,000 for
# each PyTorch layout (less on 1 thread); longer under load.
#
#   PYTHON=/path/to/python scripts/bench_scaling.sh
#   STEPS=10 REPS=1 BATCHES=32 PYTHON=/path/to/python scripts/bench_scaling.sh   # a quick check
# Without a PYTHON that imports torch it prints ddptrain's figures and why
# PyTorch was not measured.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-100}
REPS=${REPS:-5}
BATCHES=${BATCHES:-32 100 256}
PYTHON=${PYTHON:-python3}
read -ra batches <<<"$BATCHES"
for b in "${batches[@]}"; do
  if ! [[ $b =~ ^[0-9]+$ ]] || ((b < 2 || b % 2)); then
    echo "BATCHES: $b is not an even batch of at least 2 (world 2 splits it in halves)" >&2
    exit 2
  fi
done

# shellcheck source=scripts/bench_common.sh
. scripts/bench_common.sh
bench_setup

echo "command: STEPS=$STEPS REPS=$REPS BATCHES=\"$BATCHES\" PYTHON=$PYTHON scripts/bench_scaling.sh"
echo "ddptrain: $(git describe --always --dirty 2>/dev/null || echo unknown), $BIN"
echo "CPU: $(cpu_model), $(nproc) cores"
echo "load average at start: $(loadavg)"
why=$(torch_why)
if [ -z "$why" ]; then
  echo "PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__)') ($PYTHON), allocator (TORCH_ALLOC=${TORCH_ALLOC:-auto}): $(torch_alloc || true)"
else
  echo "PyTorch: not measured ($PYTHON cannot import torch: $why)"
fi

# configuration name -> "world threads"
configs=(w1t1 w1t2 w2t1)
declare -A cfg=([w1t1]="1 1" [w1t2]="1 2" [w2t1]="2 1")
rows="$out/rows.txt"
: >"$rows"
start=$SECONDS
for r in $(seq "$REPS"); do
  # Both PyTorch layouts run in one process per cell (one start-up of torch),
  # the first of them alternating from round to round.
  if [ -n "$why" ]; then layouts=""; elif ((r % 2)); then layouts=nchw,channels_last; else layouts=channels_last,nchw; fi
  for b in "${batches[@]}"; do
    steps=$(((STEPS * 100 + b / 2) / b))
    [ "$steps" -ge 1 ] || steps=1
    warmup=$(((640 + b - 1) / b))
    [ "$warmup" -ge 3 ] || warmup=3
    for c in "${configs[@]}"; do
      read -r world threads <<<"${cfg[$c]}"
      if ! v=$(ddptrain_ips o0 "$world" "$threads" "$b" "$steps" "$out/run" --set run.device=cpu 2>"$out/ddptrain.err"); then
        echo "ddptrain, batch $b, $c, round $r failed:" >&2
        cat "$out/ddptrain.err" >&2
        exit 1
      fi
      echo "$r $b $c ddptrain $v" >>"$rows"
      rm -rf "$out/run"
      if [ -n "$layouts" ]; then
        if torch_ips "$layouts" "$threads" "$b" "$steps" --world "$world" --bucket-cap-mb 0.0625 \
          --warmup "$warmup" >"$out/torch.out" 2>"$out/torch.err"; then
          while read -r l v; do echo "$r $b $c pytorch_$l $v" >>"$rows"; done <"$out/torch.out"
        else
          echo "PyTorch, batch $b, $c, round $r failed: $(tail -n1 "$out/torch.err")" >&2
        fi
      fi
    done
  done
  echo "round $r of $REPS done after $((SECONDS - start)) s" >&2
done

python3 - "$rows" "$REPS" "$STEPS" <<'PY'
import collections, statistics, sys
rows, reps, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = collections.defaultdict(dict)  # (batch, config, trainer) -> round -> images/s
batches, trainers = [], set()
for line in open(rows):
    r, b, c, t, v = line.split()
    runs[int(b), c, t][int(r)] = float(v)
    trainers.add(t)
    if int(b) not in batches:
        batches.append(int(b))
names = {"w1t1": "world 1, 1 thread", "w1t2": "world 1, 2 threads", "w2t1": "world 2 x batch/2, 1 thread each"}
layouts = {"pytorch_nchw": "NCHW", "pytorch_channels_last": "channels_last"}
med = {k: statistics.median(v.values()) for k, v in runs.items()}
torch = any(t in layouts for t in trainers)


def fastest(b, c):
    got = [t for t in layouts if (b, c, t) in med]
    return max(got, key=lambda t: med[b, c, t]) if got else None


def speedup(b, c, t):
    base = (b, "w1t1", t if t == "ddptrain" else fastest(b, "w1t1"))
    return f"{med[b, c, t] / med[base]:.2f}x" if base in med else "-"


print()
print(f"Seed ConvNet, fp32, synthetic data, {steps * 100} images per run, medians of {reps} interleaved rounds "
      "(ddptrain / PyTorch: median of the per-round ratios).")
print()
head = ["batch", "configuration", "ddptrain O0 images/s", "vs world 1, 1 thread"]
if torch:
    head += ["PyTorch images/s", "PyTorch layout", "vs world 1, 1 thread", "ddptrain / PyTorch"]
print("| " + " | ".join(head) + " |")
print("|" + "|".join("---" if "configuration" in h or "layout" in h else "---:" for h in head) + "|")
for b in batches:
    for c in names:
        if (b, c, "ddptrain") not in med:
            continue
        row = [str(b), names[c], f"{med[b, c, 'ddptrain']:.0f}", speedup(b, c, "ddptrain")]
        t = fastest(b, c)
        if torch and t:
            rs = [runs[b, c, "ddptrain"][r] / runs[b, c, t][r] for r in runs[b, c, t] if r in runs[b, c, "ddptrain"]]
            row += [f"{med[b, c, t]:.0f}", layouts[t], speedup(b, c, t), f"{statistics.median(rs):.2f}x"]
        elif torch:
            row += ["failed", "-", "-", "-"]
        print("| " + " | ".join(row) + " |")
print()
print("Per round (images/s):")
for (b, c, t), v in runs.items():
    print(f"  batch {b:>4} {c} {t:<22} {' '.join(f'{x:.0f}' for x in v.values())}")
PY
if [ -n "$why" ]; then echo "PyTorch: not measured ($PYTHON cannot import torch: $why)"; fi
echo "load average at end: $(loadavg)"
