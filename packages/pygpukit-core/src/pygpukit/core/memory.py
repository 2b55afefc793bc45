"""Device memory: pool-backed buffers, pool statistics and limits, pinned host memory, raw copies.

Every device allocation goes through the Rust pool in the native module, so freed blocks are reused
per stream, cached blocks are released under pressure, and an :class:`OutOfMemoryError` names the
requested, in-use, cached and limit bytes. On the CPU backend a host array stands in for the device
memory and the same accounting is kept in Python.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from . import backend as _backend
from .backend import backend_state
from .errors import InvalidPointerError, OutOfMemoryError, PyGPUkitError
from .stream import Stream, current_stream
from .stream import _local as _thread_state
from .stream import current_streams as _current_streams

__all__ = [
    "AllocationScope",
    "DeviceBuffer",
    "ExternalBuffer",
    "PinnedBuffer",
    "allocation_scope",
    "current_allocation_scope",
    "empty_cache",
    "get_memory_info",
    "memcpy_device_to_device_async",
    "memcpy_device_to_host_async",
    "memcpy_host_to_device_async",
    "memory_stats",
    "pinned_free",
    "pinned_malloc",
    "set_memory_limit",
]


def _native() -> Any:
    state = backend_state()
    return state.native if state.name == "cuda" else None


class _CpuPool:
    """The CPU backend's accounting, mirroring the device pool's statistics and limit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.limit: int | None = None
        self.all_devices_limit: int | None = None  # the CPU backend has one "device": both caps apply
        self.stats = dict.fromkeys(
            ("in_use_bytes", "peak_in_use_bytes", "in_use_blocks", "requests", "frees", "device_allocations"), 0
        )

    def allocate(self, nbytes: int) -> None:
        with self.lock:
            for what, limit in (("pool limit", self.limit), ("all-device limit", self.all_devices_limit)):
                if limit is not None and self.stats["in_use_bytes"] + nbytes > limit:
                    raise OutOfMemoryError(
                        f"out of memory ({what}): requested {nbytes} bytes, in use {self.stats['in_use_bytes']} "
                        f"bytes, cached 0 bytes, limit {limit} bytes",
                        requested=nbytes,
                        in_use=self.stats["in_use_bytes"],
                        cached=0,
                        limit=limit,
                    )
            s = self.stats
            s["in_use_bytes"] += nbytes
            s["in_use_blocks"] += 1
            s["requests"] += 1
            s["device_allocations"] += 1
            s["peak_in_use_bytes"] = max(s["peak_in_use_bytes"], s["in_use_bytes"])

    def free(self, nbytes: int) -> None:
        with self.lock:
            self.stats["in_use_bytes"] -= nbytes
            self.stats["in_use_blocks"] -= 1
            self.stats["frees"] += 1


_cpu_pool = _CpuPool()


class AllocationScope(Protocol):
    """Something that accounts for the device memory allocated while it is the current scope (the
    scheduler's per-context budgets). ``charge`` runs before the allocation and refuses it by raising;
    ``refund`` runs when the buffer is freed (from any thread, possibly during garbage collection)."""

    def charge(self, nbytes: int) -> None: ...

    def refund(self, nbytes: int) -> None: ...


# A ContextVar, not a thread-local: each asyncio task sees the scope it entered.
_scope: contextvars.ContextVar[AllocationScope | None] = contextvars.ContextVar(
    "pygpukit_allocation_scope", default=None
)


@contextlib.contextmanager
def allocation_scope(scope: AllocationScope | None) -> Iterator[AllocationScope | None]:
    """Make ``scope`` account for every DeviceBuffer allocated inside the block (in this thread or
    asyncio task); ``None`` suspends an outer scope."""
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_allocation_scope() -> AllocationScope | None:
    return _scope.get()


