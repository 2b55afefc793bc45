"""The compiled PyTorch reference decoder that the LLM benchmark compares pygpukit against.

What it is: the "gpt-fast" recipe written out in plain PyTorch for the dense decoder families that
pygpukit.llm runs (LLaMA 2/3/3.1/3.2, Mistral, Qwen2/2.5, Qwen3, SmolLM2): RMSNorm, RoPE (neox
pairing, partial ``rotary_dim``, the scaling types default, linear, dynamic, llama3 and yarn), grouped
query attention, the q/k/v biases of Qwen2, the per-head q/k RMSNorm of Qwen3, the SwiGLU MLP, tied or
separate output head and the final norm. There is no hand-written kernel: every step is a PyTorch
operator, the KV cache is static (one preallocated (batch, kv_heads, max_seq_len, head_dim) tensor
per layer for keys and one for values, written at ``input_pos`` with ``index_copy_``), attention is
``torch.nn.functional.scaled_dot_product_attention`` with a boolean causal mask sliced from one
preallocated (max_seq_len, max_seq_len) mask by ``input_pos``, and the one-token decode step is
compiled with ``torch.compile(mode="reduce-overhead", fullgraph=True)``, which replays it as a CUDA
graph. The greedy choice (argmax over float32 logits) runs inside that compiled step, so a decode
step reads nothing back to the host.

Grouped query attention does not repeat the cache: the ``num_heads // num_kv_heads`` query heads of
one kv head are folded into the query-length axis, (batch, kv_heads, group * q_len, head_dim), and
attend over the un-repeated cache with the mask rows repeated to match. That is exactly GQA (query
head h reads kv head h // group, as ``repeat_interleave`` would give) without copying the cache every
step, and it works with every SDPA backend that takes a mask.

Numerics follow pygpukit.llm's model (pygpukit/llm/model.py): norms, RoPE and SwiGLU are computed in
float32 and rounded once to the model dtype; residual adds, projections and logits are in the model
dtype; RoPE tables are computed in float64 and stored in float32. On float32 weights its logits agree
with pygpukit's to float32 rounding (tests/test_torch_reference.py checks it on the CPU backend).

Use::

    from torch_decode import TorchDecoder        # benchmarks/reference on sys.path, or load by path

    model = pygpukit.llm.load(path, dtype="bfloat16")
    ref = TorchDecoder.from_pygpukit(model, max_seq_len=len(prompt) + 128, batch=1, compile=True)
    ref.warmup(len(prompt), 128)                  # or: one untimed generate() of the same shape
    tokens, stats = ref.generate([prompt], new_tokens=128)
    stats["ttft_s"], stats["decode_tokens_per_s"], stats["decode_s"]

``compile=True`` compiles the decode step (CUDA graphs on a CUDA device); prefill runs eager unless
``compile_prefill=True`` (then ``torch.compile(dynamic=True, fullgraph=True)``, which adds
recompilation time for new prompt lengths). The first compiled ``generate`` compiles and captures:
call :meth:`TorchDecoder.warmup` (or one untimed ``generate``) before timing. ``compile=False`` runs
every step eagerly (the CPU tests use it).

Limits: dense weights only (a quantized pygpukit weight raises TypeError naming it); no MoE blocks and
no GPT-2 (NotImplementedError); the prompts of one ``generate`` have equal lengths (one shared
position per step, as in gpt-fast) and generation never stops early (no EOS check), so
``new_tokens`` are produced for every row; the prompt plus ``new_tokens`` must fit ``max_seq_len``.
Attention reads the whole ``max_seq_len`` cache every step (masked), as gpt-fast does, so size
``max_seq_len`` to the work. Dynamic NTK RoPE scaling uses the frequencies pygpukit computes once,
for ``max_position_embeddings`` positions (not re-derived per length). pygpukit is imported only
inside :meth:`TorchDecoder.from_pygpukit`; this module itself needs only torch (and NumPy for the
CPU-backend weight copy).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as nnf

__all__ = ["ROPE_TYPES", "ReferenceConfig", "TorchDecoder", "rope_cos_sin", "rope_inv_freq"]

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -- configuration ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReferenceConfig:
    """The sizes and constants the reference computes with (taken from a pygpukit TransformerConfig)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    rotary_dim: int
    max_position_embeddings: int
    rope_scaling: Mapping[str, Any] | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


