#!/usr/bin/env bash
# Named phases of a GPU-machine run, so that one `device` call runs several and each writes its log and
# JSON under $OUT: `bash ci/gpu_phases.sh PHASE...` from the repository root, with .device/dist carried
# (ci/device_bundle.sh). Whisper's model.bin comes in two parts (ci/gpu_asr.sh says how to make them):
# the phase `stage-a` copies part00 from .bigA to /tmp/m in a first call, `asr-*` phases of a second call
# join it with .bigB's part01 and unpack .bigB/whisper-small.tar.
#
#   stage-a         copy .bigA/* to /tmp/m (first of the two calls)
#   stage-lib       copy .libA/*.whl (ci/librosa_bundle.sh: llvmlite) to /tmp/libw (first of two calls)
#   with-librosa    install /tmp/libw's and .libB's wheels (librosa and its dependencies) into /tmp/librosa-site
#                   and put it on PYTHONPATH for the phases after it (audio-bench then times librosa too)
#   kernels         benchmarks/tools/kernel_times.py: fft, rfft, stft kernels against torch's, and
#                   pygpukit's under the FFT plan variants of $FFT_VARIANTS (default smem,reg8,reg16)
#   ncu-fft         Nsight Compute sections of the first FFT launches (fft 2^20's two, stft n_fft 2048's);
#                   NCU_EXTRA adds options (e.g. "--section SourceCounters --print-details all": where warps stall)
#   initcheck       ci/initcheck_probe.py: initcheck on torch-only and pygpukit-only programs
#   fft-tests       the gpu-marked tests of test_fft.py and test_gpu_dsp.py (the FFT kernels, stft, mel)
#   audio-tests     the audio package's gpu-marked tests (the model tests skip without their files)
#   graph-tests     the core's gpu-marked graph and memory-pool tests (captures, replays, holds)
#   asr-unit-tests  the ASR tests that need no model files (random-weight models: graph decode, batching) on
#                   the CUDA backend
#   quant-tests     the gpu-marked tests of the weight-only, int4, block-FP8, NVF4 and GGUF linear and of the
#                   quantized MoE experts
#   fp8-tests       scaled_matmul's scale kinds and fp8 output, the fp8 activation quantizer, the block-FP8
#                   weights (W8A16 GEMV, W8A8 prefill) and the HF fp8 checkpoint test, all on the CUDA backend
#   gemv-tests      the gpu-marked tests of the GGUF decode GEMVs (test_quant_gemv.py: SIMT and tensor-core kernels)
#   gemv-bench      python -m pygpukit.benchmark.quant_gemv: $GEMV_SIMT_FORMATS through the SIMT kernel (--simt), then
#                   $GEMV_FORMATS through the default kernels compared with it, as shares of the copy bandwidth measured in the run
#   gemv-warps      the GGUF GEMVs ($GEMV_FORMATS, default Q4_K,Q5_K,Q6_K,Q8_0; $GEMV_SHAPES): the SIMT kernels,
#                   the tensor-core ones with one block per tile, then the persistent launch, then at $GEMV_WARPS
#                   (default 2 4 8) warps;
#                   the tensor-core kernels at M = 1 for every format (--mma-all-rows)
#   gemv-stages     Q4_K / Q6_K tensor-core GEMVs with 3 and 2 stages per warp (a block per tile; 2 also with the
#                   resident grid), then the Llama-3-8B Q4_K_M decode at 3 and 2 stages
#   wo-tests        every test of the FP8 / INT8 per-channel weights (test_quant_weight_only.py: GEMVs, W8A8 prefill)
#                   and of their HF checkpoints (test_quant_channel_hf.py), on the CUDA backend
#   wo-rows         FP8 / INT8 per-channel GEMVs at 1-4 rows of x, SIMT against tensor-core kernel (MMA_MIN_ROWS)
#   scale-probe     benchmarks/tools/cublaslt_scale_probe.py: which fp8 scale modes (per tensor, per channel, 1x128 x
#                   128x128 blocks) cuBLASLt runs in which operand order, checked and timed next to torch._scaled_mm
#   ncu-gemv        Nsight Compute sections of one GEMV launch per $NCU_GEMV_CASES entry (default: the Q4_K
#                   tensor-core kernel, 14336 x 4096, M = 1)
#   gemm-tests      the built-in GEMM kernels' and the MoE ops' gpu-marked tests (the mma.sync main loop that the
#                   dense, grouped and quantized grouped GEMMs share)
#   linear-tests    test_matmul.py's linear tests on the GPU (out=, epilogues; not the every-route sweep)
#   llm-profile     the kernel table and chrome trace of one eager decode on $LLM_SHAPES ($LLM_ARGS: e.g. --quant q4_k_m)
#   pdl-tests       programmatic dependent launch: test_programmatic_launch.py (on against off, bitwise), then with
#                   it on (PYGPUKIT_PROGRAMMATIC_LAUNCH=1) the tests of the kernels that use it (fused_gemv, the GEMVs,
#                   rope_kv_append, kv_write, decode attention, elementwise, norms, gated, embedding) and of the
#                   decode strategies and Whisper's graph decoders
#   pdl-bench       pygpukit.llm.benchmark at batch 1 on $LLM_SHAPES (default smollm2-135m,qwen2.5-0.5b) with fuse
#                   true and all, programmatic launch on and off (random weights, no peers)
#   llm-tests       the LLM package's gpu-marked tests (random-weight models; the real-model ones skip)
#   llm-shapes      python -m pygpukit.llm.benchmark on $LLM_SHAPES (default qwen2.5-0.5b) with $LLM_ARGS
#                   (random-weight models; the compiled torch reference and transformers in the same run)
#   audio-bench     benchmarks/tools/audio_bench.py (stft, mel, fft, resample against torch)
#   stage-audio     unpack .bigB/audio-subset.tar (ci/audio_subset.sh: the recordings the librosa tests read)
#                   into /tmp/m/cache/audio-testdata, for librosa-tests in a later call on the same machine
#   librosa-tests   the audio tests that compare with librosa (real recordings included), whole files, on the
#                   CUDA backend; needs with-librosa and stage-audio
#   asr-profile     benchmarks/tools/asr_batch_profile.py --kernels (batch 16 against one by one)
#   asr-tests       the ASR tests with the real model (ci/gpu_asr.sh's list)
#   asr-bench       benchmarks/tools/asr_bench.py (medians of $ASR_REPEAT runs, default 3)
# A summary line per phase comes last; the exit status is 1 when a phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee "$OUT/date.txt"
python3 -m pygpukit info >"$OUT/pygpukit-info.txt" 2>&1 || true  # driver, NVRTC, cuBLASLt versions and paths
grep -i -A2 "cublaslt" "$OUT/pygpukit-info.txt" | head -4
summary=()
status=0

