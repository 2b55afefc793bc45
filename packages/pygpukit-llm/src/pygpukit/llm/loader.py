"""Loading models: a Hugging Face checkpoint directory, a safetensors file (or sharded index) or a
GGUF file becomes a :class:`CausalTransformerModel` with its tokenizer and chat template.

Weights are uploaded in their stored form and converted on the device (dtype casts, GPT-2's Conv1D
transposes, stacking gate/up projections and experts, GGUF block dequantization and the inverse of
llama.cpp's Q/K row permutation); nothing is dequantized or transposed on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import DType, as_dtype
from pygpukit.core.errors import ArgumentError, PyGPUkitError
from pygpukit.ops.quant import (
    QUANT_FORMATS,
    ActOrderError,
    ChannelQuantizedTensor,
    Int4Tensor,
    QuantizedExperts,
    QuantizedTensor,
    quantize_experts,
)
from pygpukit.ops.quant.fp8_block import BlockFP8Tensor, concat_rows
from pygpukit.ops.quant.int4 import concat_out_features

from .config import (
    GPT2_SPEC,
    MIXTRAL_SPEC,
    ModelConfigError,
    ModelSpec,
    TransformerConfig,
    config_from_gguf_metadata,
    config_from_hf,
    detect_model_spec,
    load_hf_config,
)
from .model import CausalTransformerModel, LayerWeights, ModelWeights

__all__ = ["LOAD_QUANTIZE", "MissingWeightError", "load", "load_gguf", "load_model_from_safetensors",
           "quantize_weights"]  # fmt: skip

_DTYPES = ("float32", "float16", "bfloat16")


class MissingWeightError(PyGPUkitError, KeyError):
    """A tensor the architecture needs is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _model_dtype(dtype: Any, default: str) -> DType:
    name = default if dtype is None else as_dtype(dtype).name
    if name not in _DTYPES:
        raise ArgumentError(f"model dtype must be one of {', '.join(_DTYPES)}, got {name}")
    return as_dtype(name)


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", disable=None if enabled else True, leave=False)


class _Source:
    """Named weights on the device, in the model dtype, from some checkpoint."""

    def __init__(self, names: Sequence[str], fetch: Callable[[str, DType], GPUArray], dtype: DType,
                 progress: Any) -> None:  # fmt: skip
        self.names = set(names)
        self._fetch = fetch
        self.dtype = dtype
        self._progress = progress

    def has(self, name: str) -> bool:
        return name in self.names

    def get(self, name: str, dtype: DType | None = None) -> GPUArray:
        if name not in self.names:
            raise MissingWeightError(f"the checkpoint has no tensor {name!r}")
        array = self._fetch(name, dtype or self.dtype)
        self._progress.update(1)
        return array

    def first(self, *names: str) -> GPUArray:
        for name in names:
            if name in self.names:
                return self.get(name)
        raise MissingWeightError(f"the checkpoint has none of the tensors {', '.join(repr(n) for n in names)}")

    def optional(self, name: str) -> GPUArray | None:
        return self.get(name) if name in self.names else None


def _stack_rows(parts: Sequence[Any]) -> Any:
    """Arrays of one trailing shape stacked along the first axis, on the device (INT4 weights of an
    AWQ/GPTQ checkpoint along their output features)."""
    if isinstance(parts[0], Int4Tensor):
        return concat_out_features(parts)
    if isinstance(parts[0], BlockFP8Tensor):  # an HF "fp8" checkpoint's block-scaled weights
        return concat_rows(parts)
    if isinstance(parts[0], ChannelQuantizedTensor):  # per-channel 8-bit weights: rows and their scales
        if len({(p.kind, p.shape[1], p.activation_scheme) for p in parts}) != 1:
            raise ModelConfigError(f"stacked weights differ in kind, K or activation scheme: "
                                   f"{[(p.kind, p.shape, p.activation_scheme) for p in parts]}")  # fmt: skip
        return parts[0].with_rows(ops.concatenate([p.data for p in parts], axis=0),
                                  ops.concatenate([p.scale for p in parts], axis=0))  # fmt: skip
    if isinstance(parts[0], QuantizedTensor):  # GGUF blocks of one format: the raw rows concatenate
        if len({(p.format, p.shape[1]) for p in parts}) != 1:
            raise ModelConfigError(f"stacked weights differ in format or K: {[(p.format, p.shape) for p in parts]}")
        data = ops.concatenate([p.data for p in parts], axis=0)
        return QuantizedTensor(data, parts[0].format, (sum(p.shape[0] for p in parts), parts[0].shape[1]))
    rows = sum(p.shape[0] for p in parts)
    out = empty((rows, *parts[0].shape[1:]), parts[0].dtype)
    start = 0
    for part in parts:
        out[start : start + part.shape[0]].copy_(part)
        start += part.shape[0]
    return out


