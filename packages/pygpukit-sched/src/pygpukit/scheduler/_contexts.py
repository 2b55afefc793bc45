"""Execution contexts: several models sharing one GPU, each with a VRAM budget, a QoS class and its own
streams.

A context is admitted against the device's capacity (Guaranteed contexts reserve their whole budget;
Burstable and BestEffort ones reserve nothing and are held to their budget). Inside
``context_session(ctx)`` every device allocation of the calling thread or asyncio task is charged to
the context through pygpukit-core's allocation scope, so the budget holds for real allocations: one
that would exceed it raises :class:`QuotaExceededError` there and nowhere else. Work issued inside the
session goes to the context's stream (high priority for Guaranteed, low for BestEffort; paced to its
``compute_share`` when it has one).

Admission, reservations and the budgets' accounting are Rust's (``_pygpukit_rust.ContextRegistry``
and ``ContextBudget``, whose ``charge`` is the allocation scope itself); this module orchestrates:
argument checks, names to objects, sessions, streams and the error messages of admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

import _pygpukit_rust
from _pygpukit_rust import errors as _rust_errors
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import ArgumentError
from pygpukit.core.memory import allocation_scope, get_memory_info
from pygpukit.core.stream import Event, Stream

from ._pacing import PacedStream

__all__ = [
    "GB",
    "KB",
    "MB",
    "AdmissionError",
    "ContextError",
    "ExecutionContext",
    "QuotaExceededError",
    "SchedulerStats",
    "context_session",
    "create_context",
    "destroy_context",
    "get_context",
    "initialize",
    "is_initialized",
    "list_contexts",
    "shutdown",
    "stats",
    "wait",
]

KB = 1024
MB = 1024**2
GB = 1024**3

QosClass = Literal["guaranteed", "burstable", "best_effort"]
_QOS: tuple[str, ...] = ("guaranteed", "burstable", "best_effort")


# The error classes are defined next to the Rust module, which raises them from the allocation path.
ContextError = _rust_errors.ContextError
AdmissionError = _rust_errors.AdmissionError
QuotaExceededError = _rust_errors.BudgetExceededError


def _bytes(value: int) -> str:
    for unit, size in (("GiB", GB), ("MiB", MB), ("KiB", KB)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


class ExecutionContext:
    """One model's share of the GPU. Create with :func:`create_context`; use with
    :func:`context_session`. Its budget and counters live in Rust (``budget``, a
    ``_pygpukit_rust.ContextBudget``), which is the allocation scope of its sessions: every real
    allocation is charged there, lock-free, from any thread."""

    def __init__(
        self,
        name: str,
        max_vram: int,
        qos: str,
        priority: int,
        device: int,
        *,
        budget: Any = None,
        compute_share: float | None = None,
        launch_rate: float = 0.0,
        partition: str | None = None,
    ) -> None:
        self.name = name
        self.max_vram = max_vram
        self.qos = qos
        self.priority = priority
        self.device = device
        self.compute_share = compute_share
        self.partition = partition
        self._launch_rate = launch_rate
        if budget is None:  # a context made outside create_context: admitted nowhere, still budgeted
            budget = _pygpukit_rust.ContextRegistry(max(max_vram, 1)).admit(name, qos, max_vram, priority)
        self.budget = budget
        self._lock = threading.Lock()
        self._sessions = 0
        self._stream: Stream | None = None

    # -- the AllocationScope protocol of pygpukit-core (the session makes `budget` itself the scope) --
    def charge(self, nbytes: int) -> None:
        self.budget.charge(nbytes)

    def refund(self, nbytes: int) -> None:
        self.budget.refund(nbytes)

    # -- streams and waiting ------------------------------------------------------------------------
    @property
    def stream(self) -> Stream:
        """The context's own stream (created on first use; priority from the QoS class; a
        :class:`PacedStream` held to ``compute_share`` when the context has one)."""
        with self._lock:
            if self._stream is None:
                priority = _stream_priority(self.qos)
                if self.compute_share is None:
                    self._stream = Stream(priority=priority)
                else:
                    self._stream = PacedStream(self.compute_share, self._launch_rate, priority=priority)
            return self._stream

    def synchronize(self) -> None:
        """Block until the work queued on the context's stream is done."""
        self.stream.synchronize()

    async def wait(self) -> None:
        """Wait, without blocking the event loop, until the context's queued work is done."""
        await wait(self.stream.record_event())

    # -- inspection ----------------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return int(self.budget.used_bytes)

    @property
    def destroyed(self) -> bool:
        return bool(self.budget.destroyed)

    def snapshot(self) -> dict[str, Any]:
        row: dict[str, Any] = dict(self.budget.usage())
        row["sessions"] = self._sessions
        row["compute_share"] = self.compute_share
        stream = self._stream
        if isinstance(stream, PacedStream):
            pacing = stream.pacing_stats()
            row["launches"], row["throttled"] = int(pacing["launches"]), int(pacing["throttled"])
        return row

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"{_bytes(self.used_bytes)} of {_bytes(self.max_vram)}"
        return f"ExecutionContext({self.name!r}, {self.qos}, priority={self.priority}, {state})"


