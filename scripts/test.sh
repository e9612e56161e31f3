#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: fetches the MNIST digits the
# end-to-end tests train on (idempotent), then the Rust tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-mnist.sh
cargo test --all-targets "$@"
