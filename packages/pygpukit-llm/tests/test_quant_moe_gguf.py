"""GGUF MoE experts kept in their block formats: a tiny qwen3moe file whose ffn_gate_exps / ffn_up_exps /
ffn_down_exps are Q8_0, Q4_K and Q6_K blocks loads them as QuantizedExperts (``keep_quantized``, the
default), holds fewer bytes than the dequantized load and gives its logits and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm
import pygpukit.ops as ops
from pygpukit.ops.quant import QuantizedExperts, QuantizedTensor

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 256, 2, 4, 2, 64
EXPERTS, USED, EXPERT_INTER = 4, 2, 256
IDS = [5, 17, 33, 2, 60, 41]


def _quantized_bytes(gguf: object, tensor: np.ndarray, kind: str) -> np.ndarray:
    """``tensor`` (..., K) in the GGUF block format ``kind`` as the file stores it: (..., bytes of a row)."""
    qtype = gguf.GGMLQuantizationType[kind]  # type: ignore[attr-defined]
    try:
        raw: np.ndarray = gguf.quants.quantize(np.ascontiguousarray(tensor), qtype)  # type: ignore[attr-defined]
        return raw
    except NotImplementedError:  # gguf-py has no k-quant quantizers: pygpukit's own, same block layout
        flat = np.ascontiguousarray(tensor.reshape(-1, tensor.shape[-1]))
        q = ops.quantize(flat, kind.lower())
        assert isinstance(q, QuantizedTensor)
        return q.data.to_numpy().reshape(*tensor.shape[:-1], -1)


def _moe_gguf(tmp_path: Path, formats: dict[str, str]) -> Path:
    """A random 2-layer qwen3moe GGUF file; ``formats`` maps a tensor name (or a suffix of it, the
    first that matches) to its GGUF block format, the other tensors are F32."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(11)

    def w(*shape: int, scale: float = 0.06) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tensors = {"token_embd.weight": w(VOCAB, HIDDEN, scale=1.0), "output_norm.weight": w(HIDDEN) + 1,
               "output.weight": w(VOCAB, HIDDEN)}  # fmt: skip
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensors |= {p + "attn_norm.weight": w(HIDDEN) + 1, p + "ffn_norm.weight": w(HIDDEN) + 1,
                    p + "attn_q.weight": w(q, HIDDEN), p + "attn_k.weight": w(kv, HIDDEN),
                    p + "attn_v.weight": w(kv, HIDDEN), p + "attn_output.weight": w(HIDDEN, q),
                    p + "attn_q_norm.weight": w(HEAD_DIM) + 1, p + "attn_k_norm.weight": w(HEAD_DIM) + 1,
                    p + "ffn_gate_inp.weight": w(EXPERTS, HIDDEN, scale=0.5),
                    p + "ffn_gate_exps.weight": w(EXPERTS, EXPERT_INTER, HIDDEN),
                    p + "ffn_up_exps.weight": w(EXPERTS, EXPERT_INTER, HIDDEN),
                    p + "ffn_down_exps.weight": w(EXPERTS, HIDDEN, EXPERT_INTER)}  # fmt: skip
    path = tmp_path / "moe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(LAYERS)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(4 * HIDDEN)
    writer.add_expert_feed_forward_length(EXPERT_INTER)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    for name, tensor in tensors.items():  # numpy dim order; the writer stores the GGUF dims reversed
        kind = formats.get(name) or next((f for suffix, f in formats.items() if name.endswith(suffix)), None)
        if kind is None:
            writer.add_tensor(name, np.ascontiguousarray(tensor))
        else:
            raw = _quantized_bytes(gguf, tensor, kind)
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


FORMATS = {"blk.0.ffn_gate_exps.weight": "Q8_0", "blk.0.ffn_up_exps.weight": "Q8_0",
           "blk.0.ffn_down_exps.weight": "Q6_K", "blk.1.ffn_gate_exps.weight": "Q4_K",
           "blk.1.ffn_up_exps.weight": "Q4_K", "blk.1.ffn_down_exps.weight": "Q8_0", "attn_q.weight": "Q8_0",
           "attn_k.weight": "Q8_0", "attn_v.weight": "Q8_0", "attn_output.weight": "Q8_0",
           "output.weight": "Q8_0"}  # fmt: skip


