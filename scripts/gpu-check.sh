#!/usr/bin/env bash
# The GPU acceptance check, run ON the GPU machine from the repo root. That
# machine has no Rust toolchain and no internet: it runs what
# scripts/gpu-bundle.sh built elsewhere into gpu-bundle/ (or builds it with
# cargo when cargo exists). Steps:
#   1. library paths: libcuda from the driver; cuBLAS, NVRTC and NCCL from the
#      python site-packages `nvidia/*/lib` (PyTorch's wheels) and
#      /usr/local/cuda*/lib64 (DDPTRAIN_CUDA_LIBS=dir:dir goes first); CUDA headers for NVRTC (DDPTRAIN_CUDA_INCLUDE)
#   2. the GPU's name (nvidia-smi)
#   3. every kernels/*.cu compiles with NVRTC (kernels-compile-test)
#   4. the GPU unit tests: kernel parity vs the CPU twins (`tests_cuda`), the GPT against the CPU (`tests_gpt`),
#      cuBLAS, NCCL at world size 1, device selection. A test that prints
#      "skipped: no CUDA device" here is a FAILURE.
#   5. configs/mnist_o2.toml with run.device=cuda reaches its accuracy gate
#   6. two ranks sharing the GPU over the tcp backend reproduce one rank
#   7. scripts/bench.sh on the GPU: ddptrain O0/O2 vs PyTorch fp32/autocast,
#      the seed ConvNet and configs/gpt_sotu_gpu_o2.toml (text from data/sotu or
#      the bundle's part of it), and that GPT resumed after SIGTERM byte for byte
#   7c. ResNet-20 at batch 128 against PyTorch eager, autocast and autocast NHWC
#   8. the GPU integration tests (tests/gpu_trainer.rs, gpu_sync.rs,
#      ddp_cuda.rs), one row each, spawning the bundled ddptrain
#      (DDPTRAIN_BIN) and reading configs/ here (DDPTRAIN_REPO). Under CI=true
#      a missing GPU or NCCL fails them; NCCL runs that need a GPU per rank
#      skip on fewer GPUs and are counted in the row's figure.
#   9. the modeled step of three configs against ncu's kernel times here
#      (scripts/gpu_model/measured.py, the bundle's modeled/*.json)
# and prints a summary table. Exit 0 only when every check passed; a piece
# that cannot run is reported "not run (reason)" and fails the check.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

bundle=${DDPTRAIN_BUNDLE:-gpu-bundle}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
# GPU_CHECK_LOGS=dir keeps every step's full log there (the table shows tails).
keep_logs() {
    if [ -n "${GPU_CHECK_LOGS:-}" ]; then
        mkdir -p "$GPU_CHECK_LOGS" && cp "$work"/*.log "$GPU_CHECK_LOGS"/ 2>/dev/null
    fi
    rm -rf "$work"
}
trap keep_logs EXIT

rows=()
failed=0
# record CHECK RESULT FIGURE; RESULT is PASS, FAIL or "not run (...)".
record() {
    rows+=("$1"$'\t'"$2"$'\t'"$3")
    [ "$2" = PASS ] || failed=1
    printf '== %s: %s %s\n' "$1" "$2" "$3"
}

# --- 0. binaries ------------------------------------------------------------
if [ ! -x "$bundle/lib-tests" ] && command -v cargo >/dev/null; then
    echo "== no $bundle/ yet and cargo is here: building it (scripts/gpu-bundle.sh)"
    scripts/gpu-bundle.sh || echo "gpu-bundle.sh failed"
fi
have() { [ -x "$bundle/$1" ]; }
if have ddptrain && have lib-tests && have kernels-compile-test; then
    record "binaries" PASS "$(sed -n 's/^commit: //p' "$bundle/MANIFEST" 2>/dev/null | cut -c1-12)"
else
    record "binaries" FAIL "missing in $bundle/ (run scripts/gpu-bundle.sh on a machine with Rust)"
fi

# --- 1. library paths ---------------------------------------------------------
# Folders holding the nvidia-* wheels' libraries, for every python we can find.
wheel_dirs() {
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        "$py" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for root in roots:
    for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
        print(d)
EOF
    done
    # Interpreters we could not import from: the usual site-packages layouts.
    ls -d /usr/local/lib/python3*/{site,dist}-packages/nvidia/*/lib \
        /usr/lib/python3*/{site,dist}-packages/nvidia/*/lib \
        "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib \
        /opt/conda/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null
}
lib_dirs=()
add_dir() {
    local d
    for d in "$@"; do
        [ -d "$d" ] || continue
        case " ${lib_dirs[*]-} " in *" $d "*) ;; *) lib_dirs+=("$d") ;; esac
    done
}
# DDPTRAIN_CUDA_LIBS (colon-separated folders) first: an explicit choice wins.
IFS=: read -r -a extra <<<"${DDPTRAIN_CUDA_LIBS:-}"
add_dir "${extra[@]}"
# CUDA 13 wheels (nvidia/cu13/lib) next: ddptrain is built against CUDA 13.
mapfile -t wheel < <(wheel_dirs | sort -u)
for d in "${wheel[@]}"; do case "$d" in */cu13/lib) add_dir "$d" ;; esac; done
add_dir "${wheel[@]}"
add_dir /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib
# libcuda comes with the driver; containers often mount it outside the default path.
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
    [ -e "$d/libcuda.so.1" ] && add_dir "$d"