def _stream_priority(qos: str) -> int:
    """Lower numbers are higher priorities in CUDA; the runtime clamps to the device's range."""
    return {"guaranteed": -5, "burstable": 0, "best_effort": 5}[qos]


class _Runtime:
    def __init__(self, device: int, capacity: int, launch_rate: float) -> None:
        self.device = device
        self.capacity = capacity
        self.launch_rate = launch_rate
        self.lock = threading.Lock()
        self.contexts: dict[str, ExecutionContext] = {}
        # Admission (Guaranteed contexts reserve their budget up to the whole capacity; Burstable and
        # BestEffort ones reserve nothing and are held to their budget) and accounting are Rust's.
        self.registry = _pygpukit_rust.ContextRegistry(capacity)
        # Paced streams of partitions, by (manager, partition id); see partition_session.
        self.partition_streams: dict[tuple[int, str], tuple[Any, Stream]] = {}

    def reserved(self) -> int:
        return int(self.registry.reserved)


_runtime: _Runtime | None = None
_runtime_lock = threading.Lock()


def _positive_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ContextError(f"{name} must be a positive, finite number, got {value!r}")
    return float(value)


def initialize(device_id: int = 0, *, capacity: int | None = None, launch_rate: float = 20_000.0) -> None:
    """Start the scheduler for ``device_id``. ``capacity`` (bytes) is what contexts are admitted
    against; by default the device's total memory (host memory on the CPU backend). ``launch_rate``
    (launches per second) is what compute shares divide: a context or partition with share ``s``
    may issue ``s * launch_rate`` launches per second on its stream."""
    global _runtime
    if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
        raise ContextError(f"device_id must be a non-negative int, got {device_id!r}")
    rate = _positive_number("launch_rate", launch_rate)
    state = backend_state()
    if state.name == "cuda":
        from pygpukit.core.device import device_count, set_device

        if device_id >= device_count():
            raise ContextError(f"device {device_id} does not exist ({device_count()} CUDA device(s))")
        set_device(device_id)
    total = get_memory_info()[1]
    if capacity is not None and (
        not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0 or capacity > total
    ):
        raise ContextError(f"capacity must be a positive int of at most {total} bytes, got {capacity!r}")
    with _runtime_lock:
        if _runtime is not None and _runtime.contexts:
            raise ContextError("the scheduler is already initialised with contexts; call shutdown() first")
        _runtime = _Runtime(device_id, capacity or total, rate)


def is_initialized() -> bool:
    return _runtime is not None


