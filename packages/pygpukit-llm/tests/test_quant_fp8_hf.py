"""HF "fp8" block-quantized checkpoints (DeepSeek-V3 / Qwen3-FP8 layout: float8_e4m3fn ``weight`` with
float32 ``weight_scale_inv`` per 128x128 block, config.json ``quantization_config`` quant_method "fp8"
with ``weight_block_size`` [128, 128]): a tiny random model written to disk loads with its linear weights
kept as BlockFP8Tensor and gives the logits of a dense checkpoint holding the dequantized weights.
Also ``load(..., quantize="q4_k" | "q6_k")`` (the k-quant quantizers) on the dense checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
import pygpukit.llm as llm
from pygpukit.core.errors import ArgumentError
from pygpukit.ops.quant import BlockFP8Tensor, QuantizedTensor

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 256, 2, 4, 2, 64, 256
LINEAR = ("wq", "wk", "wv", "wo", "w_gate_up", "w_down")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def _block_quantize(w: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """fp8 values and per-128x128-block float32 scales (random scales, as a checkpoint would have)."""
    n, k = w.shape
    grid = (-(-n // 128), -(-k // 128))
    scale = rng.uniform(0.5e-3, 2e-3, grid).astype(np.float32)
    full = np.repeat(np.repeat(scale, 128, axis=0)[:n], 128, axis=1)[:, :k]
    return np.clip(w / full, -448, 448).astype(ml_dtypes.float8_e4m3fn), scale


def _dequantized(data: np.ndarray, scale: np.ndarray) -> np.ndarray:
    n, k = data.shape
    full = np.repeat(np.repeat(scale, 128, axis=0)[:n], 128, axis=1)[:, :k]
    result: np.ndarray = data.astype(np.float32) * full
    return result


Pack = Callable[[np.ndarray, np.random.Generator], tuple[dict[str, np.ndarray], np.ndarray]]


def _pack_blocks(w: np.ndarray, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    data, scale = _block_quantize(w, rng)
    return {"weight": data, "weight_scale_inv": scale}, _dequantized(data, scale)


def _checkpoints(tmp_path: Path, quantization: Mapping[str, object], pack: Pack = _pack_blocks) -> tuple[Path, Path]:
    """A quantized checkpoint and its dense twin (the same weights, dequantized to float32). ``pack``
    turns a projection's float32 weight into its stored tensors (by name suffix) and their dequantized
    value; the default stores HF "fp8" 128x128 blocks."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    config = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "intermediate_size": INTER, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0}  # fmt: skip
    shapes = _SHAPES
    common = {"model.embed_tokens.weight": w(VOCAB, HIDDEN, scale=1.0), "model.norm.weight": w(HIDDEN) + 1,
              "lm_head.weight": w(VOCAB, HIDDEN)}  # fmt: skip
    fp8: dict[str, np.ndarray] = dict(common)
    dense: dict[str, np.ndarray] = dict(common)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for norm in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            fp8[p + norm] = dense[p + norm] = w(HIDDEN) + 1
        for name in PROJECTIONS:
            stored, dequantized = pack(w(*shapes[name]), rng)
            fp8 |= {f"{p}{name}.{suffix}": value for suffix, value in stored.items()}
            dense[p + name + ".weight"] = dequantized
    paths = []
    for label, tensors, extra in (("fp8", fp8, {"quantization_config": quantization}), ("dense", dense, {})):
        directory = tmp_path / label
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config | extra))
        save_file(tensors, str(directory / "model.safetensors"))
        paths.append(directory)
    return paths[0], paths[1]


_Q, _KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
_SHAPES = {"self_attn.q_proj": (_Q, HIDDEN), "self_attn.k_proj": (_KV, HIDDEN), "self_attn.v_proj": (_KV, HIDDEN),
           "self_attn.o_proj": (HIDDEN, _Q), "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
           "mlp.down_proj": (HIDDEN, INTER)}  # fmt: skip
FP8_CONFIG: dict[str, object] = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}