done

# find_lib NAME...: first file of these names in lib_dirs or the linker cache.
find_lib() {
    local d n
    for n in "$@"; do
        for d in "${lib_dirs[@]}"; do
            [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }
        done
        ldconfig -p 2>/dev/null | awk -v n="$n" '$1 == n { print $NF; exit }' | grep . && return 0
    done
    return 1
}
# cudarc opens libnccl.so (or .so.<CUDA major>), never libnccl.so.2 as shipped:
# give it an unversioned link in a folder of our own, first on the path.
links="$work/libs"
mkdir -p "$links"
if nccl=$(find_lib libnccl.so libnccl.so.2); then
    ln -sf "$nccl" "$links/libnccl.so"
fi
path=$links
for d in "${lib_dirs[@]}"; do path="$path:$d"; done
LD_LIBRARY_PATH="$path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

if [ -z "${DDPTRAIN_CUDA_INCLUDE:-}" ]; then
    for d in "${lib_dirs[@]}"; do
        for inc in "${d%/lib*}/include" "$d/../include"; do
            [ -f "$inc/cuda_fp16.h" ] && { DDPTRAIN_CUDA_INCLUDE=$(cd "$inc" && pwd); break 2; }
        done
    done
    for inc in /usr/local/cuda/include /usr/local/cuda-*/include /usr/local/cuda/targets/x86_64-linux/include; do
        [ -z "${DDPTRAIN_CUDA_INCLUDE:-}" ] && [ -f "$inc/cuda_fp16.h" ] && DDPTRAIN_CUDA_INCLUDE=$inc
    done
fi
export DDPTRAIN_CUDA_INCLUDE=${DDPTRAIN_CUDA_INCLUDE:-}

libs_found=() libs_missing=()
check_lib() { # label names...
    local label=$1 f
    shift
    if f=$(find_lib "$@"); then libs_found+=("$label=$f"); else libs_missing+=("$label"); fi
}
check_lib libcuda libcuda.so.1 libcuda.so
check_lib cublas libcublas.so.13 libcublas.so.12 libcublas.so
check_lib nvrtc libnvrtc.so.13 libnvrtc.so.12 libnvrtc.so
check_lib nccl libnccl.so libnccl.so.2
[ -n "$DDPTRAIN_CUDA_INCLUDE" ] || libs_missing+=("cuda_fp16.h")
printf '   %s\n' "${libs_found[@]}" "DDPTRAIN_CUDA_INCLUDE=$DDPTRAIN_CUDA_INCLUDE" "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [ ${#libs_missing[@]} -eq 0 ]; then
    record "CUDA libraries" PASS "libcuda cuBLAS NVRTC NCCL headers"
else
    record "CUDA libraries" FAIL "missing: ${libs_missing[*]}"
fi

# --- 2. the GPU -------------------------------------------------------------
gpu=""
if ! command -v nvidia-smi >/dev/null; then
    record "GPU" FAIL "no GPU: nvidia-smi not found"
elif ! gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n1) \
    || [ -z "$gpu" ] || grep -qi "fail\|error\|no devices" <<<"$gpu"; then
    record "GPU" FAIL "no GPU: nvidia-smi says: ${gpu:-nothing}"
    gpu=""
else
    record "GPU" PASS "$gpu"
fi