# -- RoPE ------------------------------------------------------------------------------------------
def _scaling_number(scaling: Mapping[str, Any], key: str, rope_type: str) -> float:
    value = scaling.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"rope scaling {rope_type!r} needs a number {key!r}, got {value!r}")
    return float(value)


def _original_positions(scaling: Mapping[str, Any], keys: Sequence[str], fallback: int) -> float:
    for key in keys:
        value = scaling.get(key)
        if value is not None:
            return float(value)
    return float(fallback)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(
    head_dim: int,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    max_positions: int = 2048,
) -> tuple[torch.Tensor, float]:
    """The ``rotary_dim // 2`` inverse frequencies (float64 CPU tensor) and the attention factor
    multiplying cos and sin, for a Hugging Face ``rope_scaling`` dict (``rope_type`` or ``type``:
    default, linear, dynamic, llama3 or yarn; None is default). ``max_positions`` is the model's
    ``max_position_embeddings``: the length dynamic NTK is computed for and the fallback original
    length. Another scaling type raises NotImplementedError naming it."""
    dim = head_dim if rotary_dim is None else rotary_dim
    if dim < 2 or dim % 2 or dim > head_dim:
        raise ValueError(f"rotary_dim must be an even number in [2, head_dim={head_dim}], got {rotary_dim!r}")
    rope_type = "default"
    params: Mapping[str, Any] = scaling or {}
    if scaling is not None:
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise NotImplementedError(
            f"rope scaling type {rope_type!r} is not implemented by the PyTorch reference "
            f"(implemented: {', '.join(ROPE_TYPES)})"
        )
    base = float(theta)
    half = dim // 2
    exponent = torch.arange(half, dtype=torch.float64) * 2.0 / dim
    factor = 1.0 if rope_type == "default" else _scaling_number(params, "factor", rope_type)
    attention_factor = 1.0
    if rope_type == "dynamic":
        original = _original_positions(params, ("max_position_embeddings", "original_max_position_embeddings"),
                                       max_positions)  # fmt: skip
        length = max(float(max_positions), original)
        base *= (factor * length / original - (factor - 1.0)) ** (dim / (dim - 2))
    inv_freq = 1.0 / torch.pow(torch.tensor(base, dtype=torch.float64), exponent)
    if rope_type == "linear":
        inv_freq = inv_freq / factor
    elif rope_type == "llama3":
        low = _scaling_number(params, "low_freq_factor", rope_type)
        high = _scaling_number(params, "high_freq_factor", rope_type)
        original = _original_positions(params, ("original_max_position_embeddings", "max_position_embeddings"),
                                       max_positions)  # fmt: skip
        wavelength = 2.0 * math.pi / inv_freq
        # Long wavelengths (beyond original / low) are slowed down by the factor, short ones (below
        # original / high) kept, and the band between them blends the two linearly in original / wavelength.
        slowed = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        blend = (original / wavelength - low) / (high - low)
        blended = (1.0 - blend) * slowed / factor + blend * slowed
        in_band = (wavelength >= original / high) & (wavelength <= original / low)
        inv_freq = torch.where(in_band, blended, slowed)
    elif rope_type == "yarn":
        original = _original_positions(params, ("original_max_position_embeddings", "max_position_embeddings"),
                                       max_positions)  # fmt: skip
        if params.get("attention_factor") is not None:
            attention_factor = _scaling_number(params, "attention_factor", rope_type)
        elif params.get("mscale") and params.get("mscale_all_dim"):
            attention_factor = _yarn_mscale(factor, float(params["mscale"])) / _yarn_mscale(
                factor, float(params["mscale_all_dim"])
            )
        else:
            attention_factor = _yarn_mscale(factor)
        fast = float(params.get("beta_fast") or 32.0)
        slow = float(params.get("beta_slow") or 1.0)

        def dimension_of(rotations: float) -> float:
            # The dimension index whose wavelength makes ``rotations`` turns over the original length.
            return dim * math.log(original / (rotations * 2.0 * math.pi)) / (2.0 * math.log(base))

        lo, hi = dimension_of(fast), dimension_of(slow)
        if params.get("truncate", True):
            lo, hi = float(math.floor(lo)), float(math.ceil(hi))
        lo, hi = max(lo, 0.0), min(hi, float(dim - 1))
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(half, dtype=torch.float64) - lo) / (hi - lo)).clamp(0.0, 1.0)
        keep = 1.0 - ramp  # 1: the original frequency (high frequencies), 0: interpolated by the factor
        inv_freq = inv_freq / factor * (1.0 - keep) + inv_freq * keep
    return inv_freq, attention_factor


