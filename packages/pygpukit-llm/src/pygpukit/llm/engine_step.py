"""The :class:`~pygpukit.llm.Engine`'s batched decode step with preallocated buffers, and its CUDA graph.

:class:`PagedDecodeStep` is :class:`~pygpukit.llm.DecodeM1`'s step (the same buffers, projections,
norms and MLP, ``out=`` everywhere: the layers of :class:`~pygpukit.llm.decode_layers.LayerStep`)
over the engine's paged KV cache instead of a fixed one (its ``_attend``): RoPE at
the cache's ``context_lens``, the key and value appended into each slot's blocks there, paged decode
attention over each slot's block-table row with the lengths ``context_lens + mask``, the greedy pick
into ``tokens_out``, then ``context_lens += mask`` (only decoding slots advance). Every input is read
from device buffers (the tokens, the engine's mask, the cache's table and lengths), so one captured
graph replays at every step whatever requests run (``graph=True``, the default on the CUDA backend).
The picks are also the next step's input tokens, so a steady-state step uploads nothing and
allocates nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import int32
from pygpukit.core.graph import CudaGraph

from .decode import DecodeM1
from .decode_layers import capture_step

if TYPE_CHECKING:
    from .model import CausalTransformerModel

__all__ = ["PagedDecodeStep"]

# The CPU backend's CudaGraph records the calls this module makes into pygpukit inside a capture.
__pygpukit_record_calls__ = True


class PagedDecodeStep(DecodeM1):
    """One decode token for each of ``batch`` paged-cache slots, allocation-free (see the module)."""

    def __init__(self, model: CausalTransformerModel, cache: ops.PagedKVCache, mask: GPUArray,
                 workspace: ops.DecodeWorkspace, graph: bool) -> None:  # fmt: skip
        # DecodeM1's buffers without its fixed-size KV cache (the state is the paged cache here).
        self.model = model
        self.batch = cache.max_batch
        self.max_seq_len = cache.max_blocks_per_seq * cache.block_size
        self.sampler = None
        self._settings = {}
        self._history = None
        self._history_host = None
        self.fuse = True
        self._fuse_all = False
        self.paged = cache
        self.mask = mask
        self.paged_workspace = workspace
        self.lens = empty(self.batch, int32)
        self._allocate()
        # self.tokens: the greedy picks (sampled rows overwritten by the engine), also the next step's
        # input; the engine writes a request's first token (from its prefill) into its row.
        self.input = self.tokens
        self.tokens.copy_(np.zeros(self.batch, np.int32))  # valid ids in every row (free rows embed token 0)
        self.graph: CudaGraph | None = None
        if graph:
            self.graph = capture_step(self._step, "Engine: the decode step was not captured")

    @property
    def tokens_out(self) -> GPUArray:
        return self.tokens

    def run(self) -> None:
        """One step: the graph's replay, or the ops launched one by one."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _attend(self, index: int, q: GPUArray, k: GPUArray, v: GPUArray) -> None:
        """RoPE at ``context_lens``, the key and value appended there, paged attention over ``lens``."""
        model, cache = self.model, self.paged
        if model.rope is not None:
            model.rope(q, k, cache.context_lens)
        cache.append(index, k, v)  # at context_lens: blockless slots are skipped
        ops.paged_decode_attention(q[:, 0], cache.k_blocks(index), cache.v_blocks(index), cache.block_table,
                                   self.lens, out=self.attn, workspace=self.paged_workspace)  # fmt: skip

    def _step(self) -> None:
        w, b = self.model.weights, self.batch
        ctx = self.paged.context_lens  # the new tokens' positions
        ops.add(ctx, self.mask, out=self.lens)  # the attention sees the new token of decoding slots
        ops.embedding(w.embed, self.input.reshape(b, 1), out=self.residual)
        if w.position_embed is not None:
            assert self.position_rows is not None
            ops.embedding(w.position_embed, ctx.reshape(b, 1), out=self.position_rows)
            ops.add(self.residual, self.position_rows, out=self.residual)
        self._layers()
        ops.greedy(self.logits, out=self.tokens)
        ops.add(ctx, self.mask, out=ctx)

    def read(self) -> np.ndarray[Any, Any]:
        return self.tokens.to_numpy()
