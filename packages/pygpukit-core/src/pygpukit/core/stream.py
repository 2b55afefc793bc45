"""Streams and events, with a per-thread current stream.

On the CUDA backend these own driver streams and events. On the CPU backend work runs immediately,
so streams are ordering-only tokens and events record host time.

A reset of their device (:func:`pygpukit.reset_device`) invalidates streams and events: their handles
died with the old context, so any later use raises :class:`DeviceResetError` (reading ``_handle``
included, which is what the launch fast paths do) and they are never destroyed in the new context.
The invalidated objects change class to a subclass whose ``__getattr__`` raises for the removed
handle, so live ones keep plain slot access on the launch path.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from .backend import backend_state
from .errors import DeviceResetError, DTypeError, PyGPUkitError

if TYPE_CHECKING:
    from ._native import NativeModule

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


def _native() -> NativeModule | None:
    state = backend_state()
    return state.native if state.name == "cuda" else None


# Called with (device, handle) when a Stream is destroyed (closed, or collected): per-stream caches
# (the ops' completion counters) drop their arrays, whose blocks go to the stream's pool cache, which
# the native destroy then gives back. Hooks must not block: they may run in a garbage collection.
_destroy_hooks: list[Callable[[int, int], None]] = []


def on_stream_destroyed(hook: Callable[[int, int], None]) -> None:
    """Call ``hook(device, handle)`` whenever a :class:`Stream` is destroyed (``device`` -1: the CPU
    backend), before its handle can be reused: for caches keyed by stream handle."""
    _destroy_hooks.append(hook)


def _stream_destroyed(device: int, handle: int) -> None:
    for hook in _destroy_hooks:
        with suppress(Exception):
            hook(device, handle)


def _destroy_stream(native: NativeModule, handle: int, device: int) -> None:
    _stream_destroyed(device, handle)
    with suppress(Exception):
        native.stream_destroy(handle)


def _destroy_event(native: NativeModule, handle: int) -> None:
    with suppress(Exception):
        native.event_destroy(handle)


# Every stream and event made here (Stream.null() aside: the legacy stream outlives a reset), weakly,
# for a device reset to invalidate.
_streams: weakref.WeakSet[Stream] = weakref.WeakSet()
_events: weakref.WeakSet[Event] = weakref.WeakSet()


def _reset_lookup(obj: Any, name: str, kind: str) -> Any:
    """``__getattr__`` of invalidated streams and events (it runs only for an attribute that is not
    set): a reset removes ``_handle``, so reading it raises :class:`DeviceResetError`, for the C
    launcher too, which then takes the general path, reads ``_handle`` again and raises."""
    if name == "_handle":
        raise DeviceResetError.of(f"this {kind} (handle {obj._id:#x})", obj._reset)
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


class Stream:
    """A CUDA stream. ``Stream()`` creates one; :meth:`Stream.null` is the legacy default stream.

    ``priority``: lower numbers run first (clamped to the device's range, see
    :meth:`priority_range`). Used as a context manager it becomes the thread's current stream, which
    every operation without an explicit ``stream=`` uses.
    """

    # _device: the device whose context owns it (-1: CPU backend); _id: the handle it was created with
    # (kept after a reset, for hashing and messages); _reset: set only by a reset of its device.
    __slots__ = ("__weakref__", "_device", "_finalizer", "_handle", "_id", "_priority", "_reset")
    _reset: int

    def __init__(self, priority: int = 0, *, non_blocking: bool = True) -> None:
        if isinstance(priority, bool) or not hasattr(priority, "__index__"):
            raise DTypeError(f"Stream priority must be an int, got {type(priority).__name__} {priority!r}")
        priority = priority.__index__()
        native = _native()
        if native is None:
            self._handle = self._id = next(_cpu_handles)
            self._device = -1
            self._priority = priority
            self._finalizer: weakref.finalize[Any, Any] | None = None
            weakref.finalize(self, _stream_destroyed, -1, self._handle)  # no handle to destroy: the hooks
        else:
            self._handle = self._id = int(native.stream_create(priority, non_blocking))
            self._device = _local.device
            self._priority = int(native.stream_priority(self._handle))
            self._finalizer = weakref.finalize(self, _destroy_stream, native, self._handle, self._device)
        _streams.add(self)

    @classmethod
    def null(cls) -> Stream:
        """The legacy default stream (handle 0)."""
        stream = cls.__new__(cls)
        stream._handle = stream._id = 0
        stream._device = -1
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
        handle: int = self._handle  # raises DeviceResetError after a reset of the stream's device
        if self._finalizer is not None and not self._finalizer.alive:
            raise PyGPUkitError("the stream was closed")
        return handle

    @property
    def priority(self) -> int:
        return self._priority

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: (version 0, handle)."""
        return (0, self.handle)

    def synchronize(self) -> None:
        """Wait until all work queued on the stream is done."""
        handle = self.handle
        native = _native()
        if native is not None:
            native.stream_synchronize(handle)

    def query(self) -> bool:
        """True when all work queued on the stream is done."""
        handle = self.handle
        native = _native()
        return True if native is None else bool(native.stream_query(handle))

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for ``event``."""
        handle, event_handle = self.handle, event.handle
        native = _native()
        if native is not None:
            native.stream_wait_event(handle, event_handle)

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
        self.handle  # noqa: B018 - raises for a closed stream or one of a reset device
        current_streams.set((*current_streams.get(), self))
        return self

    def __exit__(self, *exc: object) -> None:
        stack = current_streams.get()
        if stack and stack[-1] is self:
            current_streams.set(stack[:-1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return False
        if hasattr(self, "_reset") or hasattr(other, "_reset"):  # a reset stream equals only itself
            return self is other
        return other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        reset = ", invalidated by reset_device" if hasattr(self, "_reset") else ""
        return f"Stream(handle={self._id:#x}, priority={self._priority}{reset})"


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

    # _device, _id and _reset as for Stream.
    __slots__ = ("__weakref__", "_device", "_finalizer", "_handle", "_host_time", "_id", "_reset", "_timing")
    _reset: int

    def __init__(self, *, timing: bool = True, blocking: bool = False) -> None:
        self._timing = timing
        self._host_time: float | None = None
        native = _native()
        if native is None:
            self._handle = self._id = next(_cpu_handles)
            self._device = -1
            self._finalizer: weakref.finalize[Any, Any] | None = None
        else:
            self._handle = self._id = int(native.event_create(timing, blocking))
            self._device = _local.device
            self._finalizer = weakref.finalize(self, _destroy_event, native, self._handle)
        _events.add(self)

    @property
    def handle(self) -> int:
        """The CUevent value; raises :class:`DeviceResetError` after a reset of the event's device."""
        handle: int = self._handle
        return handle

    def record(self, stream: Stream | None = None) -> Event:
        """Record on ``stream`` (the current stream by default)."""
        handle = self._handle
        native = _native()
        if native is None:
            (stream or current_stream()).handle  # noqa: B018 - the same checks as on the GPU
            self._host_time = time.perf_counter()
        else:
            native.event_record(handle, (stream or current_stream()).handle)
        return self

    def synchronize(self) -> None:
        handle = self._handle
        native = _native()
        if native is not None:
            native.event_synchronize(handle)

    def query(self) -> bool:
        handle = self._handle
        native = _native()
        return True if native is None else bool(native.event_query(handle))

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both recorded, both with timing)."""
        if not (self._timing and end._timing):
            raise PyGPUkitError("elapsed_time needs two events created with timing=True")
        start_handle, end_handle = self._handle, end._handle
        native = _native()
        if native is None:
            if self._host_time is None or end._host_time is None:
                raise PyGPUkitError("both events must be recorded before elapsed_time")
            return (end._host_time - self._host_time) * 1e3
        return float(native.event_elapsed_ms(start_handle, end_handle))

    def __repr__(self) -> str:
        reset = ", invalidated by reset_device" if hasattr(self, "_reset") else ""
        return f"Event(handle={self._id:#x}, timing={self._timing}{reset})"


class _ResetStream(Stream):
    """A Stream of a reset device (see the module documentation)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return _reset_lookup(self, name, "stream")


class _ResetEvent(Event):
    """An Event of a reset device."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return _reset_lookup(self, name, "event")


def invalidate_device(device: int) -> tuple[int, int]:
    """Device reset (:func:`pygpukit.reset_device`, before the context is reset): the streams and
    events of ``device`` (-1: the CPU backend) lose their handles, which died with the context, and are
    never destroyed. Returns (streams, events) invalidated."""
    counts = []
    groups: tuple[tuple[list[Stream] | list[Event], type], ...] = (
        (list(_streams), _ResetStream),
        (list(_events), _ResetEvent),
    )
    for group, reset_class in groups:
        count = 0
        for item in group:
            if item._device != device or hasattr(item, "_reset"):
                continue
            if item._finalizer is not None:
                item._finalizer.detach()
            item._reset = device
            del item._handle
            item.__class__ = reset_class
            count += 1
        counts.append(count)
    return counts[0], counts[1]
