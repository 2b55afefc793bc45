"""`CausalTransformerModel`: one decoder-only transformer for every spec, computed with pygpukit ops.

The forward pass is written once; the spec decides the norm (RMSNorm or LayerNorm), the MLP (SwiGLU,
GPT-2's GELU MLP or a sparse MoE block), the positions (RoPE or learned), QKV biases and QK-norm.
Prefill runs causal flash attention over the prompt and writes the keys and values into a
:class:`pygpukit.KVCache`; each decode step appends one token per sequence and runs split-K decode
attention over the cache, with the positions held on the device (``lengths``), so a step reads
nothing back to the host. The same code runs on the CPU simulation backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, from_numpy, zeros
from pygpukit.core.backend import backend_state
from pygpukit.core.dtypes import DType, as_dtype, int32
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.ops.quant import ChannelQuantizedTensor, QuantizedExperts, QuantizedTensor

from .config import TransformerConfig

if TYPE_CHECKING:
    from .chat import ChatTemplate
    from .generation import GenerationStats
    from .tokenizer import Tokenizer

__all__ = ["CausalTransformerModel", "DecodeState", "LayerWeights", "LinearWeight", "ModelWeights"]

# A linear layer's weight (out_features, in_features): dense, in a GGUF block format, or FP8/INT8 with
# per-channel scales; ops.linear runs each.
LinearWeight = GPUArray | QuantizedTensor | ChannelQuantizedTensor


@dataclass
class LayerWeights:
    """The device weights of one transformer block (absent parts are None)."""

    attn_norm: GPUArray
    wq: LinearWeight
    wk: LinearWeight
    wv: LinearWeight
    wo: LinearWeight
    mlp_norm: GPUArray
    attn_norm_bias: GPUArray | None = None
    mlp_norm_bias: GPUArray | None = None
    bq: GPUArray | None = None
    bk: GPUArray | None = None
    bv: GPUArray | None = None
    bo: GPUArray | None = None
    q_norm: GPUArray | None = None
    k_norm: GPUArray | None = None
    # Fused QKV (CausalTransformerModel.fuse_qkv): the (q + 2 kv, H) stack [wq | wk | wv] of rows, of
    # which wq, wk and wv are then row views (one copy of the weights), and its bias.
    w_qkv: LinearWeight | None = None
    b_qkv: GPUArray | None = None
    # Dense MLP: SwiGLU keeps gate and up stacked as one (2I, H) weight ([gate | up] rows), so one GEMM
    # produces the concatenated input of swiglu; GPT-2 keeps its (I, H) fc weight here.
    w_gate_up: LinearWeight | None = None
    b_gate_up: GPUArray | None = None
    w_down: LinearWeight | None = None
    b_down: GPUArray | None = None
    # Sparse MoE MLP.
    w_router: GPUArray | None = None
    # Dense (E, ...) arrays, or QuantizedExperts (a GGUF file's experts kept in their block format).
    experts_gate_up: GPUArray | QuantizedExperts | None = None  # (E, 2I, H)
    experts_down: GPUArray | QuantizedExperts | None = None  # (E, H, I)


@dataclass
class ModelWeights:
    """Every device weight of a model."""

    embed: GPUArray  # (vocab, hidden)
    layers: list[LayerWeights]
    final_norm: GPUArray
    lm_head: LinearWeight  # (vocab, hidden); the embedding itself when tied
    final_norm_bias: GPUArray | None = None
    position_embed: GPUArray | None = None  # GPT-2's learned positions (max_positions, hidden)

    @property
    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for value in self._arrays():  # by allocation: views (a fused QKV's wq, wk, wv) count once
            seen[id(value.buffer)] = value.buffer.nbytes
        return sum(seen.values())

    def _arrays(self) -> Iterator[GPUArray]:
        """Every device array, a quantized weight's bytes included."""
        for value in (self.embed, self.final_norm, self.lm_head, self.final_norm_bias, self.position_embed):
            if value is not None:
                yield from _device_arrays(value)
        for layer in self.layers:
            for value in vars(layer).values():
                yield from _device_arrays(value)


