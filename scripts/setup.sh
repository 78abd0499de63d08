#!/usr/bin/env bash
# One-time, idempotent set-up for a fresh machine: the wasm target, software
# Vulkan and the toolchain components wtune's build and checks use, then the guest
# components (the examples, the hostile test guests, the replay guest and the
# compute-interface guest).
# These machines set RUSTUP_AUTO_INSTALL=0, so nothing is added implicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
# Software Vulkan (lavapipe), so the wgpu compute backend is tested on
# machines without a GPU. Only the loader and the Mesa drivers are needed.
if [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] && [ ! -e /usr/share/vulkan/icd.d/lvp_icd.aarch64.json ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 >/dev/null
fi
rustup component add rustfmt clippy >/dev/null
cargo build --release --locked --target wasm32-wasip2 -p digits-mlp -p hostile -p stateful -p replay -p kernels
# The burn guests (the CNN example, and the one that attacks the host's burn
# interface) are members of the burn workspace (see Cargo.toml's exclude).
cargo build --release --locked --target wasm32-wasip2 --manifest-path guest-sdk/burn-remote/Cargo.toml \
  -p digits-cnn -p burn-hostile --target-dir target
