"""HF checkpoints quantized to INT4 (config.json ``quantization_config``, quant_method "awq" / "gptq"):
a tiny random Llama written to disk in both packings (packed by pygpukit's packer, checked against a
slow unpacker written here from the format descriptions) loads with its linear weights kept packed
and gives the logits of the same model with the weights dequantized; ``load(..., quantize="int4")``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.errors import ArgumentError
from pygpukit.ops.quant import ActOrderError, Int4Tensor
from pygpukit.ops.quant.int4_pack import pack_qweight, pack_qzeros, quantize_groups

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, GROUP = 64, 128, 2, 2, 1, 64, 192, 64
PROJ = {"self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv", "self_attn.o_proj": "wo",
        "mlp.down_proj": "w_down"}  # fmt: skip
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: field i of a word holds column 8c + AWQ_PACK_ORDER[i]


def slow_weight(qweight: Any, qzeros: Any, scales: Any, packing: str, group: int) -> Any:
    """W (out, in) in float64 from a checkpoint's tensors, one 4-bit field at a time."""
    groups, n = scales.shape
    k = groups * group
    w = np.zeros((n, k))
    for r in range(k):
        for c in range(n):
            if packing == "awq":
                q = (int(qweight[r, c // 8]) & 0xFFFFFFFF) >> (4 * AWQ_PACK_ORDER.index(c % 8)) & 15
                z = (int(qzeros[r // group, c // 8]) & 0xFFFFFFFF) >> (4 * AWQ_PACK_ORDER.index(c % 8)) & 15
            else:
                q = (int(qweight[r // 8, c]) & 0xFFFFFFFF) >> (4 * (r % 8)) & 15
                z = ((int(qzeros[r // group, c // 8]) & 0xFFFFFFFF) >> (4 * (c % 8)) & 15) + 1
            w[c, r] = float(scales[r // group, c]) * (q - z)
    return w


def _checkpoint(tmp_path: Path, packing: str | None, **qc: Any) -> tuple[Path, dict[str, Any]]:
    """A random Llama; with ``packing`` its linear layers stored as an AWQ / GPTQ checkpoint does.
    Returns the directory and the float weights the checkpoint stands for (dequantized)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)

    def w(*shape: int, scale: float = 0.08) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    config: dict[str, Any] = {
        "model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "intermediate_size": INTER, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    }  # fmt: skip
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    dense = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, scale=1.0), "model.norm.weight": w(HIDDEN) + 1,
             "lm_head.weight": w(VOCAB, HIDDEN)}  # fmt: skip
    shapes = {"self_attn.q_proj": (q, HIDDEN), "self_attn.k_proj": (kv, HIDDEN), "self_attn.v_proj": (kv, HIDDEN),
              "self_attn.o_proj": (HIDDEN, q), "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
              "mlp.down_proj": (HIDDEN, INTER)}  # fmt: skip
    stored = dict(dense)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            stored[p + norm + ".weight"] = dense[p + norm + ".weight"] = w(HIDDEN) + 1
        for name, shape in shapes.items():
            weight = w(*shape)
            if packing is None:
                stored[p + name + ".weight"] = dense[p + name + ".weight"] = weight
                continue
            qv, zv, sv = quantize_groups(weight, GROUP, symmetric=packing == "gptq", min_zero=0)
            tensors = {"qweight": pack_qweight(qv, packing), "qzeros": pack_qzeros(zv, packing, 1), "scales": sv}
            if packing == "gptq":
                tensors["g_idx"] = (np.arange(shape[1]) // GROUP).astype(np.int32)
            stored |= {f"{p}{name}.{key}": value for key, value in tensors.items()}
            dense[p + name + ".weight"] = slow_weight(tensors["qweight"], tensors["qzeros"], sv, packing, GROUP)
    if packing is not None:
        settings = {"quant_method": packing, "bits": 4, "group_size": GROUP}
        settings |= {"version": "gemm", "zero_point": True} if packing == "awq" else {"desc_act": False, "sym": True}
        config["quantization_config"] = settings | qc
    directory = tmp_path / f"model-{packing}"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(stored, str(directory / "model.safetensors"))
    return directory, dense


def _dense_twin(tmp_path: Path, dense: dict[str, Any]) -> Any:
    from safetensors.numpy import save_file

    directory, _ = _checkpoint(tmp_path, None)
    save_file({k: np.asarray(v, np.float32) for k, v in dense.items()}, str(directory / "model.safetensors"))
    return llm.load(directory, dtype="float32", progress=False)


@pytest.mark.parametrize("packing", ["awq", "gptq"])
def test_hf_int4_checkpoint_loads_packed(tmp_path: Path, packing: str) -> None:
    path, dense = _checkpoint(tmp_path, packing)
    model = llm.load(path, dtype="float32", progress=False)
    for i, layer in enumerate(model.weights.layers):
        for name, attr in PROJ.items():
            value = getattr(layer, attr)
            assert isinstance(value, Int4Tensor), (attr, value)
            assert value.packing == packing
            want = dense[f"model.layers.{i}.{name}.weight"]
            np.testing.assert_array_equal(value.dequantize(gp.float32).to_numpy(), want.astype(np.float32))
        stacked = np.concatenate([dense[f"model.layers.{i}.mlp.{n}_proj.weight"] for n in ("gate", "up")])
        gate_up: Any = layer.w_gate_up
        assert isinstance(gate_up, Int4Tensor)
        np.testing.assert_array_equal(gate_up.dequantize(gp.float32).to_numpy(), stacked.astype(np.float32))
    twin = _dense_twin(tmp_path, dense)
    packed = sum(getattr(layer, a).nbytes for layer in model.weights.layers for a in (*PROJ.values(), "w_gate_up"))
    assert packed < model.weights.nbytes < 0.3 * twin.weights.nbytes  # about 0.56 bytes per linear weight
    for ids in ([3, 9, 27, 1, 50], list(range(12))):  # the GEMV (up to 8 rows) and the prefill path
        got = model.forward(ids).to_numpy().astype(np.float64)
        want = twin.forward(ids).to_numpy().astype(np.float64)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), ids
    if model.backend != "cuda":  # same float64 products on the CPU backend: the same greedy tokens
        tokens = model.generate([5, 6, 7], max_new_tokens=4, temperature=0)
        assert tokens == twin.generate([5, 6, 7], max_new_tokens=4, temperature=0)


def test_load_quantize_int4(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path, None)
    model = llm.load(path, dtype="float32", progress=False, quantize="INT4")
    twin = llm.load(path, dtype="float32", progress=False)
    dense = twin.forward([3, 9, 27]).to_numpy().astype(np.float64)
    for ql, dl in zip(model.weights.layers, twin.weights.layers, strict=True):
        for attr in (*PROJ.values(), "w_gate_up"):
            value = getattr(ql, attr)
            assert isinstance(value, Int4Tensor), attr
            assert value.group_size in (64, 128)
            setattr(dl, attr, value.dequantize(gp.float32))
    head: Any = model.weights.lm_head
    twin.weights.lm_head = head.dequantize(gp.float32)
    got = model.forward([3, 9, 27]).to_numpy().astype(np.float64)
    want = twin.forward([3, 9, 27]).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(got - dense).max() <= 0.3 * np.abs(dense).max()


def test_unsupported_quantization_configs(tmp_path: Path) -> None:
    path, _ = _checkpoint(tmp_path / "a", "gptq", desc_act=True)
    with pytest.raises(ActOrderError, match="desc_act"):
        llm.load(path, progress=False)
    path, _ = _checkpoint(tmp_path / "b", "awq", bits=8)
    with pytest.raises(ArgumentError, match="bits = 8"):
        llm.load(path, progress=False)
    path, _ = _checkpoint(tmp_path / "c", "awq", version="gemv")
    with pytest.raises(ArgumentError, match="'gemv'"):
        llm.load(path, progress=False)
    path, _ = _checkpoint(tmp_path / "d", "gptq", group_size=-1)
    with pytest.raises(ArgumentError, match="group_size"):
        llm.load(path, progress=False)
