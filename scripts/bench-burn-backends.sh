#!/usr/bin/env bash
# digits-cnn's epoch (train + validation) on each place burn can run: native
# burn (no sandbox, examples/native_step), native with wtune's burn executor
# in the same process (`native_step ... worker`: the checks without the
# sandbox), in the guest (backend = "wasm") and on the host's burn worker
# (backend = "host"). Same config for all (BENCHMARKS.md, 2026-11-26 18:50:
# lr 0.004, hidden 64, dropout 0.1, batch 64, seed 0), 5 epochs per run,
# ROUNDS runs of each interleaved, for each of CHANNELS (default "4 8 32");
# prints the median epoch of each run, and fuel per epoch. GUEST names
# another build of the guest to time.
#
# Needs `bash scripts/setup.sh` and the burn workspace's tests built
# (`cargo test --release --workspace --manifest-path
# guest-sdk/burn-remote/Cargo.toml --target-dir target --no-run`), which
# build native_step and the worker.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
wtune=$root/target/release/wtune
guest=${GUEST:-$root/target/wasm32-wasip2/release/digits_cnn.wasm}
native=$root/target/release/examples/native_step
rounds=${ROUNDS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
  for channels in ${CHANNELS:-4 8 32}; do
    for place in flex worker; do
      epoch=$("$native" "$channels" 5 "$place" | grep '^epoch' |
        sed -E 's/.*train ([0-9.]+)s \+ eval ([0-9.]+)s.*/\1 \2/' |
        awk '{print $1 + $2}' | sort -n | sed -n 3p)
      echo "round $round channels $channels native-$place $epoch -"
    done
    for backend in wasm host; do
      cat > "$work/e.toml" <<TOML
name = "bench"
metric = "val_accuracy"
mode = "max"
[stop]
training_iteration = 5
[data]
digits = "$root/examples/digits-mlp/data"
[param_space]
lr = 0.004
channels = $channels
hidden = 64
dropout = 0.1
batch_size = 64
seed = 0
backend = "$backend"
TOML
      rm -rf "$work/out"
      "$wtune" run "$guest" --config "$work/e.toml" --output-dir "$work/out" > /dev/null 2>&1
      python3 - "$work/out/trial_0000/result.jsonl" "$round" "$channels" "$backend" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
epoch = statistics.median(r["time_this_iter_s"] for r in rows)
fuel = statistics.median(r["fuel_this_iter"] for r in rows)
print(f"round {sys.argv[2]} channels {sys.argv[3]} {sys.argv[4]} {epoch:.3f} {fuel:.4g}"
      f" (last train_loss {rows[-1]['train_loss']:.6f})")
PY
    done
  done
done
