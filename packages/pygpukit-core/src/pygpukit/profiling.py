"""pygpukit.profiling: named ranges timed with events, per-kernel records, pool memory snapshots and a
chrome-trace export.

    from pygpukit import profiling

    with profiling.Profiler() as prof:
        with profiling.range("prefill"):          # a context manager ...
            ...

        @profiling.range("step")                   # ... or a decorator
        def step(): ...

        prof.snapshot("after prefill")             # the pool's statistics now
    print(prof.summary())
    prof.export_chrome_trace("trace.json")       # chrome://tracing or https://ui.perfetto.dev

A range records a timing :class:`~pygpukit.core.stream.Event` on its stream (the current one by
default, or ``stream=``) when it opens and when it closes, and the host clock at both; ranges nest.
While a profiler records kernels, every launch of a :class:`~pygpukit.core.jit.JITKernel` (every
pygpukit kernel, and user kernels) is recorded with its grid, block, stream and enclosing range,
between two events of its stream. Library calls that are not JIT kernels (cuBLASLt GEMMs) and the
kernels inside a replayed CUDA graph are not seen one by one: they show in the ranges around them
(time a graph replay with a range). Launches made while a stream is being captured into a graph are
recorded without timing (``captured``). Durations are read when the profile is resolved (at
:meth:`Profiler.stop`, which synchronizes the device once), so recording never waits for the GPU.

Profiling off costs one global read per kernel launch (``pygpukit.core.jit``) and a global read per
range. One profiler records at a time (process-wide). On the CPU simulation backend events carry
host times, ops run NumPy instead of kernels (so no kernel records), and ranges and memory snapshots
work as on the GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .core import backend as _backend
from .core.errors import ArgumentError, PyGPUkitError
from .core.graph import is_capturing
from .core.jit import set_launch_hook
from .core.memory import memory_stats
from .core.stream import Event, Stream, current_stream

__all__ = [
    "KernelRecord",
    "MemorySnapshot",
    "Profiler",
    "ProfilerError",
    "Range",
    "RangeRecord",
    "active_profiler",
    "range",
    "snapshot",
]

F = TypeVar("F", bound=Callable[..., Any])
_active: Profiler | None = None
_lock = threading.Lock()
_local = threading.local()  # .stack: the open range names of this thread


class ProfilerError(PyGPUkitError):
    """A profiler used out of order (started twice, another one active, resolved while recording)."""


def _stack() -> list[str]:
    stack: list[str] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@dataclass
class RangeRecord:
    """One closed (or still open) named range: its stream, nesting, host times (seconds, perf_counter)
    and, once resolved, ``start_ms``/``duration_ms`` on the device timeline (ms since the profiler's
    start; host times where the stream was being captured)."""

    name: str
    stream: int
    thread: int
    depth: int
    parent: str | None
    host_start: float
    host_end: float | None = None
    start_ms: float | None = None
    duration_ms: float | None = None
    _events: tuple[Event, Event | None] | None = field(default=None, repr=False)


@dataclass
class KernelRecord:
    """One kernel launch: name, grid, block, dynamic shared memory, stream, the innermost open range,
    whether it was captured into a graph (no timing then), and once resolved its device times."""

    name: str
    grid: Any
    block: Any
    shared_mem: int
    stream: int
    range: str | None
    captured: bool
    host_time: float
    thread: int = 0
    start_ms: float | None = None
    duration_ms: float | None = None
    _events: tuple[Event, Event] | None = field(default=None, repr=False)


@dataclass
class MemorySnapshot:
    """The pool's statistics (:func:`pygpukit.core.memory.memory_stats`) at ``host_time``."""

    label: str
    host_time: float
    in_use_bytes: int
    cached_bytes: int
    peak_bytes: int
    requests: int
    stats: dict[str, Any] = field(repr=False, default_factory=dict)


def active_profiler() -> Profiler | None:
    """The profiler recording now, or None."""
    return _active