def test_fp8_checkpoint_keeps_block_weights_and_matches_the_dense_model(tmp_path: Path) -> None:
    from pygpukit.llm.safetensors import load_safetensors

    fp8_path, dense_path = _checkpoints(tmp_path, FP8_CONFIG)
    model = llm.load(fp8_path, dtype="float32", progress=False)
    dense = llm.load(dense_path, dtype="float32", progress=False)
    stored = load_safetensors(fp8_path / "model.safetensors")
    for i, layer in enumerate(model.weights.layers):
        for attr in LINEAR:
            value = getattr(layer, attr)
            assert isinstance(value, BlockFP8Tensor), (attr, type(value))
            assert value.block == (128, 128)
        p = f"model.layers.{i}."
        wq: object = layer.wq
        assert isinstance(wq, BlockFP8Tensor)
        raw = stored.numpy(p + "self_attn.q_proj.weight")
        np.testing.assert_array_equal(wq.data.to_numpy().view(np.uint8), raw.view(np.uint8))
        np.testing.assert_array_equal(wq.scale.to_numpy(), stored.numpy(p + "self_attn.q_proj.weight_scale_inv"))
        gate_up: object = layer.w_gate_up
        assert isinstance(gate_up, BlockFP8Tensor)
        assert gate_up.shape == (2 * INTER, HIDDEN)
        assert gate_up.scale.shape == (2 * INTER // 128, HIDDEN // 128)
    linear_bytes = sum(4 * int(np.prod(shape)) for shape in _SHAPES.values()) * LAYERS  # float32 in the twin
    fp8_bytes = sum(int(np.prod(shape)) + 4 * -(-shape[0] // 128) * -(-shape[1] // 128) for shape in _SHAPES.values())
    assert model.weights.nbytes == dense.weights.nbytes - linear_bytes + fp8_bytes * LAYERS
    ids = [3, 9, 27, 1, 50, 7, 7, 2, 60, 11]  # 10 tokens: the prefill path too
    want = dense.forward(ids).to_numpy().astype(np.float64)
    # "dynamic" activations: the prefill quantizes x to e4m3 per 1x128 group (W8A8), as transformers
    # runs such a checkpoint: about e4m3's 2^-4 relative rounding of every input feature.
    assert all(getattr(layer, attr).activation_scheme == "dynamic" for layer in model.weights.layers for attr in LINEAR)
    got = model.forward(ids).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()
    for layer in model.weights.layers:  # W8A16: the weights dequantized, x as it is
        for attr in LINEAR:
            getattr(layer, attr).activation_scheme = None
    got = model.forward(ids).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    tokens = model.generate([3, 9, 27], max_new_tokens=4, temperature=0, ignore_eos=True)
    assert tokens == dense.generate([3, 9, 27], max_new_tokens=4, temperature=0, ignore_eos=True)


def test_fp8_checkpoint_without_block_size_is_refused(tmp_path: Path) -> None:
    fp8_path, _ = _checkpoints(tmp_path, {"quant_method": "fp8", "activation_scheme": "static"})
    with pytest.raises(ArgumentError, match="weight_block_size"):
        llm.load(fp8_path, dtype="float32", progress=False)


@pytest.mark.parametrize("fmt", ["q4_k", "Q6_K"])
def test_load_quantize_k_quants_equals_the_dequantized_model(tmp_path: Path, fmt: str) -> None:
    _, dense_path = _checkpoints(tmp_path, FP8_CONFIG)
    model = llm.load(dense_path, dtype="float32", progress=False, quantize=fmt)
    twin = llm.load(dense_path, dtype="float32", progress=False)
    ids = [3, 9, 27, 1, 50]
    dense = twin.forward(ids).to_numpy().astype(np.float64)
    for ql, dl in zip(model.weights.layers, twin.weights.layers, strict=True):
        for attr in LINEAR:
            value = getattr(ql, attr)
            assert isinstance(value, QuantizedTensor), (attr, type(value))
            assert value.format == fmt.upper()
            setattr(dl, attr, value.dequantize(gp.float32))
    head = model.weights.lm_head  # untied: quantized too
    assert isinstance(head, QuantizedTensor)
    twin.weights.lm_head = head.dequantize(gp.float32)
    got = model.forward(ids).to_numpy().astype(np.float64)
    want = twin.forward(ids).to_numpy().astype(np.float64)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(got - dense).max() <= 0.2 * np.abs(dense).max()  # and still the model it was


@pytest.mark.gpu
def test_gpu_fp8_checkpoint_matches_the_dense_model(tmp_path: Path) -> None:
    fp8_path, dense_path = _checkpoints(tmp_path, FP8_CONFIG)
    for dtype in ("float32", "bfloat16"):
        model = llm.load(fp8_path, dtype=dtype, progress=False)
        dense = llm.load(dense_path, dtype=dtype, progress=False)
        for ids in ([3, 9, 27], [3, 9, 27, 1, 50, 7, 7, 2, 60, 11, 5, 5]):
            got = model.forward(ids).to_numpy().astype(np.float64)
            want = dense.forward(ids).to_numpy().astype(np.float64)
            # up to 8 tokens the block-FP8 GEMV reads the weights exactly (W8A16); the 12-token prefill of
            # this "dynamic" checkpoint quantizes x to fp8 (W8A8 on Hopper), an error of its own
            tolerance = 1e-3 if dtype == "float32" and len(ids) <= 8 else 5e-2
            assert np.abs(got - want).max() <= tolerance * np.abs(want).max()