class DeviceBuffer:
    """One pool allocation of ``nbytes`` bytes for work on ``stream``; returned to the pool on free/GC."""

    __slots__ = ("__weakref__", "_host", "_live", "_native", "_scope", "device", "nbytes", "ptr")

    def __init__(self, nbytes: int, *, stream: Stream | None = None) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self.nbytes = nbytes
        self._live = False
        scope = self._scope = _scope.get()
        if scope is not None:
            scope.charge(nbytes)  # may refuse: nothing is allocated then
        try:
            state = _backend._state or backend_state()
            native = state.native if state.name == "cuda" else None
            self._native = native
            if native is None:
                _cpu_pool.allocate(nbytes)
                self._host: np.ndarray[Any, Any] | None = np.empty(max(nbytes, 1), dtype=np.uint8)
                self.ptr = int(self._host.ctypes.data)
                self.device = -1
            else:
                self._host = None
                if stream is None:
                    streams = _current_streams.get()
                    handle = streams[-1]._handle if streams else 0
                else:
                    handle = stream._handle
                self.ptr = native.mem_alloc(nbytes, handle)
                self.device = _thread_state.device
        except BaseException:
            if scope is not None:
                scope.refund(nbytes)
            raise
        self._live = True

    @property
    def freed(self) -> bool:
        return not self._live

    def free(self) -> None:
        """Return the memory to the pool now. Later use of arrays over it raises."""
        if not self._live:
            raise InvalidPointerError(f"buffer at {self.ptr:#x} was already freed")
        self._release()

    def _release(self) -> None:
        self._live = False
        try:
            if self._native is None:
                _cpu_pool.free(self.nbytes)
            else:
                self._native.mem_free(self.ptr, self.device)
        finally:
            if self._scope is not None:
                self._scope.refund(self.nbytes)

    def __del__(self) -> None:
        try:  # _live is unset when __init__ failed before it (AttributeError)
            if self._live:
                self._release()
        except Exception:  # nothing to report to during garbage collection
            pass

    def host_view(self) -> np.ndarray[Any, Any]:
        """CPU backend only: the host bytes standing in for the device memory."""
        if self._host is None:
            raise PyGPUkitError("host_view() exists only on the CPU backend")
        return self._host

    def __repr__(self) -> str:
        where = "cpu" if self.device < 0 else f"cuda:{self.device}"
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={where}, freed={self.freed})"


class ExternalBuffer:
    """Device memory owned by someone else (a DLPack or CUDA-Array-Interface producer).

    Holds ``owner`` alive and calls ``release`` (if given) when garbage-collected; never frees the
    memory through the pool.
    """

    __slots__ = ("__weakref__", "_finalizer", "_live", "device", "nbytes", "owner", "ptr")
    _finalizer: weakref.finalize[Any, Any]

    def __init__(self, ptr: int, nbytes: int, device: int, owner: Any, release: Any = None) -> None:
        self._live = True
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.device = int(device)
        self.owner = owner
        self._finalizer = weakref.finalize(self, release or (lambda: None))

    @property
    def freed(self) -> bool:
        return False

    def free(self) -> None:
        raise InvalidPointerError("memory imported from another library is freed by its owner, not by pygpukit")

    def host_view(self) -> np.ndarray[Any, Any]:
        raise PyGPUkitError("imported device memory has no host view")

    def __repr__(self) -> str:
        return f"ExternalBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device=cuda:{self.device})"


def get_memory_info() -> tuple[int, int]:
    """(free, total) bytes of the current device (of host RAM on the CPU backend)."""
    native = _native()
    if native is None:
        page = os.sysconf("SC_PAGE_SIZE")
        return int(os.sysconf("SC_AVPHYS_PAGES") * page), int(os.sysconf("SC_PHYS_PAGES") * page)
    free, total = native.mem_get_info()
    return int(free), int(total)


def memory_stats() -> dict[str, Any]:
    """The current device pool's statistics: bytes and blocks in use and cached, peak, requests,
    reuse hits, device allocations, frees, releases, limit (None when unlimited), and for all devices
    together ``all_devices_limit`` and ``all_devices_reserved_bytes`` (in use + cached)."""
    native = _native()
    if native is None:
        with _cpu_pool.lock:
            stats: dict[str, Any] = dict(_cpu_pool.stats)
        stats.update(cached_bytes=0, cached_blocks=0, pending_bytes=0, reuse_hits=0, releases=0, released_bytes=0)
        stats["limit"] = _cpu_pool.limit
        stats["all_devices_limit"] = _cpu_pool.all_devices_limit
        stats["all_devices_reserved_bytes"] = stats["in_use_bytes"]
        return stats
    return dict(native.mem_stats())