def snapshot(label: str = "") -> MemorySnapshot | None:
    """A memory snapshot in the active profiler (None when none records)."""
    prof = _active
    return None if prof is None else prof.snapshot(label)


def _timed(stream: Stream) -> bool:
    """Whether events can time work on ``stream`` now (a CUDA graph capture records them instead)."""
    return not is_capturing(stream)


def _kernel_hook(kernel: Any, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: int,
                 stream: Stream | None) -> None:  # fmt: skip
    """The launch hook (pygpukit.core.jit) while a profiler records kernels: the launch between two
    events of its stream, and its record (none when the launch fails)."""
    prof = _active
    if prof is None or not prof.kernels_on:
        kernel._launch_unhooked(args, grid, block, shared_mem, stream)
        return
    target = stream if stream is not None else current_stream()
    stack = _stack()
    record = KernelRecord(kernel.name, grid, block, shared_mem, target._id, stack[-1] if stack else None,
                          not _timed(target), time.perf_counter(), threading.get_ident())  # fmt: skip
    if record.captured:
        kernel._launch_unhooked(args, grid, block, shared_mem, stream)
    else:
        start = Event().record(target)
        kernel._launch_unhooked(args, grid, block, shared_mem, stream)
        record._events = (start, Event().record(target))
    prof.kernels.append(record)


