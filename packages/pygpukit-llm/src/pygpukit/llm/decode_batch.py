"""Batched decoding: :class:`DecodeBatch` decodes up to ``batch_size`` sequences together.

The prompts (of any lengths) are right-padded into one (batch_size, longest) prefill; each row keeps
its own length in the KV cache (``state.lengths``), so the decode step appends every row's key and
value at that row's position and the decode attention reads that row's keys only: a row's tokens do
not depend on its neighbours' prompts. The step itself is :class:`~pygpukit.llm.decode.DecodeM1`'s
(every buffer allocated once, ``out=`` everywhere), or on the CUDA backend, when the model allows it,
:class:`~pygpukit.llm.decode.DecodeM1Graph`'s single graph replay per step for the whole batch.

Each row stops on its own (a stop id such as end-of-sequence, or its own token limit); a finished
row is still computed (the batch keeps its shape, so the graph replays unchanged) but its tokens are
dropped, and the loop ends when every row is done. More prompts than ``batch_size`` run in groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pygpukit.core.errors import ArgumentError, ShapeError

from .decode import DecodeM1, DecodeM1Graph, UnsupportedStrategyError, graph_unsupported_reason

if TYPE_CHECKING:
    from .generation import SamplingParams
    from .model import CausalTransformerModel

__all__ = ["FINISHED", "DecodeBatch"]

FINISHED = -1  # the entry of a row that has stopped, in the arrays DecodeBatch.iterate yields


def _positive_int(owner: str, name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{owner}: {name} must be an int >= 1, got {value!r}")
    return int(value)


class DecodeBatch:
    """Decode up to ``batch_size`` sequences together (the seeds' ``DecodeBatch(batch_size)``).

    ``max_seq_len`` bounds prompt + new tokens of every row. ``sampling`` None (or a greedy
    :class:`~pygpukit.llm.SamplingParams`) is greedy: each row's tokens then equal that prompt decoded
    alone with :class:`~pygpukit.llm.DecodeM1`. Sampled rows draw from one seeded sampler for the
    batch (``seed``): reproducible for the same batch, not equal to the row run alone. ``graph``: True
    replays one CUDA graph per step (DecodeM1Graph), False launches op by op (DecodeM1), None (the
    default) the graph on the CUDA backend when the model and sampling allow it."""

    def __init__(self, model: CausalTransformerModel, batch_size: int, max_seq_len: int,
                 sampling: SamplingParams | None = None, seed: int = 0, graph: bool | None = None) -> None:  # fmt: skip
        self.batch_size = _positive_int("DecodeBatch", "batch_size", batch_size)
        self.max_seq_len = _positive_int("DecodeBatch", "max_seq_len", max_seq_len)
        if graph not in (None, True, False):
            raise ArgumentError(f"DecodeBatch: graph must be None, True or False, got {graph!r}")
        reason = graph_unsupported_reason(model, sampling)
        if graph and reason is not None:
            raise UnsupportedStrategyError(f"DecodeBatch(graph=True) does not support {reason}; pass graph=False")
        use_graph = model.backend == "cuda" and reason is None if graph is None else graph
        self.model = model
        self.graph = bool(use_graph)
        kind = DecodeM1Graph if self.graph else DecodeM1
        self.decoder: DecodeM1 = kind(model, self.batch_size, self.max_seq_len, sampling, seed)
        self.steps = 0  # decode steps (batched forwards after the prefill) of the last iterate()

    # -- one group ----------------------------------------------------------------------------------
    def iterate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                stop_token_ids: Sequence[int] = ()) -> Iterator[np.ndarray[Any, Any]]:  # fmt: skip
        """Decode one group of at most ``batch_size`` prompts; yields, per step, an int32 array with
        one entry per prompt: the row's new token, or :data:`FINISHED` once the row has stopped (after
        yielding a stop id, which is kept, or its ``max_new_tokens``: one int or one per prompt)."""
        rows = self._check_group(prompts)
        limits = self._limits(max_new_tokens, len(rows))
        longest = max(len(p) for p in rows)
        needed = longest + max(limits)  # finished rows keep decoding until the last one stops
        if needed > self.max_seq_len:
            raise ArgumentError(f"DecodeBatch: the longest prompt ({longest}) and max_new_tokens ({max(limits)}) "
                                f"need {needed} positions, more than max_seq_len {self.max_seq_len}")  # fmt: skip
        stops = {int(t) for t in stop_token_ids}
        count = len(rows)
        ids = np.zeros((self.batch_size, longest), np.int32)
        lengths = [1] * self.batch_size  # unused rows decode a 1-token prompt; their tokens are dropped
        for row, p in enumerate(rows):
            ids[row, : len(p)] = p
            lengths[row] = len(p)
        produced = [0] * count
        live = [n > 0 for n in limits]
        self.steps = 0
        if not any(live):
            return
        host = self.decoder.start(ids, lengths)
        while True:
            out = np.full(count, FINISHED, np.int32)
            for row in range(count):
                if live[row]:
                    token = int(host[row])
                    out[row] = token
                    produced[row] += 1
                    live[row] = produced[row] < limits[row] and token not in stops
            yield out
            if not any(live):
                return
            host = self.decoder.step()
            self.steps += 1

    def _check_group(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        rows = self._check_prompts(prompts)
        if len(rows) > self.batch_size:
            raise ShapeError(f"DecodeBatch.iterate: {len(rows)} prompts exceed batch_size {self.batch_size} "
                             "(generate() runs them in groups)")  # fmt: skip
        return rows

    def _check_prompts(self, prompts: Any) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise ArgumentError(f"DecodeBatch: prompts must be a non-empty list of token id lists, got {prompts!r:.80}")
        vocab = self.model.config.vocab_size
        rows: list[list[int]] = []
        for index, p in enumerate(prompts):
            if isinstance(p, (str, bytes)) or not isinstance(p, (Sequence, np.ndarray)) or len(p) == 0:
                raise ArgumentError(f"DecodeBatch: prompt {index} must be a non-empty list of token ids, got {p!r:.80}")
            row = [int(t) for t in p]
            bad = [t for t in row if not 0 <= t < vocab]
            if bad:
                raise ArgumentError(f"DecodeBatch: prompt {index}: token id {bad[0]} is outside [0, {vocab})")
            rows.append(row)
        return rows

    @staticmethod
    def _limits(max_new_tokens: int | Sequence[int], count: int) -> list[int]:
        values = [max_new_tokens] * count if not isinstance(max_new_tokens, Sequence) else list(max_new_tokens)
        if len(values) != count:
            raise ArgumentError(f"DecodeBatch: {len(values)} max_new_tokens values for {count} prompts")
        for value in values:
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise ArgumentError(f"DecodeBatch: max_new_tokens must be ints >= 0, got {value!r}")
        return [int(v) for v in values]

    # -- any number of prompts ----------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                 stop_token_ids: Sequence[int] = ()) -> list[list[int]]:  # fmt: skip
        """The new token ids of every prompt (a stop id that ended a row included), decoding the
        prompts in groups of ``batch_size``."""
        rows = self._check_prompts(prompts)
        limits = self._limits(max_new_tokens, len(rows))
        results: list[list[int]] = [[] for _ in rows]
        for first in range(0, len(rows), self.batch_size):
            group = slice(first, first + self.batch_size)
            for out in self.iterate(rows[group], limits[group], stop_token_ids):
                for offset, token in enumerate(out.tolist()):
                    if token != FINISHED:
                        results[first + offset].append(token)
        return results

    def __repr__(self) -> str:
        return (f"DecodeBatch(batch_size={self.batch_size}, max_seq_len={self.max_seq_len}, "
                f"step={'graph' if self.graph else 'm1'})")  # fmt: skip