def test_gguf_moe_experts_stay_packed_and_equal_the_dequantized_load(tmp_path: Path) -> None:
    path = _moe_gguf(tmp_path, FORMATS)
    native = llm.load(path, progress=False)
    dense = llm.load(path, progress=False, keep_quantized=False)
    assert native.config.spec.moe
    assert native.config.num_experts == EXPERTS
    want_formats = [("Q8_0", "Q6_K"), ("Q4_K", "Q8_0")]
    for layer, (gate_up_fmt, down_fmt) in zip(native.weights.layers, want_formats, strict=True):
        assert isinstance(layer.experts_gate_up, QuantizedExperts)
        assert isinstance(layer.experts_down, QuantizedExperts)
        assert (layer.experts_gate_up.format, layer.experts_down.format) == (gate_up_fmt, down_fmt)
        assert layer.experts_gate_up.shape == (EXPERTS, 2 * EXPERT_INTER, HIDDEN)
        assert layer.experts_down.shape == (EXPERTS, HIDDEN, EXPERT_INTER)
    for layer in dense.weights.layers:
        assert isinstance(layer.experts_gate_up, gp.GPUArray)
        assert isinstance(layer.experts_down, gp.GPUArray)
    # The packed rows are the dense load's weights: per expert its gate rows, then its up rows.
    for ql, dl in zip(native.weights.layers, dense.weights.layers, strict=True):
        assert isinstance(ql.experts_gate_up, QuantizedExperts)
        assert isinstance(ql.experts_down, QuantizedExperts)
        assert isinstance(dl.experts_gate_up, gp.GPUArray)
        assert isinstance(dl.experts_down, gp.GPUArray)
        np.testing.assert_array_equal(ql.experts_gate_up.dequantize(gp.float32).to_numpy(),
                                      dl.experts_gate_up.to_numpy())  # fmt: skip
        np.testing.assert_array_equal(ql.experts_down.dequantize(gp.float32).to_numpy(), dl.experts_down.to_numpy())
    experts_dense = sum(EXPERTS * 3 * EXPERT_INTER * HIDDEN * 4 for _ in range(LAYERS))
    assert native.weights.nbytes < dense.weights.nbytes - 0.6 * experts_dense
    got = native.forward(IDS).to_numpy().astype(np.float64)
    want = dense.forward(IDS).to_numpy().astype(np.float64)
    assert got.shape == (len(IDS), VOCAB)
    scale = np.abs(want).max()
    # The expert weights are bit-identical (above), but the dense moe_mlp and the per-expert quantized
    # linear round their float32 products differently, so the logits agree to float32 rounding only.
    if native.backend != "cuda":
        assert np.abs(got - want).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 1e-4 * scale
    a = native.generate(IDS, max_new_tokens=4, temperature=0, ignore_eos=True)
    b = dense.generate(IDS, max_new_tokens=4, temperature=0, ignore_eos=True)
    assert a == b
    assert len(a) == len(IDS) + 4


def test_gguf_moe_quantize_leaves_the_packed_experts(tmp_path: Path) -> None:
    path = _moe_gguf(tmp_path, FORMATS)
    model = llm.load(path, progress=False, quantize="q8_0")
    layer = model.weights.layers[1]
    assert isinstance(layer.experts_gate_up, QuantizedExperts)
    assert layer.experts_gate_up.format == "Q4_K"
    assert isinstance(layer.experts_down, QuantizedExperts)
    assert layer.experts_down.format == "Q8_0"
    assert model.forward(IDS[:3]).shape == (3, VOCAB)


def test_gguf_moe_mixed_gate_up_formats_load_dense(tmp_path: Path) -> None:
    formats = dict(FORMATS)
    formats["blk.0.ffn_up_exps.weight"] = "Q4_0"  # gate Q8_0, up Q4_0: no one packed gate/up stack
    path = _moe_gguf(tmp_path, formats)
    native = llm.load(path, progress=False)
    dense = llm.load(path, progress=False, keep_quantized=False)
    first, second = native.weights.layers
    assert isinstance(first.experts_gate_up, gp.GPUArray)
    assert isinstance(first.experts_down, gp.GPUArray)
    assert first.experts_gate_up.shape == (EXPERTS, 2 * EXPERT_INTER, HIDDEN)
    assert isinstance(second.experts_gate_up, QuantizedExperts)  # the other layer's experts stay packed
    got = native.forward(IDS).to_numpy().astype(np.float64)
    want = dense.forward(IDS).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_load_quantize_turns_dense_experts_into_blocks() -> None:
    """quantize_weights (load(..., quantize=fmt)) makes QuantizedExperts of dense expert stacks for the
    GGUF formats; the model then equals the same model with those experts dequantized."""
    from pygpukit.llm.loader import quantize_weights
    from pygpukit.ops.quant import QuantizedExperts

    hf = {"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 256, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 256,
          "moe_intermediate_size": 256, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}  # fmt: skip
    model = llm.random_model(hf, "float32", seed=3, std=0.05, progress=False)
    twin = llm.random_model(hf, "float32", seed=3, std=0.05, progress=False)
    quantize_weights(model.weights, "q8_0")
    for ql, dl in zip(model.weights.layers, twin.weights.layers, strict=True):
        assert isinstance(ql.experts_gate_up, QuantizedExperts)
        assert isinstance(ql.experts_down, QuantizedExperts)
        assert ql.experts_gate_up.format == "Q8_0"
        dl.experts_gate_up = ql.experts_gate_up.dequantize("float32")
        dl.experts_down = ql.experts_down.dequantize("float32")
        for attr in ("wq", "wk", "wv", "wo"):
            setattr(dl, attr, getattr(ql, attr).dequantize(gp.float32))
    assert isinstance(model.weights.lm_head, QuantizedTensor)  # untied: quantized too
    twin.weights.lm_head = model.weights.lm_head.dequantize(gp.float32)
    ids = [3, 9, 27, 1, 50]
    got = model.forward(ids).to_numpy().astype(np.float64)
    want = twin.forward(ids).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
