#!/usr/bin/env bash
# The Whisper run on the GPU machine (pygpukit.asr, issue 17). model.bin of whisper-tiny.en (76 MB) arrives
# in two parts like the SmolLM2 GGUF (ci/gpu_smollm2.sh, docs/contributing.md "Large files"): $1 holds
# model.part00 (copied by an earlier run), $2 (default $1) model.part01 and whisper-small.tar (config.json,
# tokenizer.json, vocabulary.txt of the model and pocketsphinx-testdata's cards/ and librivox/ clips). Make
# them here with:
#   split -b 50000000 -d ~/.cache/pygpukit/models/whisper-tiny.en/model.bin /tmp/parts/model.part
#   tar -C ~/.cache/pygpukit -cf whisper-small.tar models/whisper-tiny.en/{config.json,tokenizer.json,vocabulary.txt} \
#       audio-testdata/pocketsphinx-testdata
# Then, with the .device/dist wheels (built from this tree: they must contain pygpukit/asr/graph_decode.py,
# token_step.py and hf_export.py): the asr tests (GPU ones included: the CUDA-graph decode step against the
# eager loop, the device token rules against TokenRules, logits against transformers fp32 on the GPU) ->
# $OUT/asr-tests.log, and benchmarks/tools/asr_bench.py (logits against transformers fp32; 10 minutes of
# speech at batch 1, graph and eager, against transformers' pipeline fp16 + SDPA; the real-time factor;
# 16 files batched against one by one) -> $OUT/asr_bench.json. torch and transformers must be importable
# (they are on the GPU machine); without them the parity tests skip and the bench records the error.
set -uo pipefail
cd "$(dirname "$0")/.."
parts="${1:?usage: ci/gpu_asr.sh DIR_WITH_PART00 [DIR_WITH_PART01_AND_TAR]}"
second="${2:-$parts}"
out="${OUT:-$PWD/build/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYGPUKIT_CACHE_DIR="$parts/cache"
mkdir -p "$PYGPUKIT_CACHE_DIR"
tar -C "$PYGPUKIT_CACHE_DIR" -xf "$second/whisper-small.tar" || exit 1
model_dir="$PYGPUKIT_CACHE_DIR/models/whisper-tiny.en"
cat "$parts/model.part00" "$second/model.part01" >"$model_dir/model.bin" || exit 1
echo "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a  $model_dir/model.bin" | sha256sum -c - || exit 1
site="$(mktemp -d)/site"
python3 -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
  .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl || exit 1
export PYTHONPATH="$site"
export PYGPUKIT_REQUIRE_MODELS=1
status=0
python3 -m pytest -p no:cacheprovider -q -rs -s -o addopts="--strict-markers --import-mode=importlib" \
  packages/pygpukit-audio/tests/test_asr_gpu.py packages/pygpukit-audio/tests/test_asr_model.py \
  packages/pygpukit-audio/tests/test_asr_features.py packages/pygpukit-audio/tests/test_asr_transcribe.py \
  packages/pygpukit-audio/tests/test_asr_graph_decode.py packages/pygpukit-audio/tests/test_asr_hf_parity.py \
  2>&1 | tee "$out/asr-tests.log" | tail -30
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
python3 benchmarks/tools/asr_bench.py --model "$model_dir" \
  --audio "$PYGPUKIT_CACHE_DIR/audio-testdata/pocketsphinx-testdata/pocketsphinx/test/data" \
  --out "$out/asr_bench.json" 2>&1 | tee "$out/asr_bench.log" | grep -v Warning
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/nvidia-smi.txt"
date -u +%Y-%m-%dT%H:%M:%SZ
exit $status
