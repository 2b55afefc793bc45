#!/usr/bin/env bash
# compute-sanitizer over a representative subset of the GPU tests (issue 21, item 1). Run on the GPU
# machine from the repository root, after the install step of ci/gpu.sh (or let this script do it):
#   OUT=$OUT bash ci/sanitize.sh                      # all four tools
#   SANITIZE_TOOLS="memcheck racecheck" OUT=$OUT bash ci/sanitize.sh   # some of them
#
# 1. pygpukit: used as installed (PYTHONPATH of the caller kept); if it cannot be imported and
#    .device/dist exists, the wheels are installed into a scratch directory exactly as ci/gpu.sh does.
# 2. A plain pytest run of the subset (no sanitizer) checks that it passes and fills the kernel cache,
#    so the sanitized runs spend their time in kernels, not in NVRTC.
# 3. One run of the subset under each tool (memcheck, racecheck, synccheck, initcheck), each limited
#    to its time limit (below); output in $OUT/sanitize-<tool>.log. racecheck checks shared memory
#    only, so it skips the elementwise tests (those kernels use none).
# 4. ci/sanitize_probe.py (the pool's statistics around an eager run, a capture and threads) plainly
#    and under the first tool, logs in $OUT/sanitize-probe-*.log (SANITIZE_PROBE=0: skipped).
# 5. A summary line per tool with its error count, in $OUT/sanitize-summary.txt and last on stdout.
#
# Exit status: 0 when every tool ran to the end and reported no error; 1 when a tool reported an
# error (or the plain run failed, or compute-sanitizer was not found); 2 when no error was reported but
# a tool was cut off by its time limit (the count then covers only what ran).
#
# Environment: OUT (default build/sanitize), PYTHON (default python3), COMPUTE_SANITIZER (the binary;
# else found on PATH, under $CUDA_HOME, /usr/local/cuda*, or in an installed nvidia wheel),
# SANITIZE_TOOLS, SANITIZE_TESTS (a file of pytest node ids replacing the built-in subset below),
# SANITIZE_PLAIN=0 (skip the plain run, e.g. in a second call whose kernel cache is warm).
# Time limits, in seconds per tool: SANITIZE_TIMEOUT_<TOOL> (e.g. SANITIZE_TIMEOUT_RACECHECK), else
# SANITIZE_TIMEOUT for every tool, else memcheck 240, synccheck 240, racecheck 420, initcheck 300
# (an H100 ran memcheck over the subset in 31 s and synccheck in 10 s; racecheck and initcheck are
# slower, by how much is to be measured). Where one command may run 10 minutes at most:
#   SANITIZE_TOOLS="memcheck synccheck" ...                  (plain run ~200 s with a cold kernel cache)
#   SANITIZE_PLAIN=0 SANITIZE_TOOLS=racecheck ...            (one tool per command, warm cache)
#   SANITIZE_PLAIN=0 SANITIZE_TOOLS=initcheck ...
#
# What memcheck can and cannot see: an access outside a driver allocation. The pool rounds blocks up
# to a size class and reuses freed blocks, so an overrun that stays inside the rounded block, or a
# read of a freed-and-reused block, is invisible to it; --padding puts guard bytes after every driver
# allocation so that an overrun past the block's end is caught.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/build/sanitize}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
read -r -a tools <<<"${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}"
limit_for() {  # the time limit of tool $1 (see Environment above)
  local per_tool="SANITIZE_TIMEOUT_${1^^}" default
  case "$1" in racecheck) default=420 ;; initcheck) default=300 ;; *) default=240 ;; esac
  echo "${!per_tool:-${SANITIZE_TIMEOUT:-$default}}"
}

# -- pygpukit ------------------------------------------------------------------------------------
if ! "$python" -c "import pygpukit.ops" >/dev/null 2>&1 && [[ -d .device/dist ]]; then
  site="$(mktemp -d)/site"
  extra=(); compgen -G ".whl/*.whl" >/dev/null && extra=(.whl/*.whl)
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
    .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl "${extra[@]}" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$python" -c "import pygpukit.ops" >"$out/sanitize-import.log" 2>&1; then
  echo "sanitize: pygpukit cannot be imported by $python (see $out/sanitize-import.log)" >&2
  exit 1
fi

# -- compute-sanitizer ---------------------------------------------------------------------------
find_sanitizer() {
  local candidate
  for candidate in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
    "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" "${CUDA_PATH:-/nonexistent}/bin/compute-sanitizer" \
    /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n "$candidate" && -x "$candidate" ]] && { echo "$candidate"; return 0; }
  done
  # Versioned toolkits, newest first; then the binary of an nvidia pip wheel.
  for candidate in $(ls -d /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/*/bin/compute-sanitizer 2>/dev/null | sort -rV); do
    [[ -x "$candidate" ]] && { echo "$candidate"; return 0; }
  done
  candidate="$("$python" - <<'EOF' 2>/dev/null
