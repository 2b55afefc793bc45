"""Streams and events, with a per-thread current stream.

On the CUDA backend these own driver streams and events. On the CPU backend work runs immediately,
so streams are ordering-only tokens and events record host time.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
import weakref
from contextlib import suppress
from typing import Any

from .backend import backend_state
from .errors import PyGPUkitError

__all__ = ["Event", "Stream", "current_stream", "synchronize", "thread_device"]

_cpu_handles = itertools.count(1)


class _ThreadState(threading.local):
    """Per-thread runtime state; attributes start at their defaults in every thread."""

    def __init__(self) -> None:
        self.device = 0


_local = _ThreadState()

# The current-stream stack, innermost last. A ContextVar rather than a thread-local, so that asyncio
# tasks (each running in its own copy of the context) have their own current stream; threads still
# start from an empty stack.
current_streams: contextvars.ContextVar[tuple[Stream, ...]] = contextvars.ContextVar("pygpukit_streams", default=())


def _native() -> Any:
    state = backend_state()
    return state.native if state.name == "cuda" else None


def _destroy_stream(native: Any, handle: int) -> None:
    with suppress(Exception):
        native.stream_destroy(handle)


def _destroy_event(native: Any, handle: int) -> None:
    with suppress(Exception):
        native.event_destroy(handle)


class Stream:
    """A CUDA stream. ``Stream()`` creates one; :meth:`Stream.null` is the legacy default stream.

    ``priority``: lower numbers run first (clamped to the device's range, see
    :meth:`priority_range`). Used as a context manager it becomes the thread's current stream, which
    every operation without an explicit ``stream=`` uses.
    """

    __slots__ = ("__weakref__", "_finalizer", "_handle", "_priority")

    def __init__(self, priority: int = 0, *, non_blocking: bool = True) -> None:
        native = _native()
        if native is None:
            self._handle = next(_cpu_handles)
            self._priority = priority
            self._finalizer: weakref.finalize[Any, Any] | None = None
            return
        self._handle = int(native.stream_create(priority, non_blocking))
        self._priority = int(native.stream_priority(self._handle))
        self._finalizer = weakref.finalize(self, _destroy_stream, native, self._handle)

    @classmethod
    def null(cls) -> Stream:
        """The legacy default stream (handle 0)."""
        stream = cls.__new__(cls)
        stream._handle = 0
        stream._priority = 0
        stream._finalizer = None
        return stream

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(lowest, highest) priority; the highest is the numerically smaller one."""
        native = _native()
        if native is None:
            return (0, 0)
        least, greatest = native.stream_priority_range()
        return int(least), int(greatest)

    @property
    def handle(self) -> int:
        """The CUstream value (0 for the default stream)."""
        if self._finalizer is not None and not self._finalizer.alive:
            raise PyGPUkitError("the stream was closed")
        return self._handle

    @property
    def priority(self) -> int:
        return self._priority

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: (version 0, handle)."""
        return (0, self.handle)

    def synchronize(self) -> None:
        """Wait until all work queued on the stream is done."""
        native = _native()
        if native is not None:
            native.stream_synchronize(self.handle)

    def query(self) -> bool:
        """True when all work queued on the stream is done."""
        native = _native()
        return True if native is None else bool(native.stream_query(self.handle))

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for ``event``."""
        native = _native()
        if native is not None:
            native.stream_wait_event(self.handle, event.handle)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream and return it."""
        event = event or Event()
        event.record(self)
        return event

    def close(self) -> None:
        """Synchronize and destroy the stream now (also done when it is garbage-collected)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Stream:
        current_streams.set((*current_streams.get(), self))
        return self

    def __exit__(self, *exc: object) -> None:
        stack = current_streams.get()
        if stack and stack[-1] is self:
            current_streams.set(stack[:-1])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._handle == self._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def __repr__(self) -> str:
        return f"Stream(handle={self._handle:#x}, priority={self._priority})"


def thread_device() -> int:
    """The calling thread's current device ordinal as pygpukit set it (mirrors the native side)."""
    return _local.device


def set_thread_device(ordinal: int) -> None:
    _local.device = ordinal


_NULL = Stream.null()


def current_stream() -> Stream:
    """The calling thread's current stream (the default stream unless inside ``with stream:``)."""
    stack = current_streams.get()
    return stack[-1] if stack else _NULL


def synchronize() -> None:
    """Wait for all work on the current device."""
    native = _native()
    if native is not None:
        native.device_synchronize()


class Event:
    """A CUDA event: record it on a stream, wait for it, or time the work between two events."""

    __slots__ = ("__weakref__", "_finalizer", "_handle", "_host_time", "_timing")

    def __init__(self, *, timing: bool = True, blocking: bool = False) -> None:
        self._timing = timing
        self._host_time: float | None = None
        native = _native()
        if native is None:
            self._handle = next(_cpu_handles)
            self._finalizer: weakref.finalize[Any, Any] | None = None
            return
        self._handle = int(native.event_create(timing, blocking))
        self._finalizer = weakref.finalize(self, _destroy_event, native, self._handle)

    @property
    def handle(self) -> int:
        return self._handle

    def record(self, stream: Stream | None = None) -> Event:
        """Record on ``stream`` (the current stream by default)."""
        native = _native()
        if native is None:
            self._host_time = time.perf_counter()
        else:
            native.event_record(self._handle, (stream or current_stream()).handle)
        return self

    def synchronize(self) -> None:
        native = _native()
        if native is not None:
            native.event_synchronize(self._handle)

    def query(self) -> bool:
        native = _native()
        return True if native is None else bool(native.event_query(self._handle))

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both recorded, both with timing)."""
        if not (self._timing and end._timing):
            raise PyGPUkitError("elapsed_time needs two events created with timing=True")
        native = _native()
        if native is None:
            if self._host_time is None or end._host_time is None:
                raise PyGPUkitError("both events must be recorded before elapsed_time")
            return (end._host_time - self._host_time) * 1e3
        return float(native.event_elapsed_ms(self._handle, end._handle))

    def __repr__(self) -> str:
        return f"Event(handle={self._handle:#x}, timing={self._timing})"