def _check_shape(name: str, array: GPUArray, shape: tuple[int, ...]) -> GPUArray:
    if array.shape != shape:
        raise ModelConfigError(f"weight {name}: shape {array.shape} does not match the config's {shape}")
    return array


# -- Hugging Face names ---------------------------------------------------------------------------
def _hf_prefix(names: set[str], spec: ModelSpec) -> str:
    if spec is GPT2_SPEC:
        return "transformer." if any(n.startswith("transformer.") for n in names) else ""
    return "model." if any(n.startswith("model.") for n in names) else ""


def _gpt2_weights(src: _Source, config: TransformerConfig, prefix: str) -> ModelWeights:
    h = config.hidden_size

    def conv(name: str) -> GPUArray:  # Conv1D stores (in, out): transpose on the device
        return src.get(name).T.contiguous()

    layers = []
    for i in range(config.num_layers):
        p = f"{prefix}h.{i}."
        qkv = conv(p + "attn.c_attn.weight")
        qkv_b = src.get(p + "attn.c_attn.bias")
        layers.append(LayerWeights(
            attn_norm=src.get(p + "ln_1.weight"), attn_norm_bias=src.get(p + "ln_1.bias"),
            wq=qkv[:h].contiguous(), wk=qkv[h : 2 * h].contiguous(), wv=qkv[2 * h :].contiguous(),
            bq=qkv_b[:h].contiguous(), bk=qkv_b[h : 2 * h].contiguous(), bv=qkv_b[2 * h :].contiguous(),
            wo=conv(p + "attn.c_proj.weight"), bo=src.get(p + "attn.c_proj.bias"),
            mlp_norm=src.get(p + "ln_2.weight"), mlp_norm_bias=src.get(p + "ln_2.bias"),
            w_gate_up=conv(p + "mlp.c_fc.weight"), b_gate_up=src.get(p + "mlp.c_fc.bias"),
            w_down=conv(p + "mlp.c_proj.weight"), b_down=src.get(p + "mlp.c_proj.bias"),
        ))  # fmt: skip
    embed = src.get(prefix + "wte.weight")
    lm_head = src.get("lm_head.weight") if src.has("lm_head.weight") else embed
    return ModelWeights(embed=embed, layers=layers, final_norm=src.get(prefix + "ln_f.weight"),
                        final_norm_bias=src.get(prefix + "ln_f.bias"), lm_head=lm_head,
                        position_embed=src.get(prefix + "wpe.weight"))  # fmt: skip


def _hf_experts(src: _Source, config: TransformerConfig, p: str) -> tuple[GPUArray, GPUArray, GPUArray]:
    """Router (E, H), stacked gate/up (E, 2I, H) and down (E, H, I) of one MoE block."""
    router = src.first(p + "block_sparse_moe.gate.weight", p + "mlp.gate.weight")
    for base in (p + "mlp.experts.", p + "block_sparse_moe.experts."):
        if src.has(base + "gate_up_proj"):  # transformers 5's fused expert parameters
            return router, src.get(base + "gate_up_proj"), src.get(base + "down_proj")
    gate_up, down = [], []
    for e in range(config.num_experts):
        if src.has(f"{p}block_sparse_moe.experts.{e}.w1.weight"):
            b = f"{p}block_sparse_moe.experts.{e}."
            gate, up, dn = src.get(b + "w1.weight"), src.get(b + "w3.weight"), src.get(b + "w2.weight")
        else:
            b = f"{p}mlp.experts.{e}."
            gate, up, dn = (
                src.get(b + "gate_proj.weight"),
                src.get(b + "up_proj.weight"),
                src.get(b + "down_proj.weight"),
            )
        gate_up.append(_stack_rows([gate, up]))
        down.append(dn)
    i, h = config.moe_intermediate_size, config.hidden_size
    stacked_gate_up = _stack_rows([g.reshape(1, 2 * i, h) for g in gate_up])
    stacked_down = _stack_rows([d.reshape(1, h, i) for d in down])
    return router, stacked_gate_up, stacked_down


