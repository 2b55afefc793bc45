"""Model architectures: `ModelSpec` (what an architecture computes and how its tensors are named) and
`TransformerConfig` (one model's sizes), read from a Hugging Face ``config.json`` or GGUF metadata.

Six specs cover the seeds' architectures: GPT-2 (LayerNorm, GELU, learned positions), LLaMA 2/3/3.1/3.2
(RMSNorm, SwiGLU, RoPE with Llama-3 scaling, GQA, tied embeddings for 3.2), Qwen2/2.5 (QKV bias),
Qwen3 (QK-norm), Mixtral and Qwen3-MoE (sparse MoE MLP). Mistral checkpoints are LLaMA-shaped and load
with the LLaMA spec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pygpukit.core.errors import PyGPUkitError

__all__ = [
    "GPT2_SPEC",
    "LLAMA_SPEC",
    "MIXTRAL_SPEC",
    "MODEL_SPECS",
    "QWEN2_SPEC",
    "QWEN3_MOE_SPEC",
    "QWEN3_SPEC",
    "ModelConfigError",
    "ModelSpec",
    "TransformerConfig",
    "config_from_gguf_metadata",
    "config_from_hf",
    "detect_model_spec",
    "load_hf_config",
]


class ModelConfigError(PyGPUkitError, ValueError):
    """A model's configuration is missing a value, holds an invalid one, or names an unsupported
    architecture."""


@dataclass(frozen=True)
class ModelSpec:
    """What one architecture computes. Sizes live in :class:`TransformerConfig`."""

    name: str
    norm: str  # "rmsnorm" or "layernorm"
    activation: str  # "silu" (gated SwiGLU MLP) or "gelu_tanh" (GPT-2's plain MLP)
    positions: str  # "rope" or "learned"
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: bool = False
    hf_model_types: tuple[str, ...] = ()
    gguf_architectures: tuple[str, ...] = ()


GPT2_SPEC = ModelSpec("gpt2", "layernorm", "gelu_tanh", "learned", qkv_bias=True, hf_model_types=("gpt2",),
                      gguf_architectures=("gpt2",))  # fmt: skip
LLAMA_SPEC = ModelSpec("llama", "rmsnorm", "silu", "rope", hf_model_types=("llama", "mistral"),
                       gguf_architectures=("llama", "mistral"))  # fmt: skip
QWEN2_SPEC = ModelSpec("qwen2", "rmsnorm", "silu", "rope", qkv_bias=True, hf_model_types=("qwen2",),
                       gguf_architectures=("qwen2",))  # fmt: skip
QWEN3_SPEC = ModelSpec("qwen3", "rmsnorm", "silu", "rope", qk_norm=True, hf_model_types=("qwen3",),
                       gguf_architectures=("qwen3",))  # fmt: skip
MIXTRAL_SPEC = ModelSpec("mixtral", "rmsnorm", "silu", "rope", moe=True, hf_model_types=("mixtral",))
QWEN3_MOE_SPEC = ModelSpec("qwen3_moe", "rmsnorm", "silu", "rope", qk_norm=True, moe=True,
                           hf_model_types=("qwen3_moe",), gguf_architectures=("qwen3moe",))  # fmt: skip

MODEL_SPECS: dict[str, ModelSpec] = {
    s.name: s for s in (GPT2_SPEC, LLAMA_SPEC, QWEN2_SPEC, QWEN3_SPEC, MIXTRAL_SPEC, QWEN3_MOE_SPEC)
}


@dataclass(frozen=True)
class TransformerConfig:
    """The sizes and constants of one decoder-only transformer."""

    spec: ModelSpec
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    rotary_dim: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "max_position_embeddings")  # fmt: skip
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelConfigError(f"model config: {key} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"model config: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ModelConfigError(f"model config: the norm epsilon must be positive, got {self.norm_eps!r}")
        if self.spec.moe and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ModelConfigError(
                f"model config: {self.spec.name} needs 0 < num_experts_per_tok ({self.num_experts_per_tok}) "
                f"<= num_experts ({self.num_experts})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def with_(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)


# -- detection from tensor names ------------------------------------------------------------------
def detect_model_spec(tensor_names: Iterable[str]) -> ModelSpec:
    """The architecture of a Hugging Face checkpoint, from its tensor names alone."""
    names = set(tensor_names)

    def has(suffix: str) -> bool:
        return any(n.endswith(suffix) for n in names)

    if has("attn.c_attn.weight"):
        return GPT2_SPEC
    if has("block_sparse_moe.gate.weight"):
        return MIXTRAL_SPEC
    moe = has("mlp.gate.weight") and any(".mlp.experts." in n for n in names)
    if has("self_attn.q_norm.weight"):
        return QWEN3_MOE_SPEC if moe else QWEN3_SPEC
    if moe:
        raise ModelConfigError("detect_model_spec: a MoE checkpoint without QK-norm (Qwen2-MoE?) is not supported")
    if has("self_attn.q_proj.weight"):
        return QWEN2_SPEC if has("self_attn.q_proj.bias") else LLAMA_SPEC
    sample = ", ".join(sorted(names)[:5])
    raise ModelConfigError(f"detect_model_spec: no supported architecture matches these tensors ({sample}, ...)")


def _spec_for_model_type(model_type: str) -> ModelSpec:
    for spec in MODEL_SPECS.values():
        if model_type in spec.hf_model_types:
            return spec
    known = sorted(t for s in MODEL_SPECS.values() for t in s.hf_model_types)
    raise ModelConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(known)})")


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise ModelConfigError(f"model config: eos_token_id must be an int or a list of ints, got {value!r}")


def load_hf_config(directory: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory as a dict (typed error when absent or not JSON)."""
    path = Path(directory) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read the model config ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    if len(text) > 16 << 20:
        raise ModelConfigError(f"{path}: {len(text)} bytes is too large for a config.json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc.msg} at offset {exc.pos})") from exc
    except (RecursionError, ValueError) as exc:  # nested too deeply; an int beyond Python's digit limit
        raise ModelConfigError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: the config must be a JSON object")
    return data


