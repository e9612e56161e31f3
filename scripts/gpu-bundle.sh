#!/usr/bin/env bash
# Builds, on a machine with a Rust toolchain (x86-64 Linux), what
# scripts/gpu-check.sh runs on a GPU machine that has none: the release
# `ddptrain` binary, the library's unit-test binary (the CUDA parity, cuBLAS
# and NCCL tests) and the kernel compile test, copied into gpu-bundle/
# (gitignored) with a MANIFEST, plus the MNIST files when data/mnist has them. Debug info is stripped so the bundle stays
# small enough to copy (limit: 60 MB).
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

echo "gpu-bundle: cargo test --release --no-run (lib unit tests, kernels_compile)"
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cargo test --release --no-run --lib --test kernels_compile --message-format=json >"$json"

# The test executables, by kind: the lib's unit tests and the kernels_compile test.
paths=$(python3 - "$json" <<'EOF'
import json, sys
lib = compile_test = None
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
    elif t["name"] == "kernels_compile":
        compile_test = m["executable"]
if not lib or not compile_test:
    sys.exit(f"gpu-bundle: test executables not found in cargo's output (lib={lib}, kernels_compile={compile_test})")
print(lib)
print(compile_test)
EOF
)
lib_tests=$(sed -n 1p <<<"$paths")
compile_test=$(sed -n 2p <<<"$paths")
bin="${CARGO_TARGET_DIR:-target}/release/ddptrain"
[ -x "$bin" ] || { echo "gpu-bundle: $bin was not built" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
cp "$bin" "$out/ddptrain"
cp "$lib_tests" "$out/lib-tests"
cp "$compile_test" "$out/kernels-compile-test"
if command -v strip >/dev/null; then
    strip --strip-debug "$out/ddptrain" "$out/lib-tests" "$out/kernels-compile-test"
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

{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
    for f in ddptrain lib-tests kernels-compile-test; do
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
