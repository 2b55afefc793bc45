#!/usr/bin/env bash
# Wheels of librosa (the CPU peer of benchmarks/tools/audio_bench.py, issue 16's ">= 100x librosa"
# targets) for the GPU machine, which cannot reach a package index: cp312 manylinux wheels of the librosa
# version uv.lock pins and of its dependencies except numpy (the machine has it), split in two carry
# folders under the 64 MiB limit of a `device` call: .libA holds llvmlite (about 60 MB), .libB the rest.
# The phase `stage-lib` of ci/gpu_phases.sh copies .libA to /tmp/libw in a first call; `with-librosa` in a
# second call (carrying .libB) installs both and puts them on PYTHONPATH for the phases after it:
#   bash ci/librosa_bundle.sh
#   device call 1 (carry .device .libA):  bash ci/gpu_phases.sh stage-lib
#   device call 2 (carry .device .libB):  bash ci/gpu_phases.sh with-librosa audio-bench
set -euo pipefail
cd "$(dirname "$0")/.."
version="$(awk '/^name = "librosa"$/ {getline; gsub(/[^0-9.]/, "", $0); print; exit}' uv.lock)"
[[ -n "$version" ]] || { echo "no librosa version in uv.lock" >&2; exit 1; }
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$scratch" "librosa==$version"
rm -f "$scratch"/numpy-*.whl
rm -rf .libA .libB
mkdir -p .libA .libB
mv "$scratch"/llvmlite-*.whl .libA/
mv "$scratch"/*.whl .libB/
du -sh .libA .libB
for dir in .libA .libB; do
  bytes="$(du -sb "$dir" | cut -f1)"
  if ((bytes > 60 * 1024 * 1024)); then
    echo "$dir holds $bytes bytes: with .device it may not fit one 64 MiB carry" >&2
  fi
done
grep -qx '.libA/' .git/info/exclude 2>/dev/null || printf '.libA/\n.libB/\n' >>.git/info/exclude
