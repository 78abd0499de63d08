#!/usr/bin/env bash
# Host compute on a real GPU, checked from prebuilt binaries on a machine with
# a GPU and no network (no Rust toolchain, no registries, no Vulkan loader).
#
#   bash scripts/gpu-check.sh pack [DIR]        # here: build, and pack into DIR
#   bash scripts/gpu-check.sh run [DIR] [OUT]   # there, from a copy of this repository
#
# DIR defaults to .gpu-check (ignored by git; copy it along with the repository).
# `run` writes into OUT (default DIR/out): the GPU's name, the compute tests'
# log, the Python package's trainable tests, `wtune-bench compute-gpu step`
# (bench.md), the example experiment's wall time on each backend (example.md),
# the burn worker's GPU tests and the burn CNN's epoch on each backend
# (burn.md), and PyTorch's matmul on the same card (torch.md) when PyTorch is
# there, the reference BENCHMARKS.md compares against.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
dir=$(realpath -m "${2:-.gpu-check}")

# Test and bench executables find the guests and the data through the path
# they were built in; on the GPU machine that path is made to lead here.
pack() {
  bash scripts/setup.sh
  bash scripts/python-env.sh
  cargo build --release --locked -p wtune -p wtune-bench
  local tests burn_tests
  tests=$(cargo test --release --locked -p wtune --no-run --test compute --message-format=json |
    executable compute)
  # The burn worker, and its GPU tests (sessions, snapshots, confinement).
  burn_tests=$(cargo test --release --locked --manifest-path guest-sdk/burn-remote/Cargo.toml \
    --target-dir target -p wtune-burn-worker --no-run --test gpu --message-format=json |
    executable gpu)
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/guests" "$dir/python"
  xz -T0 -c target/release/wtune >"$dir/bin/wtune.xz"
  xz -T0 -c target/release/wtune-bench >"$dir/bin/wtune-bench.xz"
  xz -T0 -c "$tests" >"$dir/bin/compute-tests.xz"
  xz -T0 -c target/release/wtune-burn-worker >"$dir/bin/wtune-burn-worker.xz"
  xz -T0 -c "$burn_tests" >"$dir/bin/burn-gpu-tests.xz"
  cp target/wasm32-wasip2/release/*.wasm "$dir/guests/"
  # The Python package's wheel, as `pip install ./python` builds it.
  PATH="$PWD/target/python-env/bin:$PATH" target/python-env/bin/maturin build -q --release --locked \
    -m python/Cargo.toml -o "$dir/python"
  # The GPU machines of this project have the NVIDIA driver but no loader.
  (cd "$dir" && apt-get download libvulkan1 >/dev/null 2>&1) ||
    echo "gpu-check: could not download libvulkan1; the GPU machine must have a Vulkan loader" >&2
  pwd >"$dir/built-in"
  du -sh "$dir"
}

# The test executable named $1 among cargo's JSON messages on stdin.
executable() {
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}

# The loader, and the NVIDIA driver's Vulkan ICD where the stock list has
# none; the ICD that names libGLX_nvidia cannot start without a display, so
# one naming the driver's EGL library is written instead.
vulkan() {
  if ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
    for deb in "$dir"/libvulkan1_*.deb; do dpkg -x "$deb" /; done
    ldconfig
  fi
  export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
  local stock=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1 && [ -e "$stock" ]; then
    local egl=/usr/local/nvidia/lib64/libEGL_nvidia.so.0
    if grep -q libGLX_nvidia "$stock" && [ -e "$egl" ]; then
      sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$egl\"#" "$stock" >"$dir/nvidia_icd.json"
      export VK_DRIVER_FILES=$dir/nvidia_icd.json
    else
      export VK_DRIVER_FILES=$stock
    fi
  fi
}

run() {
  local out=${3:-$dir/out}
  mkdir -p "$out" target/release target/wasm32-wasip2/release
  out=$(cd "$out" && pwd)
  vulkan
  local built_in
  built_in=$(cat "$dir/built-in")
  if [ "$built_in" != "$PWD" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"
  fi
  for name in wtune wtune-bench compute-tests wtune-burn-worker burn-gpu-tests; do
    xz -dc "$dir/bin/$name.xz" >"target/release/$name" && chmod +x "target/release/$name"
  done
  cp "$dir"/guests/*.wasm target/wasm32-wasip2/release/
  export WTUNE_WORKER=$PWD/target/release/wtune
  local python=$dir/python
  python3 -m zipfile -e "$python"/wtune-*.whl "$python"

  (nvidia-smi -L || true) >"$out/gpu.txt" 2>&1
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}" >>"$out/gpu.txt"
  local failed=0
  # One test at a time: a GPU is one device, and timings are not asserted.
  target/release/compute-tests --test-threads=1 2>&1 | tee "$out/compute-tests.log" || failed=1
  PYTHONPATH=$python python3 -m pytest -q -p no:cacheprovider python/tests/test_trainable.py 2>&1 |
    tee "$out/python-tests.log" || failed=1
  target/release/wtune-bench compute-gpu step 2>&1 | tee "$out/bench.md" || failed=1
  # The main job (scripts/example.sh) on each backend, by wall time.
  printf '| compute | wall time of the example experiment |\n| --- | --- |\n' >"$out/example.md"
  for compute in cpu gpu; do
    local results started
    results=$(mktemp -d)
    started=$(date +%s%N)
    if target/release/wtune run target/wasm32-wasip2/release/digits_mlp.wasm \
      --config examples/digits-mlp/experiment.toml --compute "$compute" \
      --output-dir "$results/run" >"$results/log" 2>&1; then
      echo "| $compute | $(( ($(date +%s%N) - started) / 1000000 )) ms |" >>"$out/example.md"
    else
      failed=1
      echo "| $compute | failed: $(tail -c 300 "$results/log" | tr '\n' ' ') |" >>"$out/example.md"
    fi
    rm -rf "$results"
  done
  cat "$out/example.md"
  burn "$out" || failed=1
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    python3 - <<'EOF' 2>&1 | tee "$out/torch.md" || failed=1
import torch

def tflops(n, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 / (start.elapsed_time(end) / 10 / 1e3) / 1e12

print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}:")
print("| n | fp32 TFLOP/s | TF32 TFLOP/s |\n| --- | --- | --- |")
for n in (512, 1024, 2048, 4096):
    print(f"| {n} | {tflops(n, False):.1f} | {tflops(n, True):.1f} |")
EOF
  fi
  return $failed
}

# burn on the GPU (issue 29): the worker's GPU tests, then one CNN trial
# with its tensors on the host (`backend = "host"`), on each backend, for a
# small model and a wide one: the first epoch (kernels compiled and
# autotuned) and the mean of the others.
burn() {
  local out=$1 failed=0
  target/release/burn-gpu-tests --test-threads=1 2>&1 | tee "$out/burn-gpu-tests.log" || failed=1
  printf '| compute | model | first epoch | later epochs (mean) | final val_accuracy |\n| --- | --- | --- | --- | --- |\n' >"$out/burn.md"
  local model compute results
  for model in "channels = 8|hidden = 64|batch_size = 64" "channels = 64|hidden = 1024|batch_size = 256"; do
    for compute in cpu gpu; do
      results=$(mktemp -d)
      printf 'name = "cnn"\nmetric = "val_accuracy"\nmode = "max"\n[stop]\ntraining_iteration = 6\n[limits]\nfuel_per_call = 1_000_000_000_000\ncall_timeout = "600s"\n[data]\ndigits = "%s/examples/digits-mlp/data"\n[param_space]\nlr = 0.003\ndropout = 0.1\nseed = 3\nbackend = "host"\n%s\n' \
        "$PWD" "${model//|/$'\n'}" >"$results/experiment.toml"
      if target/release/wtune run target/wasm32-wasip2/release/digits_cnn.wasm \
        --config "$results/experiment.toml" --compute "$compute" \
        --output-dir "$results/run" >"$results/log" 2>&1; then
        python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
times = [r["time_this_iter_s"] for r in rows]
later = sum(times[1:]) / max(len(times) - 1, 1)
accuracy = rows[-1]["val_accuracy"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {times[0]:.2f} s | {later:.3f} s | {accuracy:.3f} |")' \
          "$results/run/trial_0000/result.jsonl" "$compute" "${model//|/, }" >>"$out/burn.md"
      else
        failed=1
        echo "| $compute | ${model//|/, } | failed: $(tail -c 300 "$results/log" | tr '\n' ' ') | | |" >>"$out/burn.md"
      fi
      rm -rf "$results"
    done
  done
  cat "$out/burn.md"
  return $failed
}

case "$mode" in
  pack) pack ;;
  run) run "$@" ;;
  *)
    echo "usage: bash scripts/gpu-check.sh pack|run [DIR] [OUT]" >&2
    exit 2
    ;;
esac
