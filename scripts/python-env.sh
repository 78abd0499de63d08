#!/usr/bin/env bash
# The Python environment the tests read wtune's output with (TensorBoard's
# own reader and server): a venv in target/python-env with the pinned
# packages of tests/python/requirements.txt. Idempotent: it is made again
# only when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=target/python-env
requirements=tests/python/requirements.txt
stamp="$env_dir/.requirements"
if [ -x "$env_dir/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  exit 0
fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    python3-venv >/dev/null
fi
rm -rf "$env_dir"
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