# --- 3. kernel compile test ---------------------------------------------------
# libtest summary "test result: ok. 1 passed; 0 failed; ..." -> "P F".
counts() { sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$1" | tail -n1; }
if have kernels-compile-test; then
    log="$work/compile.log"
    # CI=true: a missing NVRTC fails instead of skipping. Only this test: the
    # table test reads kernels/ through the build machine's absolute path.
    CI=true timeout 600 "$bundle/kernels-compile-test" every_kernel_compiles --test-threads=1 --show-output >"$log" 2>&1
    rc=$?
    read -r p f <<<"$(counts "$log")"
    grep -E "^NVRTC|panicked|error" "$log" | head -n 5 | sed 's/^/   /'
    if [ "$rc" -eq 0 ] && [ "${p:-0}" -ge 1 ]; then
        record "kernels compile (NVRTC)" PASS "$(grep -o '^NVRTC [0-9.]*' "$log" | head -n1), sm_80 + sm_90"
    else
        record "kernels compile (NVRTC)" FAIL "exit $rc, ${p:-0} passed, ${f:-?} failed (log above)"
        tail -n 30 "$log" | sed 's/^/   | /'
    fi
else
    record "kernels compile (NVRTC)" "not run (no kernels-compile-test binary)" ""
fi

# --- 4. GPU unit tests --------------------------------------------------------
if have lib-tests; then
    log="$work/unit.log"
    DDPTRAIN_REPO="$(pwd)" timeout 900 "$bundle/lib-tests" tests_cuda tests_gpt cuda::blas cuda::nccl cuda::select tests_race tests_snapshot tests_fault \
        --test-threads=1 --show-output >"$log" 2>&1
    rc=$?
    read -r p f <<<"$(counts "$log")"
    skipped=$(grep -c "skipped: no CUDA device" "$log")
    fig="${p:-0} passed, ${f:-?} failed, $skipped skipped (no CUDA device)"
    if [ "$rc" -eq 0 ] && [ "${p:-0}" -gt 0 ] && [ "$skipped" -eq 0 ]; then
        record "GPU unit tests" PASS "$fig"
    else
        record "GPU unit tests" FAIL "exit $rc: $fig"
        grep -E "^test .* FAILED|skipped: no CUDA device|panicked" "$log" | head -n 40 | sed 's/^/   | /'
    fi
else
    record "GPU unit tests" "not run (no lib-tests binary)" ""
fi

# --- 5. MNIST O2 on the GPU -----------------------------------------------------
data=""
for d in data/mnist "$bundle/data/mnist"; do
    [ -e "$d/t10k-labels-idx1-ubyte" ] || [ -e "$d/t10k-labels-idx1-ubyte.gz" ] && { data=$d; break; }
done
if ! have ddptrain; then
    record "MNIST O2 on GPU" "not run (no ddptrain binary)" ""
elif [ -z "$gpu" ]; then
    record "MNIST O2 on GPU" "not run (no GPU)" ""
elif [ -z "$data" ]; then
    record "MNIST O2 on GPU" "not run (no MNIST files in data/mnist or $bundle/data/mnist)" ""
else
    log="$work/train.log"
    "$bundle/ddptrain" --config configs/mnist_o2.toml --set run.device=cuda --set "data.path=$data" \
        --set "run.out_dir=$work/mnist_o2" >"$log" 2>&1 &
    pid=$!
    on_gpu=no
    # Seen as a compute process (not inside every container's PID namespace).
    while kill -0 "$pid" 2>/dev/null; do
        nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -qx "$pid" && on_gpu=yes
        sleep 2
    done
    wait "$pid"
    rc=$?
    tail -n 8 "$log" | sed 's/^/   | /'
    acc=$(grep -o 'test accuracy [0-9.]*' "$log" | tail -n1 | grep -o '[0-9.]*$')
    ips=$(grep -o '[0-9]* images/s' "$log" | tail -n1)
    name=${gpu%%,*}
    if grep -qi "cuda\|$name" "$log"; then on_gpu=yes; fi
    if [ "$rc" -ne 0 ] && grep -q "not yet supported" "$log"; then
        record "MNIST O2 on GPU" "not run (this ddptrain has no CUDA training: $(grep -m1 -o 'not yet supported.*' "$log"))" ""
    elif [ "$rc" -ne 0 ]; then
        record "MNIST O2 on GPU" FAIL "exit $rc, accuracy ${acc:-n/a} (gate 97%)"
    elif [ "$on_gpu" != yes ]; then
        record "MNIST O2 on GPU" FAIL "accuracy ${acc:-n/a} but no sign the run used the GPU"
    else
        record "MNIST O2 on GPU" PASS "test accuracy ${acc:-n/a} (gate 97%), ${ips:-n/a}"
    fi
fi

# --- 6. two ranks on one GPU (tcp) vs one rank ---------------------------------
# Max |w| difference of two safetensors files (f32 tensors), read by hand so
# that no python package beyond the standard library is needed.
max_diff() {
    python3 - "$1" "$2" <<'EOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        out[k] = struct.unpack(f"<{len(raw) // 4}f", raw)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
d = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
peak = max(abs(x) for k in a for x in a[k])
print(f"{d:.3e} {peak:.3e}")
EOF
}
if ! have ddptrain || [ -z "$gpu" ]; then
    record "2 ranks on 1 GPU (tcp)" "not run (no ddptrain binary or no GPU)" ""
else
    common=(--config configs/mnist_o0.toml --set run.device=cuda --set data.dataset=synthetic
        --set data.synthetic_train_size=2000 --set data.synthetic_test_size=200 --set train.max_steps=20
        --set parallel.backend=tcp --set parallel.sync_batchnorm=true --set logging.progress=never
        --set expect.min_test_accuracy=0.0)
    log="$work/w2.log"
    "$bundle/ddptrain" "${common[@]}" --set data.batch_size=100 --set "run.out_dir=$work/w1" >"$log" 2>&1
    rc1=$?
    "$bundle/ddptrain" launch --nproc-per-node 2 -- "${common[@]}" --set data.batch_size=50 \
        --set "run.out_dir=$work/w2" >>"$log" 2>&1
    rc2=$?
    if [ "$rc1" -ne 0 ] || [ "$rc2" -ne 0 ]; then
        record "2 ranks on 1 GPU (tcp)" FAIL "exit $rc1 (1 rank), $rc2 (2 ranks)"
        tail -n 20 "$log" | sed 's/^/   | /'
    else
        read -r d peak <<<"$(max_diff "$work/w1/model.safetensors" "$work/w2/model.safetensors")"
        if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 1e-3 * max(1.0, float(sys.argv[2])) else 1)" "$d" "$peak"; then
            record "2 ranks on 1 GPU (tcp)" PASS "max |w2 - w1| = $d after 20 O0 steps (SyncBN)"
        else
            record "2 ranks on 1 GPU (tcp)" FAIL "max |w2 - w1| = $d (largest weight $peak)"
        fi
    fi