def shutdown() -> None:
    """Destroy every context and forget the scheduler (``initialize`` may be called again)."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.registry.clear()


def _require() -> _Runtime:
    runtime = _runtime
    if runtime is None:
        raise ContextError("the scheduler is not initialised: call pygpukit.scheduler.initialize(device_id) first")
    return runtime


def _check_partition(partition: object) -> tuple[Any, str] | None:
    if partition is None:
        return None
    if (
        isinstance(partition, tuple)
        and len(partition) == 2
        and isinstance(partition[0], _pygpukit_rust.PartitionManager)
        and isinstance(partition[1], str)
    ):
        return partition[0], partition[1]
    raise ContextError(f"partition must be a (PartitionManager, partition_id) pair, got {partition!r}")


def create_context(
    name: str,
    max_vram: int,
    qos: QosClass = "burstable",
    priority: int = 0,
    *,
    compute_share: float | None = None,
    partition: tuple[Any, str] | None = None,
) -> ExecutionContext:
    """Admit a context named ``name`` with a budget of ``max_vram`` bytes.

    ``qos``: "guaranteed" reserves the budget (refused when the reservations would exceed the device's
    capacity), "burstable" and "best_effort" reserve nothing and are held to their budget; the class
    also sets the stream priority. ``priority`` orders contexts of one class in :func:`stats`.
    ``compute_share`` in (0, 1] paces every launch on the context's stream to that share of the
    scheduler's ``launch_rate`` (None: not paced). ``partition``, a ``(PartitionManager,
    partition_id)`` pair, also charges the context's allocations to that partition: they must fit
    its memory limit too (and the budget must not exceed it).
    """
    runtime = _require()
    if not isinstance(name, str) or not name:
        raise ContextError(f"a context needs a non-empty name, got {name!r}")
    if not isinstance(max_vram, int) or isinstance(max_vram, bool) or max_vram <= 0:
        raise ContextError(f"max_vram must be a positive number of bytes, got {max_vram!r}")
    if qos not in _QOS:
        raise ContextError(f"qos must be one of {_QOS}, got {qos!r}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ContextError(f"priority must be an int, got {priority!r}")
    if compute_share is not None and (_positive_number("compute_share", compute_share) > 1.0):
        raise ContextError(f"compute_share must be in (0, 1], got {compute_share!r}")
    link = _check_partition(partition)
    with runtime.lock:
        try:
            if link is None:
                budget = runtime.registry.admit(name, qos, max_vram, priority)
            else:
                budget = runtime.registry.admit(name, qos, max_vram, priority, link[0], link[1])
        except _rust_errors.DuplicateIdError:
            raise AdmissionError(f"a context named {name!r} already exists", reason="duplicate") from None
        except _rust_errors.UnknownIdError as error:
            raise ContextError(f"context {name!r}: {error}") from None
        except _rust_errors.AdmissionRejectedError as error:
            kind, why = error.reason.kind, error.reason.message
            if kind == "exceeds_capacity":
                raise AdmissionError(
                    f"context {name!r}: max_vram {_bytes(max_vram)} exceeds the device's capacity "
                    f"{_bytes(runtime.capacity)}",
                    reason="capacity",
                ) from None
            raise AdmissionError(
                f"context {name!r} ({qos}, {_bytes(max_vram)}) was not admitted: {why} "
                f"(guaranteed reservations {_bytes(runtime.reserved())} of {_bytes(runtime.capacity)})",
                reason=kind,
            ) from None
        ctx = ExecutionContext(
            name, max_vram, qos, priority, runtime.device, budget=budget, compute_share=compute_share,
            launch_rate=runtime.launch_rate, partition=None if link is None else link[1],
        )  # fmt: skip
        runtime.contexts[name] = ctx
    return ctx


def get_context(name: str) -> ExecutionContext:
    """The live context named ``name``; :class:`ContextError` when there is none."""
    runtime = _require()
    if not isinstance(name, str):
        raise ContextError(f"get_context needs a context name (str), got {type(name).__name__}")
    with runtime.lock:
        ctx = runtime.contexts.get(name)
        known = sorted(runtime.contexts)
    if ctx is None:
        raise ContextError(f"no context named {name!r} (known: {known})")
    return ctx


def destroy_context(ctx: ExecutionContext | str) -> None:
    """Remove a context: its reservation is released and later allocations in its sessions refused.
    Memory it already holds stays valid until freed.

    Given a name, the live context of that name is destroyed. Given a context object, exactly that
    context is: an object that was already destroyed (or shut down) raises :class:`ContextError` and
    leaves alone a newer context created since under the same name."""
    runtime = _require()
    if isinstance(ctx, str):
        name, expected = ctx, None
    elif isinstance(ctx, ExecutionContext):
        name, expected = ctx.name, ctx
    else:
        raise ContextError(f"destroy_context needs an ExecutionContext or its name, got {type(ctx).__name__}")
    with runtime.lock:
        found = runtime.contexts.get(name)
        if found is not None and (expected is None or found is expected):
            runtime.registry.destroy(name, found.budget.serial)
            del runtime.contexts[name]
            return
    if expected is None or found is None:
        raise ContextError(f"no context named {name!r} (already destroyed?)")
    if expected.destroyed:
        raise ContextError(
            f"this context {name!r} was already destroyed; the live context of that name is a newer one "
            "and was left alone"
        )
    raise ContextError(
        f"this context {name!r} is not the scheduler's context of that name (not made by create_context?)"
    )


def list_contexts() -> list[ExecutionContext]:
    runtime = _require()
    with runtime.lock:
        return [runtime.contexts[b.name] for b in runtime.registry.contexts() if b.name in runtime.contexts]


class _Session:
    """``with context_session(ctx):`` and ``async with context_session(ctx):``."""

    def __init__(self, ctx: ExecutionContext) -> None:
        if not isinstance(ctx, ExecutionContext):
            raise ContextError(f"context_session needs an ExecutionContext, got {type(ctx).__name__}")
        if ctx.destroyed:
            raise ContextError(f"context {ctx.name!r} was destroyed")
        self.ctx = ctx
        self._stacks: list[contextlib.ExitStack] = []  # one per (nested) entry

    def __enter__(self) -> ExecutionContext:
        stack = contextlib.ExitStack()
        stack.enter_context(allocation_scope(self.ctx.budget))
        stack.enter_context(self.ctx.stream)
        with self.ctx._lock:
            self.ctx._sessions += 1  # orchestration only: budgets and admission are Rust's
        self._stacks.append(stack)
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        with self.ctx._lock:
            self.ctx._sessions -= 1
        self._stacks.pop().close()

    async def __aenter__(self) -> ExecutionContext:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


def context_session(ctx: ExecutionContext) -> _Session:
    """Charge the allocations of the calling thread or asyncio task to ``ctx`` and make its stream
    current, as a ``with`` or ``async with`` block. Tasks created inside inherit the session."""
    return _Session(ctx)


def _interval(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ArgumentError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


async def wait(what: Event | Stream, *, poll_interval: float = 50e-6, max_interval: float = 2e-3) -> None:
    """Wait for an event (or everything queued on a stream) without blocking the event loop: the event
    is polled with a back-off from ``poll_interval`` to ``max_interval`` seconds. Anything but an
    :class:`Event` or a :class:`Stream`, or a non-positive interval, raises :class:`ArgumentError`."""
    target: object = what  # checked at run time whatever the annotation says
    if not isinstance(target, (Event, Stream)):
        hint = ""
        if isinstance(target, ExecutionContext):
            hint = "; for a context's queued work use `await ctx.wait()`"
        elif isinstance(target, str):
            hint = "; for a context by name use `await get_context(name).wait()`"
        raise ArgumentError(f"wait needs a pygpukit Event or Stream, got {type(target).__name__}{hint}")
    delay = _interval("poll_interval", poll_interval)
    longest = max(_interval("max_interval", max_interval), delay)
    event = target.record_event() if isinstance(target, Stream) else target
    while not event.query():
        await asyncio.sleep(delay)
        delay = min(delay * 2, longest)


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot: the device, its capacity, the Guaranteed reservations and one row per context.
    ``str()`` gives a readable table."""

    device: int
    capacity: int
    reserved: int
    contexts: tuple[dict[str, Any], ...]

    def __str__(self) -> str:
        header: tuple[str, ...] = ("context", "qos", "prio", "budget", "in use", "peak", "allocs", "refused",
                                   "sessions")  # fmt: skip
        rows: list[tuple[str, ...]] = [
            (c["name"], c["qos"], str(c["priority"]), _bytes(c["max_vram"]), _bytes(c["used_bytes"]),
             _bytes(c["peak_bytes"]), str(c["allocations"]), str(c["refused"]), str(c["sessions"]))
            for c in self.contexts
        ]  # fmt: skip
        if any(c.get("compute_share") is not None for c in self.contexts):  # paced contexts: their pacing
            header += ("share", "launches", "throttled")
            rows = [
                (*r, *(("-", "-", "-") if c.get("compute_share") is None else
                       (f"{c['compute_share']:g}", str(c.get("launches", 0)), str(c.get("throttled", 0)))))
                for r, c in zip(rows, self.contexts, strict=True)
            ]  # fmt: skip
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        lines = [
            f"pygpukit scheduler on device {self.device}: capacity {_bytes(self.capacity)}, "
            f"guaranteed reservations {_bytes(self.reserved)}",
            "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
            "  ".join("-" * w for w in widths),
        ]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        if not rows:
            lines.append("(no contexts)")
        return "\n".join(lines)


def stats() -> SchedulerStats:
    runtime = _require()
    contexts = tuple(c.snapshot() for c in list_contexts())
    with runtime.lock:
        reserved = runtime.reserved()
    return SchedulerStats(runtime.device, runtime.capacity, reserved, contexts)
