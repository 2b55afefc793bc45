#!/usr/bin/env bash
# Build, on the development machine, the wheels the GPU machine needs into .device/dist: every
# distribution for the GPU machine's Python (3.12; PYGPUKIT_DEVICE_PYTHON overrides). The GPU machine
# has no Rust toolchain, so the abi3 scheduler module must come from here; the C++ native modules are
# built here too so what is tested there is exactly a wheel. Carry .device to the GPU machine and run
# `bash ci/gpu.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYGPUKIT_DEVICE_PYTHON:-}"
if [[ -z "$python" ]]; then
  for candidate in python3.12 "$(pyenv prefix 3.12 2>/dev/null)/bin/python3.12" /usr/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      python="$candidate"
      break
    fi
  done
fi
if [[ -z "$python" ]]; then
  echo "no Python 3.12 interpreter found; set PYGPUKIT_DEVICE_PYTHON" >&2
  exit 1
fi
echo "building device wheels with $python"
rm -rf .device/dist
mkdir -p .device/dist
for cuda in 13 12; do
  PYGPUKIT_DIST_DIR="$PWD/.device/dist" python3 -m nox -s "build(cuda='$cuda')" -- --python "$python"
done
ls -la .device/dist
