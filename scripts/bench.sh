#!/usr/bin/env bash
# Benchmark, not a test: training throughput of the seed ConvNet in fp32
# (configs/mnist_o0.toml) and under apex O1/O2 (f16 emulated on the CPU) on
# synthetic data (batch BATCH, default 100), and, when a python with torch is
# importable, PyTorch on the same model, batch, optimizer and thread count.
#
# On the CPU: ddptrain O0/O1/O2 and PyTorch in each CPU configuration (eager
# NCHW, eager channels_last, torch.compile), REPS rounds of each run back to
# back; reports medians, ddptrain O0 against the fastest PyTorch configuration
# (median of the per-round ratios), and the share of the machine's FMA peak
# (examples/fma_peak.rs) that ddptrain O0 reaches.
#
#   scripts/bench.sh                 # 300 steps, 5 rounds, all cores
#   STEPS=500 REPS=7 THREADS=2 BATCH=256 PYTHON=/path/to/python scripts/bench.sh
#   DEVICE=cuda BIN=gpu-bundle/ddptrain scripts/bench.sh   # on a GPU machine (gpu-check.sh runs this)
# On the GPU: ddptrain O0 and O2 against PyTorch eager fp32 and PyTorch
# autocast(float16) + GradScaler, same model, batch and data on the device.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-300}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu}
BATCH=${BATCH:-100}
REPS=${REPS:-5}

if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  BIN="${CARGO_TARGET_DIR:-target}/release/ddptrain"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# images/s of the seed ConvNet at one opt level (same model, data, batch and threads).
run_level() {
  RAYON_NUM_THREADS=$THREADS "$BIN" --config "configs/mnist_$1.toml" --set run.device="$DEVICE" \
    --set data.dataset=synthetic --set data.synthetic_train_size=$((STEPS * BATCH)) \
    --set data.synthetic_test_size=$BATCH --set data.batch_size=$BATCH \
    --set train.max_steps="$STEPS" --set run.out_dir="$out/$1" \
    --set logging.progress=never --set expect.min_test_accuracy=0.0 >/dev/null
  python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['images_per_s']))" "$out/$1/summary.json"
}
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$1" "$2"; }

if [ "$DEVICE" = cuda ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
  ours=$(run_level o0)
  ours_o2=$(run_level o2)
  echo "seed ConvNet, batch $BATCH, $STEPS steps, on ${gpu:-an unnamed GPU}"
  printf '%-28s %12s\n' "trainer" "images/s"
  printf '%-28s %12s\n' "ddptrain O0" "$ours" "ddptrain O2" "$ours_o2"
  if "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    fp32=$("$PYTHON" scripts/bench_torch.py --steps "$STEPS" --batch "$BATCH" --device cuda)
    amp=$("$PYTHON" scripts/bench_torch.py --steps "$STEPS" --batch "$BATCH" --device cuda --amp)
    printf '%-28s %12s\n' "pytorch fp32" "$fp32" "pytorch autocast+GradScaler" "$amp"
    echo "ratio ddptrain O0/pytorch fp32: $(ratio "$ours" "$fp32")"
    echo "ratio ddptrain O2/pytorch autocast+GradScaler: $(ratio "$ours_o2" "$amp")"
  else
    echo "pytorch: not measured ($PYTHON cannot import torch with CUDA; set PYTHON)"
  fi
  exit 0
fi
# The machine's own FMA peak on THREADS threads (examples/fma_peak.rs).
cargo build --release --quiet --example fma_peak
peak_line=$("${CARGO_TARGET_DIR:-target}/release/examples/fma_peak" "$THREADS")
peak=${peak_line%% *}

# REPS rounds; each runs every trainer once, back to back, so load from other
# processes hits them alike and each round gives one ratio per pair.
have_torch=0
if "$PYTHON" -c "import torch" 2>/dev/null; then have_torch=1; fi
torch_cfgs=("nchw" "channels_last" "compile")
torch_run() {
  case $1 in
    nchw) "$PYTHON" scripts/bench_torch.py --steps "$STEPS" --threads "$THREADS" --batch "$BATCH" ;;
    channels_last) "$PYTHON" scripts/bench_torch.py --steps "$STEPS" --threads "$THREADS" --batch "$BATCH" --layout channels_last ;;
    compile) "$PYTHON" scripts/bench_torch.py --steps "$STEPS" --threads "$THREADS" --batch "$BATCH" --compile ;;
  esac
}
rows="$out/rows.txt"
: >"$rows"
for r in $(seq "$REPS"); do
  for l in o0 o1 o2; do echo "$r ddptrain_$l $(run_level $l)" >>"$rows"; done
  if [ "$have_torch" = 1 ]; then
    for c in "${torch_cfgs[@]}"; do echo "$r pytorch_$c $(torch_run "$c" 2>/dev/null | tail -n1)" >>"$rows"; done
  fi
