#!/usr/bin/env bash
# The whole test suite: unit tests, the end-to-end and hostile-guest suites
# (which run the guest components built by setup.sh), the dashboard's
# browser test, and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# TensorBoard and MLflow, whose own reader and servers check what wtune writes there.
bash scripts/python-env.sh
# The dashboard test drives headless Chromium through chromedriver.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver fonts-liberation >/dev/null
fi
# The workspace of everything built with burn, first: its tests build
# wtune-burn-worker, which wtune's own tests start. It holds the burn client
# that sends a guest's tensor operations to the host (what burn computes
# through it, in process and in a confined worker, agrees), the worker that
# checks and runs them (hostile frames), and the burn CNN example (its model
# and reset(), natively).
cargo test --release --locked --workspace --manifest-path guest-sdk/burn-remote/Cargo.toml --target-dir target
cargo test --release --locked --workspace
# The Python package, built and installed into the test venv as the README's
# `pip install ./python` does (maturin from the venv, cargo's target dir
# shared), then its suite: the sandbox from Python and Ray Tune on a real
# multi-node cluster.
PATH="$PWD/target/python-env/bin:$PATH" target/python-env/bin/pip install -q \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
target/python-env/bin/python -m pytest -q -p no:cacheprovider python/tests
