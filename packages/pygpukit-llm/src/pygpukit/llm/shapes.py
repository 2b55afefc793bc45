"""Models of a known shape with random weights, made on the device: for benchmarks and tests of
sizes one has not downloaded (a 7B model's 15 GB in bf16 is made in about a second on a GPU).

:data:`MODEL_SHAPES` names the HF ``config.json`` of some published models (the sizes only; no weights,
no tokenizer). :func:`random_model` builds a :class:`CausalTransformerModel` of such a config (a name
of :data:`MODEL_SHAPES`, an HF config mapping or a :class:`TransformerConfig`) through the same
weight assembly as the safetensors loader, so its layout (fused gate/up rows, tied heads, Qwen2's
biases, Qwen3's q/k norms, stacked MoE experts) is the loaded one::

    import pygpukit.llm as llm

    model = llm.random_model("qwen2.5-0.5b", dtype="bfloat16", seed=0)
    tokens = model.generate(list(range(1, 129)), max_new_tokens=64, temperature=0, ignore_eos=True)

How the values are made: one pool of ``pool_size`` normal values (``numpy.random.default_rng(seed)``,
times ``std``) is uploaded once in the model dtype; each linear weight, embedding and bias is filled by
device-to-device copies of that pool starting at an offset drawn from the same generator (so a tensor
repeats the pool with its period, and no two tensors start alike); norm weights are 1 plus the same
noise. The same ``(config, dtype, seed, std, pool_size)`` gives the same weights on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError

from .config import GPT2_SPEC, MIXTRAL_SPEC, TransformerConfig, config_from_hf
from .loader import _hf_weights, _model_dtype, _progress, _Source
from .model import CausalTransformerModel

__all__ = ["MODEL_SHAPES", "QUANT_MIXES", "hf_tensor_shapes", "random_model"]

# The sizes of published checkpoints (their config.json, the fields the loader reads).
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    "llama3-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    "qwen3-0.6b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
}  # fmt: skip


def _config(config: str | Mapping[str, Any] | TransformerConfig) -> TransformerConfig:
    if isinstance(config, TransformerConfig):
        return config
    if isinstance(config, str):
        key = config.lower()
        if key not in MODEL_SHAPES:
            raise ArgumentError(f"random_model: unknown shape {config!r} (known: {', '.join(MODEL_SHAPES)})")
        return config_from_hf(MODEL_SHAPES[key], name=key)
    if isinstance(config, Mapping):
        return config_from_hf(config, name=str(config.get("_name_or_path", "")))
    raise ArgumentError(
        f"random_model: config must be a shape name, an HF config mapping or a TransformerConfig, "
        f"got {type(config).__name__}"
    )


def hf_tensor_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of an HF checkpoint of ``config`` (LLaMA, Qwen2, Qwen3, Mixtral and
    Qwen3-MoE layouts; MoE experts as transformers 5's fused ``gate_up_proj`` / ``down_proj``)."""
    if config.spec is GPT2_SPEC:
        raise ArgumentError("random_model: GPT-2 checkpoints are not supported (LLaMA, Qwen2/3 and the MoE specs are)")
    c = config
    shapes: dict[str, tuple[int, ...]] = {}
    shapes["model.embed_tokens.weight"] = (c.vocab_size, c.hidden_size)
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
        for name, rows in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)):
            shapes[f"{a}{name}_proj.weight"] = (rows, c.hidden_size)
            if c.attention_bias:
                shapes[f"{a}{name}_proj.bias"] = (rows,)
        shapes[a + "o_proj.weight"] = (c.hidden_size, c.q_size)
        if c.spec.qk_norm:
            shapes[a + "q_norm.weight"] = shapes[a + "k_norm.weight"] = (c.head_dim,)
        if c.spec.moe:
            e, inner = c.num_experts, c.moe_intermediate_size
            block = "block_sparse_moe." if c.spec is MIXTRAL_SPEC else "mlp."
            shapes[p + block + "gate.weight"] = (e, c.hidden_size)
            shapes[p + block + "experts.gate_up_proj"] = (e, 2 * inner, c.hidden_size)
            shapes[p + block + "experts.down_proj"] = (e, c.hidden_size, inner)
        else:
            m = p + "mlp."
            shapes[m + "gate_proj.weight"] = shapes[m + "up_proj.weight"] = (c.intermediate_size, c.hidden_size)
            shapes[m + "down_proj.weight"] = (c.hidden_size, c.intermediate_size)
    return shapes


_LINEAR_SUFFIXES = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "o_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
    "lm_head.weight",
)


