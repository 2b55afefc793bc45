#!/usr/bin/env bash
# GPU tests from the wheelhouse, on a machine with an NVIDIA GPU and no package index, from the
# repository root:
#
#   bash ci/gpu_wheelhouse.sh WHEELHOUSE [--list] [pytest arguments...]
#
# WHEELHOUSE: dist/wheelhouse of `nox -s release`, or the smaller copy for a lent GPU machine made by
# `python3 ci/release.py device --py 3.12 [3.X ...]` (.device/wheelhouse, 50 MiB for two Pythons: our
# wheels and their dependencies without the NVIDIA and triton wheels; NVRTC and cuBLASLt then come from
# the machine's CUDA install).
#
# 1. Looks for CPython 3.10 to 3.13 (python3.1X on PATH, /usr/bin, /usr/local/bin, pyenv, uv's managed
#    Pythons, python3 and the interpreter its venv is based on) and reports every one it finds.
#    --list stops there.
# 2. For each version the wheelhouse has wheels for (at most two, newest first): a fresh venv
#    (`python -m venv`, or --without-pip with the pip of another interpreter), then
#    `pip install --no-index --find-links WHEELHOUSE` of every distribution (pygpukit-triton without
#    triton, pygpukit without the NVIDIA wheels) and pytest.
# 3. For each venv, for the cu13 and the cu12 wheel (PYGPUKIT_CUDA_VARIANT): `pygpukit info` and the
#    core and ops tests, GPU tests included (pytest arguments replace the default test paths).
# 4. Logs and junit XML per run under $OUT (or build/gpu-wheelhouse); a summary last: device, date,
#    the Pythons found, one line per run with pytest's totals. Exits non-zero if a run failed or
#    fewer than two Python versions could be tested.
#
# Environment:
#   WHEELHOUSE_PYTHONS  the versions to test, e.g. "3.13 3.12" (default: the two newest found); with a
#                       list given, exactly those versions must be tested.
#   WHEELHOUSE_CU12_SITE  a directory put on PYTHONPATH for the cu12 runs only, holding what the
#                       nvidia-cuda-nvrtc-cu12 and nvidia-cuda-runtime-cu12 wheels install
#                       (nvidia/cuda_nvrtc/lib, nvidia/cuda_runtime/include): on a machine with a CUDA
#                       13 toolkit only, NVRTC 12 and its headers come from there, as from a pip install.
#   WHEELHOUSE_JOBS     shards per (Python, variant), all run at once (default 1): 2 Pythons x 2 variants
#                       x 3 shards keep 12 cores busy compiling kernels. Tests are dealt to shards by
#                       test function, balanced by count.
#   WHEELHOUSE_SERIAL   test file names run after the shards, one process at a time (default
#                       test_oom_recovery.py: its tests fill the device).
#   WHEELHOUSE_SHARD    run only this shard (0 .. WHEELHOUSE_JOBS-1), e.g. one per 10-minute command.
#   WHEELHOUSE_TIMEOUT  seconds each pytest may run (default: none); past it pytest is interrupted
#                       (SIGINT), so its log and junit XML still report the tests that ran.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || ! -d "$1" ]]; then
  echo "usage: bash ci/gpu_wheelhouse.sh WHEELHOUSE [--list] [pytest arguments...]" >&2
  exit 2
fi
wheelhouse="$(cd "$1" && pwd)"
shift
list_only=0
if [[ "${1:-}" == "--list" ]]; then
  list_only=1
  shift
fi
out="${OUT:-$PWD/build/gpu-wheelhouse}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
scratch="$(mktemp -d)"
summary=()
status=0

# -- 1. the Pythons on this machine ------------------------------------------------------------------
declare -A found=()  # "3.12" -> interpreter
report=()
probe() {  # probe PATH: record it if it is a CPython 3.10-3.13 not seen yet
  local candidate="$1" version
  [[ -x "$candidate" ]] || return 0
  version="$("$candidate" -c 'import sys, platform; print("%d.%d" % sys.version_info[:2] if platform.python_implementation() == "CPython" else "")' 2>/dev/null)" || return 0
  case "$version" in 3.10 | 3.11 | 3.12 | 3.13) ;; *) return 0 ;; esac
  if [[ -z "${found[$version]:-}" ]]; then
    found[$version]="$candidate"
    report+=("CPython $version: $candidate")
  fi
}
for minor in 13 12 11 10; do
  probe "$(command -v "python3.$minor" 2>/dev/null)"
  probe "/usr/bin/python3.$minor"
  probe "/usr/local/bin/python3.$minor"
  for dir in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3."$minor".* "$HOME"/.local/share/uv/python/cpython-3."$minor".*; do
    probe "$dir/bin/python3.$minor"
    probe "$dir/bin/python3"
  done