def _typed(what: str, exc: Exception) -> ModelConfigError:
    """A value of the wrong type or out of range (a str where a number belongs, zero heads) as a typed error."""
    return ModelConfigError(f"{what}: a value has the wrong type or is out of range ({type(exc).__name__}: {exc})")


def config_from_hf(config: Mapping[str, Any], spec: ModelSpec | None = None, name: str = "") -> TransformerConfig:
    """A :class:`TransformerConfig` from a Hugging Face ``config.json`` dict (``spec`` overrides the
    ``model_type`` it names)."""
    try:
        return _config_from_hf(config, spec, name)
    except ModelConfigError:
        raise
    except (ValueError, TypeError, ZeroDivisionError, OverflowError, AttributeError) as exc:
        raise _typed("model config", exc) from exc


def _config_from_hf(config: Mapping[str, Any], spec: ModelSpec | None, name: str) -> TransformerConfig:
    cfg = dict(config.get("text_config") or config) if "text_config" in config else dict(config)
    if spec is None:
        model_type = cfg.get("model_type") or config.get("model_type")
        if not isinstance(model_type, str):
            raise ModelConfigError("model config: model_type is missing")
        spec = _spec_for_model_type(model_type)

    def need(*keys: str) -> Any:
        for key in keys:
            if key in cfg and cfg[key] is not None:
                return cfg[key]
        raise ModelConfigError(f"model config: {keys[0]} is missing ({spec.name})")

    if spec is GPT2_SPEC:
        hidden = int(need("n_embd", "hidden_size"))
        heads = int(need("n_head", "num_attention_heads"))
        inner = cfg.get("n_inner")
        return TransformerConfig(
            spec=spec, vocab_size=int(need("vocab_size")), hidden_size=hidden,
            num_layers=int(need("n_layer", "num_hidden_layers")), num_heads=heads, num_kv_heads=heads,
            head_dim=hidden // heads, intermediate_size=int(inner) if inner else 4 * hidden,
            max_position_embeddings=int(need("n_positions", "max_position_embeddings")),
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), tie_word_embeddings=True, attention_bias=True,
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_ids(cfg.get("eos_token_id")), name=name,
            extra=cfg,
        )  # fmt: skip
    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rope_parameters = cfg.get("rope_parameters")
    rope_scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(rope_parameters, Mapping):  # transformers 5 folds theta and scaling into one dict
        theta = rope_parameters.get("rope_theta", theta)
        if rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
    if isinstance(rope_scaling, Mapping) and rope_scaling.get("rope_type", rope_scaling.get("type")) == "default":
        rope_scaling = None
    partial = cfg.get("partial_rotary_factor")
    rotary_dim = int(head_dim * float(partial)) if partial else None
    moe_kwargs: dict[str, Any] = {}
    if spec.moe:
        experts = int(need("num_local_experts", "num_experts"))
        moe_inter = int(cfg.get("moe_intermediate_size") or need("intermediate_size"))
        moe_kwargs = {
            "num_experts": experts,
            "num_experts_per_tok": int(need("num_experts_per_tok")),
            "moe_intermediate_size": moe_inter,
            "norm_topk_prob": True if spec is MIXTRAL_SPEC else bool(cfg.get("norm_topk_prob", False)),
        }
        if int(cfg.get("decoder_sparse_step", 1) or 1) != 1 or cfg.get("mlp_only_layers"):
            raise ModelConfigError("model config: MoE models with dense layers (mlp_only_layers) are not supported")
    return TransformerConfig(
        spec=spec, vocab_size=int(need("vocab_size")), hidden_size=hidden,
        num_layers=int(need("num_hidden_layers")), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(theta if theta is not None else 10000.0),
        rope_scaling=dict(rope_scaling) if isinstance(rope_scaling, Mapping) else None, rotary_dim=rotary_dim,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", spec.qkv_bias)), bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_ids(cfg.get("eos_token_id")), name=name, extra=cfg, **moe_kwargs,
    )  # fmt: skip