fi

# --- 7. GPU benchmark ------------------------------------------------------------
# bench_row CHECK LOG [VAR=VALUE...]: scripts/bench.sh on the GPU with those
# variables, its table shown and its O2 / PyTorch autocast ratio recorded.
bench_row() {
    local check=$1 log=$2
    shift 2
    if env "$@" DEVICE=cuda BIN="$bundle/ddptrain" scripts/bench.sh >"$log" 2>&1; then
        sed 's/^/   | /' "$log"
        record "$check" PASS "$(grep -o 'O2/pytorch autocast+GradScaler: [0-9.]*x' "$log" || echo 'see the table above')"
    else
        record "$check" FAIL "scripts/bench.sh failed"
        tail -n 20 "$log" | sed 's/^/   | /'
    fi
}
if ! have ddptrain || [ -z "$gpu" ]; then
    record "GPU benchmark" "not run (no ddptrain binary or no GPU)" ""
else
    bench_row "GPU benchmark" "$work/bench.log" STEPS="${BENCH_STEPS:-300}"
fi

# --- 7b. the GPU GPT: against PyTorch, and resumed after SIGTERM ---------------
sotu=""
for d in data/sotu "$bundle/data/sotu"; do
    ls "$d"/*.txt >/dev/null 2>&1 && { sotu=$d; break; }
done
if ! have ddptrain || [ -z "$gpu" ] || [ -z "$sotu" ]; then
    record "GPT benchmark" "not run (no ddptrain binary, GPU or text in data/sotu or $bundle/data/sotu)" ""
    record "GPT resume after SIGTERM" "not run (no ddptrain binary, GPU or text)" ""
else
    bench_row "GPT benchmark" "$work/gpt_bench.log" MODEL=gpt BENCH_CONFIG=configs/gpt_sotu_gpu_o2.toml \
        BENCH_TEXT="$sotu" BATCH=64 STEPS="${GPT_BENCH_STEPS:-60}"
    # 300 steps straight, and the same run sent SIGTERM mid-way (it saves a
    # checkpoint and exits 143) and run again: the two must end byte for byte alike.
    log="$work/gpt_resume.log"
    g=(--config configs/gpt_sotu_gpu_o2.toml --set "data.path=$sotu" --set train.max_steps=300
        --set train.eval_every=100 --set train.eval_iters=5 --set checkpoint.every_steps=100
        --set logging.progress=never --set checkpoint.resume=never)
    "$bundle/ddptrain" "${g[@]}" --set "run.out_dir=$work/gpt_a" >"$log" 2>&1
    rc1=$?
    "$bundle/ddptrain" "${g[@]}" --set "run.out_dir=$work/gpt_b" >>"$log" 2>&1 &
    pid=$!
    sleep "${GPT_KILL_AFTER:-6}"
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc2=$?
    "$bundle/ddptrain" "${g[@]/checkpoint.resume=never/checkpoint.resume=auto}" --set "run.out_dir=$work/gpt_b" >>"$log" 2>&1
    rc3=$?
    from=$(grep -o 'resuming from [^ ]*' "$log" | tail -n1)
    if [ "$rc1" -ne 0 ] || [ "$rc3" -ne 0 ]; then
        record "GPT resume after SIGTERM" FAIL "exit $rc1 (straight), $rc2 (SIGTERM), $rc3 (resumed)"
        tail -n 20 "$log" | sed 's/^/   | /'
    elif [ -z "$from" ]; then
        record "GPT resume after SIGTERM" FAIL "the second run did not resume (exit $rc2 after SIGTERM; set GPT_KILL_AFTER)"
    elif cmp -s "$work/gpt_a/model.safetensors" "$work/gpt_b/model.safetensors"; then
        record "GPT resume after SIGTERM" PASS "resumed from ${from##*/}: model.safetensors byte-identical after 300 steps"
    else
        record "GPT resume after SIGTERM" FAIL "resumed from ${from##*/}: model.safetensors differs from the straight run's"
    fi
