"""random_model: published shapes with random weights made on the device, and the LLM benchmark CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.errors import ArgumentError
from pygpukit.llm.benchmark import main as bench_main
from pygpukit.llm.shapes import MODEL_SHAPES, hf_tensor_shapes


def _host(array: gp.GPUArray) -> np.ndarray:
    return array.to_numpy().astype(np.float64)


@pytest.mark.parametrize("shape", sorted(MODEL_SHAPES))
def test_every_shape_builds_with_its_layout(shape: str) -> None:
    model = llm.random_model(shape, "float32", num_layers=2, pool_size=4099, progress=False)
    c, hf = model.config, MODEL_SHAPES[shape]
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (
        hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"], hf["vocab_size"])  # fmt: skip
    assert c.num_layers == 2
    assert len(model.weights.layers) == 2
    layer = model.weights.layers[1]
    assert layer.w_gate_up is not None
    assert layer.w_gate_up.shape == (2 * c.intermediate_size, c.hidden_size)
    assert (layer.bq is not None) == (c.spec.name == "qwen2")
    assert (layer.q_norm is not None) == (c.spec.name == "qwen3")
    assert (model.weights.lm_head is model.weights.embed) == bool(hf["tie_word_embeddings"])
    expected = sum(int(np.prod(s)) for s in hf_tensor_shapes(c).values()) * 4
    assert model.weights.nbytes == expected
    if c.hidden_size > 1024:  # the simulation's 7B-wide GEMVs are slow; the small shapes run the same code
        return
    tokens = model.generate(list(range(1, 12)), max_new_tokens=3, temperature=0, ignore_eos=True)
    assert len(tokens) == 14
    assert all(0 <= t < c.vocab_size for t in tokens)


def test_values_are_seeded_normal_and_norms_near_one() -> None:
    a = llm.random_model("smollm2-135m", "float32", num_layers=1, seed=5, std=0.05, progress=False)
    b = llm.random_model("smollm2-135m", "float32", num_layers=1, seed=5, std=0.05, progress=False)
    c = llm.random_model("smollm2-135m", "float32", num_layers=1, seed=6, std=0.05, progress=False)
    wa, wb, wc = (_host(m.weights.layers[0].w_down) for m in (a, b, c))
    assert np.array_equal(wa, wb)
    assert not np.array_equal(wa, wc)
    assert abs(wa.std() - 0.05) < 0.002
    assert abs(wa.mean()) < 0.002
    # Distinct tensors start at different places of the pool.
    assert not np.array_equal(_host(a.weights.layers[0].wq)[0, :64], _host(a.weights.layers[0].wo)[0, :64])
    norm = _host(a.weights.layers[0].attn_norm)
    assert abs(norm.mean() - 1.0) < 0.01
    assert norm.std() > 0.01


def test_bfloat16_and_a_config_mapping() -> None:
    hf = dict(MODEL_SHAPES["qwen2.5-0.5b"], num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=96, vocab_size=300)  # fmt: skip
    model = llm.random_model(hf, "bfloat16", progress=False)
    assert model.dtype == gp.bfloat16
    assert model.weights.embed.dtype == gp.bfloat16
    assert model.config.spec is llm.QWEN2_SPEC
    assert model.weights.embed.shape == (300, 64)


def test_moe_shapes() -> None:
    hf = {"model_type": "qwen3_moe", "vocab_size": 200, "hidden_size": 128, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 64,
          "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2}  # fmt: skip
    model = llm.random_model(hf, "float32", progress=False)
    layer = model.weights.layers[0]
    assert layer.experts_gate_up is not None
    assert layer.experts_gate_up.shape == (4, 32, 128)
    assert layer.experts_down is not None
    assert layer.experts_down.shape == (4, 128, 16)
    assert len(model.generate([1, 2, 3], max_new_tokens=2, temperature=0, ignore_eos=True)) == 5


@pytest.mark.parametrize("quant", ["q4_k", "q4_k_m"])
def test_packed_random_blocks_and_the_llama_cpp_mix(quant: str) -> None:
    """quant= keeps the linear weights packed; "q4_k_m" puts the head and the V and down projections of
    llama.cpp's layers (0, 3, 6 and 7 of 8) in Q6_K, everything else in Q4_K; the model decodes."""
    from pygpukit.ops.quant import QuantizedTensor

    hf = dict(MODEL_SHAPES["qwen2.5-0.5b"], num_hidden_layers=8, hidden_size=256, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=512, vocab_size=300, tie_word_embeddings=False)  # fmt: skip
    model = llm.random_model(hf, "bfloat16", quant=quant, progress=False)
    more = {0, 3, 6, 7} if quant == "q4_k_m" else set()
    for index, layer in enumerate(model.weights.layers):
        formats = {name: getattr(layer, name).format for name in ("wq", "wk", "wv", "wo", "w_gate_up", "w_down")
                   if isinstance(getattr(layer, name), QuantizedTensor)}  # fmt: skip
        assert set(formats) == {"wq", "wk", "wv", "wo", "w_gate_up", "w_down"}
        want = "Q6_K" if index in more else "Q4_K"
        assert formats == dict.fromkeys(formats, "Q4_K") | {"wv": want, "w_down": want}
    head = model.weights.lm_head
    assert isinstance(head, QuantizedTensor)
    assert head.format == ("Q6_K" if quant == "q4_k_m" else "Q4_K")
    assert len(model.generate([1, 2, 3], max_new_tokens=2, temperature=0, ignore_eos=True)) == 5


