"""Continuous batching over a paged KV cache: :class:`Engine`.

Requests join (``submit``) and leave (a stop id, their ``max_tokens``) between steps. Every request
holds a slot of one :class:`pygpukit.PagedKVCache` (``max_batch`` slots); blocks of ``block_size``
positions are taken from the cache's :class:`pygpukit.BlockAllocator` as a sequence grows and given
back when it finishes.

One ``step()``:

1. admission: waiting requests take free slots, oldest first, while the free blocks cover their
   first prefill chunk plus one block for every decoding request (``queue``: the rest wait);
2. one batched decode step over all ``max_batch`` slots (fixed shapes): every decoding request's
   last token is embedded, its key and value written at its position (``context_lens``, on the
   device) into its blocks, and paged decode attention reads each slot's block table row and length
   on the device; the lengths of the decoding slots then advance by a device mask, so slots that
   are prefilling or free are left alone (their rows are computed and dropped). The step is
   :class:`~pygpukit.llm.engine_step.PagedDecodeStep` (DecodeM1's preallocated buffers), one CUDA
   graph replay on the CUDA backend (``graph``);
3. chunked prefill: at most ``prefill_chunk`` prompt tokens per step, oldest request first, the
   chunks of several requests laid end to end in ONE forward; a chunk's keys and values go into its
   request's blocks (``write_prefill``) and every query attends over its request's blocks with the
   same paged decode attention, one row per query (its own block-table row; it sees the keys up to
   its own position), so a long prompt is spread over several steps between decode steps;
4. sampling: greedy rows by one argmax over the batch; each sampled request draws from its own
   :class:`pygpukit.Sampler` (its seed), so its tokens do not depend on its neighbours.

When a request needs a block and none is free, the newest request holding a slot is preempted: its
blocks are freed and it goes back to the queue, to be recomputed later (its prompt and the tokens it
has produced are prefilled again; its sampler keeps its state). A request that can never fit (its
prompt plus ``max_tokens`` over the cache or ``max_seq_len``) is refused at ``submit``.

With ``context=`` (a :mod:`pygpukit.scheduler` execution context), the cache is allocated and every
step runs inside ``context_session(context)``: the memory is charged to its budget, and a cache the
budget cannot hold raises :class:`EngineMemoryError` before anything is allocated.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, from_numpy, zeros
from pygpukit.core.dtypes import int32
from pygpukit.core.errors import ArgumentError
from pygpukit.ops.kv_cache import BlocksExhaustedError
from pygpukit.profiling import Range

from .decode import UnsupportedStrategyError, graph_unsupported_reason
from .engine_request import EngineMemoryError, EngineStats, Request, RequestSampling, as_sampling
from .engine_step import PagedDecodeStep

if TYPE_CHECKING:
    from .model import CausalTransformerModel, LayerWeights

__all__ = ["Engine", "EngineMemoryError", "EngineStats", "Request", "RequestSampling"]

_STEP = Range("llm.engine.step")
_DECODE = Range("llm.engine.decode")
_PREFILL = Range("llm.engine.prefill_chunk")


def _int(owner: str, name: str, value: Any, low: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ArgumentError(f"{owner}: {name} must be an int >= {low}, got {value!r}")
    return int(value)


class Engine:
    """A continuous-batching engine over a paged KV cache (module docstring).

    ``max_batch`` requests run at once; ``max_seq_len`` bounds prompt + new tokens of one request;
    the cache holds ``num_blocks`` blocks of ``block_size`` positions, or as many as ``memory_budget``
    bytes hold (give at most one; default: enough for ``max_batch`` full sequences, or with a
    ``context`` 80 % of its free budget). ``prefill_chunk`` is the most prompt tokens prefilled per
    step. ``graph``: the decode step as one CUDA graph replay (True), launched op by op (False), or
    (None, the default) the graph on the CUDA backend when the model allows it (dense or quantized
    linear weights; MoE blocks with dense experts, or GGUF-quantized ones outside float32 models)."""

    def __init__(self, model: CausalTransformerModel, max_batch: int = 8, max_seq_len: int | None = None,
                 block_size: int = 16, num_blocks: int | None = None, memory_budget: int | None = None,
                 context: Any = None, prefill_chunk: int = 256, graph: bool | None = None) -> None:  # fmt: skip
        c = model.config
        self.model = model
        self.max_batch = _int("Engine", "max_batch", max_batch)
        seq = c.max_position_embeddings if max_seq_len is None else _int("Engine", "max_seq_len", max_seq_len)
        if seq > c.max_position_embeddings:
            raise ArgumentError(f"Engine: max_seq_len {seq} exceeds the model's {c.max_position_embeddings} positions "
                                "(max_position_embeddings)")  # fmt: skip
        self.max_seq_len = seq
        self.block_size = _int("Engine", "block_size", block_size)
        self.prefill_chunk = _int("Engine", "prefill_chunk", prefill_chunk)
        if num_blocks is not None and memory_budget is not None:
            raise ArgumentError("Engine: give num_blocks or memory_budget, not both")
        if graph not in (None, True, False):
            raise ArgumentError(f"Engine: graph must be None, True or False, got {graph!r}")
        reason = graph_unsupported_reason(model, None)
        if graph and reason is not None:
            raise UnsupportedStrategyError(f"Engine(graph=True) does not support {reason}; pass graph=False")
        use_graph = model.backend == "cuda" and reason is None if graph is None else graph
        self.context = context
        self.blocks_per_seq = -(-seq // self.block_size)
        self.block_bytes = 2 * c.num_layers * c.num_kv_heads * self.block_size * c.head_dim * model.dtype.itemsize
        free = self._context_free()
        if num_blocks is not None:
            blocks = _int("Engine", "num_blocks", num_blocks)
        elif memory_budget is not None:
            budget = _int("Engine", "memory_budget", memory_budget)
            blocks = budget // self.block_bytes
            if blocks < 1:
                raise EngineMemoryError(f"Engine: memory_budget {budget} bytes holds no KV block of "
                                        f"{self.block_bytes} bytes", needed_bytes=self.block_bytes,
                                        available_bytes=budget)  # fmt: skip
        elif free is not None:
            blocks = max(1, int(free * 0.8) // self.block_bytes)
        else:
            blocks = self.max_batch * self.blocks_per_seq
        self.num_blocks = blocks
        needed = blocks * self.block_bytes
        if free is not None and needed > free:
            raise EngineMemoryError(f"Engine: a KV cache of {blocks} blocks needs {needed} bytes, the context "
                                    f"{getattr(context, 'name', context)!r} has {free} of its budget free",
                                    needed_bytes=needed, available_bytes=free)  # fmt: skip
        with self._session():
            model.fuse_qkv()  # one GEMM for q, k and v (as DecodeM1 does)
            self.cache = ops.PagedKVCache(c.num_layers, blocks, self.block_size, c.num_kv_heads, c.head_dim,
                                          dtype=model.dtype, max_batch=self.max_batch,
                                          max_blocks_per_seq=self.blocks_per_seq)  # fmt: skip
            if model.backend != "cuda":  # the NumPy attention reads whole blocks: keep unwritten ones finite
                for layer in range(c.num_layers):
                    self.cache.k_blocks(layer).copy_(np.zeros(self.cache.shape, model.dtype.numpy))
                    self.cache.v_blocks(layer).copy_(np.zeros(self.cache.shape, model.dtype.numpy))
            capacity = self.blocks_per_seq * self.block_size
            self.workspace = ops.decode_workspace(self.max_batch, c.num_heads, c.num_kv_heads, c.head_dim, capacity)
            self._mask = zeros(self.max_batch, int32)  # 1 for decoding slots: their lengths advance
            self.decoder = PagedDecodeStep(model, self.cache, self._mask, self.workspace, use_graph)
        self.graph = use_graph
        self._mask_host = np.zeros(self.max_batch, np.int32)
        self._eos = frozenset(model.tokenizer.eos_token_ids) if model.tokenizer is not None else frozenset()
        self._slots: dict[int, Request] = {}
        self._waiting: list[Request] = []
        self._next_id = 0
        self.stats = EngineStats(blocks_total=blocks)

    # -- memory ----------------------------------------------------------------------------------------
    def _context_free(self) -> int | None:
        ctx = self.context
        if ctx is None:
            return None
        if not hasattr(ctx, "max_vram") or not hasattr(ctx, "used_bytes"):
            raise ArgumentError(f"Engine: context must be a pygpukit.scheduler ExecutionContext, got "
                                f"{type(ctx).__name__}")  # fmt: skip
        return max(0, int(ctx.max_vram) - int(ctx.used_bytes))

    def _session(self) -> contextlib.AbstractContextManager[Any]:
        if self.context is None:
            return contextlib.nullcontext()
        from pygpukit.scheduler import context_session

        return context_session(self.context)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the KV blocks (every layer, keys and values)."""
        return self.num_blocks * self.block_bytes

    # -- requests --------------------------------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int], sampling: RequestSampling | dict[str, Any] | None = None,
               **overrides: Any) -> Request:  # fmt: skip
        """Queue a request: ``prompt`` token ids or a text (encoded with the model's tokenizer);
        ``sampling`` a :class:`RequestSampling` (or a dict of its fields), keyword ``overrides``
        replace its fields. It joins the running batch at a later step."""
        params = as_sampling(sampling, overrides)
        was_text = isinstance(prompt, str)
        if isinstance(prompt, str):
            if self.model.tokenizer is None:
                raise ArgumentError("Engine.submit: a text prompt needs a model with a tokenizer; pass token ids")
            ids = list(self.model.tokenizer.encode(prompt))
        elif isinstance(prompt, (Sequence, np.ndarray)) and not isinstance(prompt, bytes):
            ids = [int(t) for t in prompt]
        else:
            raise ArgumentError(f"Engine.submit: prompt must be a str or token ids, got {type(prompt).__name__}")
        vocab = self.model.config.vocab_size
        if not ids:
            raise ArgumentError("Engine.submit: the prompt is empty")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ArgumentError(f"Engine.submit: token id {bad[0]} is outside [0, {vocab})")
        total = len(ids) + params.max_tokens
        if total > self.max_seq_len:
            raise ArgumentError(f"Engine.submit: the prompt ({len(ids)} tokens) and max_tokens ({params.max_tokens}) "
                                f"need {total} positions, more than max_seq_len {self.max_seq_len}")  # fmt: skip
        blocks = -(-total // self.block_size)
        if blocks > self.num_blocks:
            raise ArgumentError(f"Engine.submit: the prompt ({len(ids)} tokens) and max_tokens ({params.max_tokens}) "
                                f"need {blocks} blocks of {self.block_size}, the cache has "
                                f"{self.num_blocks}")  # fmt: skip
        stops = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos)
        request = Request(self, self._next_id, ids, params, stops, was_text=was_text)
        self._next_id += 1
        self._waiting.append(request)
        self._update_stats()
        return request

    async def generate(self, prompt: str | Sequence[int], sampling: RequestSampling | dict[str, Any] | None = None,
                       **overrides: Any) -> Any:  # fmt: skip
        """Submit and await a request: its new token ids, or its text for a text prompt."""
        request = self.submit(prompt, sampling, **overrides)
        async for _ in request:
            pass
        return request.text() if request.was_text else list(request.output)

    @property
    def has_work(self) -> bool:
        return bool(self._slots or self._waiting)

    def run_until_done(self) -> int:
        """Step until every submitted request has finished; returns the steps taken."""
        steps = 0
        while self.has_work:
            self.step()
            steps += 1
        return steps

    # -- one step --------------------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, int]]:
        """Admit, decode one token for every decoding request, prefill one chunk budget and sample;
        returns the (request, token) pairs produced."""
        if not self.has_work:
            return []
        start = time.perf_counter()
        emitted: list[tuple[Request, int]] = []
        with self._session(), _STEP:
            self._admit()
            decoding = self._grow([r for r in self._by_age() if r.state == "decode"])
            if decoding:
                emitted += self._decode(decoding)
            emitted += self._prefill()
        for request, token in emitted:
            self._emit(request, token)
        self.stats.steps += 1
        self.stats.busy_s += time.perf_counter() - start
        self._update_stats()
        return emitted

    def _by_age(self) -> list[Request]:
        return sorted(self._slots.values(), key=lambda r: r.id)

    def _admit(self) -> None:
        decoding = sum(1 for r in self._slots.values() if r.state == "decode")
        while self._waiting and len(self._slots) < self.max_batch:
            request = self._waiting[0]
            first = min(len(request.prompt) + len(request.output) + 1, self.prefill_chunk + 1)
            needed = -(-first // self.block_size) + decoding
            if self.cache.allocator.available < needed and self._slots:
                return  # queue: wait for blocks to come back (an empty engine always admits)
            self._waiting.pop(0)
            request.slot = self.cache.add_sequence(0)
            self._slots[request.slot] = request
            request.state = "prefill"
            request.context = request.prompt + request.output
            request.cached = 0
            if request.sampler is None and not request.sampling.greedy:
                request.sampler = ops.Sampler(request.sampling.seed, 1, self.model.config.vocab_size, self.model.dtype)

    def _reserve(self, request: Request, length: int) -> bool:
        """Blocks for ``length`` positions of ``request``, preempting the newest requests while none
        are free; False when ``request`` itself was the newest and was preempted."""
        while True:
            try:
                assert request.slot is not None
                self.cache.ensure_capacity(request.slot, length)
                return True
            except BlocksExhaustedError:
                victim = max(self._slots.values(), key=lambda r: r.id)
                self._preempt(victim)
                if victim is request:
                    return False

    def _preempt(self, request: Request) -> None:
        """Free the request's blocks and queue it again, to be recomputed (prompt and output prefilled)."""
        assert request.slot is not None
        self.cache.remove_sequence(request.slot)
        del self._slots[request.slot]
        request.slot = None
        request.state = "waiting"
        request.cached = 0
        request.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.append(request)
        self._waiting.sort(key=lambda r: r.id)

    def _grow(self, decoding: list[Request]) -> list[Request]:
        """Room for one more token of every decoding request (oldest first); the preempted drop out."""
        for request in decoding:
            if request.state == "decode":
                self._reserve(request, request.cached + 1)
        return [r for r in decoding if r.state == "decode"]

    # -- the batched decode step -----------------------------------------------------------------------
    def _decode(self, decoding: list[Request]) -> list[tuple[Request, int]]:
        b = self.max_batch
        mask = np.zeros(b, np.int32)
        for request in decoding:
            assert request.slot is not None
            mask[request.slot] = 1  # its input token is in the decoder's tokens (last step's pick or prefill's)
        with _DECODE:
            if not np.array_equal(mask, self._mask_host):  # requests joined or left: a new mask
                self._mask_host = mask
                self._mask.copy_(mask)
            self.decoder.run()
            logits, tokens = self.decoder.logits, self.decoder.tokens_out
            for request in decoding:
                if request.sampler is not None:
                    assert request.slot is not None
                    slot = request.slot
                    self._draw(request, logits[slot : slot + 1], tokens[slot : slot + 1])
            host = tokens.to_numpy()
        self.stats.decode_steps += 1
        out = []
        for request in decoding:
            assert request.slot is not None
            request.cached += 1
            out.append((request, int(host[request.slot])))
        return out

    def _draw(self, request: Request, logits: GPUArray, out: GPUArray) -> None:
        s = request.sampling
        assert request.sampler is not None
        request.sampler.sample(logits, out, temperature=float(s.temperature), top_k=s.top_k, top_p=s.top_p)

    # -- chunked prefill -------------------------------------------------------------------------------
    def _prefill(self) -> list[tuple[Request, int]]:
        """Up to ``prefill_chunk`` context tokens of the prefilling requests, oldest first, as ONE
        forward over their chunks laid end to end."""
        budget = self.prefill_chunk
        plan: list[tuple[Request, int, int]] = []  # (request, start, n)
        for request in [r for r in self._by_age() if r.state == "prefill"]:
            if budget == 0:
                break
            if request.state != "prefill":  # preempted for an older request's chunk
                continue
            n = min(budget, len(request.context) - request.cached)
            if not self._reserve(request, request.cached + n):  # preempts only requests newer than this one
                continue
            plan.append((request, request.cached, n))
            budget -= n
        return self._chunks(plan) if plan else []

    def _chunks(self, plan: list[tuple[Request, int, int]]) -> list[tuple[Request, int]]:
        """Prefill the planned chunks in one forward (every token a row: its own position, block-table
        row and causal length); the first sampled token of each request whose context is complete."""
        model, cache, c = self.model, self.cache, self.model.config
        total = sum(n for _, _, n in plan)
        with _PREFILL:
            ids = np.concatenate([np.asarray(r.context[s : s + n], np.int32) for r, s, n in plan])
            where = np.concatenate([np.arange(s, s + n, dtype=np.int32) for _, s, n in plan])
            table = np.full((total, self.blocks_per_seq), -1, np.int32)
            sequences = cache.sequences
            offsets = []
            offset = 0
            for request, _, n in plan:
                assert request.slot is not None
                blocks = sequences[request.slot]
                table[offset : offset + n, : len(blocks)] = blocks
                offsets.append(offset)
                offset += n
            positions = from_numpy(where)
            table_device = from_numpy(table)
            lens = from_numpy(where + 1)  # a query sees the keys up to its own position
            h = model._embed(from_numpy(ids[None]), positions)

            def attend(index: int, layer: LayerWeights, normed: GPUArray) -> GPUArray:
                q, k, v = model._qkv(layer, normed, 1, total)
                if model.rope is not None:
                    model.rope(q, k, positions)
                for (request, start, n), first in zip(plan, offsets, strict=True):
                    assert request.slot is not None
                    cache.write_prefill(index, request.slot, k[:, first : first + n], v[:, first : first + n], start)
                out = ops.paged_decode_attention(q[0], cache.k_blocks(index), cache.v_blocks(index), table_device, lens)
                return ops.linear(out.reshape(1, total, c.q_size), layer.wo, layer.bo)

            h = model._blocks(h, attend)
            done: list[tuple[Request, int]] = []
            for (request, start, n), first in zip(plan, offsets, strict=True):
                assert request.slot is not None
                request.cached = start + n
                cache.set_length(request.slot, request.cached)
                self.stats.prefill_chunks += 1
                self.stats.prompt_tokens += n
                if request.cached == len(request.context):
                    done.append((request, first + n - 1))
            if not done:
                return []
            rows = from_numpy(np.asarray([row for _, row in done], np.int32))
            logits = model._logits(ops.embedding(h.reshape(total, c.hidden_size), rows))  # the last rows' logits
            tokens = ops.greedy(logits)
            for index, (request, _) in enumerate(done):
                if request.sampler is not None:
                    self._draw(request, logits[index : index + 1], tokens[index : index + 1])
            out: list[tuple[Request, int]] = []
            host = tokens.to_numpy()
            for index, (request, _) in enumerate(done):
                assert request.slot is not None
                request.state = "decode"
                self.decoder.tokens[request.slot : request.slot + 1].copy_(tokens[index : index + 1])  # next input
                out.append((request, int(host[index])))
            return out

    # -- results ---------------------------------------------------------------------------------------
    def _emit(self, request: Request, token: int) -> None:
        request.output.append(token)
        self.stats.generated_tokens += 1
        if token in request.stop_ids:
            self._finish(request, "stop")
        elif len(request.output) >= request.sampling.max_tokens:
            self._finish(request, "length")

    def _finish(self, request: Request, reason: str) -> None:
        if request in self._waiting:  # preempted after its last token was sampled
            self._waiting.remove(request)
        if request.slot is not None:
            self.cache.remove_sequence(request.slot)  # its blocks go back to the allocator
            del self._slots[request.slot]
            request.slot = None
        request.state = "finished"
        request.finished = True
        request.finish_reason = reason
        request.sampler = None
        self.stats.finished += 1

    def _update_stats(self) -> None:
        self.stats.running = len(self._slots)
        self.stats.waiting = len(self._waiting)
        self.stats.blocks_used = self.cache.allocator.used

    def __repr__(self) -> str:
        return (f"Engine(max_batch={self.max_batch}, max_seq_len={self.max_seq_len}, blocks={self.num_blocks}x"
                f"{self.block_size}, running={len(self._slots)}, waiting={len(self._waiting)})")  # fmt: skip
