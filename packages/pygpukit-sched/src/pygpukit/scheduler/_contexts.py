"""Execution contexts: several models sharing one GPU, each with a VRAM budget, a QoS class and its own
streams.

A context is admitted against the device's capacity (Guaranteed contexts reserve their whole budget;
Burstable and BestEffort ones reserve nothing and are held to their budget). Inside
``context_session(ctx)`` every device allocation of the calling thread or asyncio task is charged to
the context through pygpukit-core's allocation scope, so the budget holds for real allocations: one
that would exceed it raises :class:`QuotaExceededError` there and nowhere else. Work issued inside the
session goes to the context's stream (high priority for Guaranteed, low for BestEffort).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pygpukit.core import errors as _core_errors
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import ArgumentError, PyGPUkitError
from pygpukit.core.memory import allocation_scope, get_memory_info
from pygpukit.core.stream import Event, Stream

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


class ContextError(PyGPUkitError):
    """An unknown, destroyed or duplicate context, or the scheduler used before ``initialize``."""


class AdmissionError(ContextError):
    """A context was refused at creation; ``reason`` says why: the Rust evaluator's reject kind
    (``"insufficient_memory"``, ...), ``"capacity"`` (a budget above the device) or ``"duplicate"``."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class QuotaExceededError(_core_errors.QuotaExceededError):
    """An allocation inside a context session would exceed the context's budget (a
    ``pygpukit.QuotaExceededError`` with the context's name). ``context`` names it;
    ``requested``, ``in_use`` and ``limit`` are in bytes."""

    def __init__(self, message: str, *, context: str, requested: int, in_use: int, limit: int) -> None:
        super().__init__(message, requested=requested, in_use=in_use, cached=0, limit=limit)
        self.context = context


