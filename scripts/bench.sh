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
#   TORCH_ALLOC=glibc scripts/bench.sh   # PyTorch on glibc malloc as it comes
#   DEVICE=cuda BIN=gpu-bundle/ddptrain scripts/bench.sh   # on a GPU machine (gpu-check.sh runs this)
#   MODEL=resnet20 THREADS=2 scripts/bench.sh   # ResNet-20 (configs/resnet20_fashion_o2.toml)
#   MODEL=gpt THREADS=2 scripts/bench.sh        # the baby GPT (configs/gpt_sotu_o2.toml), tokens/s
#   MODEL=gpt DEVICE=cuda BENCH_CONFIG=configs/gpt_sotu_gpu_o2.toml BATCH=64 scripts/bench.sh   # another config of the model
#   BASE_BIN=/path/to/old/ddptrain scripts/bench.sh   # an older build too, in the same rounds
#   DDPTRAIN_WARMUP=3 TORCH_WARMUP=3 MODEL=resnet20 scripts/bench.sh   # both timed after 3 untimed steps
# MODEL=resnet20 measures the ResNet-20 config instead of the seed ConvNet:
# ddptrain at O0 and O2 (amp.opt_level set on the one config), PyTorch with
# Nesterov momentum as the config trains, batch 128 and 30 steps by default
# (a step is ~50x the seed's), no world-2 run. MODEL=gpt measures the baby
# GPT's training tokens/s on the SOTU corpus (BENCH_TEXT, default data/sotu)
# at O0 and O2, batch 12 and 100 steps by default, against PyTorch's nanoGPT
# (eager and torch.compile) with AdamW on random windows of the same shape.
# PyTorch runs under its fastest allocator (torch_alloc in bench_common.sh:
# tcmalloc when installed, else glibc malloc tuned by its environment).
# On the GPU: ddptrain O0 and O2 against PyTorch eager fp32 and PyTorch
# autocast(float16) + GradScaler, same model, batch and data on the device.
# scripts/bench_scaling.sh measures how the cost grows with the batch, the
# threads and the world size (helpers shared in scripts/bench_common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-seed}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cpu}
REPS=${REPS:-5}
case $MODEL in
  seed) STEPS=${STEPS:-300} BATCH=${BATCH:-100} levels=(o0 o1 o2) title="seed ConvNet" ;;
  resnet20)
    STEPS=${STEPS:-30} BATCH=${BATCH:-128} levels=(o0 o2) title="ResNet-20"
    export BENCH_CONFIG=${BENCH_CONFIG:-configs/resnet20_fashion_o2.toml} TORCH_NESTEROV=1
    # PyTorch's fastest allocator here is glibc malloc as it comes: the tuned
    # glibc settings ran eager NCHW at 65 images/s against 609 untuned (2
    # threads, 2026-11-25). torch.compile needs filelock and networkx
    # importable (PYTHONPATH).
    export TORCH_ALLOC=${TORCH_ALLOC:-glibc}
    ;;
  gpt)
    STEPS=${STEPS:-100} BATCH=${BATCH:-12} levels=(o0 o2) title="baby GPT"
    export BENCH_CONFIG=${BENCH_CONFIG:-configs/gpt_sotu_o2.toml} BENCH_TEXT=${BENCH_TEXT:-data/sotu}
    export TORCH_ALLOC=${TORCH_ALLOC:-glibc}
    ;;
  *) echo "bench.sh: MODEL=$MODEL: use seed, resnet20 or gpt" >&2; exit 2 ;;
esac

# shellcheck source=scripts/bench_common.sh
. scripts/bench_common.sh
bench_setup

