#!/usr/bin/env bash
# Builds, on a machine with a Rust toolchain (x86-64 Linux), what
# scripts/gpu-check.sh runs on a GPU machine that has none: the release
# `ddptrain` binary, the library's unit-test binary (the CUDA parity, cuBLAS
# and NCCL tests), the kernel compile test and the GPU integration tests
# (tests/gpu_trainer.rs, gpu_sync.rs, ddp_cuda.rs: gpu-check runs them with
# DDPTRAIN_BIN and DDPTRAIN_REPO, since their build paths do not exist there),
# copied into gpu-bundle/ (gitignored) with a MANIFEST, plus the MNIST and
# cats-and-dogs files and part of the SOTU corpus when data/ has them, and
# the modeled GPU step of three configs (modeled/*.json). Debug info and symbol tables are
# stripped so the bundle stays small enough to copy (limit: 60 MB).
#
#   scripts/gpu-bundle.sh            # then copy the repo with gpu-bundle/ to the GPU machine
#   scripts/gpu-check.sh             # there, from the repo root
set -euo pipefail
cd "$(dirname "$0")/.."

out=gpu-bundle
limit_mb=60
command -v cargo >/dev/null || { echo "gpu-bundle: cargo not found; this script builds, run it where Rust is installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "gpu-bundle: python3 not found (used to read cargo's JSON)" >&2; exit 1; }

echo "gpu-bundle: cargo build --release"
cargo build --release --bin ddptrain

echo "gpu-bundle: cargo test --release --no-run (lib unit tests, kernels_compile, gpu_trainer, gpu_sync, ddp_cuda)"
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test --release --no-run --lib --test kernels_compile --test gpu_trainer --test gpu_sync --test ddp_cuda \
    --message-format=json >"$json"

# The test executables, one a line in this order: the lib's unit tests, then
# the integration tests by name.
tests=(kernels_compile gpu_trainer gpu_sync ddp_cuda)
paths=$(python3 - "$json" "${tests[@]}" <<'EOF'
import json, sys
lib = None
found = {}
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    t = m["target"]
    if "lib" in t["kind"] or "rlib" in t["kind"]:
        lib = m["executable"]
    elif t["name"] in sys.argv[2:]:
        found[t["name"]] = m["executable"]
missing = ([] if lib else ["lib"]) + [n for n in sys.argv[2:] if n not in found]
if missing:
    sys.exit(f"gpu-bundle: test executables not found in cargo's output: {' '.join(missing)}")
print(lib)
for n in sys.argv[2:]:
    print(found[n])
EOF
)
mapfile -t exe <<<"$paths"
bin="${CARGO_TARGET_DIR:-target}/release/ddptrain"
[ -x "$bin" ] || { echo "gpu-bundle: $bin was not built" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
cp "$bin" "$out/ddptrain"
# Bundle names, in the order of exe: lib-tests, then <test>-test with dashes
# (kernels-compile-test, gpu-trainer-test, gpu-sync-test, ddp-cuda-test).
names=(lib-tests)
for t in "${tests[@]}"; do names+=("${t//_/-}-test"); done
for i in "${!names[@]}"; do cp "${exe[$i]}" "$out/${names[$i]}"; done
if command -v strip >/dev/null; then
    # The symbol tables too (8 MB): a panic still names its file and line,
    # only a backtrace's frames go unnamed.
    strip --strip-all "$out/ddptrain" "${names[@]/#/$out/}"
else
    echo "gpu-bundle: warning: strip not found; the bundle keeps its debug info"
fi

# The GPU machine cannot download MNIST: bring the digits along when we have them.
mnist=${MNIST_DIR:-data/mnist}
if [ -e "$mnist/t10k-labels-idx1-ubyte" ] || [ -e "$mnist/t10k-labels-idx1-ubyte.gz" ]; then
    mkdir -p "$out/data"
    cp -rL "$mnist" "$out/data/mnist"
else
    echo "gpu-bundle: warning: no MNIST in $mnist (scripts/fetch-mnist.sh, or set MNIST_DIR); gpu-check will not train"
fi
# The ResNet-20 cats-and-dogs tests (gpu_trainer's resume test) read these.
catsdogs=${CATSDOGS_DIR:-data/catsdogs}
if [ -e "$catsdogs/test_batch.bin" ]; then
    mkdir -p "$out/data"
    cp -rL "$catsdogs" "$out/data/catsdogs"
else
    echo "gpu-bundle: warning: no cats and dogs in $catsdogs (scripts/fetch-catsdogs.sh, or set CATSDOGS_DIR); gpu_trainer's ResNet-20 resume test will fail"
fi
# gpu-check's GPT rows train configs/gpt_sotu_gpu_o2.toml on text: the
# addresses from 2000 on (22 files, 0.8 MB) keep the bundle under its limit.
sotu=${SOTU_DIR:-data/sotu}
if ls "$sotu"/20*.txt >/dev/null 2>&1; then
    mkdir -p "$out/data/sotu"
    cp -L "$sotu"/20*.txt "$out/data/sotu/"
else
    echo "gpu-bundle: warning: no State of the Union addresses in $sotu (scripts/fetch-sotu.sh, or set SOTU_DIR); gpu-check will not train the GPT"
fi

# The modeled step of each gated config on the GPU lent here (an H200; set
# MODELED_DEVICE=h100 for another), which gpu-check.sh holds the measured
# kernels against (scripts/gpu_model/measured.py). MODELED=0 skips it (about
# 7 minutes on 2 cores).
if [ "${MODELED:-1}" != 0 ]; then
    mkdir -p "$out/modeled"
    for c in configs/mnist_o2.toml configs/resnet20_fashion_o2.toml configs/gpt_sotu_gpu_o2.toml; do
        stem=$(basename "$c" .toml)
        echo "gpu-bundle: modeled step of $c on ${MODELED_DEVICE:-h200}"
        DDPTRAIN_BIN="$bin" scripts/gpu-profile.sh --config "$c" --device "${MODELED_DEVICE:-h200}" --json \
            >"$out/modeled/$stem.json" \
            || { echo "gpu-bundle: warning: no modeled step of $c; gpu-check will not compare it"; rm -f "$out/modeled/$stem.json"; }
    done
fi
{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
    for f in ddptrain "${names[@]}"; do
        echo "$f: $(du -k "$out/$f" | cut -f1) KiB"
    done
} >"$out/MANIFEST"

total_kb=$(du -sk "$out" | cut -f1)
cat "$out/MANIFEST"
echo "gpu-bundle: $out/ is $((total_kb / 1024)) MB"
if [ "$total_kb" -gt $((limit_mb * 1024)) ]; then
    echo "gpu-bundle: $out/ is over ${limit_mb} MB" >&2
    exit 1
fi