def rope_cos_sin(config: ReferenceConfig, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 (positions, rotary_dim // 2) cos and sin tables (computed in float64, attention
    factor folded in) on the CPU."""
    inv_freq, attention_factor = rope_inv_freq(config.head_dim, config.rope_theta, config.rotary_dim,
                                               config.rope_scaling, config.max_position_embeddings)  # fmt: skip
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = (torch.cos(angles) * attention_factor).to(torch.float32)
    sin = (torch.sin(angles) * attention_factor).to(torch.float32)
    return cos, sin


# -- the model -------------------------------------------------------------------------------------
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis in float32, rounded once to x's dtype."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """RoPE, neox pairing (i with i + rotary_dim / 2) on the first rotary_dim features of every head
    of x (batch, seq, heads, head_dim); cos and sin are (seq, rotary_dim / 2) float32. In float32,
    rounded once."""
    half = rotary_dim // 2
    xf = x.float()
    first, second = xf[..., :half], xf[..., half:rotary_dim]
    c, s = cos[:, None, :], sin[:, None, :]
    parts = [first * c - second * s, second * c + first * s]
    if rotary_dim < x.shape[-1]:
        parts.append(xf[..., rotary_dim:])
    return torch.cat(parts, dim=-1).to(x.dtype)


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _optional(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else _frozen(t)


class _Block(nn.Module):
    """One transformer block with its static KV cache (buffers, so torch.compile treats them as
    static addresses and mutates them in place inside the CUDA graph)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, config: ReferenceConfig, weights: Mapping[str, torch.Tensor | None], batch: int,
                 max_seq_len: int) -> None:  # fmt: skip
        super().__init__()
        self.config = config

        def need(name: str) -> torch.Tensor:
            value = weights[name]
            assert value is not None, name
            return value

        self.attn_norm = _frozen(need("attn_norm"))
        self.w_qkv = _frozen(need("w_qkv"))
        self.b_qkv = _optional(weights.get("b_qkv"))
        self.wo = _frozen(need("wo"))
        self.bo = _optional(weights.get("bo"))
        self.q_norm = _optional(weights.get("q_norm"))
        self.k_norm = _optional(weights.get("k_norm"))
        self.mlp_norm = _frozen(need("mlp_norm"))
        self.w_gate_up = _frozen(need("w_gate_up"))
        self.b_gate_up = _optional(weights.get("b_gate_up"))
        self.w_down = _frozen(need("w_down"))
        self.b_down = _optional(weights.get("b_down"))
        w = self.w_qkv
        shape = (batch, config.num_kv_heads, max_seq_len, config.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=w.dtype, device=w.device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=w.dtype, device=w.device), persistent=False)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                  input_pos: torch.Tensor) -> torch.Tensor:  # fmt: skip
        c = self.config
        batch, seq, _ = x.shape
        qkv = nnf.linear(x, self.w_qkv, self.b_qkv)
        kv_end = c.q_size + c.kv_size
        q = qkv[..., : c.q_size].reshape(batch, seq, c.num_heads, c.head_dim)
        k = qkv[..., c.q_size : kv_end].reshape(batch, seq, c.num_kv_heads, c.head_dim)
        v = qkv[..., kv_end:].reshape(batch, seq, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q = _rms_norm(q, self.q_norm, c.norm_eps)
            k = _rms_norm(k, self.k_norm, c.norm_eps)
        q = _rotate(q, cos, sin, c.rotary_dim).transpose(1, 2)  # (batch, heads, seq, head_dim)
        k = _rotate(k, cos, sin, c.rotary_dim).transpose(1, 2)
        v = v.transpose(1, 2)
        k_cache, v_cache = self.k_cache, self.v_cache
        k_cache.index_copy_(2, input_pos, k)
        v_cache.index_copy_(2, input_pos, v)
        group = c.num_heads // c.num_kv_heads
        # GQA without repeating the cache: the group's query heads become extra query rows.
        q = q.reshape(batch, c.num_kv_heads, group * seq, c.head_dim)
        rows = mask.repeat(group, 1)[None, None] if group > 1 else mask[None, None]
        out = nnf.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=rows)
        out = out.reshape(batch, c.num_heads, seq, c.head_dim).transpose(1, 2).reshape(batch, seq, c.q_size)
        return nnf.linear(out, self.wo, self.bo)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = nnf.linear(x, self.w_gate_up, self.b_gate_up)
        size = self.config.intermediate_size
        gate, up = gate_up[..., :size], gate_up[..., size:]  # rows [gate | up]
        hidden = (nnf.silu(gate.float()) * up.float()).to(x.dtype)
        return nnf.linear(hidden, self.w_down, self.b_down)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                input_pos: torch.Tensor) -> torch.Tensor:  # fmt: skip
        eps = self.config.norm_eps
        h = h + self.attention(_rms_norm(h, self.attn_norm, eps), cos, sin, mask, input_pos)
        return h + self.mlp(_rms_norm(h, self.mlp_norm, eps))