def _hf_weights(src: _Source, config: TransformerConfig, prefix: str) -> ModelWeights:
    spec = config.spec
    layers = []
    for i in range(config.num_layers):
        p = f"{prefix}layers.{i}."
        a = p + "self_attn."
        layer = LayerWeights(
            attn_norm=src.get(p + "input_layernorm.weight"), mlp_norm=src.get(p + "post_attention_layernorm.weight"),
            wq=src.get(a + "q_proj.weight"), wk=src.get(a + "k_proj.weight"), wv=src.get(a + "v_proj.weight"),
            wo=src.get(a + "o_proj.weight"), bq=src.optional(a + "q_proj.bias"), bk=src.optional(a + "k_proj.bias"),
            bv=src.optional(a + "v_proj.bias"), bo=src.optional(a + "o_proj.bias"),
        )  # fmt: skip
        if spec.qk_norm:
            layer.q_norm, layer.k_norm = src.get(a + "q_norm.weight"), src.get(a + "k_norm.weight")
        if spec.moe:
            layer.w_router, layer.experts_gate_up, layer.experts_down = _hf_experts(src, config, p)
        else:
            m = p + "mlp."
            layer.w_gate_up = _stack_rows([src.get(m + "gate_proj.weight"), src.get(m + "up_proj.weight")])
            layer.b_gate_up = None
            if src.has(m + "gate_proj.bias"):
                layer.b_gate_up = _stack_rows([src.get(m + "gate_proj.bias"), src.get(m + "up_proj.bias")])
            layer.w_down, layer.b_down = src.get(m + "down_proj.weight"), src.optional(m + "down_proj.bias")
        layers.append(layer)
    embed = _check_shape(
        "embed_tokens", src.get(prefix + "embed_tokens.weight"), (config.vocab_size, config.hidden_size)
    )
    tied = config.tie_word_embeddings or not src.has("lm_head.weight")
    lm_head = embed if tied else src.get("lm_head.weight")
    return ModelWeights(embed=embed, layers=layers, final_norm=src.get(prefix + "norm.weight"), lm_head=lm_head)


def _safetensors(path: Path) -> Any:
    from .safetensors import load_safetensors

    return load_safetensors(path)


def _int4_settings(directory: Path) -> dict[str, Any] | None:
    """An AWQ / GPTQ checkpoint's INT4 settings from config.json's ``quantization_config`` (None for a
    checkpoint without one, or of another quant_method)."""
    path = directory / "config.json"
    if not path.is_file():
        return None
    import json

    qc = json.loads(path.read_text()).get("quantization_config")
    method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else ""
    if method not in ("awq", "gptq"):
        return None
    assert isinstance(qc, dict)
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ArgumentError(f"{path}: {method} checkpoints with bits = {bits!r} are not supported (4 only)")
    group = qc.get("group_size", qc.get("q_group_size"))
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or qc.get("zero_point", True) is False:
            raise ArgumentError(f"{path}: AWQ version {version!r} with zero_point={qc.get('zero_point')!r} is not "
                                f"supported (the GEMM packing with zero points only)")  # fmt: skip
        return {"packing": "awq", "group_size": group, "zero_offset": 0}
    if qc.get("desc_act", False):
        raise ActOrderError(f"{path}: GPTQ with desc_act=True (act-order) is not supported")
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ArgumentError(f"{path}: GPTQ checkpoint_format {fmt!r} is not supported ('gptq' or 'gptq_v2')")
    return {"packing": "gptq", "group_size": group, "zero_offset": 1 if fmt == "gptq" else 0}


def _fp8_block_settings(directory: Path) -> tuple[tuple[int, int], str | None] | None:
    """The ``weight_block_size`` of an HF "fp8" checkpoint (config.json's ``quantization_config``
    with ``quant_method`` "fp8": float8_e4m3fn weights with float32 ``weight_scale_inv`` per block)
    and its ``activation_scheme`` when that is "dynamic" (W8A8 prefill, as transformers runs such a
    checkpoint), or None for a checkpoint of another kind."""
    path = directory / "config.json"
    if not path.is_file():
        return None
    import json

    qc = json.loads(path.read_text()).get("quantization_config")
    if not isinstance(qc, dict) or str(qc.get("quant_method", "")).lower() != "fp8":
        return None
    block = qc.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ArgumentError(f"{path}: fp8 checkpoints need weight_block_size [rows, columns] (block scales), "
                            f"got {block!r}")  # fmt: skip
    scheme = qc.get("activation_scheme")
    return (int(block[0]), int(block[1])), "dynamic" if scheme == "dynamic" else None


