#!/usr/bin/env bash
# Benchmark, not a test: ddptrain O0 vs PyTorch fp32 training images/s on the
# seed ConvNet (batch 100, synthetic data), alternating the two REPS times so
# that load from other processes hits both alike. Prints each pair, the median
# ratio, the ratio of the two best runs, and the load average. On a shared
# machine only ratios mean much; the best run of each is the one that other
# processes (and other VMs on the host) disturbed least.
#
#   REPS=5 STEPS=150 PYTHON=/path/to/python scripts/bench_ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-150}
REPS=${REPS:-5}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-python3}
BATCH=100

cargo build --release --quiet
BIN="${CARGO_TARGET_DIR:-target}/release/ddptrain"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ours() {
  # Each round trains afresh: a run into the last round's out_dir is refused.
  rm -rf "$out/o0"
  RAYON_NUM_THREADS=$THREADS "$BIN" --config configs/mnist_o0.toml \
    --set data.dataset=synthetic --set data.synthetic_train_size=$((STEPS * BATCH)) \
    --set data.synthetic_test_size=$BATCH --set data.batch_size=$BATCH \
    --set train.max_steps="$STEPS" --set run.out_dir="$out/o0" \
    --set logging.progress=never --set expect.min_test_accuracy=0.0 >/dev/null
  python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['images_per_s']))" "$out/o0/summary.json"
}
theirs() {
  "$PYTHON" scripts/bench_torch.py --bin "$BIN" --steps "$STEPS" --threads "$THREADS" --batch "$BATCH"
}

ratios=()
best_a=0
best_b=0
for r in $(seq "$REPS"); do
  a=$(ours)
  b=$(theirs)
  ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.3f}')" "$a" "$b")
  ratios+=("$ratio")
  best_a=$(python3 -c "import sys; print(max(float(sys.argv[1]), float(sys.argv[2])))" "$a" "$best_a")
  best_b=$(python3 -c "import sys; print(max(float(sys.argv[1]), float(sys.argv[2])))" "$b" "$best_b")
  echo "rep $r: ddptrain $a  pytorch $b  ratio $ratio"
done
python3 -c "import statistics,sys; print(f'median ratio ddptrain/pytorch: {statistics.median(map(float, sys.argv[1:])):.2f}x')" "${ratios[@]}"
python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'best runs: ddptrain {a:.0f}  pytorch {b:.0f}  ratio {a / b:.2f}x')" "$best_a" "$best_b"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
