#!/usr/bin/env bash
# The soak of issue 21 (item 5) as one command on the GPU machine, from the repository root:
#   OUT=$OUT bash ci/soak.sh              # 9 minutes (SOAK_MINUTES), within a 10-minute command limit
# Installs the wheels of .device/dist into a scratch directory exactly as ci/gpu.sh does (when present),
# then runs benchmarks/tools/soak.py, whose --minutes bound counts from the start of its process
# (imports and warm-up included) and whose summary goes to $OUT/soak.json (also written at every
# sample, so a killed run leaves its figures so far). Extra arguments go to soak.py. Exit status:
# soak.py's (1 unless memory stayed flat and every check passed).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-$PWD/build/soak}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
if [[ -d .device/dist ]]; then
  site="$(mktemp -d)/site"
  extra=(); compgen -G ".whl/*.whl" >/dev/null && extra=(.whl/*.whl)
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
    .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl "${extra[@]}" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/nvidia-smi.txt" 2>&1 || true
"$python" benchmarks/tools/soak.py --minutes "${SOAK_MINUTES:-9}" --out "$OUT/soak.json" "$@" 2>&1 | tee "$OUT/soak.log"
exit "${PIPESTATUS[0]}"
