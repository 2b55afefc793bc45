"""Quantized linear weights in models: ``load(..., quantize=fmt)`` on a small random checkpoint, and a
GGUF file whose linear weights are Q8_0/Q4_0 blocks kept packed (``keep_quantized``, the default).
Each quantized model must give the logits of the same model with those weights dequantized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.errors import ArgumentError
from pygpukit.ops.quant import ChannelQuantizedTensor, QuantizedTensor

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 128, 2, 4, 2, 64, 192
LINEAR = ("wq", "wk", "wv", "wo", "w_gate_up", "w_down")


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    config = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "intermediate_size": INTER, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0}  # fmt: skip
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    weights = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, scale=1.0), "model.norm.weight": w(HIDDEN) + 1,
               "lm_head.weight": w(VOCAB, HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {p + "input_layernorm.weight": w(HIDDEN) + 1, p + "post_attention_layernorm.weight": w(HIDDEN) + 1,
                    p + "self_attn.q_proj.weight": w(q, HIDDEN), p + "self_attn.k_proj.weight": w(kv, HIDDEN),
                    p + "self_attn.v_proj.weight": w(kv, HIDDEN), p + "self_attn.o_proj.weight": w(HIDDEN, q),
                    p + "mlp.gate_proj.weight": w(INTER, HIDDEN), p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                    p + "mlp.down_proj.weight": w(HIDDEN, INTER)}  # fmt: skip
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, str(directory / "model.safetensors"))
    return directory, weights


def _dequantized_twin(model: Any, twin: Any) -> None:
    """Give ``twin`` (a dense load of the same checkpoint) ``model``'s quantized weights, dequantized."""
    for ql, dl in zip(model.weights.layers, twin.weights.layers, strict=True):
        for attr in LINEAR:
            value = getattr(ql, attr)
            assert isinstance(value, (QuantizedTensor, ChannelQuantizedTensor)), (attr, type(value))
            setattr(dl, attr, value.dequantize(gp.float32))
    head = model.weights.lm_head
    if head is not model.weights.embed:
        assert isinstance(head, (QuantizedTensor, ChannelQuantizedTensor))
        twin.weights.lm_head = head.dequantize(gp.float32)


@pytest.mark.parametrize("fmt", ["q8_0", "Q4_1", "q5_0", "fp8", "int8"])
def test_load_quantize_equals_the_dequantized_model(tmp_path: Path, fmt: str) -> None:
    path, _ = _checkpoint(tmp_path)
    model = llm.load(path, dtype="float32", progress=False, quantize=fmt)
    twin = llm.load(path, dtype="float32", progress=False)
    dense = twin.forward([3, 9, 27, 1, 50]).to_numpy().astype(np.float64)
    _dequantized_twin(model, twin)
    assert model.weights.nbytes < 0.5 * twin.weights.nbytes + VOCAB * HIDDEN * 4
    ids = [3, 9, 27, 1, 50]
    got = model.forward(ids).to_numpy().astype(np.float64)
    want = twin.forward(ids).to_numpy().astype(np.float64)
    scale = np.abs(want).max()
    if model.backend != "cuda" and fmt.upper() not in ("FP8", "INT8"):
        np.testing.assert_array_equal(got, want)  # same float32 weights, float64 products on the CPU backend
    assert np.abs(got - want).max() <= 1e-4 * scale
    assert np.abs(got - dense).max() <= 0.2 * np.abs(dense).max()  # and still the model it was
    text = model.generate([3, 9, 27], max_new_tokens=3, temperature=0, ignore_eos=True)
    assert len(text) == 6


def test_load_quantize_refuses_unknown_formats(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path)
    with pytest.raises(ArgumentError, match="'q7_k'"):
        llm.load(path, progress=False, quantize="q7_k")


def _gguf_file(tmp_path: Path, weights: dict[str, np.ndarray], formats: dict[str, str]) -> Path:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    for i in range(LAYERS):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        tensor = weights[hf]
        heads = HEADS if gg.endswith("attn_q.weight") else KV_HEADS if gg.endswith("attn_k.weight") else 0
        if heads:  # llama.cpp's interleaving of the two rotary halves
            rows = tensor.shape[0]
            tensor = tensor.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(tensor.shape)
        kind = next((f for suffix, f in formats.items() if gg.endswith(suffix)), None)
        if kind is None:
            writer.add_tensor(gg, np.ascontiguousarray(tensor))
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            raw = gguf.quants.quantize(np.ascontiguousarray(tensor), qtype)
            writer.add_tensor(gg, raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_blocks_stay_packed_and_equal_the_dequantized_load(tmp_path: Path) -> None:
    _, weights = _checkpoint(tmp_path)
    formats = {"attn_q.weight": "Q8_0", "attn_k.weight": "Q4_0", "attn_v.weight": "Q5_1", "attn_output.weight": "Q8_0",
               "ffn_gate.weight": "Q4_1", "ffn_up.weight": "Q4_1", "ffn_down.weight": "Q8_0",
               "output.weight": "Q8_0"}  # fmt: skip
    path = _gguf_file(tmp_path, weights, formats)
    native = llm.load(path, progress=False)
    dequantized = llm.load(path, progress=False, keep_quantized=False)
    layer = native.weights.layers[0]
    assert isinstance(layer.wk, QuantizedTensor)
    assert (layer.wq.format, layer.wk.format, layer.w_gate_up.format) == ("Q8_0", "Q4_0", "Q4_1")  # type: ignore[union-attr]
    assert isinstance(native.weights.lm_head, QuantizedTensor)
    assert isinstance(dequantized.weights.layers[0].wq, gp.GPUArray)
    ids = [5, 17, 33, 2, 60, 41]
    got = native.forward(ids).to_numpy().astype(np.float64)
    want = dequantized.forward(ids).to_numpy().astype(np.float64)
    if native.backend != "cuda":
        np.testing.assert_array_equal(got, want)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
