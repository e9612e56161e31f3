# Shell helpers shared by scripts/bench.sh and scripts/bench_scaling.sh;
# sourced from the repository root, not run.
# shellcheck shell=bash

# Builds the release binary unless BIN is set, sets BIN, and makes $out a
# scratch directory removed on exit.
bench_setup() {
  if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    BIN="${CARGO_TARGET_DIR:-target}/release/ddptrain"
  fi
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
}

# json_field FILE KEY: the number KEY of a JSON object, rounded.
json_field() {
  python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))[sys.argv[2]]))" "$1" "$2"
}

# steady_rate DIR WARMUP WORLD FIELD: FIELD (images_per_s or tokens_per_s)
# of the run in DIR over its training steps after the first WARMUP, from
# the per-step lines of DIR/metrics.jsonl (each rank's rate over its own
# step, times WORLD), as PyTorch is timed after its warmup steps.
steady_rate() {
  python3 - "$@" <<'PY'
import json, sys
d, warmup, world, field = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rates = [r["images_per_s"] for r in map(json.loads, open(f"{d}/metrics.jsonl"))
         if r.get("kind") == "train" and r["step"] > warmup]
if not rates:
    sys.exit(f"steady_rate: {d} has no training step after the first {warmup}")
s = json.load(open(f"{d}/summary.json"))
per_image = s[field] / s["images_per_s"]  # 1, or the block size for tokens/s
print(round(world * len(rates) / sum(1 / r for r in rates) * per_image))
PY
}

# ddptrain_ips LEVEL WORLD THREADS BATCH STEPS DIR [ARG...]: one ddptrain run of
# configs/mnist_LEVEL.toml (or, when BENCH_CONFIG is set, of that config with
# amp.opt_level=LEVEL) on synthetic data: STEPS steps of global batch BATCH
# (BATCH/WORLD per rank; STEPS x BATCH training images, one test batch), rayon
# THREADS per rank (empty: launch's even split of the cores), run dir DIR, ARGs
# appended. Prints images/s from DIR/summary.json (training steps only, all
# ranks); with BENCH_TEXT set, a text config's tokens/s on the corpus there.
# With DDPTRAIN_WARMUP=W (default 0), over the steps after the first W
# instead (steady_rate), the whole run's rate left in DIR/summary.json. WORLD > 1 goes through `ddptrain launch --nproc-per-node WORLD` on
# MASTER_PORT (default 29517) with 16 KB / 64 KB buckets: the seed ConvNet's
# 116 KB of gradients fit in DDP's default 1 MB first bucket, whose all-reduce
# can only start when backward ends; small buckets let the fc and conv2 buckets
# go while the earlier layers' backward still runs.
ddptrain_ips() {
  local level=$1 world=$2 threads=$3 batch=$4 steps=$5 dir=$6
  shift 6
  local config=(--config "configs/mnist_$level.toml")
  if [ -n "${BENCH_CONFIG:-}" ]; then config=(--config "$BENCH_CONFIG" --set "amp.opt_level=${level^^}"); fi
  local data=(--set data.dataset=synthetic --set data.synthetic_train_size=$((steps * batch))
    --set data.synthetic_test_size="$batch" --set expect.min_test_accuracy=0.0) field=images_per_s
  # A language model reads its corpus (BENCH_TEXT) and scores one validation batch.
  if [ -n "${BENCH_TEXT:-}" ]; then
    data=(--set data.path="$BENCH_TEXT" --set train.eval_iters=1 --set expect.max_val_loss=100.0)
    field=tokens_per_s
  fi
  local env=() args=("${config[@]}" "${data[@]}"
    --set data.batch_size=$((batch / world)) --set train.max_steps="$steps" --set run.out_dir="$dir"
    --set logging.progress=never "$@")
  if [ -n "$threads" ]; then env=(RAYON_NUM_THREADS="$threads"); fi
  local warmup=${DDPTRAIN_WARMUP:-0}
  if [ "$warmup" -gt 0 ]; then args+=(--set logging.every_steps=1); fi
  # Each round trains afresh: a run into the last round's out_dir is refused,
  # and an older BASE_BIN does not know run.overwrite.
  rm -rf "$dir"
  if [ "$world" = 1 ]; then
    env "${env[@]}" "$BIN" "${args[@]}" >/dev/null
  else
    env "${env[@]}" "$BIN" launch --nproc-per-node "$world" --master-port "${MASTER_PORT:-29517}" -- \
      "${args[@]}" --set parallel.first_bucket_mb=0.015625 --set parallel.bucket_cap_mb=0.0625 >/dev/null
  fi
  if [ "$warmup" -gt 0 ]; then
    steady_rate "$dir" "$warmup" "$world" "$field"
  else
    json_field "$dir/summary.json" "$field"
  fi
}