def _channel_settings(directory: Path) -> tuple[str, str | None] | None:
    """The stored dtype of the 8-bit linear weights of a checkpoint whose weights carry a per-channel or
    per-tensor ``weight_scale`` (config.json's ``quantization_config``): "float8_e4m3fn" for
    compressed-tensors float-quantized (e.g. the "FP8-dynamic" checkpoints) and fbgemm_fp8, "int8" for
    compressed-tensors int-quantized (W8A8-INT8); None for a checkpoint of another kind. With it the
    activation scheme: "dynamic" for FP8 weights whose checkpoint quantizes activations dynamically
    (fbgemm_fp8; compressed-tensors ``input_activations`` with ``dynamic`` true), which then run W8A8 in
    prefill; None otherwise (INT8 weights run weight-only). Other compressed-tensors schemes (4-bit
    pack-quantized, group or block strategies, asymmetric) raise :class:`ArgumentError` naming the
    setting."""
    path = directory / "config.json"
    if not path.is_file():
        return None
    import json

    qc = json.loads(path.read_text()).get("quantization_config")
    method = str(qc.get("quant_method", "")).lower() if isinstance(qc, dict) else ""
    if method == "fbgemm_fp8":
        return "float8_e4m3fn", "dynamic"
    if method != "compressed-tensors":
        return None
    assert isinstance(qc, dict)
    fmt = qc.get("format")
    if fmt not in ("float-quantized", "int-quantized"):
        raise ArgumentError(f"{path}: compressed-tensors format {fmt!r} is not supported (float-quantized and "
                            "int-quantized: 8-bit weights)")  # fmt: skip
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ArgumentError(f"{path}: compressed-tensors checkpoints with one config group are supported, got "
                            f"{len(groups) if isinstance(groups, dict) else groups!r}")  # fmt: skip
    group_config = next(iter(groups.values()))
    weights = group_config.get("weights") or {}
    kind = {"float": "float8_e4m3fn", "int": "int8"}.get(str(weights.get("type")))
    settings = (weights.get("num_bits"), weights.get("strategy"), weights.get("symmetric", True))
    if kind is None or settings[0] != 8 or settings[1] not in ("channel", "tensor") or settings[2] is not True:
        raise ArgumentError(f"{path}: compressed-tensors weights of type {weights.get('type')!r}, num_bits "
                            f"{settings[0]!r}, strategy {settings[1]!r}, symmetric {settings[2]!r} are not supported "
                            "(8-bit float or int, per channel or per tensor, symmetric)")  # fmt: skip
    acts = group_config.get("input_activations") or {}
    dynamic = kind == "float8_e4m3fn" and acts.get("type") == "float" and acts.get("dynamic") is True
    return kind, "dynamic" if dynamic else None


def _channel_weight(st: Any, name: str, settings: tuple[str, str | None], rows: int) -> ChannelQuantizedTensor:
    """The 8-bit weight ``name`` and its ``weight_scale`` (per channel (N, 1) or per tensor) as a
    ChannelQuantizedTensor (a per-tensor scale repeated for every row) with the checkpoint's activation
    scheme (``settings``: :func:`_channel_settings`)."""
    kind, scheme = settings
    base = name[: -len("weight")]
    data = st.to_gpu(name)
    if data.dtype.name != kind:
        raise ModelConfigError(f"weight {name}: stored as {data.dtype}, the quantization_config says {kind}")
    scale = np.asarray(st.numpy(base + "weight_scale"), np.float32).reshape(-1)
    if scale.size == 1:
        scale = np.full(rows, scale[0], np.float32)
    if scale.shape != (rows,):
        raise ModelConfigError(f"weight {base}weight_scale: shape {st.info(base + 'weight_scale').shape} is neither "
                               f"per channel ({rows}, 1) nor per tensor")  # fmt: skip
    return ChannelQuantizedTensor(data, from_numpy(scale), activation_scheme=scheme)


def _int4_weight(st: Any, base: str, settings: dict[str, Any]) -> Int4Tensor:
    """The packed INT4 weight ``base`` + qweight / qzeros / scales (/ g_idx) of an AWQ/GPTQ checkpoint."""
    g_idx = st.numpy(base + "g_idx") if base + "g_idx" in st.tensor_names else None
    scales = st.to_gpu(base + "scales", "float16")
    return Int4Tensor(st.to_gpu(base + "qweight"), st.to_gpu(base + "qzeros"), scales, settings["packing"],
                      settings["group_size"], g_idx=g_idx, zero_offset=settings["zero_offset"])  # fmt: skip


