"""Paced streams: a context's or partition's stream held to its compute share by a token bucket in
Rust (``_pygpukit_rust.KernelPacingEngine``).

Every way of issuing work on a stream resolves the stream's handle first: the native launcher of
JIT kernels and built-in ops reads ``stream._handle`` (for the current stream too), the general
launch path, cuBLASLt calls, graph launches, copies and stream-ordered allocations read
``stream._handle`` or ``stream.handle``. A :class:`PacedStream` turns that read into the pacing
point: it takes one token (one launch) from the stream's bucket first, waiting with the GIL
released while the bucket is empty, so every launch on the stream is paced without any check on
the launch path of other streams (plain :class:`~pygpukit.core.stream.Stream` objects are not
touched: pacing costs nothing outside a paced context). Synchronising, querying and waiting on the
stream do not take tokens; recording an event on it (``Event.record`` reads ``stream.handle``)
does.

Shares are of a launch rate (``launch_rate``, launches per second, given to
:func:`pygpukit.scheduler.initialize`): a stream with share ``s`` may issue ``s * launch_rate``
launches per second after an initial burst of ``window_ms`` of that rate. Launches are not equal
in cost, so a share is a share of launches, not of SM time; see docs/scheduler.md.
"""

from __future__ import annotations

from typing import Any

from pygpukit.core.backend import backend_state
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.stream import Stream, current_streams

__all__ = ["PacedStream", "priority_for_share"]

# The slot that holds a Stream's handle; PacedStream's `_handle` property stands in front of it.
_SLOT: Any = Stream.__dict__["_handle"]


def priority_for_share(share: float) -> int:
    """The stream priority of a compute share: 0 for none, down to -5 (the highest CUDA priority on
    current GPUs; the runtime clamps to the device's range) for the whole device."""
    return -round(5 * min(max(share, 0.0), 1.0))


class PacedStream(Stream):
    """A :class:`Stream` whose launches are paced: each one first takes a token from a Rust token
    bucket refilled at ``share * launch_rate`` launches per second."""

    # No slots of its own: the stream keeps Stream's layout, so that a device reset can still turn it
    # into an invalidated stream (a class change). Each paced stream gets its own subclass holding its
    # bucket (`_engine`) and share as class attributes.
    __slots__ = ()
    _engine: Any = None  # None while Stream.__init__ runs: creating the stream takes no token
    _share: float = 0.0

    def __init__(self, share: float, launch_rate: float, *, priority: int = 0, window_ms: float = 100.0) -> None:
        import _pygpukit_rust

        engine = _pygpukit_rust.KernelPacingEngine(
            _pygpukit_rust.PacingConfig(total_bandwidth=launch_rate, window_ms=window_ms)
        )
        engine.allocate_stream(0, share)  # validates the share (InvalidArgumentError)
        super().__init__(priority)
        self.__class__ = type("PacedStream", (PacedStream,), {"__slots__": (), "_engine": engine, "_share": share})

    # -- the pacing point ---------------------------------------------------------------------------
    @property
    def _handle(self) -> int:
        handle: int = _SLOT.__get__(self, Stream)
        engine = self._engine
        if engine is not None:
            engine.acquire(0, 1.0)  # waits, with the GIL released, while the bucket is empty
        return handle

    @_handle.setter
    def _handle(self, value: int) -> None:
        _SLOT.__set__(self, value)

    @_handle.deleter
    def _handle(self) -> None:
        _SLOT.__delete__(self)

    def _raw(self) -> int:
        """The handle without taking a token, with :attr:`Stream.handle`'s checks."""
        handle: int = _SLOT.__get__(self, Stream)
        if self._finalizer is not None and not self._finalizer.alive:
            raise PyGPUkitError("the stream was closed")
        return handle

    # -- operations that are not launches -----------------------------------------------------------
    def synchronize(self) -> None:
        handle = self._raw()
        state = backend_state()
        if state.name == "cuda":
            state.native.stream_synchronize(handle)  # type: ignore[union-attr]

    def query(self) -> bool:
        handle = self._raw()
        state = backend_state()
        return True if state.name != "cuda" else bool(state.native.stream_query(handle))  # type: ignore[union-attr]

    def wait_event(self, event: Any) -> None:
        handle, event_handle = self._raw(), event.handle
        state = backend_state()
        if state.name == "cuda":
            state.native.stream_wait_event(handle, event_handle)  # type: ignore[union-attr]

    def __enter__(self) -> PacedStream:
        self._raw()
        current_streams.set((*current_streams.get(), self))
        return self

    # -- inspection ---------------------------------------------------------------------------------
    @property
    def share(self) -> float:
        return self._share

    @property
    def launch_rate(self) -> float:
        return float(self._engine.total_bandwidth)

    def pacing_stats(self) -> dict[str, Any]:
        """share, rate (launches/s), tokens, launches, throttled (launches that had to wait)."""
        stats = dict(self._engine.stream_stats(0))
        del stats["granted"]
        return stats

    def __repr__(self) -> str:
        return f"PacedStream(handle={self._id:#x}, priority={self._priority}, share={self._share})"
