"""Decode strategies (pygpukit.llm.decode): DecodeM1's preallocated step equals the model's eager
decode_step, DecodeM1Graph's replayed graph equals DecodeM1 bitwise for 256 steps, steady-state steps
allocate nothing from the pool, and generate(strategy=...) picks and checks them.

On the CPU backend CudaGraph records the step's op calls and replays them; the GPU-marked tests at
the end run the same comparisons with real CUDA graphs (bfloat16, random config and SmolLM2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
import pygpukit.llm as llm
import pygpukit.ops as ops
from pygpukit.core.errors import ArgumentError
from pygpukit.core.memory import memory_stats
from pygpukit.llm import DecodeM1, DecodeM1Graph, SamplingParams, UnsupportedStrategyError

_tm = sibling("test_model")  # its random checkpoints and float64 reference
_config, _save, _weights = _tm._config, _tm._save, _tm._weights
PROMPT = [[5, 17, 3, 40, 22, 9]]
SAMPLING = SamplingParams(temperature=0.9, top_k=40, top_p=0.95)


def _model(tmp_path: Path, model_type: str = "llama", dtype: Any = None, positions: int = 512) -> Any:
    config = _config(model_type)
    config["max_position_embeddings"] = positions
    if model_type == "mixtral":
        config |= {"num_local_experts": _tm.EXPERTS, "num_experts_per_tok": _tm.TOP_K}
    return llm.load(_save(tmp_path, config, _weights(config, 7)), dtype=dtype, progress=False)


def _run(decoder: DecodeM1, prompt: list[list[int]], steps: int) -> np.ndarray[Any, Any]:
    rows = [decoder.start(np.asarray(prompt, np.int32))]
    rows += [decoder.step() for _ in range(steps)]
    return np.stack(rows, axis=1)  # (batch, steps + 1)


def _eager(model: Any, prompt: list[list[int]], steps: int) -> np.ndarray[Any, Any]:
    state = model.new_state(len(prompt), len(prompt[0]) + steps + 1)
    logits = model.prefill(gp.from_numpy(np.asarray(prompt, np.int32)), state)
    out = gp.from_numpy(np.zeros(len(prompt), np.int32))
    rows = []
    for step in range(steps + 1):
        ops.greedy(logits, out)
        rows.append(out.to_numpy())
        if step < steps:
            logits = model.decode_step(out, state)
    return np.stack(rows, axis=1)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mixtral"])
def test_m1_equals_the_eager_decode_step(model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type)
    prompt = [[5, 17, 3, 40], [8, 2, 61, 33]]
    got = _run(DecodeM1(model, 2, 4 + 13), prompt, 12)
    assert np.array_equal(got, _eager(model, prompt, 12))


def _gpt2(tmp_path: Path) -> Any:
    """A random GPT-2 (learned positions, LayerNorm, biases everywhere, GELU tanh)."""
    config, weights = _tm._gpt2_config_weights()
    return llm.load(_save(tmp_path, config, weights), progress=False)


def test_gpt2_m1_and_graph_equal_the_eager_decode_step(tmp_path: Path) -> None:
    model = _gpt2(tmp_path)
    prompt = [[3, 50, 7, 7]]
    eager = _eager(model, prompt, 30)
    assert np.array_equal(_run(DecodeM1(model, 1, 35), prompt, 30), eager)
    assert np.array_equal(_run(DecodeM1Graph(model, 1, 35), prompt, 30), eager)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_k", "int8"])
def test_quantized_weights_run_m1_and_the_graph_where_it_can(fmt: str, tmp_path: Path) -> None:
    """GGUF block and per-channel INT8 weights decode through the graph too (their GEMVs write into the
    step's buffers), with the same tokens as m1 and the eager loop."""
    config = _config("llama")
    model = llm.load(_save(tmp_path, config, _weights(config, 7)), progress=False, quantize=fmt)
    options = {"max_new_tokens": 8, "temperature": 0.8, "seed": 2, "ignore_eos": True}
    eager = model.generate([3, 4, 5], strategy="eager", **options)
    assert model.generate([3, 4, 5], strategy="m1", **options) == eager
    assert model.generate([3, 4, 5], strategy="graph", **options) == eager


def test_m1_matches_a_float64_greedy_reference(tmp_path: Path) -> None:
    _reference = _tm._reference
    config = _config("llama")
    weights = _weights(config, 11)
    model = llm.load(_save(tmp_path, config, weights), progress=False)
    got = _run(DecodeM1(model, 1, 16), [[3, 4, 5]], 5)[0].tolist()
    expected = [3, 4, 5]
    for _ in range(6):
        expected.append(int(np.argmax(_reference(config, weights, expected)[-1])))
    assert got == expected[3:]


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampling"])
def test_graph_equals_m1_bitwise_for_256_steps(sampling: SamplingParams | None, tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen3")
    steps = 256
    m1 = _run(DecodeM1(model, 1, 6 + steps + 1, sampling, seed=123), PROMPT, steps)
    graph = DecodeM1Graph(model, 1, 6 + steps + 1, sampling, seed=123)
    assert graph.num_nodes > 0
    got = _run(graph, PROMPT, steps)
    assert np.array_equal(got, m1)
    if sampling is not None:
        assert len(set(m1[0].tolist())) > 10  # the sampler really samples
    again = _run(graph, PROMPT, 20)  # the same graph decodes a second prompt from position 0 again
    assert np.array_equal(again, m1[:, :21])


def test_steady_state_steps_allocate_nothing(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2")
    for kind in (DecodeM1, DecodeM1Graph):
        decoder = kind(model, 1, 32, SAMPLING, seed=5)
        decoder.start(np.asarray(PROMPT, np.int32))
        decoder.step()
        before = memory_stats()
        for _ in range(8):
            decoder.step()
        after = memory_stats()
        assert after["requests"] == before["requests"], kind.__name__
        assert after["in_use_bytes"] == before["in_use_bytes"], kind.__name__


def test_the_full_cache_is_refused(tmp_path: Path) -> None:
    model = _model(tmp_path)
    decoder = DecodeM1(model, 1, 8)
    decoder.start(np.asarray([[1, 2, 3, 4, 5, 6]], np.int32))
    decoder.step()
    decoder.step()
    with pytest.raises(ArgumentError, match="holds 8 positions"):
        decoder.step()


def test_generate_strategies_agree_and_check(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    prompt = PROMPT[0]
    outputs = {s: model.generate(prompt, max_new_tokens=24, temperature=0.8, seed=9, ignore_eos=True, strategy=s)
               for s in ("eager", "m1", "graph")}  # fmt: skip
    assert outputs["eager"] == outputs["m1"] == outputs["graph"]
    assert len(outputs["m1"]) == len(prompt) + 24
    batch = model.generate([prompt, prompt[:3]], max_new_tokens=8, temperature=0, ignore_eos=True, strategy="m1")
    eager = model.generate([prompt, prompt[:3]], max_new_tokens=8, temperature=0, ignore_eos=True, strategy="eager")
    assert batch == eager
    penalised = {"max_new_tokens": 10, "temperature": 0.7, "repetition_penalty": 1.3, "seed": 4, "ignore_eos": True}
    assert model.generate(prompt, strategy="m1", **penalised) == model.generate(prompt, strategy="eager", **penalised)
    with pytest.raises(UnsupportedStrategyError, match="repetition_penalty"):
        model.generate(prompt, strategy="graph", **penalised)
    with pytest.raises(ArgumentError, match="strategy must be one of"):
        model.generate(prompt, max_new_tokens=2, strategy="fast")


def test_graph_runs_dense_moe_and_refuses_quantized_experts(tmp_path: Path) -> None:
    """Dense experts: the router GEMV and moe_mlp write into DecodeM1's buffers (out=, workspace=), so
    the step is captured and replays the eager tokens; quantized experts allocate, the graph refuses."""
    from pygpukit.llm.loader import quantize_weights

    model = _model(tmp_path, "mixtral")
    prompt = [[5, 17, 3, 40]]
    m1 = DecodeM1(model, 1, 4 + 13)
    assert m1.moe_workspace is not None
    eager = _eager(model, prompt, 12)
    assert np.array_equal(_run(m1, prompt, 12), eager)
    assert np.array_equal(_run(DecodeM1Graph(model, 1, 4 + 13), prompt, 12), eager)
    text = model.generate(PROMPT[0], max_new_tokens=6, temperature=0, ignore_eos=True, strategy="graph")
    assert text == model.generate(PROMPT[0], max_new_tokens=6, temperature=0, ignore_eos=True, strategy="eager")
    quantize_weights(model.weights, "q8_0")  # HIDDEN 128: whole Q8_0 blocks, the experts too
    with pytest.raises(UnsupportedStrategyError, match="quantized MoE experts with float32 activations"):
        DecodeM1Graph(model, 1, 16)


@pytest.mark.parametrize("batch", [1, 24])
def test_graph_runs_quantized_moe_experts(tmp_path: Path, batch: int) -> None:
    """GGUF-quantized experts in a bf16 model: the router GEMV and moe_mlp write into DecodeM1's buffers
    (the grouped GEMV at batch 1, the grouped GEMM at 24 x 2 routed rows), so the step is captured and
    the graph replays DecodeM1's tokens; at batch 1 the step allocates nothing."""
    _quantized_moe_graph(tmp_path, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 24])
def test_gpu_graph_runs_quantized_moe_experts(tmp_path: Path, batch: int) -> None:
    _quantized_moe_graph(tmp_path, batch)


def _quantized_moe_graph(tmp_path: Path, batch: int) -> None:
    from pygpukit.llm.loader import quantize_weights
    from pygpukit.ops.quant import QuantizedExperts

    model = _model(tmp_path, "mixtral", dtype="bfloat16")
    quantize_weights(model.weights, "q8_0")
    assert isinstance(model.weights.layers[0].experts_gate_up, QuantizedExperts)
    prompt = [[5, 17, 3, 40][: 1 + i % 4] + [7] * (3 - i % 4) for i in range(batch)]
    m1 = DecodeM1(model, batch, 4 + 13)
    tokens = _run(m1, prompt, 12)
    assert np.array_equal(_run(DecodeM1Graph(model, batch, 4 + 13), prompt, 12), tokens)
    if batch > 8:  # the GGUF attention linears dequantize beyond the GEMV's 8 rows (they allocate)
        return
    m1.start(np.asarray(prompt, np.int32))
    m1.step()
    before = memory_stats()
    for _ in range(4):
        m1.step()
    assert memory_stats()["requests"] == before["requests"]


def test_default_strategy() -> None:
    from pygpukit.llm.decode import choose_strategy

    class Fake:
        backend = "cuda"
        weights = llm.ModelWeights(gp.zeros((2, 2), "float32"), [], gp.zeros(2, "float32"), gp.zeros((2, 2), "float32"))

    model: Any = Fake()
    assert choose_strategy(model, 1, None, None) == "graph"
    assert choose_strategy(model, 1, SAMPLING, None) == "graph"
    assert choose_strategy(model, 2, None, None) == "m1"
    assert choose_strategy(model, 1, SamplingParams(repetition_penalty=1.2), None) == "m1"
    Fake.backend = "cpu"
    assert choose_strategy(model, 1, None, None) == "m1"


def test_smollm2_graph_equals_m1(smollm2_gguf: Path) -> None:
    """The real model (dense weights): 256 steps on the GPU; on the CPU backend (slow) 4 greedy ones."""
    dtype = "bfloat16" if gp.backend_state().name == "cuda" else "float32"
    model = llm.load(smollm2_gguf, dtype=dtype, progress=False, keep_quantized=False)
    cuda = model.backend == "cuda"
    steps = 256 if cuda else 4
    assert model.tokenizer is not None
    prompt = [model.tokenizer.encode("The capital of France is")]
    length = len(prompt[0]) + steps + 1
    for sampling in (None, SAMPLING) if cuda else (None,):
        m1 = _run(DecodeM1(model, 1, length, sampling, seed=1), prompt, steps)
        graph = _run(DecodeM1Graph(model, 1, length, sampling, seed=1), prompt, steps)
        assert np.array_equal(graph, m1)


# -- on the GPU: real CUDA graphs -----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["qwen2", "mixtral"])
@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampling"])
def test_gpu_graph_equals_m1_bitwise_bf16(sampling: SamplingParams | None, model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type, dtype="bfloat16")
    steps = 256
    m1 = _run(DecodeM1(model, 1, 6 + steps + 1, sampling, seed=77), PROMPT, steps)
    graph = DecodeM1Graph(model, 1, 6 + steps + 1, sampling, seed=77)
    assert graph.num_nodes > 0
    assert np.array_equal(_run(graph, PROMPT, steps), m1)
    eager = model.generate(PROMPT[0], max_new_tokens=32, temperature=0, ignore_eos=True, strategy="eager")
    assert model.generate(PROMPT[0], max_new_tokens=32, temperature=0, ignore_eos=True) == eager  # default: graph


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
def test_gpu_steady_state_decode_allocates_nothing(model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type, dtype="bfloat16")
    for kind in (DecodeM1, DecodeM1Graph):
        decoder = kind(model, 1, 64, SAMPLING, seed=3)
        decoder.start(np.asarray(PROMPT, np.int32))
        decoder.step()
        gp.synchronize()
        before = memory_stats()
        for _ in range(16):
            decoder.step()
        gp.synchronize()
        after = memory_stats()
        assert after["requests"] == before["requests"], kind.__name__
        assert after["device_allocations"] == before["device_allocations"], kind.__name__


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_graph_runs_weight_only_quantized_models(fmt: str, tmp_path: Path) -> None:
    """FP8/INT8 per-channel and INT4 weights write their decode GEMV into the step's buffers
    (quantized_linear(out=)), so DecodeM1Graph takes them and replays DecodeM1's tokens."""
    from pygpukit.llm.loader import quantize_weights

    model = _model(tmp_path, "qwen2")
    quantize_weights(model.weights, fmt)
    assert not isinstance(model.weights.layers[0].wq, gp.GPUArray)
    prompt = [[5, 17, 3, 40]]
    m1 = _run(DecodeM1(model, 1, 4 + 9), prompt, 8)
    assert np.array_equal(_run(DecodeM1Graph(model, 1, 4 + 9), prompt, 8), m1)
    assert np.array_equal(m1, _eager(model, prompt, 8))


def test_weight_only_linear_into_out_allocates_nothing_new() -> None:
    """quantized_linear(out=) for the weight-only types writes the decode GEMV into out itself."""
    from pygpukit.ops.quant import quantize_per_channel, quantized_linear

    rng = np.random.default_rng(2)
    w = quantize_per_channel(rng.standard_normal((48, 64)).astype(np.float32), "fp8")
    x = gp.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    out = gp.empty((3, 48), gp.float32)
    assert quantized_linear(x, w, out=out) is out
    np.testing.assert_array_equal(out.to_numpy(), quantized_linear(x, w).to_numpy())
    with pytest.raises(gp.ShapeError, match="out must be a contiguous float32 array of"):
        quantized_linear(x, w, out=gp.empty((3, 47), gp.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_gpu_weight_only_graph_decode_allocates_nothing_and_equals_m1(fmt: str, tmp_path: Path) -> None:
    from pygpukit.llm.loader import quantize_weights

    model = _model(tmp_path, "qwen2", dtype="bfloat16")
    quantize_weights(model.weights, fmt)
    steps = 64
    m1 = _run(DecodeM1(model, 1, 6 + steps + 1), PROMPT, steps)
    graph = DecodeM1Graph(model, 1, 6 + steps + 1 + 8)  # room for the 8 steps counted below
    assert np.array_equal(_run(graph, PROMPT, steps), m1)
    gp.synchronize()
    before = memory_stats()
    for _ in range(8):
        graph.step()
    gp.synchronize()
    assert memory_stats()["requests"] == before["requests"]