def _device_arrays(value: Any) -> Iterator[GPUArray]:
    """The device arrays a weight consists of (none for anything else)."""
    if isinstance(value, GPUArray):
        yield value
    elif isinstance(value, (QuantizedTensor, QuantizedExperts)):
        yield value.data
    elif isinstance(value, ChannelQuantizedTensor):
        yield value.data
        yield value.scale
    elif getattr(value, "_quantized", False) and hasattr(value, "qweight"):  # an Int4Tensor (AWQ / GPTQ)
        yield from (value.qweight, value.qzeros, value.scales)
    elif getattr(value, "_quantized", False):  # other quantized weights (BlockFP8Tensor, NVF4Tensor, ...)
        for slot in getattr(type(value), "__slots__", ()):
            part = getattr(value, slot, None)
            if isinstance(part, GPUArray):
                yield part


@dataclass
class DecodeState:
    """The device state of one batch being decoded: its KV cache, the per-sequence lengths (int32
    (batch,), counting the token being decoded once a step begins) and the decode-attention
    workspace."""

    cache: ops.KVCache
    lengths: GPUArray
    workspace: ops.DecodeWorkspace
    batch: int
    max_seq_len: int
    host_lengths: list[int] = field(default_factory=list)


class CausalTransformerModel:
    """A decoder-only transformer (GPT-2, LLaMA, Qwen2, Qwen3, Mixtral, Qwen3-MoE) on pygpukit arrays.

    Build one with :func:`pygpukit.llm.load` or :func:`pygpukit.llm.load_model_from_safetensors`.
    ``tokenizer`` and ``chat_template`` are attached by the loaders when the checkpoint has them.
    """

    def __init__(
        self,
        config: TransformerConfig,
        weights: ModelWeights,
        dtype: Any,
        tokenizer: Tokenizer | None = None,
        chat_template: ChatTemplate | None = None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.weights = weights
        self.dtype: DType = as_dtype(dtype)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.last_stats: GenerationStats | None = None
        if len(weights.layers) != config.num_layers:
            raise ShapeError(f"model: {len(weights.layers)} layers of weights for a {config.num_layers}-layer config")
        self.rope: ops.RotaryEmbedding | None = None
        if self.spec.positions == "rope":
            self.rope = ops.RotaryEmbedding(
                config.head_dim, config.max_position_embeddings, theta=config.rope_theta,
                rotary_dim=config.rotary_dim, scaling=config.rope_scaling,
            )  # fmt: skip

    # -- properties ---------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """ "cuda" or "cpu": where the model's arrays live."""
        return backend_state().name

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def __repr__(self) -> str:
        c = self.config
        return (
            f"CausalTransformerModel({self.spec.name}, layers={c.num_layers}, hidden={c.hidden_size}, "
            f"heads={c.num_heads}/{c.num_kv_heads}, vocab={c.vocab_size}, dtype={self.dtype.name}, "
            f"backend={self.backend})"
        )

    # -- state --------------------------------------------------------------------------------------
    def new_state(self, batch: int, max_seq_len: int) -> DecodeState:
        """A KV cache and decode workspace for ``batch`` sequences of up to ``max_seq_len`` tokens."""
        c = self.config
        if max_seq_len > c.max_position_embeddings:
            raise ArgumentError(
                f"{max_seq_len} tokens exceed the model's {c.max_position_embeddings} positions "
                "(max_position_embeddings); shorten the prompt or max_new_tokens"
            )
        cache = ops.KVCache(c.num_layers, batch, c.num_kv_heads, max_seq_len, c.head_dim, dtype=self.dtype)
        if self.backend != "cuda":  # the NumPy attention reads whole cache rows; keep unwritten ones finite
            cache.reset(clear=True)
        workspace = ops.decode_workspace(batch, c.num_heads, c.num_kv_heads, c.head_dim, max_seq_len)
        lengths = zeros(batch, int32)
        return DecodeState(cache, lengths, workspace, batch, max_seq_len, [0] * batch)

    # -- forward ------------------------------------------------------------------------------------
    def _norm(self, x: GPUArray, weight: GPUArray, bias: GPUArray | None) -> GPUArray:
        if self.spec.norm == "layernorm":
            return ops.layernorm(x, weight, bias, self.config.norm_eps)
        return ops.rmsnorm(x, weight, self.config.norm_eps)

    def _embed(self, ids: GPUArray, positions: GPUArray) -> GPUArray:
        h = ops.embedding(self.weights.embed, ids)
        if self.weights.position_embed is not None:
            h = ops.add(h, ops.embedding(self.weights.position_embed, positions))
        return h

    # -- fusions ------------------------------------------------------------------------------------
    def fuse_qkv(self) -> int:
        """Stack every layer's q, k and v projections into one weight (``LayerWeights.w_qkv``, rows
        [wq | wk | wv]) so that one GEMV/GEMM computes all three; ``wq``, ``wk`` and ``wv`` become row
        views of it, so the weights are held once (each layer's originals are released as it is
        stacked). Dense weights of one dtype stack; GGUF block-quantized ones when all three have one
        format (a row is whole blocks, so the raw rows concatenate); per-channel quantized ones when
        all three have one kind (rows and scales concatenate). Idempotent; returns the number of
        layers stacked by this call."""
        count = 0
        for layer in self.weights.layers:
            if layer.w_qkv is not None:
                continue
            fused = _stack_rows([layer.wq, layer.wk, layer.wv])
            if fused is None:
                continue
            biases = (layer.bq, layer.bk, layer.bv)
            if any(b is not None for b in biases):
                parts = [b if b is not None else zeros(_rows(w), self.dtype) for b, w in
                         zip(biases, (layer.wq, layer.wk, layer.wv), strict=True)]  # fmt: skip
                if len({p.dtype.name for p in parts}) != 1:
                    continue
                layer.b_qkv = ops.concatenate(parts, axis=0)
                layer.bq, layer.bk, layer.bv = _row_views(layer.b_qkv, [_rows(layer.wq), _rows(layer.wk)])
            layer.w_qkv = fused
            layer.wq, layer.wk, layer.wv = _row_views(fused, [_rows(layer.wq), _rows(layer.wk)])
            count += 1
        return count

    def _qkv(self, layer: LayerWeights, x: GPUArray, batch: int, seq: int) -> tuple[GPUArray, GPUArray, GPUArray]:
        c = self.config
        if layer.w_qkv is not None and layer.q_norm is None:  # one GEMM; q, k, v are views of its output
            qkv = ops.linear(x, layer.w_qkv, layer.b_qkv).reshape(batch, seq, c.num_heads + 2 * c.num_kv_heads,
                                                                   c.head_dim)  # fmt: skip
            return (qkv[:, :, : c.num_heads], qkv[:, :, c.num_heads : c.num_heads + c.num_kv_heads],
                    qkv[:, :, c.num_heads + c.num_kv_heads :])  # fmt: skip
        q = ops.linear(x, layer.wq, layer.bq).reshape(batch, seq, c.num_heads, c.head_dim)
        k = ops.linear(x, layer.wk, layer.bk).reshape(batch, seq, c.num_kv_heads, c.head_dim)
        v = ops.linear(x, layer.wv, layer.bv).reshape(batch, seq, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = ops.rmsnorm(q, layer.q_norm, c.norm_eps)
            k = ops.rmsnorm(k, layer.k_norm, c.norm_eps)
        return q, k, v

    def _mlp(self, layer: LayerWeights, x: GPUArray) -> GPUArray:
        c = self.config
        if layer.w_router is not None:
            assert layer.experts_gate_up is not None
            assert layer.experts_down is not None
            shape = x.shape
            flat = x.reshape(-1, c.hidden_size)
            logits = ops.linear(flat, layer.w_router)
            # QuantizedExperts run through moe_mlp too (the quantized grouped GEMV / GEMM)
            out = ops.moe_mlp(flat, logits, layer.experts_gate_up, layer.experts_down,
                              c.num_experts_per_tok, renormalize=c.norm_topk_prob, activation="silu")  # fmt: skip
            return out.reshape(shape)
        assert layer.w_gate_up is not None
        assert layer.w_down is not None
        if self.spec.activation == "gelu_tanh":
            hidden = ops.linear(x, layer.w_gate_up, layer.b_gate_up, activation="gelu_tanh")  # gelu_new
        else:
            hidden = ops.swiglu(ops.linear(x, layer.w_gate_up, layer.b_gate_up))
        return ops.linear(hidden, layer.w_down, layer.b_down)

    def _blocks(self, h: GPUArray, attend: Any) -> GPUArray:
        """Every transformer block over the hidden states h (batch, seq, hidden); ``attend(index, layer,
        normed)`` returns the attention output projected back to hidden."""
        w = self.weights
        c = self.config
        rms = self.spec.norm == "rmsnorm"
        residual = h
        pending: GPUArray | None = None  # the previous block's MLP output, not yet added
        for index, layer in enumerate(w.layers):
            if pending is None:
                normed = self._norm(residual, layer.attn_norm, layer.attn_norm_bias)
            elif rms:
                normed, residual = ops.add_rmsnorm(pending, residual, layer.attn_norm, c.norm_eps)
            else:
                residual = ops.add(residual, pending)
                normed = self._norm(residual, layer.attn_norm, layer.attn_norm_bias)
            attn = attend(index, layer, normed)
            if rms:
                normed, residual = ops.add_rmsnorm(attn, residual, layer.mlp_norm, c.norm_eps)
            else:
                residual = ops.add(residual, attn)
                normed = self._norm(residual, layer.mlp_norm, layer.mlp_norm_bias)
            pending = self._mlp(layer, normed)
        assert pending is not None
        if rms:
            final, _ = ops.add_rmsnorm(pending, residual, w.final_norm, c.norm_eps)
            return final
        return self._norm(ops.add(residual, pending), w.final_norm, w.final_norm_bias)

    def _logits(self, h: GPUArray) -> GPUArray:
        return ops.linear(h, self.weights.lm_head)

    def prefill(self, ids: GPUArray, state: DecodeState | None = None, lengths: Sequence[int] | None = None,
                all_logits: bool = False) -> GPUArray:  # fmt: skip
        """Run the prompt ``ids`` (int32 (batch, seq), rows right-padded to the longest) from position 0.

        Writes every layer's keys and values into ``state``'s cache (when given) and sets its lengths
        to ``lengths`` (default: seq for every row). Returns the logits of each row's last real token
        (batch, vocab), or of every position (batch, seq, vocab) with ``all_logits``."""
        c = self.config
        if ids.ndim != 2:
            raise ShapeError(f"prefill: ids must be (batch, seq), got shape {ids.shape}")
        batch, seq = ids.shape
        if seq == 0:
            raise ShapeError("prefill: the prompt is empty")
        if seq > c.max_position_embeddings or (state is not None and seq > state.max_seq_len):
            limit = c.max_position_embeddings if state is None else min(state.max_seq_len, c.max_position_embeddings)
            raise ArgumentError(f"prefill: a {seq}-token prompt exceeds the limit of {limit} positions")
        rows = [seq] * batch if lengths is None else [int(n) for n in lengths]
        if len(rows) != batch or not all(1 <= n <= seq for n in rows):
            raise ArgumentError(f"prefill: lengths {rows} must be {batch} values in [1, {seq}]")
        positions = from_numpy(np.arange(seq, dtype=np.int32))
        h = self._embed(ids, positions)

        def attend(index: int, layer: LayerWeights, normed: GPUArray) -> GPUArray:
            q, k, v = self._qkv(layer, normed, batch, seq)
            if self.rope is not None:
                self.rope(q, k, positions)
            if state is not None:
                state.cache.write_prefill(index, k, v, 0)
            out = ops.sdpa_causal(q, k, v)
            return ops.linear(out.reshape(batch, seq, c.q_size), layer.wo, layer.bo)

        h = self._blocks(h, attend)
        if state is not None:
            state.lengths.copy_(np.asarray(rows, dtype=np.int32))
            state.host_lengths = list(rows)
        if all_logits:
            return self._logits(h)
        last = ops.gather_last(h, from_numpy(np.asarray(rows, dtype=np.int32)))
        return self._logits(last)

    def decode_step(self, tokens: GPUArray, state: DecodeState) -> GPUArray:
        """One token per sequence: ``tokens`` int32 (batch,) on the device are the newest tokens, at
        positions ``state.lengths``. Appends their keys and values, advances the lengths by one on the
        device and returns the next logits (batch, vocab). Reads nothing back to the host."""
        c = self.config
        batch = state.batch
        if tokens.shape != (batch,):
            raise ShapeError(f"decode_step: tokens must be ({batch},), got {tokens.shape}")
        if max(state.host_lengths, default=0) >= state.max_seq_len:
            raise ArgumentError(f"decode_step: the KV cache holds {state.max_seq_len} positions and is full")
        lengths = state.lengths
        ops.add(lengths, 1, out=lengths)  # now counts the token being decoded
        state.host_lengths = [n + 1 for n in state.host_lengths]
        positions = ops.sub(lengths, 1) if self.weights.position_embed is not None else lengths
        h = self._embed(tokens.reshape(batch, 1), positions.reshape(batch, 1))

        def attend(index: int, layer: LayerWeights, normed: GPUArray) -> GPUArray:
            q, k, v = self._qkv(layer, normed, batch, 1)
            if self.rope is not None:
                self.rope(q, k, lengths, position_offset=-1)
            state.cache.append(index, k, v, lengths, offset=-1)
            out = ops.decode_attention(q.reshape(batch, c.num_heads, c.head_dim), state.cache.k(index),
                                       state.cache.v(index), lengths, workspace=state.workspace)  # fmt: skip
            return ops.linear(out.reshape(batch, 1, c.q_size), layer.wo, layer.bo)

        h = self._blocks(h, attend)
        return self._logits(h.reshape(batch, c.hidden_size))

    def forward(self, input_ids: Any) -> GPUArray:
        """Logits of every position (batch, seq, vocab) for int token ids (batch, seq) or (seq,) (a
        NumPy array, a list or an int32 GPUArray), without a cache."""
        ids = _as_ids(input_ids)
        squeeze = ids.ndim == 1
        if squeeze:
            ids = ids.reshape(1, -1)
        logits = self.prefill(ids, all_logits=True)
        return logits.reshape(logits.shape[1:]) if squeeze else logits

    __call__ = forward

    def get_logits(self, input_ids: Any) -> GPUArray:
        """Alias of :meth:`forward` (the seeds' name)."""
        return self.forward(input_ids)

    # -- generation (pygpukit.llm.generation) -------------------------------------------------------
    def generate(self, prompt: Any, max_new_tokens: int = 128, **kwargs: Any) -> Any:
        """Generate a continuation. See :func:`pygpukit.llm.generation.generate`."""
        from .generation import generate

        return generate(self, prompt, max_new_tokens, **kwargs)

    def generate_stream(self, prompt: Any, max_new_tokens: int = 128, **kwargs: Any) -> Iterator[str]:
        """Yield the continuation's text as it is generated. See
        :func:`pygpukit.llm.generation.generate_stream`."""
        from .generation import generate_stream

        return generate_stream(self, prompt, max_new_tokens, **kwargs)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:  # fmt: skip
        """The conversation rendered with the model's chat template."""
        from .generation import render_chat

        return render_chat(self, messages, add_generation_prompt, **template_kwargs)

    def chat(self, messages: Sequence[Mapping[str, Any]], max_new_tokens: int = 256, *,
             enable_thinking: bool | None = None, **kwargs: Any) -> str:  # fmt: skip
        """The assistant's reply to a conversation (list of {"role", "content"} dicts)."""
        return "".join(self.chat_stream(messages, max_new_tokens, enable_thinking=enable_thinking, **kwargs))

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], max_new_tokens: int = 256, *,
                    enable_thinking: bool | None = None, **kwargs: Any) -> Iterator[str]:  # fmt: skip
        """Stream the assistant's reply to a conversation."""
        template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        prompt = self.chat_prompt(messages, True, **template_kwargs)
        return self.generate_stream(prompt, max_new_tokens, add_special_tokens=False, **kwargs)