def test_bad_arguments() -> None:
    with pytest.raises(ArgumentError, match="unknown shape 'llama-9000'"):
        llm.random_model("llama-9000")
    with pytest.raises(ArgumentError, match="num_layers must be a positive int"):
        llm.random_model("smollm2-135m", num_layers=0)
    with pytest.raises(ArgumentError, match="std must be positive"):
        llm.random_model("smollm2-135m", std=float("nan"))
    with pytest.raises(ArgumentError, match="unsupported quantized format 'q4_k_x'"):
        llm.random_model("smollm2-135m", quant="q4_k_x", num_layers=1, progress=False)
    with pytest.raises(ArgumentError, match="GPT-2"):
        llm.random_model({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_head": 2, "n_layer": 1,
                          "n_positions": 16})  # fmt: skip


def test_benchmark_cli_on_the_cpu_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "llm.json"
    argv = ["--shapes", "smollm2-135m", "--num-layers", "1", "--tokens", "3", "--batches", "1,2", "--prompts", "8",
            "--decode-prompt", "5", "--repeats", "1", "--engine", "2", "--json", str(out)]  # fmt: skip
    assert bench_main(argv) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert [e["batch"] for e in row["decode"]] == [1, 2]
    assert all(e["ours"]["decode_tokens_per_s"] > 0 and len(e["ours"]["tokens"]) == e["batch"] for e in row["decode"])
    assert row["prefill"][0]["tokens"] == 8
    assert row["engine"]["requests"] == 2
    assert "| smollm2-135m | 2 |" in capsys.readouterr().out
    assert bench_main(["--shapes", "nope"]) == 2


def test_benchmark_cli_profiles_one_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--profile DIR: a kernel table of one eager decode per shape and its chrome trace."""
    argv = ["--shapes", "smollm2-135m", "--num-layers", "1", "--tokens", "3", "--batches", "1", "--prompts", "8",
            "--decode-prompt", "5", "--repeats", "1", "--profile", str(tmp_path / "prof")]  # fmt: skip
    assert bench_main(argv) == 0
    text = capsys.readouterr().out
    assert "kernel by kernel" in text
    assert "kernel launches" in text
    trace = json.loads((tmp_path / "prof" / "smollm2-135m-decode.json").read_text())
    assert trace["traceEvents"]


def test_benchmark_entry_point_forwards_llm() -> None:
    from pygpukit.benchmark import main as ops_main

    assert ops_main(["--llm", "--shapes", "nope"]) == 2
