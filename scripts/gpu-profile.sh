#!/usr/bin/env bash
# A training step of a config, profiled on the emulated device and timed on a
# modeled GPU (scripts/gpu_profile.py says how), on a machine without a GPU:
#
#   scripts/gpu-profile.sh --config configs/gpt_sotu_gpu_o2.toml
#   scripts/gpu-profile.sh --config configs/resnet20_fashion_o2.toml --batch 128 --device h200 --json
#   scripts/gpu-profile.sh --config configs/mnist_o2.toml --verify 8
#
# Builds the emulated device when stale (unless CUEMU_LIB_DIR names a build
# of it), and ddptrain (release) when DDPTRAIN_BIN names none. Needs the NVRTC wheel scripts/test.sh installs in
# .venv (the real compiler's register counts give each kernel's occupancy).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${CUEMU_LIB_DIR:-$("$root/scripts/emulated-gpu.sh")}
if [ -z "${DDPTRAIN_BIN:-}" ]; then
    (cd "$root" && cargo build --release --quiet)
    export DDPTRAIN_BIN="$root/target/release/ddptrain"
fi
exec python3 "$root/scripts/gpu_profile.py" --emu-lib "$lib" "$@"
