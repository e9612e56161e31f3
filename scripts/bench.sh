#!/usr/bin/env bash
# Benchmark, not a test: training throughput of the seed ConvNet in fp32
# (configs/mnist_o0.toml) and under apex O2 (configs/mnist_o2.toml, f16 emulated)
# on synthetic data at batch 100 on the CPU, and, when a python with torch is
# importable, PyTorch on the same model, batch and thread count, side by side.
#
#   scripts/bench.sh                 # 300 steps, all cores
#   STEPS=500 THREADS=2 PYTHON=/path/to/python scripts/bench.sh
#   DEVICE=cuda BIN=gpu-bundle/ddptrain scripts/bench.sh   # on a GPU machine (gpu-check.sh runs this)
# On the GPU: ddptrain O0 and O2 against PyTorch eager fp32 and PyTorch
# autocast(float16) + GradScaler, same model, batch and data on the device.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-300}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu}
BATCH=100

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
ours=$(run_level o0)
ours_o2=$(run_level o2)

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

echo "seed ConvNet, batch $BATCH, $THREADS threads, $STEPS steps, $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p')"
printf '%-16s %12s\n' "trainer" "images/s"
printf '%-16s %12s\n' "ddptrain O0" "$ours"
printf '%-16s %12s\n' "ddptrain O2" "$ours_o2"
printf '%-16s %12s   (2 ranks x batch %d, 16/64 KB buckets: %d%% of all-reduce time hidden behind backward)\n' "ddptrain O0 w2" "$ours_w2" $((BATCH / 2)) "$hidden_w2"
python3 -c "import sys; print(f'O2/O0 on the CPU: {float(sys.argv[1]) / float(sys.argv[2]):.2f}x (f16 is emulated here: widen, f32 kernel, round)')" "$ours_o2" "$ours"
if "$PYTHON" -c "import torch" 2>/dev/null; then
  theirs=$("$PYTHON" scripts/bench_torch.py --steps "$STEPS" --threads "$THREADS" --batch "$BATCH")
  printf '%-16s %12s\n' "pytorch fp32" "$theirs"
  python3 -c "import sys; print(f'ratio ddptrain O0/pytorch: {float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$ours" "$theirs"
else
  echo "pytorch: not measured ($PYTHON cannot import torch; set PYTHON to one that can)"
fi