fi

# --- 7c. ResNet-20 at batch 128 against PyTorch (eager, autocast, NHWC too) ------
if ! have ddptrain || [ -z "$gpu" ]; then
    record "ResNet-20 benchmark" "not run (no ddptrain binary or no GPU)" ""
else
    bench_row "ResNet-20 benchmark" "$work/resnet_bench.log" MODEL=resnet20 BATCH=128 STEPS="${RESNET_BENCH_STEPS:-100}"
fi

# --- 8. GPU integration tests ----------------------------------------------------
# Their build paths (cargo's ddptrain, the checkout) do not exist here: point
# them at the bundle's binary and this checkout, and at the MNIST files step 5
# found (gpu_trainer's accuracy tests train on them).
# Absolute: the tests hand these paths to ranks that run in other folders.
test_env=(CI=true "DDPTRAIN_BIN=$(cd "$bundle" 2>/dev/null && pwd)/ddptrain" "DDPTRAIN_REPO=$(pwd)")
[ -n "$data" ] && test_env+=("DDPTRAIN_MNIST=$(cd "$data" && pwd)")
for d in data/catsdogs "$bundle/data/catsdogs"; do
    [ -e "$d/test_batch.bin" ] && { test_env+=("DDPTRAIN_CATSDOGS=$(cd "$d" && pwd)"); break; }
