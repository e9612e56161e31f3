#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: fetches the MNIST digits the
# end-to-end tests train on (idempotent), installs the Python `tensorboard`
# package that reads back our event files and the NVRTC + CUDA-header wheels
# that compile the kernels (from PyPI, into a cached .venv/), then the Rust tests,
# the GPU ones on the emulated CUDA device (scripts/emulated-gpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-mnist.sh
if ! .venv/bin/python -c "import tensorboard" 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check tensorboard
fi
# NVRTC and the CUDA headers from PyPI, so tests/kernels_compile.rs compiles
# every kernels/*.cu on a machine without a GPU (about 60 MB, cached in .venv/).
if ! ls .venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 >/dev/null 2>&1; then
    .venv/bin/pip install --quiet --disable-pip-version-check \
        'nvidia-cuda-nvrtc==13.5.37' 'nvidia-cuda-runtime==13.5.37'
fi
CUDA_WHEEL_LIB=$(ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cu13/lib | head -n1)
export LD_LIBRARY_PATH="$CUDA_WHEEL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# tests/tensorboard_events.rs reads the events with this interpreter.
export DDPTRAIN_TB_PYTHON="$PWD/.venv/bin/python"
# Open MPI for the mpirun launch test (tests/dist_processes.rs); a no-op once installed.
if ! command -v mpirun >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin >/dev/null; } \
        || echo "warning: could not install openmpi-bin; the mpirun test will be skipped"
fi
# The kernel compile test against the real NVRTC from the wheels (sm_80, sm_90).
cargo test --test kernels_compile "$@"
# The emulated CUDA device (tests/cuda_emu): its own tests, then every test of
# the project with the emulator first on LD_LIBRARY_PATH, so the GPU tests run
# on it (under CI=true a GPU test that finds no device fails instead of skipping).
scripts/emulated-gpu.sh make -s -C tests/cuda_emu check
scripts/emulated-gpu.sh cargo test --all-targets "$@"