def empty_cache() -> int:
    """Free every cached (unused) block of the current device's pool; returns the bytes released."""
    native = _native()
    return 0 if native is None else int(native.mem_empty_cache(False))


def set_memory_limit(limit: int | None, *, all_devices: bool = False) -> None:
    """Cap the current device pool's in-use plus cached bytes (None: no cap). Cached blocks above a
    lower cap are released; allocations that would exceed it raise :class:`OutOfMemoryError`.

    With ``all_devices=True`` the cap is process-wide: the pools of every device together, on top of
    each device's own cap. An allocation over it first releases the allocating device's cached blocks.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    native = _native()
    if native is None:
        if all_devices:
            _cpu_pool.all_devices_limit = limit
        else:
            _cpu_pool.limit = limit
        return
    if all_devices:
        native.mem_set_global_limit(limit or 0)
    else:
        native.mem_set_limit(limit or 0)


class PinnedBuffer:
    """Page-locked host memory of ``nbytes`` bytes (fast, truly asynchronous copies), freed on GC."""

    __slots__ = ("__weakref__", "_finalizer", "_keep", "nbytes", "ptr")
    _finalizer: weakref.finalize[Any, Any]

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        native = _native()
        if native is None:
            self._keep: Any = np.empty(max(self.nbytes, 1), dtype=np.uint8)
            self.ptr = int(self._keep.ctypes.data)
            self._finalizer = weakref.finalize(self, lambda: None)
            return
        self._keep = None
        self.ptr = int(native.pinned_alloc(self.nbytes))
        self._finalizer = weakref.finalize(self, native.pinned_free, self.ptr)

    def numpy(self, dtype: Any = np.uint8, count: int = -1) -> np.ndarray[Any, Any]:
        """A NumPy view of the pinned bytes (valid while this buffer lives)."""
        raw = memoryview((ctypes.c_uint8 * self.nbytes).from_address(self.ptr)).cast("B")
        view: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=np.uint8).view(dtype)
        return view[: None if count < 0 else count]

    def free(self) -> None:
        self._finalizer()


def pinned_malloc(nbytes: int) -> int:
    """Allocate page-locked host memory; returns its address. Free with :func:`pinned_free`."""
    native = _native()
    if native is None:
        buffer = PinnedBuffer(nbytes)
        _cpu_pinned[buffer.ptr] = buffer
        return buffer.ptr
    return int(native.pinned_alloc(int(nbytes)))


def pinned_free(ptr: int) -> None:
    """Free memory from :func:`pinned_malloc`."""
    native = _native()
    if native is None:
        if _cpu_pinned.pop(ptr, None) is None:
            raise InvalidPointerError(f"{ptr:#x} was not allocated by pinned_malloc")
        return
    native.pinned_free(ptr)


_cpu_pinned: dict[int, PinnedBuffer] = {}


def _copy(kind: str, dst: int, src: int, nbytes: int, stream: Stream | None) -> None:
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    native = _native()
    if native is None:
        ctypes.memmove(dst, src, nbytes)
        return
    getattr(native, f"memcpy_{kind}")(dst, src, nbytes, (stream or current_stream()).handle, True)


def memcpy_host_to_device_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` from host address ``src`` to device address ``dst``, ordered on ``stream``.
    Truly asynchronous only when ``src`` is pinned memory."""
    _copy("htod", dst, src, nbytes, stream)


def memcpy_device_to_host_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` from device address ``src`` to host address ``dst``, ordered on ``stream``."""
    _copy("dtoh", dst, src, nbytes, stream)


def memcpy_device_to_device_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` between device addresses, ordered on ``stream``."""
    _copy("dtod", dst, src, nbytes, stream)
