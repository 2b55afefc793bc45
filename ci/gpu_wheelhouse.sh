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
#                       x 3 shards keep 12 cores busy compiling kernels.
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
# The pytest arguments: options pass through; directories are expanded into their test_*.py files, which
# are dealt into WHEELHOUSE_JOBS shards (largest first), so that the runs, bound by NVRTC compiling each
# kernel once per process, share the machine's cores. Each run has its own log and junit XML.
options=()
files=()
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(packages/pygpukit-core/tests packages/pygpukit-ops/tests)
for arg in "${args[@]}"; do
  if [[ -d "$arg" ]]; then
    while IFS= read -r file; do files+=("$file"); done < <(ls -S "$arg"/test_*.py)
  elif [[ -f "$arg" ]]; then
    files+=("$arg")
  else
    options+=("$arg")
  fi
done
jobs_wanted="${WHEELHOUSE_JOBS:-1}"
declare -A shard_files=()
for i in "${!files[@]}"; do
  shard=$((i % jobs_wanted))
  shard_files[$shard]+="${files[$i]} "
done
runs=()
# The float64 references run in NumPy: its BLAS threads share the cores between the concurrent runs.
shards_running=$jobs_wanted
[[ -z "${WHEELHOUSE_SHARD:-}" ]] || shards_running=1
concurrent=$(( ${#tested[@]} * 2 * shards_running ))
threads=$(( $(nproc) / (concurrent > 0 ? concurrent : 1) ))
export OMP_NUM_THREADS=$(( threads > 0 ? threads : 1 )) OPENBLAS_NUM_THREADS=$(( threads > 0 ? threads : 1 ))
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
      read -r -a these <<<"${shard_files[$shard]:-}"
      [[ ${#these[@]} -gt 0 || ${#files[@]} -eq 0 ]] || continue
      run="$name-shard$shard"
      echo "=== $run: pytest ${options[*]} ${these[*]}"
      (
        limit=()
        [[ -z "${WHEELHOUSE_TIMEOUT:-}" ]] || limit=(timeout -s INT -k 30 "$WHEELHOUSE_TIMEOUT")
        PYGPUKIT_CUDA_VARIANT=$variant "${nvrtc[@]}" "${limit[@]}" "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs \
          --junitxml="$out/junit-$run.xml" -o addopts="--strict-markers --import-mode=importlib" \
          "${options[@]}" "${these[@]}" >"$out/tests-$run.log" 2>&1
        echo $? >"$scratch/rc-$run"
      ) &
      runs+=("$run")
    done
  done
done
wait
for run in "${runs[@]}"; do
  rc="$(cat "$scratch/rc-$run" 2>/dev/null || echo 1)"
  name="${run%-shard*}"
  backend="$(grep -m1 '^backend:' "$out/info-$name.log")"
  totals="$(grep -E '(passed|failed|error)' "$out/tests-$run.log" | tail -n 1)"
  [[ $rc -eq 0 ]] || { status=1; tail -n 15 "$out/tests-$run.log"; }
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