class _Transformer(nn.Module):
    """The decoder: embedding, blocks, final norm, output head; RoPE tables and the causal mask as
    buffers of max_seq_len positions."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    causal_mask: torch.Tensor

    def __init__(self, config: ReferenceConfig, weights: Mapping[str, Any], batch: int, max_seq_len: int) -> None:
        super().__init__()
        self.config = config
        self.embed = _frozen(weights["embed"])
        self.lm_head = self.embed if weights["lm_head"] is None else _frozen(weights["lm_head"])
        self.final_norm = _frozen(weights["final_norm"])
        self.layers = nn.ModuleList(_Block(config, layer, batch, max_seq_len) for layer in weights["layers"])
        device = self.embed.device
        cos, sin = rope_cos_sin(config, max_seq_len)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)
        causal = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool, device=device))
        self.register_buffer("causal_mask", causal, persistent=False)

    def hidden(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states (batch, seq, hidden) of ``tokens`` (batch, seq) at positions
        ``input_pos`` (seq,), writing their keys and values into the caches."""
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        mask = self.causal_mask[input_pos]  # (seq, max_seq_len): True where a query may attend
        h = nnf.embedding(tokens, self.embed)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, input_pos)
        return _rms_norm(h, self.final_norm, self.config.norm_eps)

    def logits(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """float32 logits of every position (batch, seq, vocab)."""
        return nnf.linear(self.hidden(tokens, input_pos), self.lm_head).float()

    def prefill(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """float32 logits of the last position (batch, vocab)."""
        last = self.hidden(tokens, input_pos)[:, -1]
        return nnf.linear(last, self.lm_head).float()

    def decode_one(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """The greedy next token (batch,) after ``token`` (batch, 1) at position ``input_pos`` (1,)."""
        logits = nnf.linear(self.hidden(token, input_pos)[:, -1], self.lm_head).float()
        return torch.argmax(logits, dim=-1)


# -- weights from pygpukit -------------------------------------------------------------------------
class _WeightCopier:
    """Copies pygpukit arrays into torch tensors owned by the reference: DLPack on the CUDA backend,
    ``to_numpy`` on the CPU simulation backend."""

    def __init__(self, cuda_backend: bool, device: torch.device, dtype: torch.dtype) -> None:
        self.cuda_backend = cuda_backend
        self.device = device
        self.dtype = dtype

    def __call__(self, name: str, value: Any, linear: bool = False) -> torch.Tensor:
        from pygpukit.core.array import GPUArray

        if not isinstance(value, GPUArray):
            raise TypeError(
                f"TorchDecoder.from_pygpukit: {name} is a {type(value).__name__}, not a dense GPUArray "
                "(quantized weights are not supported: load the model with dense weights)"
            )
        dtype_name = value.dtype.name
        if dtype_name not in _TORCH_DTYPES:
            raise TypeError(f"TorchDecoder.from_pygpukit: {name} has dtype {dtype_name} "
                            f"(supported: {', '.join(_TORCH_DTYPES)})")  # fmt: skip
        if linear and _TORCH_DTYPES[dtype_name] != self.dtype:
            raise TypeError(f"TorchDecoder.from_pygpukit: {name} has dtype {dtype_name}, not the model's "
                            f"{self.dtype}")  # fmt: skip
        if self.cuda_backend:
            tensor = torch.utils.dlpack.from_dlpack(value)  # zero-copy view of pygpukit's memory (strides kept)
        else:
            import numpy as np

            host = np.ascontiguousarray(value.to_numpy())
            if dtype_name == "bfloat16":  # ml_dtypes bfloat16: reinterpret its bits
                tensor = torch.from_numpy(host.view(np.uint16)).view(torch.bfloat16)
            else:
                tensor = torch.from_numpy(host)
        # A contiguous copy that the reference owns, on the target device.
        return tensor.to(self.device).clone(memory_format=torch.contiguous_format)


def _reference_config(config: Any) -> ReferenceConfig:
    spec = config.spec
    if spec.moe or config.num_experts:
        raise NotImplementedError(
            f"TorchDecoder: {spec.name} has sparse MoE blocks; the PyTorch reference covers dense "
            "LLaMA / Qwen2 / Qwen3 / SmolLM2 models only"
        )
    if spec.norm != "rmsnorm" or spec.activation != "silu" or spec.positions != "rope":
        raise NotImplementedError(
            f"TorchDecoder: {spec.name} ({spec.norm}, {spec.activation}, {spec.positions} positions) is not "
            "supported; the PyTorch reference covers the RMSNorm / SwiGLU / RoPE models (LLaMA, Qwen2, Qwen3, "
            "SmolLM2), not GPT-2"
        )
    return ReferenceConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_layers=config.num_layers,
        num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        intermediate_size=config.intermediate_size, norm_eps=float(config.norm_eps),
        rope_theta=float(config.rope_theta),
        rotary_dim=config.head_dim if config.rotary_dim is None else int(config.rotary_dim),
        max_position_embeddings=config.max_position_embeddings,
        rope_scaling=dict(config.rope_scaling) if config.rope_scaling is not None else None,
    )  # fmt: skip


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"TorchDecoder.from_pygpukit: {name} has shape {tuple(tensor.shape)}, expected {shape}")
    return tensor


def _layer_weights(copy: _WeightCopier, c: ReferenceConfig, index: int, layer: Any) -> dict[str, torch.Tensor | None]:
    """One layer's tensors, the q/k/v projections as one stacked [q | k | v] weight (and bias)."""
    p = f"layers[{index}]"
    if layer.w_router is not None or layer.experts_gate_up is not None:
        raise NotImplementedError(f"TorchDecoder: {p} is a sparse MoE block; the PyTorch reference is dense only")
    hidden, rows = c.hidden_size, c.q_size + 2 * c.kv_size

    def get(field: str, shape: tuple[int, ...], linear: bool = False) -> torch.Tensor:
        return _check_shape(f"{p}.{field}", copy(f"{p}.{field}", getattr(layer, field), linear), shape)

    def maybe(field: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return None if getattr(layer, field) is None else get(field, shape, linear=True)

    out: dict[str, torch.Tensor | None] = {
        "attn_norm": get("attn_norm", (hidden,)),
        "mlp_norm": get("mlp_norm", (hidden,)),
        "wo": get("wo", (hidden, c.q_size), linear=True),
        "bo": maybe("bo", (hidden,)),
        "w_gate_up": get("w_gate_up", (2 * c.intermediate_size, hidden), linear=True),  # rows [gate | up]
        "b_gate_up": maybe("b_gate_up", (2 * c.intermediate_size,)),
        "w_down": get("w_down", (hidden, c.intermediate_size), linear=True),
        "b_down": maybe("b_down", (hidden,)),
        "q_norm": None if layer.q_norm is None else get("q_norm", (c.head_dim,)),
        "k_norm": None if layer.k_norm is None else get("k_norm", (c.head_dim,)),
    }
    if (layer.q_norm is None) != (layer.k_norm is None):
        raise ValueError(f"TorchDecoder.from_pygpukit: {p} has one of q_norm and k_norm but not the other")
    if layer.w_qkv is not None:  # fuse_qkv(): wq, wk and wv are row views of this stack
        out["w_qkv"] = get("w_qkv", (rows, hidden), linear=True)
        out["b_qkv"] = maybe("b_qkv", (rows,))
        if out["b_qkv"] is None and any(getattr(layer, b) is not None for b in ("bq", "bk", "bv")):
            raise ValueError(f"TorchDecoder.from_pygpukit: {p} has w_qkv and separate q/k/v biases but no b_qkv")
        return out
    parts = [get("wq", (c.q_size, hidden), True), get("wk", (c.kv_size, hidden), True),
             get("wv", (c.kv_size, hidden), True)]  # fmt: skip
    out["w_qkv"] = torch.cat(parts, dim=0)
    biases = [maybe("bq", (c.q_size,)), maybe("bk", (c.kv_size,)), maybe("bv", (c.kv_size,))]
    if any(b is not None for b in biases):
        sizes = (c.q_size, c.kv_size, c.kv_size)
        out["b_qkv"] = torch.cat([b if b is not None else parts[0].new_zeros(n) for b, n in
                                  zip(biases, sizes, strict=True)])  # fmt: skip
    else:
        out["b_qkv"] = None
    return out


# -- the decoder -----------------------------------------------------------------------------------
class TorchDecoder:
    """Greedy batch decoding with the plain-PyTorch model (module docstring). Build it with
    :meth:`from_pygpukit`."""

    def __init__(self, model: _Transformer, batch: int, max_seq_len: int, compile: bool = True,
                 compile_prefill: bool = False) -> None:  # fmt: skip
        self.model = model
        self.config = model.config
        self.batch = batch
        self.max_seq_len = max_seq_len
        self.device = model.embed.device
        self.dtype = model.embed.dtype
        self.compiled = bool(compile)
        self.compile_prefill = bool(compile and compile_prefill)
        self._positions = torch.arange(max_seq_len, dtype=torch.long, device=self.device)
        self._decode: Any = model.decode_one
        self._prefill: Any = model.prefill
        if compile:
            self._decode = torch.compile(model.decode_one, mode="reduce-overhead", fullgraph=True)
            if compile_prefill:
                self._prefill = torch.compile(model.prefill, dynamic=True, fullgraph=True)

    @classmethod
    def from_pygpukit(cls, model: Any, max_seq_len: int, batch: int = 1, compile: bool = True,
                      device: str | None = None, compile_prefill: bool = False) -> TorchDecoder:  # fmt: skip
        """A reference holding its own copy of ``model``'s weights (a pygpukit.llm
        CausalTransformerModel with dense weights), same dtype, with KV caches for ``batch`` rows of
        ``max_seq_len`` positions. ``device``: a torch device (default: the model's CUDA device on the
        CUDA backend, else "cpu"). ``compile``: compile the decode step (reduce-overhead: CUDA graphs);
        ``compile_prefill``: also compile prefill with dynamic shapes (default eager)."""
        from pygpukit.llm.model import CausalTransformerModel

        if not isinstance(model, CausalTransformerModel):
            raise TypeError(f"TorchDecoder.from_pygpukit: expected a CausalTransformerModel, got "
                            f"{type(model).__name__}")  # fmt: skip
        for what, value in (("batch", batch), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TorchDecoder.from_pygpukit: {what} must be an int >= 1, got {value!r}")
        c = _reference_config(model.config)
        if max_seq_len > c.max_position_embeddings:
            raise ValueError(f"TorchDecoder.from_pygpukit: max_seq_len {max_seq_len} exceeds the model's "
                             f"{c.max_position_embeddings} positions (max_position_embeddings)")  # fmt: skip
        w = model.weights
        if w.position_embed is not None:
            raise NotImplementedError("TorchDecoder: learned position embeddings (GPT-2) are not supported")
        if model.dtype.name not in _TORCH_DTYPES:
            raise TypeError(f"TorchDecoder.from_pygpukit: model dtype {model.dtype.name} is not supported")
        cuda_backend = model.backend == "cuda"
        if device is None:
            target = torch.device("cuda", int(w.embed.__dlpack_device__()[1])) if cuda_backend else torch.device("cpu")
        else:
            target = torch.device(device)
        copy = _WeightCopier(cuda_backend, target, _TORCH_DTYPES[model.dtype.name])
        embed = _check_shape("embed", copy("embed", w.embed, linear=True), (c.vocab_size, c.hidden_size))
        lm_head = None  # tied: the embedding itself
        if w.lm_head is not w.embed:
            lm_head = _check_shape("lm_head", copy("lm_head", w.lm_head, linear=True), (c.vocab_size, c.hidden_size))
        weights: dict[str, Any] = {
            "embed": embed,
            "lm_head": lm_head,
            "final_norm": _check_shape("final_norm", copy("final_norm", w.final_norm), (c.hidden_size,)),
            "layers": [_layer_weights(copy, c, i, layer) for i, layer in enumerate(w.layers)],
        }
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        with torch.no_grad():
            module = _Transformer(c, weights, batch, max_seq_len)
        return cls(module, batch, max_seq_len, compile=compile, compile_prefill=compile_prefill)

    # -- running ------------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _tokens(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        if len(prompts) != self.batch:
            raise ValueError(f"TorchDecoder: {len(prompts)} prompts for a batch of {self.batch}")
        lengths = {len(p) for p in prompts}
        if len(lengths) != 1:
            raise ValueError(f"TorchDecoder: the prompts must have equal lengths, got {sorted(lengths)}")
        if not next(iter(lengths)):
            raise ValueError("TorchDecoder: the prompts are empty")
        return torch.tensor([list(p) for p in prompts], dtype=torch.long, device=self.device)

    def logits(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """float32 logits of every position (batch, seq, vocab) of equal-length ``prompts`` run from
        position 0 (eager; overwrites the KV caches' first seq positions)."""
        tokens = self._tokens(prompts)
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(f"TorchDecoder: a {tokens.shape[1]}-token prompt exceeds max_seq_len {self.max_seq_len}")
        with torch.no_grad():
            return self.model.logits(tokens, self._positions[: tokens.shape[1]])

    def generate(self, prompts: Sequence[Sequence[int]], new_tokens: int) -> tuple[list[list[int]], dict[str, float]]:
        """Greedy decoding of ``batch`` equal-length ``prompts`` for exactly ``new_tokens`` tokens each
        (no end-of-sequence stop). Returns the new tokens of every row and the timing: ``ttft_s``
        (prompt upload, prefill and the first token), ``decode_s`` (the tokens after the first) and
        ``decode_tokens_per_s`` (batch * (new_tokens - 1) / decode_s, 0.0 for one token), the clock
        read after a device synchronization."""
        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
            raise ValueError(f"TorchDecoder.generate: new_tokens must be an int >= 1, got {new_tokens!r}")
        lengths = {len(p) for p in prompts}
        seq = max(lengths, default=0)
        if seq + new_tokens > self.max_seq_len:
            raise ValueError(f"TorchDecoder.generate: {seq} prompt + {new_tokens} new tokens exceed max_seq_len "
                             f"{self.max_seq_len}")  # fmt: skip
        # Compiled CUDA-graph steps: each call starts a new step (its outputs are cloned at once).
        mark_step: Any = (
            torch.compiler.cudagraph_mark_step_begin if self.compiled and self.device.type == "cuda" else None
        )
        with torch.no_grad():
            self._sync()
            start = time.perf_counter()
            tokens = self._tokens(prompts)
            token = torch.argmax(self._prefill(tokens, self._positions[:seq]), dim=-1)
            produced = [token]
            self._sync()
            first = time.perf_counter()
            for step in range(new_tokens - 1):
                if mark_step is not None:
                    mark_step()
                position = self._positions[seq + step : seq + step + 1]
                token = self._decode(token.view(self.batch, 1), position).clone()
                produced.append(token)
            self._sync()
            end = time.perf_counter()
        rows: list[list[int]] = torch.stack(produced, dim=1).tolist()
        decode_s = end - first
        decoded = self.batch * (new_tokens - 1)
        stats = {
            "ttft_s": first - start,
            "decode_s": decode_s,
            "decode_tokens_per_s": decoded / decode_s if decoded and decode_s > 0 else 0.0,
        }
        return rows, stats

    def warmup(self, prompt_len: int = 8, new_tokens: int = 8, runs: int = 2) -> None:
        """Compile and capture before timing: ``runs`` untimed generate() calls on a prompt of
        ``prompt_len`` zeros (the decode step's shapes do not depend on the length, so one warm-up
        serves every later call; a compiled prefill recompiles once for dynamic lengths)."""
        new_tokens = max(1, min(new_tokens, self.max_seq_len - prompt_len))
        for _ in range(runs):
            self.generate([[0] * prompt_len for _ in range(self.batch)], new_tokens)