model_dir=/tmp/m/cache/models/whisper-tiny.en
audio_dir=/tmp/m/cache/audio-testdata/pocketsphinx-testdata/pocketsphinx/test/data
asr_ready() {
  [[ -f "$model_dir/model.bin" ]] && return 0
  mkdir -p /tmp/m/cache && tar -C /tmp/m/cache -xf .bigB/whisper-small.tar || return 1
  cat /tmp/m/model.part00 .bigB/model.part01 >"$model_dir/model.bin" || return 1
  echo "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a  $model_dir/model.bin" | sha256sum -c -
}

run() {  # run NAME LIMIT_S COMMAND...: log to $OUT/NAME.log, remember the outcome
  local name="$1" limit="$2"
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | grep -v -E "Warning: |warnings.warn" | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-12s %s (%d s)' "$name" "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")" $((SECONDS - start)))")
  [[ $rc -eq 0 ]] || status=1
}

pytest_q=(python3 -m pytest -p no:cacheprovider -q -rfE -o "addopts=--strict-markers --import-mode=importlib")
for phase in "$@"; do
  case "$phase" in
    stage-a) mkdir -p /tmp/m && cp .bigA/* /tmp/m/ && summary+=("stage-a      ok") ;;
    stage-lib) mkdir -p /tmp/libw && cp .libA/*.whl /tmp/libw/ && summary+=("stage-lib    ok") ;;
    with-librosa)
      if python3 -m pip install --quiet --no-deps --no-index --no-compile --target /tmp/librosa-site /tmp/libw/*.whl \
        .libB/*.whl && PYTHONPATH="/tmp/librosa-site:$PYTHONPATH" python3 -c "import librosa; print('librosa', librosa.__version__)"; then
        export PYTHONPATH="/tmp/librosa-site:$PYTHONPATH"
        summary+=("with-librosa ok")
      else
        summary+=("with-librosa FAILED"); status=1
      fi ;;
    kernels)
      run kernels 300 python3 benchmarks/tools/kernel_times.py --variants "${FFT_VARIANTS:-smem,reg8,reg16}" \
        --json "$OUT/kernel_times.json" ;;
    ncu-fft)
      run ncu-fft 200 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:fft_ --launch-count 4 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis_Tables \
        --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
        ${NCU_EXTRA:-} python3 benchmarks/tools/kernel_times.py --plain --cases fft,stft2048 --calls 1 ;;
    initcheck) run initcheck 200 python3 ci/initcheck_probe.py --timeout 45 --json "$OUT/initcheck_probe.json" ;;
    quant-tests)
      run quant-tests 480 "${pytest_q[@]}" -m gpu packages/pygpukit-ops/tests/test_quant_weight_only.py \
        packages/pygpukit-ops/tests/test_quant_int4.py packages/pygpukit-ops/tests/test_quant_fp8_block.py \
        packages/pygpukit-ops/tests/test_quant_nvf4.py packages/pygpukit-ops/tests/test_quant_gemv.py \
        packages/pygpukit-ops/tests/test_quant_experts.py ;;
    gemv-tests) run gemv-tests 240 "${pytest_q[@]}" -m gpu packages/pygpukit-ops/tests/test_quant_gemv.py ;;
    gemv-bench)
      run gemv-bench-simt 150 python3 -m pygpukit.benchmark.quant_gemv --formats "${GEMV_SIMT_FORMATS:-Q4_K,Q5_K,Q6_K,Q8_0,FP8,INT8}" --simt \
        --json "$OUT/quant_gemv_simt.json"
      run gemv-bench 240 python3 -m pygpukit.benchmark.quant_gemv --formats "${GEMV_FORMATS:-Q4_K,Q5_K,Q6_K,Q8_0,FP8,INT8,AWQ}" \
        --json "$OUT/quant_gemv.json" --compare "$OUT/quant_gemv_simt.json" ;;
    gemv-warps)
      common=(--formats "${GEMV_FORMATS:-Q4_K,Q5_K,Q6_K,Q8_0}" --rows 1,8 --iterations 100 --mma-all-rows
              --shapes "${GEMV_SHAPES:-14336x4096,4096x14336,4096x4096,1024x4096}")
      run gemv-simt 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --simt --json "$OUT/gemv_simt.json"
      run gemv-tile-per-block 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-grid tiles \
        --json "$OUT/gemv_tile_per_block.json" --compare "$OUT/gemv_simt.json"
      run gemv-persistent 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-grid resident \
        --json "$OUT/gemv_persistent.json" \
        --compare "$OUT/gemv_tile_per_block.json"
      for warps in ${GEMV_WARPS:-2 4 8}; do
        run "gemv-warps$warps" 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-warps "$warps" \
          --json "$OUT/gemv_warps$warps.json" --compare "$OUT/gemv_persistent.json"
      done ;;
    gemv-stages)
      common=(--formats "${GEMV_FORMATS:-Q4_K,Q6_K}" --rows 1,8 --iterations 100
              --shapes "${GEMV_SHAPES:-14336x4096,4096x14336,4096x4096,28672x4096}")
      run gemv-stages3 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-stages 3 --json "$OUT/gemv_stages3.json"
      run gemv-stages2 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-stages 2 --json "$OUT/gemv_stages2.json" \
        --compare "$OUT/gemv_stages3.json"
      run gemv-stages2-resident 90 python3 -m pygpukit.benchmark.quant_gemv "${common[@]}" --mma-stages 2 --mma-grid resident \
        --json "$OUT/gemv_stages2_resident.json" --compare "$OUT/gemv_stages2.json"
      for stages in 3 2; do
        run "llm-8b-stages$stages" 180 python3 -c "import sys; from pygpukit.ops.quant import gemv; gemv.MMA_STAGES = $stages
from pygpukit.llm.benchmark import main; sys.exit(main(sys.argv[1:]))" --shapes llama3-8b --batches 1,8 --quant q4_k_m \
          --peers none --repeats 3 --prompts 8 --json "$OUT/llm_8b_stages$stages.json"
      done ;;
    wo-tests) run wo-tests 240 "${pytest_q[@]}" packages/pygpukit-ops/tests/test_quant_weight_only.py \
      packages/pygpukit-llm/tests/test_quant_channel_hf.py ;;
    wo-rows)
      run wo-rows-simt 90 python3 -m pygpukit.benchmark.quant_gemv --formats FP8,INT8 --rows 1,2,3,4 --simt \
        --json "$OUT/wo_rows_simt.json"
      run wo-rows-mma 90 python3 -m pygpukit.benchmark.quant_gemv --formats FP8,INT8 --rows 1,2,3,4 \
        --json "$OUT/wo_rows.json" --compare "$OUT/wo_rows_simt.json" ;;
    scale-probe)
      run scale-probe 240 python3 benchmarks/tools/cublaslt_scale_probe.py --json "$OUT/scale_probe.json" ;;
    ncu-gemv)
      # NCU_GEMV_CASES: FORMAT:NxK:ROWS:KERNEL_REGEX[:simt] entries, space-separated
      for case in ${NCU_GEMV_CASES:-Q4_K:14336x4096:1:gguf_gemv_mma}; do
        IFS=: read -r fmt shape m regex simt <<<"$case"
        run "ncu-gemv-$fmt-$shape-m$m${simt:+-simt}" 120 /usr/local/cuda/bin/ncu --clock-control none \
          --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy \
          --section LaunchStats --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
          --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis ${NCU_EXTRA:-} \
          python3 -m pygpukit.benchmark.quant_gemv --formats "$fmt" --rows "$m" --shapes "$shape" --iterations 3 \
          ${simt:+--simt}
      done ;;
    fp8-tests)
      run fp8-tests 300 "${pytest_q[@]}" packages/pygpukit-ops/tests/test_scaled_matmul_scales.py \
        $(ls packages/pygpukit-ops/tests/test_quant_fp8_act.py 2>/dev/null) packages/pygpukit-ops/tests/test_quant_fp8_block.py \
        packages/pygpukit-llm/tests/test_quant_fp8_hf.py packages/pygpukit-ops/tests/test_matmul.py -k "scaled or fp8 or block or channel or quant" ;;
    gemm-tests) run gemm-tests 240 "${pytest_q[@]}" -m gpu packages/pygpukit-ops/tests/test_builtin_gemm.py \
      packages/pygpukit-ops/tests/test_moe.py ;;
    linear-tests) run linear-tests 240 "${pytest_q[@]}" packages/pygpukit-ops/tests/test_matmul.py -k "linear and not every_route" ;;
    llm-shapes)
      run llm-shapes "${LLM_LIMIT:-540}" python3 -m pygpukit.llm.benchmark --shapes "${LLM_SHAPES:-qwen2.5-0.5b}" \
        ${LLM_ARGS:-} --json "$OUT/llm_shapes.json" ;;
    llm-profile)
      run llm-profile "${LLM_LIMIT:-300}" python3 -m pygpukit.llm.benchmark --shapes "${LLM_SHAPES:-qwen2.5-0.5b}" \
        ${LLM_ARGS:-} --batches 1 --prompts 8 --repeats 1 --peers none --profile "$OUT/profile" ;;
    pdl-tests)
      run pdl-tests 150 "${pytest_q[@]}" packages/pygpukit-llm/tests/test_programmatic_launch.py
      PYGPUKIT_PROGRAMMATIC_LAUNCH=1 PYGPUKIT_TEST_PRECOMPILE=0 run pdl-kernel-tests 180 "${pytest_q[@]}" \
        packages/pygpukit-ops/tests/test_gemv_fusions.py packages/pygpukit-ops/tests/test_rope_kv.py \
        packages/pygpukit-ops/tests/test_kv_cache.py packages/pygpukit-ops/tests/test_elementwise.py \
        packages/pygpukit-ops/tests/test_nn.py packages/pygpukit-ops/tests/test_attention.py -k "not prefill"
      PYGPUKIT_PROGRAMMATIC_LAUNCH=1 PYGPUKIT_TEST_PRECOMPILE=0 run pdl-gemv-tests 120 "${pytest_q[@]}" \
        packages/pygpukit-ops/tests/test_builtin_gemm.py packages/pygpukit-ops/tests/test_matmul.py -k gemv
      PYGPUKIT_PROGRAMMATIC_LAUNCH=1 run pdl-decode-tests 120 "${pytest_q[@]}" \
        packages/pygpukit-llm/tests/test_decode_strategies.py packages/pygpukit-audio/tests/test_asr_graph_decode.py ;;
    pdl-bench)
      for fuse in true all; do
        for mode in on off; do
          flag=()
          [[ $mode == on ]] && flag=(--programmatic)
          run "pdl-$fuse-$mode" 120 python3 -m pygpukit.llm.benchmark --shapes "${LLM_SHAPES:-smollm2-135m,qwen2.5-0.5b}" \
            --batches 1 --prompts 128 --repeats 3 --peers none --fuse "$fuse" "${flag[@]}" --json "$OUT/pdl_${fuse}_${mode}.json"
        done
      done ;;
    llm-tests) run llm-tests 240 "${pytest_q[@]}" -m gpu packages/pygpukit-llm/tests ;;
    fft-tests) run fft-tests 240 "${pytest_q[@]}" -m gpu packages/pygpukit-audio/tests/test_fft.py \
      packages/pygpukit-audio/tests/test_gpu_dsp.py ;;
    audio-tests) run audio-tests 300 "${pytest_q[@]}" -m gpu packages/pygpukit-audio/tests ;;
    asr-unit-tests) run asr-unit-tests 240 "${pytest_q[@]}" packages/pygpukit-audio/tests/test_asr_graph_decode.py \
      packages/pygpukit-audio/tests/test_asr_batch.py packages/pygpukit-audio/tests/test_asr_decoding.py -m "not slow" ;;
    graph-tests) run graph-tests 240 "${pytest_q[@]}" -m gpu packages/pygpukit-core/tests/test_graph.py \
      packages/pygpukit-core/tests/test_memory_defects.py packages/pygpukit-core/tests/test_reset_device.py \
      packages/pygpukit-core/tests/test_concurrency.py ;;
    audio-bench) run audio-bench 240 python3 benchmarks/tools/audio_bench.py --out "$OUT/audio_bench.json" ;;
    stage-audio)
      if mkdir -p /tmp/m/cache/audio-testdata && tar -C /tmp/m/cache/audio-testdata -xf .bigB/audio-subset.tar; then
        summary+=("stage-audio  ok")
      else
        summary+=("stage-audio  FAILED"); status=1
      fi ;;
    librosa-tests)
      PYGPUKIT_CACHE_DIR=/tmp/m/cache PYGPUKIT_REQUIRE_MODELS=1 run librosa-tests 420 "${pytest_q[@]}" \
        packages/pygpukit-audio/tests/test_librosa_parity.py packages/pygpukit-audio/tests/test_music_librosa.py \
        packages/pygpukit-audio/tests/test_analysis_onset.py packages/pygpukit-audio/tests/test_analysis_pitch.py \
        packages/pygpukit-audio/tests/test_analysis_dynamics.py packages/pygpukit-audio/tests/test_phase.py \
        packages/pygpukit-audio/tests/test_resample.py packages/pygpukit-audio/tests/test_streaming.py ;;
    asr-profile)
      asr_ready || { summary+=("asr-profile  FAILED (model)"); status=1; continue; }
      PYGPUKIT_CACHE_DIR=/tmp/m/cache run asr-profile 240 python3 benchmarks/tools/asr_batch_profile.py \
        --model "$model_dir" --audio "$audio_dir" --kernels --repeat 3 ;;
    asr-tests)
      asr_ready || { summary+=("asr-tests    FAILED (model)"); status=1; continue; }
      PYGPUKIT_CACHE_DIR=/tmp/m/cache PYGPUKIT_REQUIRE_MODELS=1 run asr-tests 420 "${pytest_q[@]}" \
        packages/pygpukit-audio/tests/test_asr_gpu.py packages/pygpukit-audio/tests/test_asr_batch.py \
        packages/pygpukit-audio/tests/test_asr_features.py packages/pygpukit-audio/tests/test_asr_transcribe.py \
        packages/pygpukit-audio/tests/test_asr_graph_decode.py packages/pygpukit-audio/tests/test_asr_hf_parity.py ;;
    asr-bench)
      asr_ready || { summary+=("asr-bench    FAILED (model)"); status=1; continue; }
      PYGPUKIT_CACHE_DIR=/tmp/m/cache run asr-bench 540 python3 benchmarks/tools/asr_bench.py --model "$model_dir" \
        --audio "$audio_dir" --repeat "${ASR_REPEAT:-3}" --out "$OUT/asr_bench.json" ;;
    *) echo "unknown phase $phase" >&2; status=1 ;;
  esac
done
echo
printf '%s\n' "${summary[@]}"
exit $status