class _BlockFiller:
    """Random GGUF blocks (random quants, small float16 scales) for linear weights kept packed, cut from
    one uploaded pool of blocks at block-aligned offsets."""

    def __init__(self, fmt: str, rng: np.random.Generator, pool_blocks: int) -> None:
        from pygpukit.benchmark.quant_gemv import random_weight
        from pygpukit.ops.gguf import gguf_block_size
        from pygpukit.ops.quant.tensor import quant_format

        self.format = quant_format("random_model", fmt)
        self.elems, self.bytes = gguf_block_size(self.format)
        self.rng = rng
        self.pool = from_numpy(random_weight(rng, self.format, 1, self.elems * pool_blocks))
        self.blocks = pool_blocks

    def fill(self, shape: tuple[int, ...]) -> Any:
        from pygpukit.ops.quant import QuantizedTensor

        n, k = shape
        if k % self.elems:
            return None  # this K is not whole blocks of the format: the weight stays dense
        out = empty((n * k // self.elems * self.bytes,), "uint8")
        total, start, done = n * k // self.elems, int(self.rng.integers(self.blocks)), 0
        while done < total:
            count = min(total - done, self.blocks - start)
            out[done * self.bytes : (done + count) * self.bytes].copy_(
                self.pool[start * self.bytes : (start + count) * self.bytes]
            )
            done += count
            start = 0
        return QuantizedTensor(out, self.format, (n, k))


class _Filler:
    """Random device tensors cut from one uploaded pool of normal values."""

    def __init__(self, dtype: DType, seed: int, std: float, pool_size: int) -> None:
        self.rng = np.random.default_rng(seed)
        noise = self.rng.standard_normal(pool_size, dtype=np.float32) * np.float32(std)
        self.pool = from_numpy(noise.astype(dtype.numpy))
        self.ones_pool: GPUArray | None = None
        self.dtype = dtype
        self.std = std

    def fill(self, shape: tuple[int, ...], around_one: bool) -> GPUArray:
        if around_one and self.ones_pool is None:
            self.ones_pool = (self.pool + 1.0).astype(self.dtype)
        pool = self.ones_pool if around_one else self.pool
        assert pool is not None
        out = empty(shape, self.dtype)
        flat, size, period = out.reshape(-1), int(np.prod(shape)), pool.shape[0]
        start = int(self.rng.integers(period))
        done = 0
        while done < size:
            n = min(size - done, period - start)
            flat[done : done + n].copy_(pool[start : start + n])
            done += n
            start = 0
        return out


QUANT_MIXES = {"q4_k_m": ("Q4_K", "Q6_K"), "q5_k_m": ("Q5_K", "Q6_K")}
"""llama.cpp's mixed K-quant recipes that :func:`random_model` reproduces: (base format, the format of
the tensors that get more bits)."""


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attention V and FFN down projections get more bits in its
    _M mixes: the first and last eighth of the layers and every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _quant_mix(quant: str, layers: int) -> Callable[[str], str]:
    """The GGUF format of each linear weight (by its HF name) for ``quant``: one format, or a mix of
    :data:`QUANT_MIXES` (the head, and the V and down projections of the layers :func:`_more_bits`
    picks, in the mix's second format)."""
    mix = QUANT_MIXES.get(quant.lower()) if isinstance(quant, str) else None
    if mix is None:
        from pygpukit.ops.quant.tensor import quant_format

        fmt = quant_format("random_model", quant)
        return lambda name: fmt
    base, more = mix

    def pick(name: str) -> str:
        if name.endswith("lm_head.weight"):
            return more
        if name.endswith(("v_proj.weight", "down_proj.weight")):
            layer = int(name.split(".layers.")[1].split(".")[0])
            return more if _more_bits(layer, layers) else base
        return base

    return pick


def random_model(
    config: str | Mapping[str, Any] | TransformerConfig,
    dtype: Any = "bfloat16",
    *,
    seed: int = 0,
    std: float = 0.02,
    pool_size: int = (1 << 24) + 7,
    num_layers: int | None = None,
    quant: str | None = None,
    progress: bool = True,
) -> CausalTransformerModel:
    """A model of ``config`` (a :data:`MODEL_SHAPES` name, an HF config mapping or a
    :class:`TransformerConfig`) with random weights made on the device (see the module docstring);
    ``num_layers`` overrides the depth (e.g. a quick test of a 7B-wide model). ``quant`` keeps the
    linear weights (Q, K, V, O, gate/up, down, an untied head) as
    :class:`pygpukit.ops.quant.QuantizedTensor` of random blocks (random quants, small float16 scales)
    made on the device, for speed measurements of packed models (a 7B Q4_K model without its 15 GB
    dense form): a GGUF block format (e.g. ``"q4_k"``) or a llama.cpp mix of :data:`QUANT_MIXES`
    (``"q4_k_m"``: Q4_K, with Q6_K for the head and for the V and down projections of a third of the
    layers). Weights whose K is not whole blocks stay dense. No tokenizer: prompts are token ids."""
    cfg = _config(config)
    if num_layers is not None:
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
            raise ArgumentError(f"random_model: num_layers must be a positive int, got {num_layers!r}")
        cfg = cfg.with_(num_layers=num_layers)
    if not (isinstance(pool_size, int) and pool_size > 0):
        raise ArgumentError(f"random_model: pool_size must be a positive int, got {pool_size!r}")
    if not (np.isfinite(std) and std > 0):
        raise ArgumentError(f"random_model: std must be positive and finite, got {std!r}")
    model_dtype = _model_dtype(dtype, "bfloat16")
    shapes = hf_tensor_shapes(cfg)
    filler = _Filler(model_dtype, seed, std, pool_size)
    pick = _quant_mix(quant, cfg.num_layers) if quant is not None else None
    block_fillers: dict[str, _BlockFiller] = {}

    def fetch(name: str, target: DType) -> Any:
        if pick is not None and name.endswith(_LINEAR_SUFFIXES):
            fmt = pick(name)
            if fmt not in block_fillers:
                block_fillers[fmt] = _BlockFiller(fmt, filler.rng, 1 << 16)
            packed = block_fillers[fmt].fill(shapes[name])
            if packed is not None:
                return packed
        around_one = name.endswith(("norm.weight", "layernorm.weight"))
        array = filler.fill(shapes[name], around_one)
        return array if target == model_dtype else array.astype(target)

    with _progress(len(shapes), f"random {cfg.name or cfg.spec.name}", progress) as bar:
        weights = _hf_weights(_Source(list(shapes), fetch, model_dtype, bar), cfg, "model.")
    return CausalTransformerModel(cfg, weights, model_dtype)
