"""The requests of :class:`pygpukit.llm.Engine`: per-request sampling parameters, the request handle
(a sync and an asyncio async iterator of its tokens), the engine's statistics and its errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pygpukit.core.errors import ArgumentError, OutOfMemoryError

if TYPE_CHECKING:
    from pygpukit.ops import Sampler

    from .engine import Engine

__all__ = ["EngineMemoryError", "EngineStats", "Request", "RequestSampling"]


class EngineMemoryError(OutOfMemoryError):
    """The KV cache asked of an :class:`~pygpukit.llm.Engine` does not fit its memory (the context's
    budget, or ``memory_budget``): names the bytes needed and those available."""

    def __init__(self, message: str, *, needed_bytes: int = 0, available_bytes: int = 0) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


@dataclass(frozen=True)
class RequestSampling:
    """How one request picks its tokens. ``temperature == 0`` (the default) is greedy; otherwise
    temperature, then top-k, then top-p, drawn by the request's own sampler seeded with ``seed``
    (the same seed gives the same tokens whatever else runs in the engine). The request stops after
    ``max_tokens`` new tokens or at one of ``stop_token_ids`` (kept in the output), and at the
    tokenizer's end-of-sequence ids unless ``ignore_eos``."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ArgumentError(f"RequestSampling: max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ArgumentError(f"RequestSampling: temperature must be a number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ArgumentError(f"RequestSampling: top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ArgumentError(f"RequestSampling: top_p must be None or in (0, 1], got {self.top_p!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ArgumentError(f"RequestSampling: seed must be an int >= 0, got {self.seed!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class EngineStats:
    """Counters of an engine since it was made (``engine.stats``)."""

    steps: int = 0
    decode_steps: int = 0
    prefill_chunks: int = 0
    prompt_tokens: int = 0  # tokens prefilled, recomputed ones included
    generated_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    running: int = 0  # requests holding a slot (prefilling or decoding)
    waiting: int = 0
    blocks_used: int = 0
    blocks_total: int = 0
    busy_s: float = 0.0  # time spent inside step()

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the time spent in ``step()``."""
        return self.generated_tokens / self.busy_s if self.busy_s > 0 else 0.0

    def summary(self) -> str:
        return (f"{self.generated_tokens} tokens in {self.steps} steps, {self.tokens_per_s:.1f} tokens/s, "
                f"running {self.running}, waiting {self.waiting}, blocks {self.blocks_used}/{self.blocks_total}, "
                f"preemptions {self.preemptions}")  # fmt: skip


@dataclass(eq=False)
class Request:
    """One sequence submitted to an :class:`~pygpukit.llm.Engine` (``engine.submit``).

    ``output`` holds the new token ids so far; ``finished`` and ``finish_reason`` ("stop" or
    "length") tell when it is done. ``for token in request`` and ``async for token in request``
    yield its new tokens as they come, running engine steps while none is ready (an async step runs
    in the event loop's thread, between awaits). ``text()`` decodes the output with the model's
    tokenizer."""

    engine: Engine
    id: int
    prompt: list[int]
    sampling: RequestSampling
    stop_ids: frozenset[int]
    output: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    state: str = "waiting"  # waiting -> prefill -> decode -> finished (preemption: back to waiting)
    slot: int | None = None
    preemptions: int = 0
    # Prefill bookkeeping: the tokens to put into the cache (the prompt, plus the output after a
    # preemption) and how many of them are there.
    context: list[int] = field(default_factory=list)
    cached: int = 0
    sampler: Sampler | None = None
    was_text: bool = False

    @property
    def tokens(self) -> list[int]:
        """Prompt and output ids."""
        return self.prompt + self.output

    def text(self, skip_special_tokens: bool = True) -> str:
        tokenizer = self.engine.model.tokenizer
        if tokenizer is None:
            raise ArgumentError("Request.text: the model has no tokenizer")
        return tokenizer.decode(self.output, skip_special_tokens=skip_special_tokens)

    def __iter__(self) -> Iterator[int]:
        index = 0
        while True:
            while index < len(self.output):
                yield self.output[index]
                index += 1
            if self.finished:
                return
            self.engine.step()

    def __aiter__(self) -> AsyncIterator[int]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[int]:
        index = 0
        while True:
            while index < len(self.output):
                yield self.output[index]
                index += 1
            if self.finished:
                return
            self.engine.step()  # serves every request; other consumers read theirs after the await
            await asyncio.sleep(0)

    def __repr__(self) -> str:
        return (f"Request(id={self.id}, state={self.state}, prompt={len(self.prompt)} tokens, "
                f"output={len(self.output)} tokens, finish_reason={self.finish_reason})")  # fmt: skip


def as_sampling(sampling: Any, overrides: dict[str, Any]) -> RequestSampling:
    """``sampling`` (a RequestSampling, a dict of its fields or None) with keyword ``overrides``."""
    if sampling is None:
        values: dict[str, Any] = {}
    elif isinstance(sampling, RequestSampling):
        values = {name: getattr(sampling, name) for name in RequestSampling.__dataclass_fields__}
    elif isinstance(sampling, dict):
        values = dict(sampling)
    else:
        raise ArgumentError(f"sampling must be a RequestSampling, a dict or None, got {type(sampling).__name__}")
    values.update(overrides)
    unknown = sorted(set(values) - set(RequestSampling.__dataclass_fields__))
    if unknown:
        known = sorted(RequestSampling.__dataclass_fields__)
        raise ArgumentError(f"sampling: unknown fields {unknown} (known: {known})")
    return RequestSampling(**values)
