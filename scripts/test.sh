#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: fetches the MNIST digits the
# end-to-end tests train on (idempotent), installs the Python `tensorboard`
# package (from PyPI, into a cached .venv/) that reads back our event files,
# then the Rust tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-mnist.sh
if ! .venv/bin/python -c "import tensorboard" 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check tensorboard
fi
# tests/tensorboard_events.rs reads the events with this interpreter.
export DDPTRAIN_TB_PYTHON="$PWD/.venv/bin/python"
cargo test --all-targets "$@"