done
for t in gpu_trainer gpu_sync ddp_cuda; do
    exe="${t//_/-}-test"
    check="$t (integration)"
    if ! have "$exe"; then
        record "$check" "not run (no $exe binary in $bundle/)" ""
        continue
    fi
    if ! have ddptrain; then
        record "$check" "not run (no ddptrain binary)" ""
        continue
    fi
    log="$work/$t.log"
    # One test at a time: gpu_sync reads per-process counters, and the others
    # start ranks that share the GPU. On a GPU the accuracy runs that are
    # opt-in on the emulated device (ci_smoke, 5 epochs of mnist_o2 and of
    # the ResNet) take seconds: run them too.
    extra=()
    [ "$t" = gpu_trainer ] && extra=(--include-ignored)
    env "${test_env[@]}" timeout 900 "$bundle/$exe" --test-threads=1 --show-output "${extra[@]}" >"$log" 2>&1
    rc=$?
    read -r p f <<<"$(counts "$log")"
    # Parts a test skipped by itself (it still counts as passed): NCCL ranks
    # that need a GPU each, or no mpirun.
    skips=$(grep -cE ": skipped: |mpirun not found" "$log")
    fig="${p:-0} passed, ${f:-?} failed, $skips parts skipped"
    [ "$skips" -gt 0 ] && fig="$fig ($(grep -oE ": skipped: .*|mpirun not found" "$log" | sed 's/^: skipped: //' | sort | uniq -c \
        | awk '{ $1 = $1 "x"; print }' | paste -sd ';' - | sed 's/;/; /g'))"
    if [ "$rc" -eq 0 ] && [ "${p:-0}" -gt 0 ]; then
        record "$check" PASS "$fig"
    else
        record "$check" FAIL "exit $rc: $fig"
        grep -E "^test .* FAILED|panicked|skipped: " "$log" | head -n 40 | sed 's/^/   | /'
        tail -n 30 "$log" | sed 's/^/   | /'
    fi
done

# --- 9. the modeled step against this GPU, kernel by kernel (ncu) --------------
# scripts/gpu_model/measured.py: each config's step under Nsight Compute
# against the bundle's modeled/*.json (gpu-bundle.sh), so every lending
# recalibrates scripts/gpu_model/devices.toml. A table a config; the row
# records the kernels' measured and modeled sums.
ncu=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)}
for c in configs/mnist_o2.toml configs/resnet20_fashion_o2.toml configs/gpt_sotu_gpu_o2.toml; do
    stem=$(basename "$c" .toml)
    check="modeled vs ncu: $stem"
    modeled="$bundle/modeled/$stem.json"
    if ! have ddptrain || [ -z "$gpu" ]; then
        record "$check" "not run (no ddptrain binary or no GPU)" ""
    elif [ -z "$ncu" ]; then
        record "$check" "not run (no ncu: set NCU)" ""
    elif [ ! -f "$modeled" ]; then
        record "$check" "not run (no $modeled: gpu-bundle.sh writes it)" ""
    elif [ "$stem" = gpt_sotu_gpu_o2 ] && [ -z "$sotu" ]; then
        record "$check" "not run (no text in data/sotu or $bundle/data/sotu)" ""
    else
        log="$work/ncu_$stem.log"
        sets=()
        [ "$stem" = gpt_sotu_gpu_o2 ] && sets=(--set "data.path=$sotu")
        # measured.py reads the config's arguments from the modeled JSON;
        # the text's folder is this machine's.
        if timeout "${NCU_TIMEOUT:-300}" python3 scripts/gpu_model/measured.py --config "$c" --bin "$bundle/ddptrain" \
            --modeled "$modeled" --ncu "$ncu" --json "$work/ncu_$stem.json" "${sets[@]}" >"$log" 2>&1; then
            sed 's/^/   | /' "$log"
            record "$check" PASS "$(grep -o '^kernels: .*' "$log" | cut -c10-)"
        else
            tail -n 25 "$log" | sed 's/^/   | /'
            record "$check" FAIL "$(grep -m1 -oE 'ncu failed.*|launch counts differ.*|LibraryNotLoaded.*' "$log" || echo 'measured.py failed (log above)')"
        fi
    fi
done

# --- summary ------------------------------------------------------------------
echo
echo "gpu-check summary${gpu:+ on ${gpu%%,*}}"
w=6
for r in "${rows[@]}"; do
    IFS=$'\t' read -r _ res _ <<<"$r"
    [ ${#res} -gt $w ] && w=${#res}
done
line=$(printf '%*s' 26 '' | tr ' ' -)-+-$(printf '%*s' "$w" '' | tr ' ' -)-+-------
printf "%-26s | %-${w}s | %s\n" check result figure
echo "$line"
for r in "${rows[@]}"; do
    IFS=$'\t' read -r c res fig <<<"$r"
    printf "%-26s | %-${w}s | %s\n" "$c" "$res" "$fig"
done
if [ "$failed" -ne 0 ]; then
    echo "gpu-check: FAILED"
    exit 1
fi
echo "gpu-check: all checks passed"
