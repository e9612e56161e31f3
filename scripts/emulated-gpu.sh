#!/usr/bin/env bash
# Runs any command on the emulated CUDA device (tests/cuda_emu): builds its
# four libraries (libcuda, libnvrtc, libcublas, libnccl, CPU implementations)
# when they are missing or stale, and puts them first on LD_LIBRARY_PATH, so
# the unmodified GPU path of ddptrain (and any cudarc program) runs on the CPU
# with the emulator's checks on.
#
#   scripts/emulated-gpu.sh cargo run --release -- --config configs/mnist_o2.toml --set run.device=cuda
#   scripts/emulated-gpu.sh cargo test --lib cuda
#
# With no command it only builds, and prints the library folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# OpenBLAS does the emulated cuBLAS's arithmetic.
if ! [ -e /usr/include/x86_64-linux-gnu/cblas.h ] && ! [ -e /usr/include/cblas.h ] \
    && ! [ -e /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ]; then
    if command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null; } \
            || { echo "emulated-gpu: could not install libopenblas-dev (the emulated cuBLAS needs it)" >&2; exit 1; }
    else
        echo "emulated-gpu: install OpenBLAS (libopenblas-dev) first" >&2
        exit 1
    fi
fi
make -s -C "$root/tests/cuda_emu" -j"$(nproc)" all >&2
lib="$root/target/cuda-emu/lib"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ $# -eq 0 ]; then
    echo "$lib"
    exit 0
fi
exec "$@"
