#!/usr/bin/env bash
# The MPI backend against tcp on this machine, 2 ranks: all-reduce time and
# throughput for gradient-sized f32 buffers (`dist-selftest --bench-iters`:
# the median of ITERS all-reduces) and training images/s of the seed ConvNet
# (O0, synthetic data, global batch 100, STEPS steps), REPS rounds with the
# four measurements interleaved in each; prints every round and the medians.
# BIN must be built with the feature: cargo build --release --features mpi.
# MPIRUN_ARGS goes to mpirun, e.g. "--mca btl tcp,self" to make Open MPI use
# loopback TCP between the ranks as tcp does, not shared memory.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release/ddptrain}
REPS=${REPS:-5}
ITERS=${ITERS:-50}
STEPS=${STEPS:-60}
# The seed ConvNet's gradients (29,034 f32), ResNet-20's (272,474), 10 MB.
SIZES=${SIZES:-29034,272474,2621440}
# shellcheck disable=SC2206 # MPIRUN_ARGS is split into words on purpose
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2 -x RAYON_NUM_THREADS=1 ${MPIRUN_ARGS:-})
export CUDA_VISIBLE_DEVICES= RAYON_NUM_THREADS=1
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
TRAIN=(--config configs/mnist_o0.toml --set data.dataset=synthetic --set data.synthetic_train_size=12000
    --set data.synthetic_test_size=100 --set data.batch_size=50 --set "train.max_steps=$STEPS"
    --set logging.progress=never --set logging.tensorboard=false --set expect.min_test_accuracy=0.0)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# $0 REPS=$REPS ITERS=$ITERS STEPS=$STEPS SIZES=$SIZES MPIRUN_ARGS=${MPIRUN_ARGS:-}; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
for r in $(seq "$REPS"); do
    port=$((29600 + r))
    mpi=$("${MPIRUN[@]}" "$BIN" dist-selftest --backend mpi --bench-iters "$ITERS" --bench-numel "$SIZES" 2>/dev/null | grep '^bench')
    tcp=$("$BIN" launch --nproc-per-node 2 --master-port "$port" -- dist-selftest \
        --bench-iters "$ITERS" --bench-numel "$SIZES" 2>/dev/null | grep 'bench' | sed 's/^\[rank 0\] //')
    mpi_img=$("${MPIRUN[@]}" "$BIN" "${TRAIN[@]}" --set parallel.backend=mpi --set "run.out_dir=$out/mpi$r" 2>/dev/null |
        awk '/^done:/ && !seen++' | grep -o '[0-9]* images/s' | cut -d' ' -f1)
    tcp_img=$("$BIN" launch --nproc-per-node 2 --master-port "$((port + 50))" -- "${TRAIN[@]}" \
        --set "run.out_dir=$out/tcp$r" 2>/dev/null | grep 'rank 0\] done:' | grep -o '[0-9]* images/s' | cut -d' ' -f1)
    echo "round $r: train images/s mpi $mpi_img tcp $tcp_img"
    while read -r line; do echo "round $r mpi: $line"; rows+=("mpi $line"); done <<<"$mpi"
    while read -r line; do echo "round $r tcp: $line"; rows+=("tcp $line"); done <<<"$tcp"
    rows+=("mpi train $mpi_img" "tcp train $tcp_img")
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${rows[@]}" | python3 -c '
import re, statistics, sys
ms, img = {}, {}
for l in sys.stdin:
    m = re.match(r"(\w+) bench all_reduce (\d+) x f32: (\d+) bytes, median ([\d.]+) ms", l)
    if m:
        ms.setdefault((int(m[2]), int(m[3])), {}).setdefault(m[1], []).append(float(m[4]))
    m = re.match(r"(\w+) train (\d+)", l)
    if m:
        img.setdefault(m[1], []).append(int(m[2]))
print("| buffer | MPI ms | tcp ms | MPI MB/s | tcp MB/s |")
print("|---|---|---|---|---|")
for (n, b), v in sorted(ms.items()):
    a, t = statistics.median(v["mpi"]), statistics.median(v["tcp"])
    print(f"| {n:,} f32 ({b / 1e6:.2f} MB) | {a:.3f} | {t:.3f} | {b / a / 1e3:.0f} | {b / t / 1e3:.0f} |")
mi, ti = statistics.median(img["mpi"]), statistics.median(img["tcp"])
print(f"| training, 2 ranks x 50, images/s | {mi:.0f} | {ti:.0f} | | |")
'