def load_model_from_safetensors(
    path: str | Path, dtype: Any = None, spec: ModelSpec | None = None, *, config: TransformerConfig | None = None,
    progress: bool = True,
) -> CausalTransformerModel:  # fmt: skip
    """A model from a safetensors file, a sharded checkpoint's ``model.safetensors.index.json`` or a
    checkpoint directory (with its ``config.json``; the tokenizer and chat template are attached when
    ``tokenizer.json`` is there). ``dtype`` (float32, float16 or bfloat16) defaults to the stored
    floating dtype. ``spec`` overrides the architecture read from config.json or the tensor names.
    An AWQ or GPTQ checkpoint (config.json's ``quantization_config``, 4 bits) keeps its linear
    weights packed (:class:`pygpukit.ops.quant.Int4Tensor`); an HF "fp8" checkpoint (``quant_method``
    "fp8" with ``weight_block_size``) keeps its float8_e4m3fn linear weights with their
    ``weight_scale_inv`` block scales (:class:`pygpukit.ops.quant.BlockFP8Tensor`); a compressed-tensors
    checkpoint with 8-bit float or int weights per channel or per tensor (``quant_method``
    "compressed-tensors", e.g. the "FP8-dynamic" and "W8A8" ones) or an fbgemm_fp8 one keeps them with
    their ``weight_scale`` (:class:`pygpukit.ops.quant.ChannelQuantizedTensor`: W8A16 decode, and W8A8
    prefill for FP8 weights whose checkpoint quantizes activations dynamically)."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    st = _safetensors(path)
    names = list(st.tensor_names)
    int4 = _int4_settings(directory)
    packed = {n[: -len("qweight")] for n in names if n.endswith(".qweight")} if int4 is not None else set()
    if config is None:
        hf = load_hf_config(directory)
        config = config_from_hf(hf, spec or (detect_model_spec(names) if "model_type" not in hf else None),
                                name=directory.name)  # fmt: skip
    elif spec is not None and spec is not config.spec:
        config = config.with_(spec=spec)
    stored = {st.info(n).dtype for n in names}
    default = "bfloat16" if "BF16" in stored else "float16" if "F16" in stored else "float32"
    model_dtype = _model_dtype(dtype, default)
    if packed and (config.spec is GPT2_SPEC or config.spec.moe):
        raise ArgumentError(f"{path}: AWQ/GPTQ weights are supported for dense decoder models, not {config.spec.name}")
    names += [p + "weight" for p in sorted(packed) if p + "weight" not in names]
    fp8 = _fp8_block_settings(directory)  # HF "fp8": weight + weight_scale_inv kept as BlockFP8Tensor
    scaled = {n[: -len("weight_scale_inv")] for n in names if n.endswith(".weight_scale_inv")} if fp8 else set()
    channel = _channel_settings(directory)  # 8-bit weight + weight_scale: ChannelQuantizedTensor
    per_channel = {n[: -len("weight_scale")] for n in names if n.endswith(".weight_scale")} if channel else set()
    if per_channel and (config.spec is GPT2_SPEC or config.spec.moe):
        raise ArgumentError(f"{path}: per-channel 8-bit weights are supported for dense decoder models, not "
                            f"{config.spec.name}")  # fmt: skip

    def fetch(name: str, target: DType) -> Any:
        if name.endswith(".weight") and name[: -len("weight")] in packed:
            return _int4_weight(st, name[: -len("weight")], int4 or {})
        if fp8 is not None and name.endswith(".weight") and name[: -len("weight")] in scaled:
            scale = st.to_gpu(name[: -len("weight")] + "weight_scale_inv", "float32")
            return BlockFP8Tensor(st.to_gpu(name), scale, fp8[0], activation_scheme=fp8[1])
        if channel is not None and name.endswith(".weight") and name[: -len("weight")] in per_channel:
            return _channel_weight(st, name, channel, int(st.info(name).shape[0]))
        array: GPUArray = st.to_gpu(name)
        return array if array.dtype == target else array.astype(target)

    with _progress(len(names), f"loading {config.name or path.name}", progress) as bar:
        src = _Source(names, fetch, model_dtype, bar)
        prefix = _hf_prefix(src.names, config.spec)
        weights = _gpt2_weights(src, config, prefix) if config.spec is GPT2_SPEC else _hf_weights(src, config, prefix)
    tokenizer = chat = None
    if (directory / "tokenizer.json").is_file():
        from .chat import ChatTemplate
        from .tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(directory)
        if tokenizer.chat_template:
            chat = ChatTemplate.from_tokenizer(tokenizer)
    return CausalTransformerModel(config, weights, model_dtype, tokenizer, chat)


# -- GGUF ------------------------------------------------------------------------------------------
def _unpermute_rows(w: GPUArray, heads: int) -> GPUArray:
    """Undo llama.cpp's Q/K row permutation (its converter interleaves the two rotary halves of every
    head for its own RoPE): a row gather on the device, bit for bit."""
    rows = w.shape[0]
    half = rows // heads // 2
    index = np.arange(rows, dtype=np.int32).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)
    return ops.embedding(w, from_numpy(np.ascontiguousarray(index)))


def _row_permutation(rows: int, heads: int) -> np.ndarray[Any, Any]:
    """The row gather of _unpermute_rows: result row i is stored row index[i]."""
    half = rows // heads // 2
    index: np.ndarray[Any, Any] = np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)
    return index


def _gguf_quantized(f: Any, names: Sequence[str], heads: int | None = None) -> QuantizedTensor | None:
    """The linear weight stacked from the rows of ``names`` kept in its GGUF block format (rows
    permuted as _unpermute_rows does when ``heads``), or None when they are not all 2-D tensors of
    one format of QUANT_FORMATS with one K (they are dequantized then)."""
    infos = [f.info(n) for n in names]
    if any(i.qtype not in QUANT_FORMATS or len(i.shape) != 2 for i in infos):
        return None
    if len({i.qtype for i in infos}) != 1 or len({i.shape[1] for i in infos}) != 1:
        return None
    parts = []
    for info in infos:
        raw = np.asarray(f.raw(info.name)).reshape(info.shape[0], -1)
        parts.append(raw[_row_permutation(info.shape[0], heads)] if heads else raw)
    raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return QuantizedTensor.from_raw(raw, infos[0].qtype, (raw.shape[0], infos[0].shape[1]))


def _gguf_experts(f: Any, p: str) -> tuple[QuantizedExperts, QuantizedExperts] | None:
    """Layer ``p``'s MoE experts kept in their GGUF block formats: gate/up as one QuantizedExperts
    (E, 2I, H) whose rows are, per expert, its I gate rows then its I up rows (stacked on the host
    from the mapped bytes, one upload), and down (E, H, I). None when a tensor is missing, gate and
    up do not share a format of QUANT_FORMATS and a shape, or down's format or shape does not fit
    (they are dequantized then)."""
    names = [p + n for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")]
    if any(n not in f for n in names):
        return None
    gate, up, down = (f.info(n) for n in names)
    if any(i.qtype not in QUANT_FORMATS or len(i.shape) != 3 for i in (gate, up, down)):
        return None
    if gate.qtype != up.qtype or gate.shape != up.shape:
        return None
    experts, inter, hidden = gate.shape  # NumPy order (the GGUF dims reversed), as src.get returns it
    if down.shape != (experts, hidden, inter):
        return None
    g = np.asarray(f.raw(gate.name)).reshape(experts, inter, -1)  # (E, I, bytes of a row)
    u = np.asarray(f.raw(up.name)).reshape(experts, inter, -1)
    rows = np.concatenate((g, u), axis=1)  # expert e: its gate rows, then its up rows
    gate_up = QuantizedTensor.from_raw(rows, gate.qtype, (experts * 2 * inter, hidden))
    down_raw = np.asarray(f.raw(down.name)).reshape(experts * hidden, -1)
    down_q = QuantizedTensor.from_raw(down_raw, down.qtype, (experts * hidden, inter))
    return QuantizedExperts(gate_up, experts), QuantizedExperts(down_q, experts)


def load_gguf(
    path: str | Path, dtype: Any = None, *, progress: bool = True, keep_quantized: bool = True
) -> CausalTransformerModel:
    """A model from a GGUF v2/v3 file: the config, tokenizer and chat template come from its metadata
    (dtype defaults to float32). With ``keep_quantized`` (the default) the linear weights stored in a
    block format of :data:`pygpukit.ops.QUANT_FORMATS` stay in it on the device
    (:class:`pygpukit.ops.QuantizedTensor`) and run through the quantized GEMV/GEMM; every other
    tensor, and every tensor with ``keep_quantized=False``, is uploaded in its block format and
    dequantized on the device. A tied output head (no ``output.weight``) then runs on the embedding's
    blocks while the token lookup uses its dequantized copy. MoE experts whose gate and up share such a
    format (down in any of them) stay packed as :class:`pygpukit.ops.quant.QuantizedExperts`."""
    from .gguf import GGUFFile

    path = Path(path)
    f = GGUFFile(path)
    metadata = f.metadata
    config = config_from_gguf_metadata(metadata, name=path.stem)  # the file name, as the user knows it
    model_dtype = _model_dtype(dtype, "float32")
    arch = metadata.get("general.architecture")
    names = list(f.tensor_names)

    def fetch(name: str, target: DType) -> GPUArray:
        array: GPUArray = f.to_gpu(name, target)
        return array

    c = config
    with _progress(len(names), f"loading {path.name}", progress) as bar:
        src = _Source(names, fetch, model_dtype, bar)
        permute = arch in ("llama", "mistral")

        def linear(names: Sequence[str], heads: int | None = None) -> Any:
            """A linear weight (rows of ``names`` stacked): kept quantized where it can be."""
            if keep_quantized:
                found = _gguf_quantized(f, names, heads)
                if found is not None:
                    bar.update(len(names))
                    return found
            arrays = [src.get(n) for n in names]
            if heads:
                arrays = [_unpermute_rows(a, heads) for a in arrays]
            return arrays[0] if len(arrays) == 1 else _stack_rows(arrays)

        if c.spec is GPT2_SPEC:
            weights = _gguf_gpt2_weights(src, c, linear)
            if keep_quantized and not src.has("output.weight"):  # the tied head on the embedding's blocks
                weights.lm_head = _gguf_quantized(f, ["token_embd.weight"]) or weights.lm_head
            return _gguf_model(config, weights, model_dtype, metadata)
        layers = []
        for i in range(c.num_layers):
            p = f"blk.{i}."
            wq = linear([p + "attn_q.weight"], c.num_heads if permute else None)
            wk = linear([p + "attn_k.weight"], c.num_kv_heads if permute else None)
            layer = LayerWeights(
                attn_norm=src.get(p + "attn_norm.weight"), mlp_norm=src.get(p + "ffn_norm.weight"), wq=wq, wk=wk,
                wv=linear([p + "attn_v.weight"]), wo=linear([p + "attn_output.weight"]),
                bq=src.optional(p + "attn_q.bias"), bk=src.optional(p + "attn_k.bias"),
                bv=src.optional(p + "attn_v.bias"), bo=src.optional(p + "attn_output.bias"),
            )  # fmt: skip
            if c.spec.qk_norm:
                layer.q_norm, layer.k_norm = src.get(p + "attn_q_norm.weight"), src.get(p + "attn_k_norm.weight")
            if c.spec.moe or src.has(p + "ffn_gate_inp.weight"):
                layer.w_router = src.get(p + "ffn_gate_inp.weight")
                packed = _gguf_experts(f, p) if keep_quantized else None
                if packed is not None:  # the experts stay in their blocks
                    layer.experts_gate_up, layer.experts_down = packed
                    bar.update(3)
                else:
                    gate, up = src.get(p + "ffn_gate_exps.weight"), src.get(p + "ffn_up_exps.weight")
                    e, i_size, h = gate.shape
                    stacked = empty((e, 2 * i_size, h), model_dtype)
                    stacked[:, :i_size].copy_(gate)
                    stacked[:, i_size:].copy_(up)
                    layer.experts_gate_up, layer.experts_down = stacked, src.get(p + "ffn_down_exps.weight")
            else:
                layer.w_gate_up = linear([p + "ffn_gate.weight", p + "ffn_up.weight"])
                layer.w_down = linear([p + "ffn_down.weight"])
            layers.append(layer)
        embed = _check_shape("token_embd", src.get("token_embd.weight"), (c.vocab_size, c.hidden_size))
        lm_head: Any = linear(["output.weight"]) if src.has("output.weight") else embed
        if not src.has("output.weight"):
            config = config.with_(tie_word_embeddings=True)
            if keep_quantized:  # the tied head reads the embedding's blocks (the gather keeps the dense copy)
                lm_head = _gguf_quantized(f, ["token_embd.weight"]) or embed
        weights = ModelWeights(embed=embed, layers=layers, final_norm=src.get("output_norm.weight"), lm_head=lm_head)
    if config.spec.moe and config.spec is not MIXTRAL_SPEC:
        config = config.with_(norm_topk_prob=bool(metadata.get(f"{arch}.expert_weights_norm", True)))
    return _gguf_model(config, weights, model_dtype, metadata)


def _gguf_model(config: TransformerConfig, weights: ModelWeights, model_dtype: DType,
                metadata: Mapping[str, Any]) -> CausalTransformerModel:  # fmt: skip
    """The model with the tokenizer and chat template of the GGUF metadata (where it has them)."""
    from .chat import ChatTemplate
    from .tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_metadata(metadata) if "tokenizer.ggml.tokens" in metadata else None
    chat = None
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        chat = ChatTemplate.from_tokenizer(tokenizer, template) if tokenizer else ChatTemplate(template)
    return CausalTransformerModel(config, weights, model_dtype, tokenizer, chat)


def _gguf_gpt2_weights(src: _Source, config: TransformerConfig, linear: Any) -> ModelWeights:
    """GPT-2 in llama.cpp's names (convert_hf_to_gguf's GPT2Model: the Conv1D weights stored transposed,
    as linear (out, in) rows; Q, K and V as one ``attn_qkv``; a norm bias next to every norm weight).
    The fused QKV rows are split into Q, K and V views: row ranges of the same blocks when they stay
    quantized, copies when dense."""
    h = config.hidden_size

    def split(qkv: Any) -> tuple[Any, Any, Any]:
        if isinstance(qkv, GPUArray):
            _check_shape("attn_qkv", qkv, (3 * h, h))
            return qkv[:h].contiguous(), qkv[h : 2 * h].contiguous(), qkv[2 * h :].contiguous()
        if tuple(qkv.shape) != (3 * h, h):
            raise ModelConfigError(f"weight attn_qkv: shape {tuple(qkv.shape)} does not match the config's "
                                   f"{(3 * h, h)}")  # fmt: skip
        return qkv.rows(0, h), qkv.rows(h, 2 * h), qkv.rows(2 * h, 3 * h)

    layers = []
    for i in range(config.num_layers):
        p = f"blk.{i}."
        wq, wk, wv = split(linear([p + "attn_qkv.weight"]))
        qkv_b = _check_shape(p + "attn_qkv.bias", src.get(p + "attn_qkv.bias"), (3 * h,))
        layers.append(LayerWeights(
            attn_norm=src.get(p + "attn_norm.weight"), attn_norm_bias=src.get(p + "attn_norm.bias"),
            wq=wq, wk=wk, wv=wv,
            bq=qkv_b[:h].contiguous(), bk=qkv_b[h : 2 * h].contiguous(), bv=qkv_b[2 * h :].contiguous(),
            wo=linear([p + "attn_output.weight"]), bo=src.get(p + "attn_output.bias"),
            mlp_norm=src.get(p + "ffn_norm.weight"), mlp_norm_bias=src.get(p + "ffn_norm.bias"),
            w_gate_up=linear([p + "ffn_up.weight"]), b_gate_up=src.get(p + "ffn_up.bias"),
            w_down=linear([p + "ffn_down.weight"]), b_down=src.get(p + "ffn_down.bias"),
        ))  # fmt: skip
    embed = _check_shape("token_embd", src.get("token_embd.weight"), (config.vocab_size, h))
    lm_head = linear(["output.weight"]) if src.has("output.weight") else embed
    positions = _check_shape("position_embd", src.get("position_embd.weight"), (config.max_position_embeddings, h))
    return ModelWeights(embed=embed, layers=layers, final_norm=src.get("output_norm.weight"),
                        final_norm_bias=src.get("output_norm.bias"), lm_head=lm_head,
                        position_embed=positions)  # fmt: skip


LOAD_QUANTIZE = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "fp8", "int8",
                 "int4")  # fmt: skip
"""The formats ``load(..., quantize=...)`` converts dense linear weights to."""


def quantize_weights(weights: ModelWeights, fmt: str) -> None:
    """Replace every dense linear weight of ``weights`` (Q, K, V, O, gate/up, down, an untied output
    head) by its ``fmt`` form (:data:`LOAD_QUANTIZE`: a GGUF block format through
    ``pygpukit.ops.quantize``, ``"fp8"`` / ``"int8"`` with per-channel scales, or ``"int4"``: AWQ
    packing, asymmetric, groups of 128, 64 or 32 (the largest dividing K; weights whose K or N fit
    none stay dense)), one weight at a time on the host. Dense MoE expert stacks become
    :class:`pygpukit.ops.quant.QuantizedExperts` for the GGUF block formats (when K is whole blocks);
    for the other formats they stay dense. Weights already quantized, the embedding, norms and biases
    stay."""

    def convert(value: Any) -> Any:
        if fmt.endswith("_k") and isinstance(value, GPUArray) and value.shape[1] % 256:
            return value  # k-quants: K not whole 256-element super-blocks stays dense
        if fmt == "int4" and isinstance(value, GPUArray):  # AWQ packing, the largest group size dividing K
            group = next((g for g in (128, 64, 32) if value.shape[1] % g == 0), None)
            return value if group is None or value.shape[0] % 8 else ops.quantize(value, "int4", group_size=group)
        return ops.quantize(value, fmt) if isinstance(value, GPUArray) else value

    def convert_experts(value: Any) -> Any:
        if not isinstance(value, GPUArray) or fmt.upper() not in QUANT_FORMATS:
            return value
        if value.shape[2] % ops.gguf_block_size(fmt.upper())[0]:
            return value  # K not whole blocks
        return quantize_experts(value, fmt)

    for layer in weights.layers:
        for attr in ("wq", "wk", "wv", "wo", "w_gate_up", "w_down"):
            setattr(layer, attr, convert(getattr(layer, attr)))
        layer.experts_gate_up = convert_experts(layer.experts_gate_up)
        layer.experts_down = convert_experts(layer.experts_down)
    if weights.lm_head is not weights.embed:
        weights.lm_head = convert(weights.lm_head)


def load(
    path: str | Path,
    dtype: Any = None,
    *,
    progress: bool = True,
    keep_quantized: bool = True,
    quantize: str | None = None,
) -> CausalTransformerModel:
    """Load a model from a checkpoint directory, a ``.safetensors`` file, a sharded index
    (``*.index.json``) or a ``.gguf`` file; the kind is detected from the path (and a GGUF file's
    magic bytes). ``keep_quantized``: GGUF block-quantized linear weights stay packed on the device
    (see :func:`load_gguf`). ``quantize`` (one of :data:`LOAD_QUANTIZE`, any case): the dense linear
    weights are quantized after loading (:func:`quantize_weights`; for the k-quants, weights whose K
    is not a multiple of 256 stay dense)."""
    fmt = None
    if quantize is not None:
        fmt = quantize.lower() if isinstance(quantize, str) else quantize
        if fmt not in LOAD_QUANTIZE:
            raise ArgumentError(f"load: quantize must be one of {', '.join(LOAD_QUANTIZE)}, got {quantize!r}")
    model = _load(Path(path).expanduser(), dtype, progress, keep_quantized)
    if fmt is not None:
        quantize_weights(model.weights, fmt)
    return model


def _load(path: Path, dtype: Any, progress: bool, keep_quantized: bool) -> CausalTransformerModel:
    if not path.exists():
        raise ArgumentError(f"model path {path} does not exist")
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").is_file():
            return load_model_from_safetensors(path, dtype, progress=progress)
        if len(ggufs) == 1:
            return load_gguf(ggufs[0], dtype, progress=progress, keep_quantized=keep_quantized)
        raise ArgumentError(f"{path}: no config.json and not exactly one .gguf file; cannot tell what to load")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return load_gguf(path, dtype, progress=progress, keep_quantized=keep_quantized)
    if path.suffix == ".json" or path.suffix == ".safetensors":
        return load_model_from_safetensors(path, dtype, progress=progress)
    raise ArgumentError(f"{path}: neither a GGUF file (magic {magic!r}) nor a .safetensors/.index.json file")