# images/s of the model at one opt level (same model, data, batch and threads).
run_level() { ddptrain_ips "$1" 1 "$THREADS" "$BATCH" "$STEPS" "$out/$1" --set run.device="$DEVICE"; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$1" "$2"; }

if [ "$DEVICE" = cuda ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
  ours=$(run_level o0)
  ours_o2=$(run_level o2)
  echo "$title, batch $BATCH, $STEPS steps, on ${gpu:-an unnamed GPU}"
  printf '%-28s %12s\n' "trainer" "$([ "$MODEL" = gpt ] && echo tokens/s || echo images/s)"
  printf '%-28s %12s\n' "ddptrain O0" "$ours" "ddptrain O2" "$ours_o2"
  if "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    targs=(--bin "$BIN" --steps "$STEPS" --batch "$BATCH" --device cuda)
    if [ -n "${BENCH_CONFIG:-}" ]; then targs+=(--config "$BENCH_CONFIG" --nesterov); fi
    fp32=$("$PYTHON" scripts/bench_torch.py "${targs[@]}")
    amp=$("$PYTHON" scripts/bench_torch.py "${targs[@]}" --amp)
    printf '%-28s %12s\n' "pytorch fp32" "$fp32" "pytorch autocast+GradScaler" "$amp"
    if [ -z "${BENCH_TEXT:-}" ]; then
      # NHWC, where cuDNN's tensor-core convolutions run without transposes.
      amp_cl=$("$PYTHON" scripts/bench_torch.py "${targs[@]}" --amp --layout channels_last)
      printf '%-28s %12s\n' "pytorch autocast NHWC" "$amp_cl"
    fi
    echo "ratio ddptrain O0/pytorch fp32: $(ratio "$ours" "$fp32")"
    echo "ratio ddptrain O2/pytorch autocast+GradScaler: $(ratio "$ours_o2" "$amp")"
    if [ -n "${amp_cl:-}" ]; then echo "ratio ddptrain O2/pytorch autocast NHWC: $(ratio "$ours_o2" "$amp_cl")"; fi
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
if [ -z "$(torch_why)" ]; then have_torch=1; fi
torch_cfgs=("nchw" "channels_last" "compile")
if [ "$MODEL" = gpt ]; then torch_cfgs=("eager" "compile"); fi
torch_run() { torch_ips "$1" "$THREADS" "$BATCH" "$STEPS"; }
rows="$out/rows.txt"
: >"$rows"
# With DDPTRAIN_WARMUP=W, ddptrain's rate is taken after its first W steps,
# as PyTorch's after TORCH_WARMUP (ddptrain's first step is 1.7x a later
# one: the page faults of every activation's first touch); the same runs'
# rates from step 1 are kept as the *_from_step1 rows.
from_step1() {
  local field=images_per_s
  if [ -n "${BENCH_TEXT:-}" ]; then field=tokens_per_s; fi
  if [ "${DDPTRAIN_WARMUP:-0}" -gt 0 ]; then echo "$1 ${2}_from_step1 $(json_field "$3/summary.json" $field)" >>"$rows"; fi
}
for r in $(seq "$REPS"); do
  for l in "${levels[@]}"; do
    echo "$r ddptrain_$l $(run_level "$l")" >>"$rows"
    from_step1 "$r" "ddptrain_$l" "$out/$l"
  done
  if [ -n "${BASE_BIN:-}" ]; then
    for l in "${levels[@]}"; do
      echo "$r base_$l $(BIN=$BASE_BIN run_level "$l")" >>"$rows"
      from_step1 "$r" "base_$l" "$out/$l"
    done
  fi
  if [ "$have_torch" = 1 ]; then
    for c in "${torch_cfgs[@]}"; do echo "$r pytorch_$c $(torch_run "$c" 2>/dev/null | tail -n1)" >>"$rows"; done
  fi
done

# World 2 on the same cores: two ranks of batch BATCH/2 (the same global batch),
# each with half the cores (launch's split), over the TCP transport on loopback,
# with 16 KB / 64 KB buckets (see ddptrain_ips in scripts/bench_common.sh).
if [ "$MODEL" = seed ]; then
  ours_w2=$(ddptrain_ips o0 2 "" "$BATCH" "$STEPS" "$out/w2")
  hidden_w2=$(python3 -c "import json,sys; print(round(100 * json.load(open(sys.argv[1]))['allreduce_hidden_fraction']))" "$out/w2/summary.json")
fi

echo "$title, batch $BATCH, $THREADS threads, $STEPS steps, $REPS rounds, $(nproc) cores: $(cpu_model)"
echo "FMA peak (examples/fma_peak.rs): $peak_line"
if [ "$have_torch" = 1 ]; then echo "PyTorch's allocator (TORCH_ALLOC=${TORCH_ALLOC:-auto}): $(torch_alloc || true)"; fi
python3 - "$rows" "$peak" "$BATCH" "$MODEL" <<'PY'
import collections, statistics, sys
rows, peak, batch, model = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
unit = "tokens/s" if model == "gpt" else "images/s"
runs = collections.defaultdict(dict)  # trainer -> round -> images/s
for line in open(rows):
    r, name, v = (line.split() + [""])[:3]
    if v:
        runs[name][int(r)] = float(v)
med = {k: statistics.median(v.values()) for k, v in runs.items()}
print(f"{'trainer':<24} {'median ' + unit:>15}   per round")
for k, v in runs.items():
    print(f"{k:<24} {med[k]:>15.0f}   {' '.join(f'{x:.0f}' for x in v.values())}")

def ratio(a, b):
    """Median over rounds of a/b, with the per-round ratios."""
    rs = [runs[a][r] / runs[b][r] for r in runs[a] if r in runs[b]]
    return statistics.median(rs), rs

for lvl in ("o1", "o2"):
    if f"ddptrain_{lvl}" not in runs:
        continue
    m, rs = ratio(f"ddptrain_{lvl}", "ddptrain_o0")
    print(f"ddptrain {lvl.upper()}/O0: {m:.2f}x (median of {len(rs)} rounds)")
torch = [k for k in med if k.startswith("pytorch_")]
if torch:
    fast = max(torch, key=med.get)
    print(f"fastest PyTorch configuration: {fast} ({med[fast]:.0f} {unit})")
    names = ("ddptrain_o0", "ddptrain_o2", "base_o0", "base_o2")
    for name in [n + s for n in names for s in ("", "_from_step1")]:
        if name in runs:
            m, rs = ratio(name, fast)
            print(f"{name} / {fast}: {m:.2f}x median of {len(rs)} interleaved pairs "
                  f"({' '.join(f'{x:.2f}' for x in rs)})")
else:
    print("pytorch: not measured (set PYTHON to a python that can import torch)")
for lvl in ("o0", "o1", "o2"):
    if f"base_{lvl}" in runs:
        m, rs = ratio(f"ddptrain_{lvl}", f"base_{lvl}")
        print(f"ddptrain {lvl.upper()} / BASE_BIN {lvl.upper()}: {m:.2f}x (median of {len(rs)} rounds)")
if model == "gpt":
    # nanoGPT's estimate_mfu: 6 FLOP per parameter per token (the
    # position table left out) plus attention's 12 x layers x width x block.
    layers, width, block, vocab = 4, 128, 64, 98
    params = layers * 12 * width * width + vocab * width
    flop = 6 * params + 12 * layers * width * block
    share = med["ddptrain_o0"] * flop / (peak * 1e9)
    print(f"ddptrain O0: {flop / 1e6:.2f} MFLOP/token x {med['ddptrain_o0']:.0f} tokens/s = "
          f"{share * 100:.1f}% of the FMA peak")
    sys.exit(0)
if model == "resnet20":
    # FLOP per training image of ResNet-20 on 1x28x28 as direct convolution:
    # (in, out, kernel, output side, count) of its convs; weight gradients
    # cost a forward again, input gradients too except conv1's.
    convs = [(1, 16, 3, 28, 1), (16, 16, 3, 28, 6), (16, 32, 3, 14, 1), (32, 32, 3, 14, 5),
             (16, 32, 1, 14, 1), (32, 64, 3, 7, 1), (64, 64, 3, 7, 5), (32, 64, 1, 7, 1)]
    fwd = [2 * c * o * k * k * s * s * n for c, o, k, s, n in convs]
    flop = 3 * sum(fwd) - fwd[0] + 3 * 2 * 64 * 10
    share = med["ddptrain_o0"] * flop / (peak * 1e9)
    print(f"ddptrain O0: {flop / 1e6:.1f} MFLOP/image as direct convolution x "
          f"{med['ddptrain_o0']:.0f} images/s = {share * 100:.0f}% of the FMA peak")
    sys.exit(0)
# FLOP per training image of the seed ConvNet: forward of conv1 (1->16, 5x5,
# 28x28), conv2 (16->32, 5x5, 14x14) and fc (1568->10); every weight
# gradient costs a forward's FLOP again, and input gradients are taken for
# conv2 and fc only (conv1's input needs none).
conv1, conv2, fc = 2 * 28 * 28 * 16 * 25, 2 * 14 * 14 * 32 * 16 * 25, 2 * 1568 * 10
flop = 2 * (conv1 + conv2 + fc) + conv2 + fc
# conv2's three passes run as Winograd F(4x4, 5x5): 64 products per 4x4
# output tile (16 tiles cover 14x14) and channel pair instead of 400.
wino = 2 * (conv1 + fc) + fc + 3 * 2 * 64 * 16 * 32 * 16
share = med["ddptrain_o0"] * flop / (peak * 1e9)
done = med["ddptrain_o0"] * wino / (peak * 1e9)
print(f"ddptrain O0: {flop / 1e6:.1f} MFLOP/image as direct convolution x {med['ddptrain_o0']:.0f} images/s = "
      f"{share * 100:.0f}% of the FMA peak; the {wino / 1e6:.1f} MFLOP of products it runs "
      f"(Winograd conv2, transforms not counted) = {done * 100:.0f}%")
PY
if [ "$MODEL" = seed ]; then printf '%-24s %15s   (2 ranks x batch %d, 16/64 KB buckets: %d%% of all-reduce time hidden behind backward)\n' "ddptrain O0 world 2" "$ours_w2" $((BATCH / 2)) "$hidden_w2"; fi
echo "load average: $(loadavg)"
