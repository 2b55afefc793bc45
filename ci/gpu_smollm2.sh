#!/usr/bin/env bash
# The real-model run on the GPU machine: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) arrives in two parts
# (docs/contributing.md, "Large files"): $1 is the directory holding model.part00 (copied by an earlier
# run) and model.part01. Then, with the .device/dist wheels (and .whl: the gguf wheel transformers
# needs to read GGUF):
#   1. with GOLDEN=1, transformers' reference generations -> $OUT/smollm2_golden.json (and tests/data);
#   2. the main job (a chat answer) and the pygpukit-llm tests on the GPU against the golden and the file;
#   3. benchmarks/tools/llm_decode.py: decode speed next to transformers -> $OUT/llm_decode.json.
set -uo pipefail
cd "$(dirname "$0")/.."
parts="${1:?usage: ci/gpu_smollm2.sh DIR_WITH_PARTS [PART01_DIR]}"
second="${2:-$parts}"
out="${OUT:-$PWD/build/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# The model goes where the model cache keeps it, so hub.pull() (docs examples, the CLI) finds it.
export PYGPUKIT_CACHE_DIR="$parts/cache"
model="$PYGPUKIT_CACHE_DIR/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$(dirname "$model")"
cat "$parts/model.part00" "$second/model.part01" >"$model" || exit 1
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $model" | sha256sum -c - || exit 1
site="$(mktemp -d)/site"
python3 -m pip install --quiet --no-deps --no-index --no-compile --target "$site" .device/dist/*cp312*.whl \
  .device/dist/*py3-none-any.whl .device/dist/*abi3*.whl .whl/*.whl || exit 1
export PYTHONPATH="$site"
export PYGPUKIT_REQUIRE_MODELS=1
status=0
# GOLDEN=1: write transformers' reference generations first (into $OUT and tests/data).
if [[ "${GOLDEN:-0}" == 1 ]]; then
  python3 packages/pygpukit-llm/tests/data/make_smollm2_golden.py "$model" "$out" 2>&1 | tee "$out/golden.log" \
    || status=1
  cp "$out/smollm2_golden.json" packages/pygpukit-llm/tests/data/ || status=1
fi
python3 -m pygpukit chat --once "What is the capital of France?" --temperature 0 2>&1 | tee "$out/chat.log"
python3 -m pytest -p no:cacheprovider -q -rs -o addopts="--strict-markers --import-mode=importlib" \
  packages/pygpukit-llm/tests 2>&1 | tee "$out/llm-tests.log" | tail -25
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
python3 benchmarks/tools/llm_decode.py "$model" --json "$out/llm_decode.json" 2>&1 | tee "$out/llm_decode.log" \
  | grep -v Warning || status=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/nvidia-smi.txt"
date -u +%Y-%m-%dT%H:%M:%SZ
exit $status
