#!/usr/bin/env bash
# The main job: tune the digits MLP example, each trial in its own sandbox.
# Extra arguments go to `wtune run` (e.g. --num-samples 8 --output-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --release --locked -p wtune -- run target/wasm32-wasip2/release/digits_mlp.wasm \
    --config examples/digits-mlp/experiment.toml "$@"