def _rows(w: Any) -> int:
    return int(w.shape[0])


def _stack_rows(weights: list[Any]) -> LinearWeight | None:
    """The row-wise stack of linear weights (out_i, K) as one (sum out_i, K) weight of the same
    kind, or None when they do not stack (mixed kinds, dtypes, formats or K)."""
    kinds = {type(w) for w in weights}
    if len(kinds) != 1 or len({w.shape[1] for w in weights}) != 1:
        return None
    first = weights[0]
    if type(first) is GPUArray:
        if len({w.dtype.name for w in weights}) != 1 or not all(w.is_contiguous for w in weights):
            return None
        return ops.concatenate(weights, axis=0)
    if isinstance(first, QuantizedTensor):
        if len({w.format for w in weights}) != 1:
            return None
        data = ops.concatenate([w.data for w in weights], axis=0)
        return QuantizedTensor(data, first.format, (sum(_rows(w) for w in weights), first.shape[1]))
    if isinstance(first, ChannelQuantizedTensor):
        if len({(w.kind, w.activation_scheme) for w in weights}) != 1 or not all(w.data.is_contiguous for w in weights):
            return None
        data = ops.concatenate([w.data for w in weights], axis=0)
        scale = ops.concatenate([w.scale for w in weights], axis=0)
        return first.with_rows(data, scale)
    return None


