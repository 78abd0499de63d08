#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for SECONDS each (default 600), one
# after another, each as one libFuzzer job. Inputs start from the committed
# seeds (fuzz/seeds/<target>); what the fuzzer finds goes to the local,
# uncommitted corpus (fuzz/corpus/<target>), crashes to fuzz/artifacts/ and
# each run's log to fuzz/logs/<target>.log. Needs a nightly toolchain;
# installs cargo-fuzz if it is missing. The first build compiles wasmtime and
# wgpu with sanitizer instrumentation: expect a quarter of an hour.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     e.g. scripts/fuzz.sh 60 snapshot
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(config snapshot state guest_values resume)
fi

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo +nightly install cargo-fuzz --locked
fi

cd fuzz
mkdir -p logs
status=0
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s"
  cargo +nightly fuzz build "$target"
  # -jobs=1: one worker process, whose output libFuzzer writes to fuzz-0.log.
  if cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -jobs=1 -print_final_stats=1 \
    >/dev/null; then
    result=clean
  else
    result="FAILED (see fuzz/logs/$target.log and fuzz/artifacts/$target/)"
    status=1
  fi
  mv fuzz-0.log "logs/$target.log"
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "logs/$target.log" || true
  echo "== $target: $result"
done
exit "$status"