def config_from_gguf_metadata(metadata: Mapping[str, Any], name: str = "") -> TransformerConfig:
    """A :class:`TransformerConfig` from GGUF metadata (``general.architecture`` and its
    ``<arch>.*`` keys)."""
    try:
        return _config_from_gguf_metadata(metadata, name)
    except ModelConfigError:
        raise
    except (ValueError, TypeError, ZeroDivisionError, OverflowError, AttributeError) as exc:
        raise _typed("GGUF metadata", exc) from exc


def _config_from_gguf_metadata(metadata: Mapping[str, Any], name: str) -> TransformerConfig:
    arch = metadata.get("general.architecture")
    spec = next((s for s in MODEL_SPECS.values() if arch in s.gguf_architectures), None)
    if spec is LLAMA_SPEC and int(metadata.get(f"{arch}.expert_count") or 0) > 0:
        spec = MIXTRAL_SPEC  # llama.cpp stores Mixtral as a llama with experts
    if spec is None:
        known = sorted(a for s in MODEL_SPECS.values() for a in s.gguf_architectures)
        raise ModelConfigError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(known)})")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelConfigError(f"GGUF metadata: {arch}.{key} is missing")
        return value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = int(metadata.get(f"{arch}.attention.key_length") or hidden // heads)
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = int(metadata.get(f"{arch}.vocab_size") or (len(tokens) if isinstance(tokens, list) else 0))
    if spec is GPT2_SPEC:
        return TransformerConfig(
            spec=spec, vocab_size=vocab, hidden_size=hidden, num_layers=int(get("block_count")),
            num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
            intermediate_size=int(get("feed_forward_length")),
            max_position_embeddings=int(get("context_length")), norm_eps=float(get("attention.layer_norm_epsilon")),
            tie_word_embeddings=True, attention_bias=True, name=name,
        )  # fmt: skip
    rope_scaling = None
    scaling_type = metadata.get(f"{arch}.rope.scaling.type")
    if scaling_type not in (None, "none"):
        factor = float(get("rope.scaling.factor"))
        original = metadata.get(f"{arch}.rope.scaling.original_context_length")
        rope_scaling = {"rope_type": scaling_type, "factor": factor}
        if original is not None:
            rope_scaling["original_max_position_embeddings"] = int(original)
    rotary = metadata.get(f"{arch}.rope.dimension_count")
    moe_kwargs: dict[str, Any] = {}
    if spec.moe:
        moe_inter = metadata.get(f"{arch}.expert_feed_forward_length") or get("feed_forward_length")
        moe_kwargs = {
            "num_experts": int(get("expert_count")),
            "num_experts_per_tok": int(get("expert_used_count")),
            "moe_intermediate_size": int(moe_inter),
            "norm_topk_prob": True,
        }
    return TransformerConfig(
        spec=spec, vocab_size=vocab, hidden_size=hidden, num_layers=int(get("block_count")), num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=int(get("feed_forward_length", 4 * hidden)),
        max_position_embeddings=int(get("context_length", 2048)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon")), rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        rotary_dim=int(rotary) if rotary is not None and int(rotary) != head_dim else None,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_ids(metadata.get("tokenizer.ggml.eos_token_id")), name=name, **moe_kwargs,
    )  # fmt: skip