def _row_views(stacked: Any, heads: list[int]) -> tuple[Any, Any, Any]:
    """Three row views of ``stacked`` (a weight or a bias): rows [0, a), [a, a + b), [a + b, end) for
    ``heads`` = [a, b]."""
    a, b = heads
    bounds = [(0, a), (a, a + b), (a + b, _rows(stacked))]
    if isinstance(stacked, GPUArray):
        return tuple(stacked[lo:hi] for lo, hi in bounds)  # type: ignore[return-value]
    if isinstance(stacked, QuantizedTensor):
        row = stacked.row_bytes
        k = stacked.shape[1]
        return tuple(QuantizedTensor(stacked.data[lo * row : hi * row], stacked.format, (hi - lo, k))
                     for lo, hi in bounds)  # type: ignore[return-value]  # fmt: skip
    return tuple(stacked.with_rows(stacked.data[lo:hi], stacked.scale[lo:hi])
                 for lo, hi in bounds)  # fmt: skip


def _as_ids(input_ids: Any) -> GPUArray:
    if isinstance(input_ids, GPUArray):
        if input_ids.dtype != int32:
            raise ArgumentError(f"token ids must be int32, got {input_ids.dtype.name}")
        return input_ids
    host = np.asarray(input_ids)
    if host.dtype.kind not in "iu":
        raise ArgumentError(f"token ids must be integers, got {host.dtype}")
    if host.ndim not in (1, 2):
        raise ShapeError(f"token ids must be (seq,) or (batch, seq), got shape {host.shape}")
    return from_numpy(host.astype(np.int32))
