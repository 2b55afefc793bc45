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

Threads of one process: a paced thread that gives the GIL up once per launch (a driver call made
with the GIL released, a synchronisation, a wait for a token) gets it back from a thread that never
blocks only when the interpreter forces a switch, every ``sys.getswitchinterval()`` seconds (5 ms
by default): about 200 launches per second whatever its share, with its bucket full. So while paced
streams exist the switch interval is lowered to a quarter of the fastest paced stream's launch
interval (not below 50 us; never raised; restored when the last paced stream is gone, unless
someone else changed it meanwhile). ``PacedStream(..., switch_interval=False)`` leaves it alone.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import weakref
from typing import Any

from pygpukit.core.backend import backend_state
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.stream import Stream, current_streams

__all__ = ["PacedStream", "priority_for_share", "switch_interval_for"]

# The slot that holds a Stream's handle; PacedStream's `_handle` property stands in front of it.
_SLOT: Any = Stream.__dict__["_handle"]


# -- the interpreter's switch interval while paced streams exist ------------------------------------
SWITCH_FLOOR_S = 50e-6  # switching more often than this costs the other threads more than it gains
_tuned: dict[int, float] = {}  # launch rate (launches/s) of each live paced stream that tunes, by key
_keys = itertools.count()
_saved: float | None = None  # the interval before the first paced stream lowered it
_applied: float | None = None  # the interval this module set last
_switch_lock = threading.Lock()


def switch_interval_for(rate: float, base: float) -> float:
    """The switch interval that lets a thread releasing the GIL once per launch keep ``rate``
    launches per second beside a thread that never blocks: a quarter of its launch interval, not
    below :data:`SWITCH_FLOOR_S` and never above ``base`` (the interval otherwise in force)."""
    return min(base, max(SWITCH_FLOOR_S, 0.25 / rate))


def _retune(created: bool) -> None:
    """Sets the switch interval for the live paced streams after one was ``created`` or collected.
    An interval changed by someone else since this module set it is theirs: a collection then leaves
    it alone (and forgets what to restore); a new paced stream takes it as the base to lower."""
    global _saved, _applied
    with _switch_lock:
        current = sys.getswitchinterval()
        if _applied is not None and abs(current - _applied) > 1e-9:
            _saved = _applied = None
        if _applied is None and not created:
            return
        if not _tuned:
            if _saved is not None:
                sys.setswitchinterval(_saved)
            _saved = _applied = None
            return
        if _saved is None:
            _saved = current
        target = switch_interval_for(max(_tuned.values()), _saved)
        if abs(target - current) > 1e-9:
            sys.setswitchinterval(target)
        _applied = sys.getswitchinterval()


def _forget(key: int) -> None:
    with _switch_lock:
        _tuned.pop(key, None)
    with contextlib.suppress(Exception):  # a finalizer at interpreter exit: nothing left to restore for
        _retune(created=False)


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
    _waited_ms: float = 0.0  # time spent waiting for tokens (GIL released), not counting getting it back

    def __init__(
        self, share: float, launch_rate: float, *, priority: int = 0, window_ms: float = 100.0,
        switch_interval: bool = True,
    ) -> None:  # fmt: skip
        """``switch_interval``: lower the interpreter's switch interval while this stream lives (see
        the module's docstring), so that its thread keeps its share beside threads that never block."""
        import _pygpukit_rust

        engine = _pygpukit_rust.KernelPacingEngine(
            _pygpukit_rust.PacingConfig(total_bandwidth=launch_rate, window_ms=window_ms)
        )
        engine.allocate_stream(0, share)  # validates the share (InvalidArgumentError)
        super().__init__(priority)
        self.__class__ = type("PacedStream", (PacedStream,), {"__slots__": (), "_engine": engine, "_share": share})
        if switch_interval:
            key = next(_keys)
            with _switch_lock:
                _tuned[key] = share * float(engine.total_bandwidth)
            _retune(created=True)
            weakref.finalize(self, _forget, key)

    # -- the pacing point ---------------------------------------------------------------------------
    @property
    def _handle(self) -> int:
        handle: int = _SLOT.__get__(self, Stream)
        engine = self._engine
        if engine is not None:
            waited = engine.acquire(0, 1.0)  # waits, with the GIL released, while the bucket is empty
            if waited:
                type(self)._waited_ms += waited
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
        """share, rate (launches/s), tokens, launches, throttled (requests told to wait: a launch that
        waited counts once per look at the bucket, usually once) and waited_ms (milliseconds launches
        waited for tokens, not counting getting the GIL back)."""
        stats = dict(self._engine.stream_stats(0))
        del stats["granted"]
        stats["waited_ms"] = self._waited_ms
        return stats

    def __repr__(self) -> str:
        return f"PacedStream(handle={self._id:#x}, priority={self._priority}, share={self._share})"