def _bytes(value: int) -> str:
    for unit, size in (("GiB", GB), ("MiB", MB), ("KiB", KB)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


class ExecutionContext:
    """One model's share of the GPU. Create with :func:`create_context`; use with
    :func:`context_session`. Thread-safe: allocations may be charged and refunded from any thread."""

    def __init__(self, name: str, max_vram: int, qos: str, priority: int, device: int) -> None:
        self.name = name
        self.max_vram = max_vram
        self.qos = qos
        self.priority = priority
        self.device = device
        self._lock = threading.Lock()
        self._used = 0
        self._peak = 0
        self._allocations = 0
        self._refused = 0
        self._sessions = 0
        self._destroyed = False
        self._stream: Stream | None = None

    # -- the AllocationScope protocol of pygpukit-core ----------------------------------------------
    def charge(self, nbytes: int) -> None:
        with self._lock:
            if self._destroyed:
                raise ContextError(f"context {self.name!r} was destroyed; allocations in its session are refused")
            if self._used + nbytes > self.max_vram:
                self._refused += 1
                raise QuotaExceededError(
                    f"context {self.name!r}: allocating {_bytes(nbytes)} would exceed its budget "
                    f"({_bytes(self._used)} in use of {_bytes(self.max_vram)})",
                    context=self.name,
                    requested=nbytes,
                    in_use=self._used,
                    limit=self.max_vram,
                )
            self._used += nbytes
            self._allocations += 1
            self._peak = max(self._peak, self._used)

    def refund(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes

    # -- streams and waiting ------------------------------------------------------------------------
    @property
    def stream(self) -> Stream:
        """The context's own stream (created on first use; priority from the QoS class)."""
        with self._lock:
            if self._stream is None:
                self._stream = Stream(priority=_stream_priority(self.qos))
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
        with self._lock:
            return self._used

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "qos": self.qos,
                "priority": self.priority,
                "max_vram": self.max_vram,
                "used_bytes": self._used,
                "peak_bytes": self._peak,
                "allocations": self._allocations,
                "refused": self._refused,
                "sessions": self._sessions,
            }

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else f"{_bytes(self.used_bytes)} of {_bytes(self.max_vram)}"
        return f"ExecutionContext({self.name!r}, {self.qos}, priority={self.priority}, {state})"


def _stream_priority(qos: str) -> int:
    """Lower numbers are higher priorities in CUDA; the runtime clamps to the device's range."""
    return {"guaranteed": -5, "burstable": 0, "best_effort": 5}[qos]


class _Runtime:
    def __init__(self, device: int, capacity: int) -> None:
        import _pygpukit_rust

        self.device = device
        self.capacity = capacity
        self.lock = threading.Lock()
        self.contexts: dict[str, ExecutionContext] = {}
        # The Rust QoS evaluator decides admission: Guaranteed contexts reserve their budget (up to the
        # whole capacity); Burstable and BestEffort ones reserve nothing and are held to their budget.
        self.qos = _pygpukit_rust.QosPolicyEvaluator(capacity, guaranteed_share=1.0, burst_share=1.0)
        self.rust = _pygpukit_rust

    def meta(self, name: str, qos: str, max_vram: int) -> Any:
        task = self.rust.QosTaskMeta
        if qos == "guaranteed":
            return task.guaranteed(name, name, max_vram)
        if qos == "burstable":
            return task.burstable(name, name, 0, memory_limit=max_vram)
        return task.best_effort(name, name, 0)

    def reserved(self) -> int:
        return int(self.qos.stats()["memory_by_class"]["guaranteed"])


_runtime: _Runtime | None = None
_runtime_lock = threading.Lock()


def initialize(device_id: int = 0, *, capacity: int | None = None) -> None:
    """Start the scheduler for ``device_id``. ``capacity`` (bytes) is what contexts are admitted
    against; by default the device's total memory (host memory on the CPU backend)."""
    global _runtime
    if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
        raise ContextError(f"device_id must be a non-negative int, got {device_id!r}")
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
        _runtime = _Runtime(device_id, capacity or total)


def is_initialized() -> bool:
    return _runtime is not None


def shutdown() -> None:
    """Destroy every context and forget the scheduler (``initialize`` may be called again)."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        for ctx in list(runtime.contexts.values()):
            ctx._destroyed = True


def _require() -> _Runtime:
    runtime = _runtime
    if runtime is None:
        raise ContextError("the scheduler is not initialised: call pygpukit.scheduler.initialize(device_id) first")
    return runtime


def create_context(name: str, max_vram: int, qos: QosClass = "burstable", priority: int = 0) -> ExecutionContext:
    """Admit a context named ``name`` with a budget of ``max_vram`` bytes.

    ``qos``: "guaranteed" reserves the budget (refused when the reservations would exceed the device's
    capacity), "burstable" and "best_effort" reserve nothing and are held to their budget; the class
    also sets the stream priority. ``priority`` orders contexts of one class in :func:`stats`.
    """
    runtime = _require()
    if not isinstance(name, str) or not name:
        raise ContextError(f"a context needs a non-empty name, got {name!r}")
    if not isinstance(max_vram, int) or isinstance(max_vram, bool) or max_vram <= 0:
        raise ContextError(f"max_vram must be a positive number of bytes, got {max_vram!r}")
    if max_vram > runtime.capacity:
        raise AdmissionError(
            f"context {name!r}: max_vram {_bytes(max_vram)} exceeds the device's capacity {_bytes(runtime.capacity)}",
            reason="capacity",
        )
    if qos not in _QOS:
        raise ContextError(f"qos must be one of {_QOS}, got {qos!r}")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ContextError(f"priority must be an int, got {priority!r}")
    with runtime.lock:
        if name in runtime.contexts:
            raise AdmissionError(f"a context named {name!r} already exists", reason="duplicate")
        decision = runtime.qos.reserve(runtime.meta(name, qos, max_vram))
        if not decision:
            reason = decision.reason
            why, kind = (reason.message, reason.kind) if reason is not None else ("refused", "refused")
            raise AdmissionError(
                f"context {name!r} ({qos}, {_bytes(max_vram)}) was not admitted: {why} "
                f"(guaranteed reservations {_bytes(runtime.reserved())} of {_bytes(runtime.capacity)})",
                reason=kind,
            )
        ctx = ExecutionContext(name, max_vram, qos, priority, runtime.device)
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
            del runtime.contexts[name]
            runtime.qos.release(name)
            found._destroyed = True
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
        return sorted(runtime.contexts.values(), key=lambda c: (_QOS.index(c.qos), -c.priority, c.name))


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
        stack.enter_context(allocation_scope(self.ctx))
        stack.enter_context(self.ctx.stream)
        with self.ctx._lock:
            self.ctx._sessions += 1
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
        header = ("context", "qos", "prio", "budget", "in use", "peak", "allocs", "refused", "sessions")
        rows = [
            (c["name"], c["qos"], str(c["priority"]), _bytes(c["max_vram"]), _bytes(c["used_bytes"]),
             _bytes(c["peak_bytes"]), str(c["allocations"]), str(c["refused"]), str(c["sessions"]))
            for c in self.contexts
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
