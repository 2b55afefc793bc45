"""Whisper's encoder and decoder on pygpukit ops (conv1d, layernorm, linear, sdpa, the KV cache).

The encoder: two convolutions with GELU (the second of stride 2), sinusoidal positions, pre-LN blocks of
self-attention and a GELU MLP, a final layer norm. The decoder: token embeddings plus learned positions,
pre-LN blocks of causal self-attention (keys and values kept in a :class:`pygpukit.ops.KVCache`),
cross-attention over the encoder output (its keys and values computed once per 30 s window by
:meth:`WhisperModel.cross_kv`) and the MLP; logits through the tied embedding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, asarray
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

from .tokenizer import WhisperTokenizer
from .weights import HEAD_DIM, WhisperConfig, load_pretrained

__all__ = ["DecoderState", "WhisperModel"]

Array = np.ndarray[Any, Any]
_EPS = 1e-5
_DTYPES = (float32, float16, bfloat16)


@dataclass
class DecoderState:
    """The per-window decoding state: the self-attention KV cache, the cross-attention keys/values of each
    layer ((batch, n_audio_ctx, heads, 64) views) and the number of positions already decoded. ``scratch``
    holds what one-token steps reuse: the decode-attention workspaces and the cross-attention lengths
    (made on first use; a workspace serves every layer's call, queued on one stream)."""

    cache: Any
    cross: list[tuple[GPUArray, GPUArray]]
    length: int = 0
    scratch: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def batch(self) -> int:
        return int(self.cache.batch)

    def workspace(self, heads: int, head_dim: int, max_len: int) -> Any:
        """decode_workspace(batch, heads, heads, head_dim, max_len), made once per state (the one
        decode_attention makes when given none: the same splits, so the same result)."""
        from pygpukit.ops import decode_workspace

        key = ("workspace", self.batch, heads, head_dim, max_len)
        found = self.scratch.get(key)
        if found is None:
            found = self.scratch[key] = decode_workspace(self.batch, heads, heads, head_dim, max_len)
        return found

    def cross_lengths(self, frames: int) -> GPUArray:
        """int32 (batch,) on the device, every value ``frames``: the cross-attention's key count."""
        key = ("cross_lengths", self.batch, frames)
        found = self.scratch.get(key)
        if found is None:
            found = self.scratch[key] = asarray(np.full(self.batch, frames, np.int32))
        return found


class WhisperModel:
    """A Whisper model on the current device in ``dtype`` (float32, float16 or bfloat16)."""

    def __init__(self, config: WhisperConfig, weights: dict[str, Array], tokenizer: WhisperTokenizer | None = None,
                 dtype: Any = float32, path: str = "") -> None:  # fmt: skip
        target = as_dtype(dtype)
        if target not in _DTYPES:
            raise DTypeError(f"WhisperModel: dtype must be float32, float16 or bfloat16, got {target.name}")
        self.config = config
        self.dtype: DType = target
        self.tokenizer = tokenizer
        self.path = path
        # greedy decoding through the captured decode step (graph_decode.py): None = on the CUDA backend
        self.graph_decode: bool | None = None
        self._graph_decoders: dict[int, Any] = {}  # batch size -> GraphDecoder (graph_decode.graph_decoder)
        self.w: dict[str, GPUArray] = {}
        for name, value in weights.items():
            array = asarray(np.ascontiguousarray(value, dtype=np.float32))
            self.w[name] = array if target == float32 else array.astype(target)

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike[str] | None = None, dtype: Any = float32) -> WhisperModel:
        """Load a CTranslate2 directory (model.bin, config.json, tokenizer.json), a transformers one
        (model.safetensors, config.json, tokenizer.json) or a registered name (``whisper-tiny.en``, the
        default, fetched into the cache on first use)."""
        from .hub import resolve_model

        folder = resolve_model(path_or_name)
        if folder.is_file():
            folder = folder.parent
        config, weights = load_pretrained(folder)
        tokenizer = None
        if (folder / "tokenizer.json").is_file():
            tokenizer = WhisperTokenizer(folder / "tokenizer.json", multilingual=config.multilingual)
        return cls(config, weights, tokenizer, dtype, str(Path(folder)))

    def __repr__(self) -> str:
        c = self.config
        return (f"WhisperModel(d_model={c.d_model}, layers={c.encoder_layers}+{c.decoder_layers}, n_mels={c.n_mels}, "
                f"vocab={c.n_vocab}, dtype={self.dtype.name})")  # fmt: skip

    # -- building blocks ---------------------------------------------------------------------------
    def _ln(self, x: GPUArray, name: str) -> GPUArray:
        from pygpukit.ops import layernorm

        return layernorm(x, self.w[name + ".g"], self.w[name + ".b"], _EPS)

    def _linear(self, x: GPUArray, name: str, activation: str | None = None) -> GPUArray:
        from pygpukit.ops import linear

        return linear(x, self.w[name + ".w"], self.w.get(name + ".b"), activation)

    def _mlp(self, x: GPUArray, prefix: str) -> GPUArray:
        from pygpukit.ops import add

        h = self._ln(x, prefix + ".mlp_ln")
        return add(x, self._linear(self._linear(h, prefix + ".fc1", "gelu"), prefix + ".fc2"))

    # -- encoder -----------------------------------------------------------------------------------
    def encode(self, features: Any) -> GPUArray:
        """Log-mel features (n_mels, 2 * n_audio_ctx) or (batch, n_mels, 2 * n_audio_ctx) -> the encoder
        output (batch, n_audio_ctx, d_model) in the model's dtype."""
        from pygpukit.ops import add, conv1d, sdpa

        c = self.config
        x = features if isinstance(features, GPUArray) else asarray(np.asarray(features, dtype=np.float32))
        if x.ndim == 2:
            x = x.reshape(1, *x.shape)
        if x.ndim != 3 or x.shape[1] != c.n_mels or x.shape[2] != 2 * c.n_audio_ctx:
            raise ShapeError(f"encode: features must be (batch, {c.n_mels}, {2 * c.n_audio_ctx}), got {x.shape}")
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        x = conv1d(x, self.w["enc.conv1.w"], self.w["enc.conv1.b"], padding=1, activation="gelu")
        x = conv1d(x, self.w["enc.conv2.w"], self.w["enc.conv2.b"], stride=2, padding=1, activation="gelu")
        x = add(x.transpose(0, 2, 1), self.w["enc.pos"])  # (batch, n_audio_ctx, d)
        batch, n, d = x.shape
        heads = c.encoder_heads
        for i in range(c.encoder_layers):
            p = f"enc.{i}"
            qkv = self._linear(self._ln(x, p + ".attn_ln"), p + ".qkv").reshape(batch, n, 3, heads, HEAD_DIM)
            attn = sdpa(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
            x = add(x, self._linear(attn.reshape(batch, n, d), p + ".out"))
            x = self._mlp(x, p)
        return self._ln(x, "enc.ln")

    # -- decoder -----------------------------------------------------------------------------------
    def cross_kv(self, encoder_out: GPUArray, repeat: int = 1) -> list[tuple[GPUArray, GPUArray]]:
        """Each decoder layer's cross-attention keys and values of ``encoder_out`` (batch, n_audio_ctx, d),
        computed once per window; ``repeat`` copies each batch row that many times (beams)."""
        from pygpukit.ops import embedding

        c = self.config
        batch, n, d = encoder_out.shape
        heads = c.decoder_heads
        out = []
        for i in range(c.decoder_layers):
            kv = self._linear(encoder_out, f"dec.{i}.cross_kv")  # (batch, n, 2d)
            if repeat > 1:
                index = asarray(np.repeat(np.arange(batch, dtype=np.int32), repeat))
                kv = embedding(kv.reshape(batch, n * 2 * d), index).reshape(batch * repeat, n, 2 * d)
            view = kv.reshape(batch * repeat, n, 2, heads, HEAD_DIM)
            out.append((view[:, :, 0], view[:, :, 1]))
        return out

    def new_state(self, encoder_out: GPUArray, repeat: int = 1, max_len: int | None = None) -> DecoderState:
        """A fresh decoding state for ``encoder_out`` ((batch, n_audio_ctx, d)), ``repeat`` rows per item."""
        from pygpukit.ops import KVCache

        c = self.config
        length = c.n_text_ctx if max_len is None else int(max_len)
        if not 1 <= length <= c.n_text_ctx:
            raise ArgumentError(f"new_state: max_len must be in [1, {c.n_text_ctx}], got {max_len}")
        batch = encoder_out.shape[0] * repeat
        cache = KVCache(c.decoder_layers, batch, c.decoder_heads, length, HEAD_DIM, self.dtype)
        cache.reset(clear=True)  # no stale values (NaN bit patterns) in positions beyond the written ones
        return DecoderState(cache, self.cross_kv(encoder_out, repeat), 0)

    def decode(self, tokens: Any, state: DecoderState, capture: dict[int, GPUArray] | None = None) -> GPUArray:
        """Run the decoder on ``tokens`` (batch, L) following the ``state.length`` positions already cached
        and return the final hidden states (batch, L, d); ``state.length`` grows by L. ``capture``
        receives each layer's cross-attention queries (batch, L, heads, 64)."""
        from pygpukit.ops import add, decode_attention, embedding, prefill_attention, sdpa

        c = self.config
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != state.batch:
            raise ShapeError(f"decode: tokens must be (batch={state.batch}, L), got shape {ids.shape}")
        batch, length = ids.shape
        start = state.length
        if length == 0 or start + length > state.cache.max_seq_len:
            raise ArgumentError(f"decode: {length} tokens after {start} exceed the context of "
                                f"{state.cache.max_seq_len} positions")  # fmt: skip
        if ids.min() < 0 or ids.max() >= c.n_vocab:
            raise ArgumentError(f"decode: token ids must be in [0, {c.n_vocab}), got {ids.min()}..{ids.max()}")
        d, heads = c.d_model, c.decoder_heads
        x = embedding(self.w["dec.embed"], asarray(ids.reshape(-1).astype(np.int32))).reshape(batch, length, d)
        x = add(x, self.w["dec.pos"][start : start + length])
        for i in range(c.decoder_layers):
            p = f"dec.{i}"
            qkv = self._linear(self._ln(x, p + ".attn_ln"), p + ".qkv").reshape(batch, length, 3, heads, HEAD_DIM)
            state.cache.write_prefill(i, qkv[:, :, 1], qkv[:, :, 2], start)
            kc, vc = state.cache.k(i), state.cache.v(i)
            if length == 1:
                q = qkv[:, 0, 0]
                attn = decode_attention(q if q.is_contiguous else q.contiguous(), kc, vc,
                                        np.full(batch, start + 1, np.int32),
                                        workspace=state.workspace(heads, HEAD_DIM, kc.shape[2]))  # fmt: skip
            else:
                attn = prefill_attention(qkv[:, :, 0], kc, vc, np.full(batch, start, np.int32))
            x = add(x, self._linear(attn.reshape(batch, length, d), p + ".out"))
            q = self._linear(self._ln(x, p + ".cross_ln"), p + ".cross_q").reshape(batch, length, heads, HEAD_DIM)
            ck, cv = state.cross[i]
            if capture is not None:
                capture[i] = q
            if length == 1:  # one query per row: the split-K decode kernel over (batch, heads, frames, dim) views
                frames = ck.shape[1]
                cross = decode_attention(q[:, 0], ck.transpose(0, 2, 1, 3), cv.transpose(0, 2, 1, 3),
                                         state.cross_lengths(frames),
                                         workspace=state.workspace(heads, HEAD_DIM, frames))  # fmt: skip
            else:
                cross = sdpa(q, ck, cv)
            x = add(x, self._linear(cross.reshape(batch, length, d), p + ".cross_out"))
            x = self._mlp(x, p)
        state.length = start + length
        return self._ln(x, "dec.ln")

    def cross_attention_scores(self, encoder_out: GPUArray, tokens: Any,
                               heads: Any) -> tuple[Array, Array]:  # fmt: skip
        """For ``tokens`` (L,) after ``encoder_out`` (1, n_audio_ctx, d): the scaled cross-attention scores
        q k^T / 8 of the (layer, head) pairs ``heads`` as (len(heads), L, n_audio_ctx) and the logits
        (L, n_vocab), both float32 NumPy arrays (for word alignment)."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        state = self.new_state(encoder_out, max_len=min(self.config.n_text_ctx, ids.shape[1]))
        queries: dict[int, GPUArray] = {}
        logits = self.logits(self.decode(ids, state, capture=queries)).to_numpy()[0]
        out = []
        for layer, head in heads:
            q = queries[int(layer)].contiguous().to_numpy()[0, :, int(head)].astype(np.float32)
            k = state.cross[int(layer)][0].contiguous().to_numpy()[0, :, int(head)].astype(np.float32)
            out.append(q @ k.T / np.sqrt(HEAD_DIM))
        return np.stack(out), logits

    def logits(self, hidden: GPUArray) -> GPUArray:
        """Vocabulary logits (..., n_vocab) of final hidden states, in float32."""
        from pygpukit.ops import linear

        rows = hidden if hidden.is_contiguous else hidden.contiguous()  # e.g. the last position of each row
        out = linear(rows, self.w["dec.embed"])
        return out if out.dtype == float32 else out.astype(float32)

    def reorder(self, state: DecoderState, rows: Any) -> None:
        """Keep the cached positions of batch rows ``rows`` (one index per row, beams), in place."""
        from pygpukit.ops import embedding

        index = np.asarray(rows, dtype=np.int32)
        if index.shape != (state.batch,):
            raise ShapeError(f"reorder: need {state.batch} row indices, got shape {index.shape}")
        if np.array_equal(index, np.arange(state.batch)):
            return
        device_index = asarray(index)
        for layer in range(state.cache.num_layers):
            for cache in (state.cache.k(layer), state.cache.v(layer)):
                flat = cache.reshape(state.batch, -1)
                cache.copy_(embedding(flat, device_index).reshape(cache.shape))

    def forward(self, features: Any, tokens: Any) -> GPUArray:
        """Logits (batch, L, n_vocab) of ``tokens`` (batch, L) given log-mel ``features`` (float32)."""
        ids = np.asarray(tokens)
        if ids.ndim == 1:
            ids = ids[None]
        state = self.new_state(self.encode(features))
        return self.logits(self.decode(ids, state))