import glob, site, sys
roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
for root in roots:
    for path in sorted(glob.glob(f"{root}/nvidia/**/compute-sanitizer", recursive=True)):
        import os
        if os.path.isfile(path) and os.access(path, os.X_OK):
            print(path)
            raise SystemExit
EOF
)"
  [[ -n "$candidate" ]] && { echo "$candidate"; return 0; }
  return 1
}
if ! sanitizer="$(find_sanitizer)"; then
  echo "sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)" >&2
  exit 1
fi
echo "sanitize: $sanitizer ($("$sanitizer" --version 2>/dev/null | grep -i version | head -1))"

# -- the subset ----------------------------------------------------------------------------------
# Per kernel family, tests with small shapes (the gpu-marked tests use model sizes, 10-100x slower
# under a sanitizer), chosen so one tool's run takes about 2-3 minutes on an H100. An id naming a
# test function takes all its parameters. Ids that no longer exist are dropped (and listed).
read -r -d '' builtin_subset <<'EOF'
packages/pygpukit-ops/tests/test_index_safety.py
packages/pygpukit-ops/tests/test_elementwise.py::test_mixed_dtypes
packages/pygpukit-ops/tests/test_elementwise.py::test_float_special_values
packages/pygpukit-ops/tests/test_elementwise.py::test_in_place_forms_and_overlap
packages/pygpukit-ops/tests/test_elementwise.py::test_where
packages/pygpukit-ops/tests/test_elementwise.py::test_clamp
packages/pygpukit-ops/tests/test_elementwise.py::test_astype_of_views
packages/pygpukit-ops/tests/test_reductions.py::test_softmax
packages/pygpukit-ops/tests/test_reductions.py::test_cumsum
packages/pygpukit-ops/tests/test_reductions.py::test_nan_and_float_sums
packages/pygpukit-ops/tests/test_reductions.py::test_determinism
packages/pygpukit-ops/tests/test_shape_ops.py::test_permute
packages/pygpukit-ops/tests/test_shape_ops.py::test_concatenate_and_stack
packages/pygpukit-ops/tests/test_shape_fastpath.py::test_join_misaligned_views
packages/pygpukit-ops/tests/test_builtin_gemm.py::test_gemm_small_any_backend
packages/pygpukit-ops/tests/test_builtin_gemm.py::test_gemv_small_any_backend
packages/pygpukit-ops/tests/test_builtin_gemm.py::test_gemm_epilogue
packages/pygpukit-ops/tests/test_builtin_gemm.py::test_gemv_vectors_and_views
packages/pygpukit-ops/tests/test_matmul.py::test_matmul_of_transposed_and_strided_views
packages/pygpukit-ops/tests/test_matmul.py::test_matmul_out_and_empty_dimensions
packages/pygpukit-ops/tests/test_matmul.py::test_linear_with_fused_bias_and_activation
packages/pygpukit-ops/tests/test_nn.py::test_embedding
packages/pygpukit-ops/tests/test_nn.py::test_embedding_out_of_range_ids_give_zero_rows_and_set_the_flag
packages/pygpukit-ops/tests/test_nn.py::test_gather_last
packages/pygpukit-ops/tests/test_nn.py::test_position_ids
packages/pygpukit-ops/tests/test_nn.py::test_norms
packages/pygpukit-ops/tests/test_nn.py::test_gated
packages/pygpukit-ops/tests/test_nn.py::test_conv1d
packages/pygpukit-ops/tests/test_rope.py::test_positions_per_sequence_and_shared
packages/pygpukit-ops/tests/test_rope.py::test_position_offset_and_per_sequence_decode_positions
packages/pygpukit-ops/tests/test_rope.py::test_strided_views_of_a_fused_qkv_buffer
packages/pygpukit-ops/tests/test_rope.py::test_gpu_positions_are_clamped
packages/pygpukit-ops/tests/test_kv_cache.py::test_prefill_then_decode
packages/pygpukit-ops/tests/test_kv_cache.py::test_paged_prefill_decode_and_removal
packages/pygpukit-ops/tests/test_kv_cache.py::test_paged_append_skips_slots_without_capacity_and_advance_too
packages/pygpukit-ops/tests/test_kv_cache.py::test_paged_decode_step_counting_the_token_first
packages/pygpukit-ops/tests/test_attention.py::test_strided_inputs_and_poisoned_out
packages/pygpukit-ops/tests/test_attention.py::test_decode_zero_length_gives_zeros
packages/pygpukit-ops/tests/test_attention.py::test_sdpa_causal_custom_scale_and_mqa
packages/pygpukit-ops/tests/test_attention.py::test_paged_decode_attention_shuffled_blocks
packages/pygpukit-ops/tests/test_attention.py::test_paged_decode_bad_device_block_ids_read_zeros
packages/pygpukit-ops/tests/test_moe.py::test_permute_puts_invalid_ids_last
packages/pygpukit-ops/tests/test_moe.py::test_permute_of_non_contiguous_rows
packages/pygpukit-ops/tests/test_moe.py::test_grouped_gemm_clamps_ill_formed_offsets
packages/pygpukit-ops/tests/test_moe.py::test_grouped_gemm_odd_sizes_and_untouched_rows
packages/pygpukit-ops/tests/test_moe.py::test_gating_sigmoid_and_special_values
packages/pygpukit-ops/tests/test_moe.py::test_moe_mlp_kn_layout_and_gelu
packages/pygpukit-ops/tests/test_sampling.py::test_greedy_special_values
packages/pygpukit-ops/tests/test_sampling.py::test_repetition_penalty_matches_reference
packages/pygpukit-ops/tests/test_sampling.py::test_per_row_settings
packages/pygpukit-ops/tests/test_sampling.py::test_strided_rows_every_entry_point
packages/pygpukit-ops/tests/test_gguf_dequant.py::test_views_at_any_offset
packages/pygpukit-ops/tests/test_gguf_dequant.py::test_shapes_type_ids_and_tiles
packages/pygpukit-ops/tests/test_quant_gemv.py::test_gemv_vector_input_and_output
packages/pygpukit-ops/tests/test_quant_kquants.py::test_gpu_linear_on_quantized_weights
packages/pygpukit-ops/tests/test_quant_fp8_block.py::test_gpu_gemv_every_row_count_and_dtype
packages/pygpukit-ops/tests/test_quant_int4.py::test_linear_matches_float64_reference
packages/pygpukit-ops/tests/test_quant_nvf4.py::test_linear_every_row_count
packages/pygpukit-ops/tests/test_rope_kv.py::test_decode_shapes
packages/pygpukit-ops/tests/test_gemv_fusions.py::test_in_place_residual_and_fresh_output
packages/pygpukit-ops/tests/test_lstm.py::test_lstm
packages/pygpukit-core/tests/test_graph.py::test_replay_is_bitwise_identical_to_eager
packages/pygpukit-core/tests/test_concurrency.py::test_threads_on_their_own_streams_do_not_cross_talk
packages/pygpukit-core/tests/test_concurrency.py::test_graph_capture_while_another_thread_allocates_and_computes
packages/pygpukit-audio/tests/test_fft.py::test_all_four_transforms_match_numpy
packages/pygpukit-audio/tests/test_fft.py::test_round_trips_and_views
packages/pygpukit-ops/tests/test_oom_recovery.py::test_work_under_a_full_memory_limit_then_recovery
EOF
subset="$out/sanitize-tests.txt"
if [[ -n "${SANITIZE_TESTS:-}" ]]; then
  cp "$SANITIZE_TESTS" "$subset"