done

# World 2 on the same cores: two ranks of batch BATCH/2 (the same global batch),
# each with half the threads, over the TCP transport on loopback. The seed
# ConvNet's 116 KB of gradients fit in DDP's default 1 MB first bucket, whose
# all-reduce can only start when backward ends; 16 KB / 64 KB buckets let the
# fc and conv2 buckets go while the earlier layers' backward still runs.
"$BIN" launch --nproc-per-node 2 --master-port "${MASTER_PORT:-29517}" -- --config configs/mnist_o0.toml \
  --set data.dataset=synthetic --set data.synthetic_train_size=$((STEPS * BATCH)) \
  --set data.synthetic_test_size=$BATCH --set data.batch_size=$((BATCH / 2)) \
  --set parallel.first_bucket_mb=0.015625 --set parallel.bucket_cap_mb=0.0625 \
  --set train.max_steps="$STEPS" --set run.out_dir="$out/w2" \
  --set logging.progress=never --set expect.min_test_accuracy=0.0 >/dev/null
read -r ours_w2 hidden_w2 < <(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(round(s['images_per_s']), round(100 * s['allreduce_hidden_fraction']))" "$out/w2/summary.json")

echo "seed ConvNet, batch $BATCH, $THREADS threads, $STEPS steps, $REPS rounds, $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p')"
echo "FMA peak (examples/fma_peak.rs): $peak_line"
python3 - "$rows" "$peak" "$BATCH" <<'PY'
import collections, statistics, sys
rows, peak, batch = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
runs = collections.defaultdict(dict)  # trainer -> round -> images/s
for line in open(rows):
    r, name, v = (line.split() + [""])[:3]
    if v:
        runs[name][int(r)] = float(v)
med = {k: statistics.median(v.values()) for k, v in runs.items()}
print(f"{'trainer':<24} {'median images/s':>15}   per round")
for k, v in runs.items():
    print(f"{k:<24} {med[k]:>15.0f}   {' '.join(f'{x:.0f}' for x in v.values())}")

def ratio(a, b):
    """Median over rounds of a/b, with the per-round ratios."""
    rs = [runs[a][r] / runs[b][r] for r in runs[a] if r in runs[b]]
    return statistics.median(rs), rs

for lvl in ("o1", "o2"):
    m, rs = ratio(f"ddptrain_{lvl}", "ddptrain_o0")
    print(f"ddptrain {lvl.upper()}/O0: {m:.2f}x (median of {len(rs)} rounds)")
torch = [k for k in med if k.startswith("pytorch_")]
if torch:
    fast = max(torch, key=med.get)
    m, rs = ratio("ddptrain_o0", fast)
    print(f"fastest PyTorch configuration: {fast} ({med[fast]:.0f} images/s)")
    print(f"ddptrain O0 / {fast}: {m:.2f}x median of {len(rs)} interleaved pairs "
          f"({' '.join(f'{x:.2f}' for x in rs)})")
else:
    print("pytorch: not measured (set PYTHON to a python that can import torch)")
# FLOP per training image of the seed ConvNet: forward of conv1 (1->16, 5x5,
# 28x28), conv2 (16->32, 5x5, 14x14) and fc (1568->10); every weight
# gradient costs a forward's FLOP again, and input gradients are taken for
# conv2 and fc only (conv1's input needs none).
conv1, conv2, fc = 2 * 28 * 28 * 16 * 25, 2 * 14 * 14 * 32 * 16 * 25, 2 * 1568 * 10
flop = 2 * (conv1 + conv2 + fc) + conv2 + fc
share = med["ddptrain_o0"] * flop / (peak * 1e9)
print(f"ddptrain O0: {flop / 1e6:.1f} MFLOP/image x {med['ddptrain_o0']:.0f} images/s = "
      f"{share * 100:.0f}% of the FMA peak")
PY
printf '%-24s %15s   (2 ranks x batch %d, 16/64 KB buckets: %d%% of all-reduce time hidden behind backward)\n' "ddptrain O0 world 2" "$ours_w2" $((BATCH / 2)) "$hidden_w2"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