class Profiler:
    """Records ranges, kernel launches (``kernels=True``) and pool memory snapshots (``memory=True``:
    at start, stop and the close of every outermost range, plus :meth:`snapshot`) between
    :meth:`start` and :meth:`stop` (or as a context manager). ``max_kernels`` bounds the kernel
    records kept (later launches are counted in ``dropped_kernels``)."""

    def __init__(self, *, kernels: bool = True, memory: bool = True, max_kernels: int = 1_000_000) -> None:
        if isinstance(max_kernels, bool) or not isinstance(max_kernels, int) or max_kernels < 0:
            raise ArgumentError(f"Profiler: max_kernels must be an int >= 0, got {max_kernels!r}")
        self.kernels_on = bool(kernels)
        self.memory_on = bool(memory)
        self.max_kernels = max_kernels
        self.ranges: list[RangeRecord] = []
        self.kernels: _Bounded = _Bounded(max_kernels)
        self.memory: list[MemorySnapshot] = []
        self.backend = ""
        self._base: tuple[Event, float] | None = None
        self._recording = False
        self._resolved = False
        self._previous_hook: Any = None

    @property
    def dropped_kernels(self) -> int:
        return self.kernels.dropped

    @property
    def recording(self) -> bool:
        return self._recording

    # -- start and stop -------------------------------------------------------------------------------
    def start(self) -> Profiler:
        global _active
        with _lock:
            if self._recording or self._base is not None:
                raise ProfilerError("Profiler.start: this profiler has already recorded (make a new one)")
            if _active is not None:
                raise ProfilerError("Profiler.start: another profiler is recording; stop it first")
            self.backend = _backend.backend_state().name
            self._base = (Event().record(), time.perf_counter())
            self._recording = True
            _active = self
            if self.kernels_on:
                self._previous_hook = set_launch_hook(_kernel_hook)
        if self.memory_on:
            self.snapshot("start")
        return self

    def stop(self) -> Profiler:
        """Stop recording and resolve the times (synchronizes the device once)."""
        global _active
        if not self._recording:
            raise ProfilerError("Profiler.stop: this profiler is not recording")
        if self.memory_on:
            self.snapshot("stop")
        with _lock:
            if self.kernels_on:
                set_launch_hook(self._previous_hook)
            self._recording = False
            _active = None
        self._resolve()
        return self

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- records --------------------------------------------------------------------------------------
    def snapshot(self, label: str = "") -> MemorySnapshot:
        """The pool's statistics now, kept in ``memory``."""
        stats = memory_stats()
        snap = MemorySnapshot(str(label), time.perf_counter(), int(stats.get("in_use_bytes", 0)),
                              int(stats.get("cached_bytes", 0)), int(stats.get("peak_bytes", 0)),
                              int(stats.get("requests", 0)), dict(stats))  # fmt: skip
        self.memory.append(snap)
        return snap

    def _resolve(self) -> None:
        base = self._base
        assert base is not None
        base_event, base_host = base
        records: list[Any] = [*self.ranges, *self.kernels]
        for rec in records:  # every stream's work done (the first wait does most of it)
            if rec._events is not None and rec._events[1] is not None:
                rec._events[1].synchronize()
        for rec in records:
            events = rec._events
            if events is not None and events[1] is not None:
                try:
                    rec.start_ms = base_event.elapsed_time(events[0])
                    rec.duration_ms = events[0].elapsed_time(events[1])
                except PyGPUkitError:  # another device's events: host times below
                    events = None
                rec._events = None
            if events is None and isinstance(rec, RangeRecord) and rec.host_end is not None:
                rec.start_ms = (rec.host_start - base_host) * 1e3
                rec.duration_ms = (rec.host_end - rec.host_start) * 1e3
        self._resolved = True

    # -- reports --------------------------------------------------------------------------------------
    def _check_resolved(self, what: str) -> tuple[Event, float]:
        if self._recording or not self._resolved or self._base is None:
            raise ProfilerError(f"Profiler.{what}: stop the profiler first")
        return self._base

    def summary(self, top: int = 20) -> str:
        """A text table: ranges and the ``top`` kernels by total device time (count, total, mean)."""
        self._check_resolved("summary")
        lines = [f"profile ({self.backend}): {len(self.ranges)} ranges, {len(self.kernels)} kernel launches"
                 + (f" ({self.dropped_kernels} not kept)" if self.dropped_kernels else "")]  # fmt: skip
        for title, items in (("range", self.ranges), ("kernel", self.kernels)):
            totals: dict[str, list[float]] = {}
            for rec in items:
                totals.setdefault(rec.name, []).append(rec.duration_ms or 0.0)
            if not totals:
                continue
            lines.append(f"{title:<60} {'count':>8} {'total ms':>12} {'mean us':>12}")
            ordered = sorted(totals.items(), key=lambda kv: -sum(kv[1]))
            for name, values in ordered[: top if title == "kernel" else len(ordered)]:
                total = sum(values)
                lines.append(f"{name[:60]:<60} {len(values):>8} {total:>12.3f} {total / len(values) * 1e3:>12.2f}")
        if self.memory:
            peak = max(s.peak_bytes for s in self.memory)
            lines.append(f"pool: {self.memory[-1].in_use_bytes} bytes in use at the end, peak {peak}")
        return "\n".join(lines)

    def to_chrome_trace(self) -> dict[str, Any]:
        """The profile as a Chrome trace-event object (``traceEvents``): process 0 is the device (one
        track per stream: ranges and kernels), process 1 the host (ranges by thread on the host
        clock), memory snapshots a counter track. Times in microseconds since the profiler's start."""
        _, base_host = self._check_resolved("to_chrome_trace")
        events: list[dict[str, Any]] = [
            {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"device ({self.backend})"}},
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "host"}},
        ]
        streams: dict[int, int] = {}

        def track(stream: int) -> int:
            if stream not in streams:
                streams[stream] = len(streams)
                events.append({"ph": "M", "pid": 0, "tid": streams[stream], "name": "thread_name",
                               "args": {"name": f"stream {stream:#x}"}})  # fmt: skip
            return streams[stream]

        for r in self.ranges:
            if r.start_ms is not None and r.duration_ms is not None:
                events.append({"ph": "X", "cat": "range", "name": r.name, "pid": 0, "tid": track(r.stream),
                               "ts": r.start_ms * 1e3, "dur": r.duration_ms * 1e3,
                               "args": {"depth": r.depth, "parent": r.parent}})  # fmt: skip
            if r.host_end is not None:
                host = {"ts": (r.host_start - base_host) * 1e6, "dur": (r.host_end - r.host_start) * 1e6}
                events.append({"ph": "X", "cat": "range", "name": r.name, "pid": 1, "tid": r.thread, **host})
        for k in self.kernels:
            args = {"grid": _jsonable(k.grid), "block": _jsonable(k.block), "shared_mem": k.shared_mem,
                    "range": k.range, "captured": k.captured}  # fmt: skip
            if k.start_ms is not None and k.duration_ms is not None:
                events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": 0, "tid": track(k.stream),
                               "ts": k.start_ms * 1e3, "dur": k.duration_ms * 1e3, "args": args})  # fmt: skip
            else:  # captured into a graph: an instant on the host clock
                events.append({"ph": "i", "s": "t", "cat": "kernel", "name": k.name, "pid": 1, "tid": k.thread,
                               "ts": (k.host_time - base_host) * 1e6, "args": args})  # fmt: skip
        for s in self.memory:
            events.append({"ph": "C", "name": "pool", "pid": 1, "ts": (s.host_time - base_host) * 1e6,
                           "args": {"in_use_bytes": s.in_use_bytes, "cached_bytes": s.cached_bytes}})  # fmt: skip
            events.append({"ph": "i", "s": "p", "cat": "memory", "name": s.label or "snapshot", "pid": 1, "tid": 0,
                           "ts": (s.host_time - base_host) * 1e6, "args": _jsonable(s.stats)})  # fmt: skip
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"backend": self.backend, "dropped_kernels": self.dropped_kernels}}  # fmt: skip

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_chrome_trace` as JSON to ``path`` (for chrome://tracing or Perfetto)."""
        target = Path(path)
        target.write_text(json.dumps(self.to_chrome_trace()) + "\n")
        return target


class _Bounded(list[KernelRecord]):
    """A list that keeps at most ``limit`` items and counts the rest."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.dropped = 0

    def append(self, item: KernelRecord) -> None:
        if len(self) < self.limit:
            super().append(item)
        else:
            self.dropped += 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


class Range(contextlib.ContextDecorator):
    """A named range: ``with Range("name"):`` or ``@Range("name")``, timed with events on ``stream``
    (the current stream when it opens, by default) while a profiler records; nothing otherwise."""

    def __init__(self, name: str, stream: Stream | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"profiling.range: name must be a non-empty str, got {name!r}")
        self.name = name
        self.stream = stream
        self._open = threading.local()  # per thread: the records this range opened, innermost last

    def __enter__(self) -> Range:
        prof = _active
        opened: list[RangeRecord | None] | None = getattr(self._open, "records", None)
        if opened is None:
            opened = self._open.records = []
        if prof is None:
            opened.append(None)
            return self
        target = self.stream if self.stream is not None else current_stream()
        stack = _stack()
        record = RangeRecord(self.name, target._id, threading.get_ident(), len(stack), stack[-1] if stack else None,
                             time.perf_counter())  # fmt: skip
        if _timed(target):
            record._events = (Event().record(target), None)
        stack.append(self.name)
        prof.ranges.append(record)
        opened.append(record)
        return self

    def __exit__(self, *exc: object) -> None:
        record = self._open.records.pop()
        if record is None:
            return
        stack = _stack()
        if stack:
            stack.pop()
        target = self.stream if self.stream is not None else current_stream()
        record.host_end = time.perf_counter()
        if record._events is not None:
            if target._id == record.stream and _timed(target):
                record._events = (record._events[0], Event().record(target))
            else:  # the current stream changed or a capture began inside the range: host times
                record._events = None
        prof = _active
        if prof is not None and prof.memory_on and record.depth == 0:
            prof.snapshot(f"end of {self.name}")


def range(name: str, stream: Stream | None = None) -> Range:  # the module's public name (shadows the builtin here)
    """A named range (:class:`Range`): a context manager and a decorator."""
    return Range(name, stream)