else
  printf '%s\n' "$builtin_subset" >"$subset.wanted"
  # Keep the ids pytest still collects (a function id matches its parametrized items).
  mapfile -t files < <(sed 's/::.*//' "$subset.wanted" | sort -u | while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
  PYGPUKIT_TEST_PRECOMPILE=0 "$python" -m pytest -p no:cacheprovider -q --collect-only \
    -o addopts="--import-mode=importlib" "${files[@]}" >"$out/sanitize-collect.log" 2>&1
  "$python" - "$subset.wanted" "$out/sanitize-collect.log" "$subset" <<'EOF'
import sys
wanted = [line.strip() for line in open(sys.argv[1]) if line.strip()]
collected = [line.strip() for line in open(sys.argv[2]) if "::" in line]
kept = [w for w in wanted if any(c == w or c.startswith(w + "[") or c.startswith(w + "::") for c in collected)]
for w in wanted:
    if w not in kept:
        print(f"sanitize: dropped (not collected): {w}", file=sys.stderr)
open(sys.argv[3], "w").write("".join(f"{k}\n" for k in kept))
EOF
fi
mapfile -t tests <"$subset"
if [[ ${#tests[@]} -eq 0 ]]; then
  echo "sanitize: no test of the subset was collected (see $out/sanitize-collect.log)" >&2
  exit 1
fi
echo "sanitize: ${#tests[@]} test ids (list in $subset)"
pytest_args=(-m pytest -p no:cacheprovider -q -rs -o addopts="--strict-markers --import-mode=importlib")
export PYGPUKIT_TEST_PRECOMPILE=0  # compile only what the subset uses

# -- the plain run -------------------------------------------------------------------------------
status=0
summary=()
if [[ "${SANITIZE_PLAIN:-1}" != 0 ]]; then
  start=$SECONDS
  "$python" "${pytest_args[@]}" "${tests[@]}" >"$out/sanitize-plain.log" 2>&1
  rc=$?
  summary+=("$(printf '%-10s %s, %d s' plain "$([[ $rc -eq 0 ]] && echo "tests passed" || echo "tests FAILED (exit $rc)")" $((SECONDS - start)))")
  [[ $rc -eq 0 ]] || status=1
fi

# -- one run per tool ----------------------------------------------------------------------------
for tool in "${tools[@]}"; do
  log="$out/sanitize-$tool.log"
  limit="$(limit_for "$tool")"
  # --show-backtrace device: the host backtraces a tool records at each launch and allocation keep
  # references to the Python frames on the stack (measured on an H100, 2026-11-25: every temporary of
  # an eager run stayed alive, so three pool tests failed under any tool and passed with this option;
  # ci/sanitize_probe.py shows it). Device backtraces still name the kernel and the faulting PC.
  options=(--tool "$tool" --target-processes all --print-limit 200 --show-backtrace device)
  tool_tests=("${tests[@]}")
  tool_args=()
  case "$tool" in
    memcheck) options+=(--padding 64) ;;
    racecheck)
      # Hazards in shared memory are what racecheck sees: the elementwise kernels use none.
      options+=(--racecheck-report all)
      mapfile -t tool_tests < <(printf '%s\n' "${tests[@]}" | grep -v '/test_elementwise\.py')
      ;;
    synccheck) ;;
    initcheck) tool_args=(-vv) ;;  # each test's name before its reports: initcheck's point at host copies
    *) echo "sanitize: unknown tool $tool" >&2; status=1; continue ;;
  esac
  echo "=== sanitize $tool: $sanitizer ${options[*]} $python -m pytest ... (${#tool_tests[@]} ids, limit ${limit} s)"
  start=$SECONDS
  timeout --signal=INT --kill-after=30 "$limit" "$sanitizer" "${options[@]}" "$python" "${pytest_args[@]}" \
    "${tool_args[@]}" "${tool_tests[@]}" >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  # One "ERROR SUMMARY: N errors" per sanitized process; racecheck adds "RACECHECK SUMMARY: ...".
  errors=$(grep -aoE "ERROR SUMMARY: [0-9]+ error" "$log" | awk '{s += $3} END {print s + 0}')
  processes=$(grep -acE "ERROR SUMMARY: [0-9]+ error" "$log")
  hazards=$(grep -aoE "RACECHECK SUMMARY: .*" "$log" | head -3 | paste -sd ';' -)
  if [[ $tool == racecheck ]]; then  # racecheck ends each process with its own summary line instead
    processes=$(grep -acE "RACECHECK SUMMARY:" "$log")
    errors=$(grep -aoE "RACECHECK SUMMARY: .*\([0-9]+ errors" "$log" | grep -oE "[0-9]+ errors" |
      awk '{s += $1} END {print s + 0}')
  fi
  tests_line=$(grep -aE "[0-9]+ (passed|failed)" "$log" | tail -1)
  note=""
  if [[ $rc -eq 124 || $rc -eq 137 || $rc -eq 130 ]] || [[ $processes -eq 0 ]]; then
    note=" INCOMPLETE (exit $rc after ${took} s: time limit or no summary)"
    [[ $status -eq 0 ]] && status=2
  fi
  [[ $errors -gt 0 ]] && status=1
  summary+=("$(printf '%-10s %d errors, %d s (limit %d s); tests: %s%s%s' "$tool" "$errors" "$took" "$limit" \
    "${tests_line:-none}" "${hazards:+; $hazards}" "$note")")
done

# -- the pool probe (ci/sanitize_probe.py), plainly and under the first tool: seconds; SANITIZE_PROBE=0 skips it.
# Its lines compare the pool's statistics with and without a sanitizer (docs/reliability.md); not counted.
if [[ "${SANITIZE_PROBE:-1}" != 0 && ${#tools[@]} -gt 0 ]]; then
  timeout 120 "$python" ci/sanitize_probe.py >"$out/sanitize-probe-plain.log" 2>&1
  timeout 300 "$sanitizer" --tool "${tools[0]}" --print-limit 20 "$python" ci/sanitize_probe.py \
    >"$out/sanitize-probe-${tools[0]}.log" 2>&1
  summary+=("$(printf '%-10s plain and %s logs: sanitize-probe-*.log' probe "${tools[0]}")")
fi

{
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "tool:   $("$sanitizer" --version 2>/dev/null | grep -i version | head -1)"
  printf '%s\n' "${summary[@]}"
} | tee "$out/sanitize-summary.txt"
exit $status
