"""SmolLM2-135M-Instruct (Q4_1 GGUF) run natively: its linear weights stay in their Q4_1 blocks on the
device (``load(..., keep_quantized=True)``, the default) and go through the quantized GEMV/GEMM of
pygpukit.ops.quant. Its greedy tokens must equal those of the run with every weight dequantized.

The dequantized run's tokens are ``data/smollm2_golden.json``'s (transformers on the same GGUF;
test_smollm2.py holds pygpukit's dequantized run to them). On a mismatch the dequantized model is run
too and the failure names the first divergence and the native logit margin there. On the CPU
simulation backend the first three prompts with 32 new tokens keep the test short; on the GPU all five
with 64.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "data" / "smollm2_golden.json"


def _greedy(model: Any, prompt: list[int], count: int) -> list[int]:
    ids = model.generate(prompt, max_new_tokens=count, temperature=0, ignore_eos=True)
    return list(ids[len(prompt) :])


def _divergence(model: Any, prompt: list[int], got: list[int], want: list[int]) -> str:
    """The first step where ``got`` leaves ``want``, with ``model``'s logits for both tokens there."""
    step = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
    logits = model.forward(np.asarray(prompt + want[:step], np.int32)).to_numpy()[-1].astype(np.float64)
    top2 = np.sort(logits)[-2:]
    return (f"first divergence at new token {step}: native {got[step]} (logit {logits[got[step]]:.6f}), "
            f"dequantized {want[step]} (logit {logits[want[step]]:.6f}); native top-2 margin "
            f"{top2[1] - top2[0]:.3g}")  # fmt: skip


def test_native_q4_1_greedy_tokens_equal_dequantized(smollm2_gguf: Path) -> None:
    import pygpukit.llm as llm
    from pygpukit.ops.quant import QuantizedTensor

    golden = json.loads(GOLDEN.read_text())
    native = llm.load(smollm2_gguf, dtype="float32", progress=False)
    layer = native.weights.layers[0]
    for weight in (layer.wq, layer.wk, layer.wv, layer.wo, layer.w_gate_up, layer.w_down, native.weights.lm_head):
        assert isinstance(weight, QuantizedTensor)  # the tied head too, on the embedding's blocks
        assert weight.format in ("Q4_1", "Q8_0")
    cuda = native.backend == "cuda"
    cases = golden["cases"] if cuda else golden["cases"][:3]
    count = 64 if cuda else 32
    failures = []
    for case in cases:
        prompt = list(case["prompt_ids"])
        got = _greedy(native, prompt, count)
        want = list(case["new_ids"][:count])
        if got == want:
            continue
        dequantized = llm.load(smollm2_gguf, dtype="float32", progress=False, keep_quantized=False)
        reference = _greedy(dequantized, prompt, count)
        if got == reference:
            continue  # the dequantized run leaves transformers' tokens too: test_smollm2.py reports that
        failures.append(f"{case['prompt_text']!r}: {_divergence(native, prompt, got, reference)}")
    assert not failures, "\n".join(failures)


def test_native_weights_take_less_memory(smollm2_gguf: Path) -> None:
    import pygpukit.llm as llm

    native = llm.load(smollm2_gguf, dtype="float32", progress=False)
    dequantized = llm.load(smollm2_gguf, dtype="float32", progress=False, keep_quantized=False)
    assert native.weights.nbytes < 0.5 * dequantized.weights.nbytes
    ids = [1, 504, 3458, 282]
    a = native.forward(ids).to_numpy().astype(np.float64)
    b = dequantized.forward(ids).to_numpy().astype(np.float64)
    if native.backend != "cuda":  # float32 weights decoded alike, float64 products: the same bits
        np.testing.assert_array_equal(a, b)
    scale = np.abs(b).max()
    assert np.abs(a - b).max() <= 1e-3 * scale, np.abs(a - b).max() / scale


@pytest.mark.gpu
def test_gpu_native_decode_runs_the_quantized_gemv(smollm2_gguf: Path) -> None:
    """On the GPU the decode steps' products go through quant.gemv (counted by wrapping it)."""
    import pygpukit.llm as llm
    from pygpukit.ops.quant import gemv as module

    native = llm.load(smollm2_gguf, dtype="bfloat16", progress=False)
    calls = []
    original = module.quantized_gemv

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    module.quantized_gemv = counting
    try:
        text = native.generate("The capital of France is", max_new_tokens=4, temperature=0)
    finally:
        module.quantized_gemv = original
    assert isinstance(text, str)
    assert calls
