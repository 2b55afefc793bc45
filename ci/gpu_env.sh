#!/usr/bin/env bash
# Source this on the GPU machine, from the repository root, before running tools there by hand or from a
# phase of a device run: it installs the wheels of .device/dist (ci/device_bundle.sh) and the third-party
# wheels of .whl (when carried) into /tmp/pygpukit-site once per machine (again when the wheels changed)
# and puts that directory on PYTHONPATH; OUT defaults to build/gpu.
#   source ci/gpu_env.sh && python benchmarks/tools/kernel_times.py
site=/tmp/pygpukit-site
stamp="$(cat .device/dist/*.whl .whl/*.whl 2>/dev/null | sha256sum | cut -c1-16)"
if [[ ! -f "$site/.stamp-$stamp" ]]; then
  rm -rf "$site"
  extra=()
  compgen -G ".whl/*.whl" >/dev/null && extra=(.whl/*.whl)
  python3 -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
    .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl "${extra[@]}" || return 1
  touch "$site/.stamp-$stamp"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export OUT="${OUT:-$PWD/build/gpu}"
mkdir -p "$OUT"
