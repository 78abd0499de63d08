#!/usr/bin/env bash
# One-time, idempotent set-up for a fresh machine: the wasm target and the
# toolchain components wtune's build and checks use, then the guest
# components (the example, the hostile test guests, the replay guest and the
# compute-interface guest).
# These machines set RUSTUP_AUTO_INSTALL=0, so nothing is added implicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
rustup component add rustfmt clippy >/dev/null
cargo build --release --locked --target wasm32-wasip2 -p digits-mlp -p hostile -p stateful -p replay -p kernels
