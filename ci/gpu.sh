#!/usr/bin/env bash
# The GPU runner: run on a machine with an NVIDIA GPU, from the repository root.
#   1. install the wheels from .device/dist (made by ci/device_bundle.sh) into a scratch directory on
#      PYTHONPATH, without touching the machine's environment (skipped if .device/dist is absent: then
#      the current environment must already have pygpukit installed);
#   2. print `pygpukit info`, run the whole pytest suite (the gpu-marked tests included) and the
#      benchmarks in benchmarks/;
#   3. write logs and JSON under $OUT (or build/gpu), and print a summary last.
# Exits non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/build/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
status=0

if [[ -d .device/dist ]]; then
  site="$(mktemp -d)/site"
  # .whl (carried too, when present): third-party wheels the machine lacks, e.g. gguf for pygpukit-llm.
  extra=(); compgen -G ".whl/*.whl" >/dev/null && extra=(.whl/*.whl)
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
    .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl "${extra[@]}" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

step() {  # step NAME COMMAND...: run, log to $out/NAME.log, remember failures
  local name="$1"
  shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [[ $rc -eq 0 ]] || status=1
  summary+=("$(printf '%-10s %s' "$name" "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")")")
}
summary=()

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/nvidia-smi.txt" 2>&1 || true
step info "$python" -m pygpukit info
"$python" -m pygpukit info --json >"$out/info.json" 2>/dev/null || true
step tests "$python" -m pytest -p no:cacheprovider -q -rs --junitxml="$out/junit.xml" \
  -o addopts="--strict-markers --import-mode=importlib" "$@"
# PYGPUKIT_BENCH: the benchmark files or directories to run (default: all of benchmarks/; "none": none).
read -r -a bench_paths <<<"${PYGPUKIT_BENCH:-benchmarks}"
if [[ "${bench_paths[0]}" != none ]] && compgen -G "benchmarks/test_*.py" >/dev/null; then
  step bench "$python" -m pytest -p no:cacheprovider -q "${bench_paths[@]}" --benchmark-only \
    --benchmark-json="$out/bench.json" -o addopts="--import-mode=importlib"
fi

echo
echo "device: $(cat "$out/nvidia-smi.txt" 2>/dev/null)"
echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '%s\n' "${summary[@]}"
grep -E "^[0-9]+ (passed|failed)|passed|failed" "$out/tests.log" | tail -1
exit $status
