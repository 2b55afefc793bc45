"""Decode fusions (pygpukit.llm.decode, CausalTransformerModel.fuse_qkv): the stacked QKV weight is
held once (wq, wk, wv become views) for dense, GGUF block-quantized and per-channel quantized weights;
the fused DecodeM1 / DecodeM1Graph (one QKV GEMV, RoPE fused with the KV-cache write; with fuse="all"
also the one-row GEMVs with the norms, SwiGLU and residual adds inside) give the unfused path's logits
within the dtype's tolerance and its tokens; the fused graph equals the fused DecodeM1 bit for bit.
On the CPU backend every fused step rounds where the op chain rounds, so fused and unfused agree
exactly there; the GPU-marked tests compare bfloat16 logits within tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.backend import backend_state
from pygpukit.core.memory import memory_stats
from pygpukit.llm import DecodeM1, DecodeM1Graph
from pygpukit.ops.quant import ChannelQuantizedTensor, QuantizedTensor

_tm = sibling("test_model")
_ds = sibling("test_decode_strategies")
PROMPT = [[5, 17, 3, 40, 22, 9]]


def _model(tmp_path: Path, model_type: str = "llama", dtype: Any = None, **load: Any) -> Any:
    config = _tm._config(model_type)
    config["max_position_embeddings"] = 512
    if model_type == "mixtral":
        config |= {"num_local_experts": _tm.EXPERTS, "num_experts_per_tok": _tm.TOP_K}
    return llm.load(_tm._save(tmp_path, config, _tm._weights(config, 7)), dtype=dtype, progress=False, **load)


def _teacher_forced_logits(decoder: DecodeM1, prompt: list[list[int]], tokens: np.ndarray[Any, Any]) -> list[Any]:
    """Logits (float64 host copies) after start() and after each step fed ``tokens[:, i]`` (the same
    inputs whatever the decoder samples)."""
    decoder.start(np.asarray(prompt, np.int32))
    out = []
    for i in range(tokens.shape[1]):
        decoder.tokens.copy_(tokens[:, i].astype(np.int32))
        decoder.step()
        out.append(decoder.logits.to_numpy().astype(np.float64))
    return out


# -- fuse_qkv: the weights are held once ------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "gpt2"])
def test_fuse_qkv_stacks_the_rows_and_keeps_one_copy(model_type: str, tmp_path: Path) -> None:
    model = _ds._gpt2(tmp_path) if model_type == "gpt2" else _model(tmp_path, model_type)
    layer = model.weights.layers[0]
    host = [getattr(layer, n).to_numpy().copy() for n in ("wq", "wk", "wv")]
    biases: list[Any] = [None if getattr(layer, n) is None else getattr(layer, n).to_numpy().copy()
                         for n in ("bq", "bk", "bv")]  # fmt: skip
    nbytes, in_use = model.weights.nbytes, memory_stats()["in_use_bytes"]
    assert model.fuse_qkv() == model.config.num_layers
    assert model.fuse_qkv() == 0  # idempotent
    assert model.weights.nbytes == nbytes
    assert memory_stats()["in_use_bytes"] <= in_use  # the originals were released
    fused = layer.w_qkv
    assert fused.to_numpy().tobytes() == np.concatenate(host, axis=0).tobytes()
    for name, want in zip(("wq", "wk", "wv"), host, strict=True):
        view = getattr(layer, name)
        assert view.buffer is fused.buffer
        assert view.to_numpy().tobytes() == want.tobytes()
    if biases[0] is not None:
        assert layer.b_qkv.to_numpy().tobytes() == np.concatenate(biases).tobytes()
        assert layer.bq.buffer is layer.b_qkv.buffer


@pytest.mark.parametrize("fmt", ["q8_0", "int8"])
def test_quantized_weights_stack_as_packed_rows(fmt: str, tmp_path: Path) -> None:
    model = _model(tmp_path, quantize=fmt)
    layer = model.weights.layers[0]
    kind = QuantizedTensor if fmt == "q8_0" else ChannelQuantizedTensor
    assert type(layer.wq) is kind
    dense = [getattr(layer, n).dequantize(gp.float32).to_numpy() for n in ("wq", "wk", "wv")]
    unfused = model.generate(PROMPT[0], max_new_tokens=6, temperature=0, ignore_eos=True, strategy="eager")
    assert model.fuse_qkv() == model.config.num_layers
    assert type(layer.w_qkv) is kind
    assert layer.wq.data.buffer is layer.w_qkv.data.buffer
    stacked = layer.w_qkv.dequantize(gp.float32).to_numpy()
    assert stacked.tobytes() == np.concatenate(dense, axis=0).tobytes()
    for strategy in ("eager", "m1"):
        got = model.generate(PROMPT[0], max_new_tokens=6, temperature=0, ignore_eos=True, strategy=strategy)
        assert got == unfused, strategy


def test_mixed_kinds_are_left_unstacked(tmp_path: Path) -> None:
    model = _model(tmp_path)
    layer = model.weights.layers[0]
    layer.wv = layer.wv.astype(gp.float16)
    assert model.fuse_qkv() == model.config.num_layers - 1
    assert layer.w_qkv is None
    assert model.weights.layers[1].w_qkv is not None


# -- fused decoding equals unfused ------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mixtral", "gpt2"])
@pytest.mark.parametrize("batch", [1, 2])
def test_fused_decode_equals_unfused(model_type: str, batch: int, tmp_path: Path) -> None:
    model = _ds._gpt2(tmp_path) if model_type == "gpt2" else _model(tmp_path, model_type)
    prompt = [[5, 17, 3, 40], [8, 2, 61, 33]][:batch]
    tokens = np.random.default_rng(3).integers(0, model.vocab_size, size=(batch, 10))
    unfused = DecodeM1(model, batch, 20, fuse=False)
    assert unfused.fusions == ()
    want = _teacher_forced_logits(unfused, prompt, tokens)
    fused = DecodeM1(model, batch, 20)
    rope = model.rope is not None
    qkv = model_type != "qwen3" or batch == 1  # QK-norm needs merged rows: fused QKV at batch 1 only
    assert fused.fusions == tuple(n for n, on in (("qkv", qkv), ("rope_kv", rope)) if on)
    got = _teacher_forced_logits(fused, prompt, tokens)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), step  # the CPU backend rounds each output once: exact
    greedy_unfused = _ds._run(DecodeM1(model, batch, 20, fuse=False), prompt, 12)
    assert np.array_equal(_ds._run(DecodeM1(model, batch, 20), prompt, 12), greedy_unfused)
    assert np.array_equal(_ds._eager(model, prompt, 12), greedy_unfused)  # eager runs the stacked weights too


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_fuse_all_runs_the_fused_gemvs_and_equals_unfused(model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type)
    tokens = np.random.default_rng(5).integers(0, model.vocab_size, size=(1, 10))
    want = _teacher_forced_logits(DecodeM1(model, 1, 20, fuse=False), PROMPT, tokens)
    decoder = DecodeM1(model, 1, 20, fuse="all")
    assert decoder.fusions == ("qkv", "rope_kv", "gemv")
    got = _teacher_forced_logits(decoder, PROMPT, tokens)
    # The CPU simulation rounds where the op chain rounds, so there the logits are bitwise equal; on the
    # GPU the fused GEMV sums each dot product in another order than the library's GEMV (seen on an
    # H100: relative differences of a few 1e-7), so there they agree within float32 rounding.
    exact = backend_state().name != "cuda"
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        if exact:
            assert np.array_equal(g, w), step
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()), err_msg=str(step))
    steps = 24
    m1 = _ds._run(DecodeM1(model, 1, 6 + steps + 1, _ds.SAMPLING, seed=2, fuse="all"), PROMPT, steps)
    graph = DecodeM1Graph(model, 1, 6 + steps + 1, _ds.SAMPLING, seed=2, fuse="all")
    plain = DecodeM1Graph(model, 1, 6 + steps + 1, _ds.SAMPLING, seed=2)
    assert graph.num_nodes < plain.num_nodes
    assert np.array_equal(_ds._run(graph, PROMPT, steps), m1)  # the same kernels: bitwise on every backend
    if exact:  # sampled tokens of differently rounded logits may part ways on the GPU
        assert np.array_equal(_ds._run(plain, PROMPT, steps), m1)


def test_fuse_all_falls_back_where_the_gemv_cannot_run(tmp_path: Path) -> None:
    model = _model(tmp_path, "llama")
    assert not DecodeM1(model, 2, 16, fuse="all").gemv  # batch 2
    assert not DecodeM1(_ds._gpt2(tmp_path / "gpt2"), 1, 16, fuse="all").gemv  # LayerNorm, GELU
    assert not DecodeM1(_model(tmp_path / "moe", "mixtral"), 1, 16, fuse="all").gemv  # MoE
    with pytest.raises(gp.ArgumentError, match="fuse must be True, False, 'all' or None"):
        DecodeM1(model, 1, 16, fuse="most")


def test_fused_graph_equals_fused_m1_bitwise(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2")
    steps = 64
    sampling = _ds.SAMPLING
    m1 = _ds._run(DecodeM1(model, 1, 6 + steps + 1, sampling, seed=5), PROMPT, steps)
    graph = DecodeM1Graph(model, 1, 6 + steps + 1, sampling, seed=5)
    assert graph.fusions == ("qkv", "rope_kv")
    assert np.array_equal(_ds._run(graph, PROMPT, steps), m1)
    unfused_graph = DecodeM1Graph(model, 1, 6 + steps + 1, sampling, seed=5, fuse=False)
    assert unfused_graph.num_nodes > graph.num_nodes  # fewer recorded calls when fused
    assert np.array_equal(_ds._run(unfused_graph, PROMPT, steps), m1)


def test_fused_prefill_equals_unfused(tmp_path: Path) -> None:
    model = _model(tmp_path, "qwen2")
    ids = gp.from_numpy(np.asarray([[5, 17, 3, 40, 22, 9], [1, 2, 3, 4, 5, 6]], np.int32))
    want = model.prefill(ids, all_logits=True).to_numpy()
    model.fuse_qkv()
    assert np.array_equal(model.prefill(ids, all_logits=True).to_numpy(), want)


# -- on the GPU ------------------------------------------------------------------------------------
def _close_bf16(got: Any, want: Any, what: str) -> None:
    scale = np.abs(want).max() + 1e-6
    err = np.abs(got - want).max() / scale
    assert err < 2e-2, f"{what}: max error {err:.3g} of the logits' scale"


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_gpu_fused_logits_match_unfused_bf16(model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type, dtype="bfloat16")
    tokens = np.random.default_rng(4).integers(0, model.vocab_size, size=(1, 16))
    want = _teacher_forced_logits(DecodeM1(model, 1, 32, fuse=False), PROMPT, tokens)
    for kind in (DecodeM1, DecodeM1Graph):
        got = _teacher_forced_logits(kind(model, 1, 32), PROMPT, tokens)
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            _close_bf16(g, w, f"{kind.__name__} step {step}")


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_gpu_fuse_all_logits_match_unfused_bf16(model_type: str, tmp_path: Path) -> None:
    model = _model(tmp_path, model_type, dtype="bfloat16")
    tokens = np.random.default_rng(6).integers(0, model.vocab_size, size=(1, 16))
    want = _teacher_forced_logits(DecodeM1(model, 1, 32, fuse=False), PROMPT, tokens)
    for kind in (DecodeM1, DecodeM1Graph):
        decoder = kind(model, 1, 32, fuse="all")
        assert decoder.gemv
        got = _teacher_forced_logits(decoder, PROMPT, tokens)
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            _close_bf16(g, w, f"{kind.__name__} step {step}")


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, "all"])
def test_gpu_fused_graph_equals_fused_m1_for_256_steps(fuse: Any, tmp_path: Path) -> None:
    model = _model(tmp_path, "llama", dtype="bfloat16")
    steps = 256
    for sampling in (None, _ds.SAMPLING):
        m1 = _ds._run(DecodeM1(model, 1, 6 + steps + 1, sampling, seed=9, fuse=fuse), PROMPT, steps)
        graph = DecodeM1Graph(model, 1, 6 + steps + 1, sampling, seed=9, fuse=fuse)
        assert np.array_equal(_ds._run(graph, PROMPT, steps), m1)


@pytest.mark.gpu
def test_gpu_smollm2_fused_matches_unfused(smollm2_gguf: Path) -> None:
    model = llm.load(smollm2_gguf, dtype="bfloat16", progress=False, keep_quantized=False)
    assert model.tokenizer is not None
    prompt = [model.tokenizer.encode("The capital of France is")]
    tokens = np.asarray([model.tokenizer.encode(" Paris. It is known for the Eiffel Tower")], np.int64)
    length = len(prompt[0]) + tokens.shape[1] + 1
    want = _teacher_forced_logits(DecodeM1(model, 1, length, fuse=False), prompt, tokens)
    for fuse in (True, "all"):
        decoder = DecodeM1Graph(model, 1, length, fuse=fuse)
        assert decoder.gemv == (fuse == "all")
        got = _teacher_forced_logits(decoder, prompt, tokens)
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            _close_bf16(g, w, f"fuse={fuse} step {step}")
            assert int(np.argmax(g)) == int(np.argmax(w)) or np.sort(w)[-1] - np.sort(w)[-2] < 0.25, step
    nbytes = model.weights.nbytes
    assert model.fuse_qkv() == 0  # the decoder stacked them already
    assert model.weights.nbytes == nbytes


# -- profiling ---------------------------------------------------------------------------------------
def test_decoding_is_profiled_in_named_ranges(tmp_path: Path) -> None:
    from pygpukit import profiling

    model = _model(tmp_path)
    for kind in (DecodeM1, DecodeM1Graph):
        decoder = kind(model, 1, 16)
        with profiling.Profiler() as prof:
            _ds._run(decoder, PROMPT, 3)
        names = [r.name for r in prof.ranges]
        assert names == ["llm.prefill"] + ["llm.decode_step"] * 3, kind.__name__
        assert all(r.duration_ms is not None for r in prof.ranges)
        assert [s.label for s in prof.memory][-1] == "stop"


def test_fuse_default_is_the_process_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path)
    monkeypatch.setattr(DecodeM1, "fuse_default", False)
    assert DecodeM1(model, 1, 8).fusions == ()
    assert model.weights.layers[0].w_qkv is None  # nothing stacked
    assert DecodeM1(model, 1, 8, fuse=True).fusions == ("qkv", "rope_kv")