# torch_why: empty when $PYTHON can import torch, else why not (one line).
torch_why() {
  local err
  if ! command -v "$PYTHON" >/dev/null; then echo "no such command"; return 0; fi
  if err=$("$PYTHON" -c "import torch" 2>&1); then return 0; fi
  echo "${err##*$'\n'}" | cut -c1-200
}

# torch_alloc: the environment (NAME=VALUE words) that gives PyTorch its
# fastest memory allocator, chosen by TORCH_ALLOC (default auto):
#   tcmalloc  LD_PRELOAD of libtcmalloc (Debian: libtcmalloc-minimal4), as
#             PyTorch's CPU performance guides advise;
#   jemalloc  LD_PRELOAD of libjemalloc (Debian: libjemalloc2);
#   tuned     glibc malloc that neither hands big blocks back to the kernel
#             nor serves them from fresh mmaps (MALLOC_MMAP_THRESHOLD_,
#             MALLOC_TRIM_THRESHOLD_), needing nothing installed;
#   glibc     glibc malloc as it comes;
#   auto      tcmalloc when installed, else tuned.
# With glibc as it comes, PyTorch's per-step activations come from fresh
# mmaps: on the seed ConvNet that measured 807,623 page faults in 300 steps
# against 125,877 with tcmalloc, and a second model in the same process ran
# 5-20% faster than the first (the allocator's state, not the warmup).
torch_alloc() {
  local mode=${TORCH_ALLOC:-auto} lib
  local tuned="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=68719476736"
  case $mode in
    glibc) echo ""; return 0 ;;
    tuned) echo "$tuned"; return 0 ;;
    auto | tcmalloc | jemalloc) ;;
    *) echo "torch_alloc: TORCH_ALLOC=$mode: use auto, tcmalloc, jemalloc, tuned or glibc" >&2; return 2 ;;
  esac
  local want=${mode/auto/tcmalloc}
  lib=$(ldconfig -p 2>/dev/null | awk -v w="lib$want" '$1 ~ "^" w && $1 !~ /_debug/ {print $NF; exit}')
  if [ -n "$lib" ]; then
    echo "LD_PRELOAD=$lib"
  elif [ "$mode" = auto ]; then
    echo "$tuned"
  else
    echo "torch_alloc: TORCH_ALLOC=$mode but no lib$want is installed (ldconfig -p)" >&2
    return 2
  fi
}

# torch_ips CFG THREADS BATCH STEPS [ARG...]: PyTorch's images/s on the CPU
# (scripts/bench_torch.py) in configuration CFG (nchw, channels_last or
# compile; eager is nchw by the name a language model's is known by), THREADS threads, batch BATCH, STEPS timed steps, ARGs appended,
# under torch_alloc's allocator; the model is the one $BIN describes for
# BENCH_CONFIG, else configs/mnist_o0.toml (scripts/torch_model.py), with
# Nesterov momentum when TORCH_NESTEROV=1 (as the ResNet configs train),
# TORCH_WARMUP untimed steps first when set (bench_torch.py's --warmup).
# A CFG of layouts with commas (channels_last,nchw) measures them one after
# the other in one process and prints a "LAYOUT images/s" line for each.
torch_ips() {
  local cfg=$1 threads=$2 batch=$3 steps=$4
  shift 4
  local extra=()
  case $cfg in
    nchw | eager) ;;
    channels_last) extra=(--layout channels_last) ;;
    compile) extra=(--compile) ;;
    *,*) extra=(--layouts "$cfg") ;;
    *) echo "torch_ips: unknown configuration $cfg" >&2; return 2 ;;
  esac
  if [ -n "${BENCH_CONFIG:-}" ]; then extra+=(--config "$BENCH_CONFIG"); fi
  if [ "${TORCH_NESTEROV:-0}" = 1 ]; then extra+=(--nesterov); fi
  if [ -n "${TORCH_WARMUP:-}" ]; then extra+=(--warmup "$TORCH_WARMUP"); fi
  local alloc
  alloc=$(torch_alloc) || return 2
  # shellcheck disable=SC2086 # alloc is NAME=VALUE words
  env $alloc "$PYTHON" scripts/bench_torch.py --bin "$BIN" --steps "$steps" --threads "$threads" --batch "$batch" \
    "${extra[@]}" "$@"
}

# cpu_model: the CPU's model name.
cpu_model() { lscpu | sed -n 's/^Model name: *//p'; }

# loadavg: the 1, 5 and 15 minute load averages.
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
