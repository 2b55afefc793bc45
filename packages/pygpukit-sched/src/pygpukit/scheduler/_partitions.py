"""Partition sessions: a partition of a ``_pygpukit_rust.PartitionManager`` enforced on real
allocations and streams.

Inside ``partition_session(manager, partition_id)`` every device allocation of the calling thread or
asyncio task is charged to the partition in Rust (``PartitionManager.scope``): one that would exceed
the partition's memory limit, or the device behind all partitions (the overcommit rule: limits may
add up to ``overcommit_ratio`` times the device, real use never more than the device), raises
:class:`QuotaExceededError` in that session only, and ``manager.get_partition(id)["memory_used"]``
is the partition's real usage. Work issued inside goes to the partition's stream: prioritised by its
compute share and, when the share is positive, a :class:`PacedStream` held to that share of the
scheduler's launch rate.
"""

from __future__ import annotations

import contextlib
from typing import Any

import _pygpukit_rust
from _pygpukit_rust import errors as _rust_errors
from pygpukit.core.memory import allocation_scope
from pygpukit.core.stream import Stream

from ._contexts import ContextError, _require
from ._pacing import PacedStream, priority_for_share

__all__ = ["partition_session", "partition_stream"]


def _check(manager: object, partition_id: object) -> dict[str, Any]:
    if not isinstance(manager, _pygpukit_rust.PartitionManager):
        raise ContextError(f"a partition session needs a PartitionManager, got {type(manager).__name__}")
    if not isinstance(partition_id, str):
        raise ContextError(f"partition_id must be a str, got {type(partition_id).__name__}")
    try:
        return dict(manager.get_partition(partition_id))
    except _rust_errors.UnknownIdError:
        raise ContextError(
            f"no partition {partition_id!r} in this manager (known: {manager.partition_ids()})"
        ) from None


def partition_stream(manager: Any, partition_id: str) -> Stream:
    """The stream of ``partition_id`` (made on first use, one per partition): priority from its
    compute share, paced to that share of the scheduler's launch rate when the share is positive.
    Needs :func:`initialize`."""
    info = _check(manager, partition_id)
    runtime = _require()
    key = (id(manager), partition_id)
    with runtime.lock:
        found = runtime.partition_streams.get(key)
        if found is not None and found[0] is manager:
            stream: Stream = found[1]
            return stream
        share = float(info["compute_share"])
        priority = priority_for_share(share)
        stream = PacedStream(share, runtime.launch_rate, priority=priority) if share > 0 else Stream(priority)
        runtime.partition_streams[key] = (manager, stream)  # holds the manager: the key stays unique
        return stream


class _PartitionSession:
    """``with partition_session(manager, id):`` and ``async with``."""

    def __init__(self, manager: Any, partition_id: str) -> None:
        _check(manager, partition_id)
        self.manager = manager
        self.partition_id = partition_id
        self.scope = manager.scope(partition_id)
        self.stream = partition_stream(manager, partition_id)
        self._stacks: list[contextlib.ExitStack] = []

    def __enter__(self) -> Stream:
        stack = contextlib.ExitStack()
        stack.enter_context(allocation_scope(self.scope))
        stack.enter_context(self.stream)
        self._stacks.append(stack)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        self._stacks.pop().close()

    async def __aenter__(self) -> Stream:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


def partition_session(manager: Any, partition_id: str) -> _PartitionSession:
    """Charge the allocations of the calling thread or asyncio task to partition ``partition_id`` of
    ``manager`` and make the partition's stream current (``with`` or ``async with``; the block gets
    the stream). A context created with ``partition=(manager, id)`` is charged to both."""
    return _PartitionSession(manager, partition_id)