done
probe "$(command -v python3 2>/dev/null)"
base="$(python3 -c 'import sys; print(getattr(sys, "_base_executable", ""))' 2>/dev/null)"
[[ -n "$base" ]] && probe "$base"
echo "Pythons found:"
printf '  %s\n' "${report[@]:-none}" | tee "$out/pythons.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/nvidia-smi.txt" 2>&1 || true
echo "device: $(cat "$out/nvidia-smi.txt")"
if [[ $list_only -eq 1 ]]; then
  exit 0
fi

# -- 2. venvs from the wheelhouse ---------------------------------------------------------------------
tested=()
declare -A venvs=()
read -r -a wanted <<<"${WHEELHOUSE_PYTHONS:-}"
for version in 3.13 3.12 3.11 3.10; do
  if [[ ${#wanted[@]} -gt 0 && " ${wanted[*]} " != *" $version "* ]]; then
    continue
  fi
  python="${found[$version]:-}"
  if [[ -z "$python" ]]; then
    if [[ ${#wanted[@]} -gt 0 ]]; then
      summary+=("CPython $version: FAILED, asked for in WHEELHOUSE_PYTHONS but not found")
      status=1
    fi
    continue
  fi
  tag="cp${version/./}"
  if ! compgen -G "$wheelhouse/pygpukit_core_cu13-*-$tag-$tag-*.whl" >/dev/null; then
    summary+=("CPython $version ($python): skipped, the wheelhouse has no $tag wheels (python3 ci/release.py device --py $version ...)")
    continue
  fi
  if [[ ${#tested[@]} -ge 2 ]]; then
    summary+=("CPython $version ($python): not tested, two versions are enough")
    continue
  fi
  venv="$scratch/venv-$version"
  pip=()
  if "$python" -m venv "$venv" >"$out/venv-$version.log" 2>&1; then
    pip=("$venv/bin/python" -m pip)
    how="python -m venv"
  elif "$python" -m venv --without-pip "$venv" >>"$out/venv-$version.log" 2>&1; then
    for host in python3 "$python"; do  # pip >= 22.3 installs into another interpreter with --python
      if "$host" -m pip --version >/dev/null 2>&1; then
        pip=("$host" -m pip --python "$venv/bin/python")
        how="python -m venv --without-pip, then $host's pip --python"
        break
      fi
    done
  fi
  if [[ ${#pip[@]} -eq 0 ]]; then
    summary+=("CPython $version ($python): FAILED, no venv with pip could be made (see venv-$version.log)")
    status=1
    continue
  fi
  echo "=== CPython $version: venv by $how"
  if ! "${pip[@]}" install --disable-pip-version-check --quiet --no-index --find-links "$wheelhouse" \
    pygpukit-core pygpukit-ops pygpukit-llm pygpukit-audio pygpukit-sched pygpukit-core-cu12 pygpukit-core-cu13 \
    pytest hypothesis >"$out/install-$version.log" 2>&1 ||
    ! "${pip[@]}" install --disable-pip-version-check --quiet --no-index --no-deps --find-links "$wheelhouse" \
      pygpukit-triton pygpukit >>"$out/install-$version.log" 2>&1; then
    cat "$out/install-$version.log"
    summary+=("CPython $version ($python): FAILED to install from the wheelhouse (install-$version.log)")
    status=1
    continue
  fi
  tested+=("$version")

  venvs[$version]="$venv"
done

# -- 3. both CUDA variants, every (Python, variant, shard) at once --------------------------------------
# The pytest arguments: options pass through; directories and files are the tests. They are collected
# once (with the options, so `-m gpu` selects), grouped by test function (its parametrizations share
# kernels, which each process compiles once or loads from the shared disk cache) and the groups dealt,
# largest first, to the least-loaded of WHEELHOUSE_JOBS shards, so that the shards take about the same
# time. Files named in WHEELHOUSE_SERIAL (default: test_oom_recovery.py, whose tests fill the whole
# device) run afterwards, one process at a time. Each run has its own log and junit XML.
options=()
paths=()
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(packages/pygpukit-core/tests packages/pygpukit-ops/tests)
for arg in "${args[@]}"; do
  if [[ -e "$arg" ]]; then paths+=("$arg"); else options+=("$arg"); fi
done
jobs_wanted="${WHEELHOUSE_JOBS:-1}"
read -r -a serial_names <<<"${WHEELHOUSE_SERIAL:-test_oom_recovery.py}"
first_venv="${venvs[${tested[0]:-none}]:-}"
mkdir -p "$scratch/shards"
if [[ -n "$first_venv" ]]; then
  PYGPUKIT_CUDA_VARIANT=cu13 "$first_venv/bin/python" -m pytest -p no:cacheprovider --collect-only -q \
    -o addopts="--strict-markers --import-mode=importlib" "${options[@]}" "${paths[@]}" >"$out/collected.txt" 2>&1
  "$first_venv/bin/python" - "$out/collected.txt" "$scratch/shards" "$jobs_wanted" "${serial_names[@]}" <<'PY'
import sys
from collections import defaultdict
from pathlib import Path

collected, folder, jobs, serial = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), set(sys.argv[4:])
groups: dict[str, list[str]] = defaultdict(list)
late: list[str] = []
for line in collected.read_text().splitlines():
    if "::" not in line or line.startswith(("=", " ")):
        continue
    node = line.strip()
    (late if Path(node.split("::")[0]).name in serial else groups[node.split("[")[0]]).append(node)
loads = [0] * jobs
shards: list[list[str]] = [[] for _ in range(jobs)]
for _, nodes in sorted(groups.items(), key=lambda item: -len(item[1])):
    least = loads.index(min(loads))
    shards[least] += nodes
    loads[least] += len(nodes)
for i, nodes in enumerate(shards):
    (folder / f"shard{i}.txt").write_text("\n".join(nodes))
(folder / "serial.txt").write_text("\n".join(late))
print(f"collected {sum(loads) + len(late)} tests in {len(groups)} functions: shards of {loads}, {len(late)} serial")
PY
fi
runs=()
# The float64 references run in NumPy: its BLAS threads share the cores between the concurrent runs.
shards_running=$jobs_wanted
[[ -z "${WHEELHOUSE_SHARD:-}" ]] || shards_running=1
concurrent=$(( ${#tested[@]} * 2 * shards_running ))
threads=$(( $(nproc) / (concurrent > 0 ? concurrent : 1) ))
export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 )) OPENBLAS_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
run_pytest() {  # run_pytest RUN VARIANT VENV NODES_FILE: pytest over the node ids in NODES_FILE
  local run="$1" variant="$2" venv="$3" nodes_file="$4" nvrtc=() limit=() nodes=()
  if [[ $variant == cu12 && -n "${WHEELHOUSE_CU12_SITE:-}" ]]; then
    nvrtc=(env "PYTHONPATH=$WHEELHOUSE_CU12_SITE${PYTHONPATH:+:$PYTHONPATH}")
  fi
  [[ -z "${WHEELHOUSE_TIMEOUT:-}" ]] || limit=(timeout -s INT -k 30 "$WHEELHOUSE_TIMEOUT")
  mapfile -t nodes <"$nodes_file"
  PYGPUKIT_CUDA_VARIANT=$variant "${nvrtc[@]}" "${limit[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs \
    --junitxml="$out/junit-$run.xml" -o addopts="--strict-markers --import-mode=importlib" \
    "${options[@]}" "${nodes[@]}" >"$out/tests-$run.log" 2>&1
  echo $? >"$scratch/rc-$run"
}
# Every op kernel compiled once per variant before the shards start (in parallel, on every core), into
# the disk kernel cache the shards then load from: twelve processes each compiling all of them at once
# took eight minutes on a 16-core machine.
warm=()
for version in "${tested[@]}"; do
  venv="${venvs[$version]}"
  for variant in cu13 cu12; do
    nvrtc=()
    if [[ $variant == cu12 && -n "${WHEELHOUSE_CU12_SITE:-}" ]]; then
      nvrtc=(env "PYTHONPATH=$WHEELHOUSE_CU12_SITE${PYTHONPATH:+:$PYTHONPATH}")
    fi
    (
      PYGPUKIT_CUDA_VARIANT=$variant "${nvrtc[@]}" "$venv/bin/python" -c '
import time
from pygpukit.core.cublaslt import cublaslt_status
from pygpukit.ops import precompile
start = time.perf_counter()
count = precompile()
print(f"precompiled {count} op kernel groups in {time.perf_counter() - start:.1f} s; cuBLASLt: {cublaslt_status()}")
' >"$out/precompile-py$version-$variant.log" 2>&1
      echo "=== py$version-$variant: $(tail -n 1 "$out/precompile-py$version-$variant.log")"
    ) &
    warm+=($!)
  done
  break  # one Python fills the cache; the others load from it
done
[[ ${#warm[@]} -eq 0 ]] || wait "${warm[@]}"
serial_runs=()
for version in "${tested[@]}"; do
  venv="${venvs[$version]}"
  for variant in cu13 cu12; do
    name="py$version-$variant"
    nvrtc=()
    if [[ $variant == cu12 && -n "${WHEELHOUSE_CU12_SITE:-}" ]]; then
      nvrtc=(env "PYTHONPATH=$WHEELHOUSE_CU12_SITE${PYTHONPATH:+:$PYTHONPATH}")
    fi
    echo "=== $name: pygpukit info"
    PYGPUKIT_CUDA_VARIANT=$variant "${nvrtc[@]}" "$venv/bin/python" -m pygpukit info 2>&1 | tee "$out/info-$name.log"
    for ((shard = 0; shard < jobs_wanted; shard++)); do
      [[ -z "${WHEELHOUSE_SHARD:-}" || "$WHEELHOUSE_SHARD" == "$shard" ]] || continue
      [[ -s "$scratch/shards/shard$shard.txt" ]] || continue
      run="$name-shard$shard"
      echo "=== $run: pytest ${options[*]} ($(wc -l <"$scratch/shards/shard$shard.txt") tests and more)"
      run_pytest "$run" "$variant" "$venv" "$scratch/shards/shard$shard.txt" &
      runs+=("$run")
    done
    if [[ -s "$scratch/shards/serial.txt" && -z "${WHEELHOUSE_SHARD:-}" ]]; then
      serial_runs+=("$name-serial $variant $venv")
    fi
  done
done
wait
for entry in "${serial_runs[@]}"; do
  read -r run variant venv <<<"$entry"
  echo "=== $run: pytest (alone on the device)"
  run_pytest "$run" "$variant" "$venv" "$scratch/shards/serial.txt"
  runs+=("$run")
done
for run in "${runs[@]}"; do
  rc="$(cat "$scratch/rc-$run" 2>/dev/null || echo 1)"
  name="${run%-shard*}"
  name="${name%-serial}"
  backend="$(grep -m1 '^backend:' "$out/info-$name.log")"
  totals="$(grep -E '(passed|failed|error|skipped)' "$out/tests-$run.log" | tail -n 1)"
  if [[ $rc -ne 0 ]]; then
    status=1
    grep -E "^(FAILED|ERROR) " "$out/tests-$run.log" | cut -c1-240 | head -n 20
  fi
  summary+=("$(printf '%-22s %-6s %s | %s' "$run" "$([[ $rc -eq 0 ]] && echo ok || echo "FAIL")" "$backend" "$totals")")
done
if [[ ${#wanted[@]} -gt 0 ]]; then
  : # the versions asked for were each reported above
elif [[ ${#tested[@]} -lt 2 ]]; then
  summary+=("only ${#tested[@]} Python version(s) could be tested (${tested[*]:-none}); two were asked for")
  status=1
fi

# -- 4. summary ---------------------------------------------------------------------------------------
echo
echo "device: $(cat "$out/nvidia-smi.txt" 2>/dev/null)"
echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "wheelhouse: $wheelhouse"
printf '%s\n' "${report[@]:-no CPython 3.10-3.13 found}"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
rm -rf "$scratch"
exit $status
