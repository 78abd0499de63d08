#!/usr/bin/env bash
# The whole test suite: unit tests, the end-to-end and hostile-guest suites
# (which run the guest components built by setup.sh), and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --release --locked --workspace
