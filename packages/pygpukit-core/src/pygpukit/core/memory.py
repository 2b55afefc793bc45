"""Device memory: pool-backed buffers, pool statistics and limits, pinned host memory, raw copies.

Every device allocation goes through the Rust pool in the native module, so freed blocks are reused
per stream, cached blocks are released under pressure, and an :class:`OutOfMemoryError` names the
requested, in-use, cached and limit bytes. On the CPU backend a host array stands in for the device
memory and the same accounting is kept in Python.

Live buffers are registered (weakly) so that :func:`pygpukit.reset_device` can invalidate every
allocation of a reset device: they then raise :class:`DeviceResetError` and are never freed into the
new context.

(Over 600 lines because the buffer types, both backends' accounting, the address maps that check raw
copies and the reset bookkeeping all work on the same private maps and registries; split, each part
would reach into the others' internals.)
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import ctypes
import operator
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import backend as _backend
from ._host_memory import is_mapped
from .backend import backend_state
from .errors import (
    ArgumentError,
    CudaError,
    DeviceResetError,
    DTypeError,
    InvalidPointerError,
    OutOfMemoryError,
    PyGPUkitError,
)
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


if TYPE_CHECKING:
    from ._native import NativeModule


def _native() -> NativeModule | None:
    state = backend_state()
    return state.native if state.name == "cuda" else None


def _byte_count(nbytes: Any, what: str) -> int:
    try:
        count = operator.index(nbytes)
    except TypeError:
        raise DTypeError(f"{what}: nbytes must be an int, got {type(nbytes).__name__}") from None
    if count < 0:
        raise ArgumentError(f"{what}: nbytes must be >= 0, got {count}")
    return count


class _CpuPool:
    """The CPU backend's accounting, mirroring the device pool's statistics and limit."""

    def __init__(self) -> None:
        # Reentrant: a buffer collected while an allocation holds the lock frees through it.
        self.lock = threading.RLock()
        self.limit: int | None = None
        self.all_devices_limit: int | None = None  # the CPU backend has one "device": both caps apply
        self.stats = dict.fromkeys(
            ("in_use_bytes", "peak_in_use_bytes", "in_use_blocks", "requests", "frees", "device_allocations"), 0
        )

    def allocate(self, nbytes: int) -> np.ndarray[Any, Any]:
        """The host bytes standing in for ``nbytes`` of device memory, counted only once they exist."""
        with self.lock:
            for what, limit in (("pool limit", self.limit), ("all-device limit", self.all_devices_limit)):
                if limit is not None and self.stats["in_use_bytes"] + nbytes > limit:
                    raise self._out_of_memory(what, nbytes, limit)
            try:
                host = np.empty(max(nbytes, 1), dtype=np.uint8)
            except (MemoryError, ValueError, OverflowError):
                # NumPy's MemoryError, or ValueError past its largest array: the same failure as a full device.
                limits = [v for v in (self.limit, self.all_devices_limit) if v is not None]
                raise self._out_of_memory("host allocation failed", nbytes, min(limits, default=None)) from None
            s = self.stats
            s["in_use_bytes"] += nbytes
            s["in_use_blocks"] += 1
            s["requests"] += 1
            s["device_allocations"] += 1
            s["peak_in_use_bytes"] = max(s["peak_in_use_bytes"], s["in_use_bytes"])
        return host

    def _out_of_memory(self, reason: str, nbytes: int, limit: int | None) -> OutOfMemoryError:
        in_use = self.stats["in_use_bytes"]
        return OutOfMemoryError(
            f"out of memory ({reason}): requested {nbytes} bytes, in use {in_use} bytes, cached 0 bytes, "
            f"limit {'none' if limit is None else f'{limit} bytes'}",
            requested=nbytes,
            in_use=in_use,
            cached=0,
            limit=limit,
        )

    def free(self, nbytes: int) -> None:
        with self.lock:
            self.stats["in_use_bytes"] -= nbytes
            self.stats["in_use_blocks"] -= 1
            self.stats["frees"] += 1


_cpu_pool = _CpuPool()


class _AddressMap:
    """Allocations by base address, answering which one holds a pointer so that raw copies can be
    checked against the allocation they touch.

    Adding and removing are one dict operation each, atomic under the GIL, because every allocation
    passes here. The sorted index that finds the allocation holding an interior pointer is rebuilt
    only when a lookup needs it after a change; lookups of a base address never need it.
    """

    __slots__ = ("_dirty", "_index", "_sizes")

    def __init__(self) -> None:
        self._sizes: dict[int, int] = {}
        self._dirty = False  # set after each change; a lookup that needs the index rebuilds it then
        self._index: list[int] = []

    def add(self, ptr: int, nbytes: int) -> None:
        self._sizes[ptr] = nbytes
        self._dirty = True  # after the change: a racing rebuild is at worst redone

    def remove(self, ptr: int) -> None:
        if self._sizes.pop(ptr, None) is not None:
            self._dirty = True

    def find(self, address: int) -> tuple[int, int] | None:
        """(base, nbytes) of the allocation holding ``address``; a 0-byte one holds its base address."""
        sizes = self._sizes
        size = sizes.get(address)
        if size is not None:
            return address, size
        starts = self._index
        if self._dirty:
            self._dirty = False  # before copying: a change during the rebuild sets it again
            starts = self._index = sorted(sizes.copy())
        at = bisect.bisect_right(starts, address) - 1
        if at < 0:
            return None
        base = starts[at]
        size = sizes.get(base)  # None: freed since the index was built
        return (base, size) if size is not None and address < base + max(size, 1) else None


# Live pool allocations (both backends) and live pinned host buffers (both backends).
_device_map = _AddressMap()
_device_sizes = _device_map._sizes  # DeviceBuffer adds and removes entries here directly (hot path)
_pinned_map = _AddressMap()
# CPU backend only: buffers freed explicitly whose objects still live. Their host bytes stay allocated
# until then, so nothing else can sit at those addresses and a pointer into one is surely stale. On the
# CUDA backend a freed address may soon belong to another library, so nothing is remembered there.
_freed_device = _AddressMap()
_freed_pinned = _AddressMap()

# Every live allocation by address, weakly, for a device reset to invalidate (one dict store per
# allocation); imported memory and pinned buffers likewise. Raw pinned_malloc blocks of the CUDA
# backend: address -> device, and those a reset took: address -> device.
_live_buffers: dict[int, weakref.ref[DeviceBuffer]] = {}
_live_external: weakref.WeakSet[ExternalBuffer] = weakref.WeakSet()
_live_pinned: weakref.WeakSet[PinnedBuffer] = weakref.WeakSet()
_raw_pinned: dict[int, int] = {}
_reset_raw_pinned: dict[int, int] = {}


def reset_error(owner: Any, what: str) -> DeviceResetError | None:
    """The :class:`DeviceResetError` for using ``what`` when ``owner`` (a buffer, stream, event, ...)
    died with a device reset, else None."""
    device = getattr(owner, "_reset", None)
    return None if device is None else DeviceResetError.of(what, device)


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


_CAPTURE_UNSUPPORTED = 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED


def _refused_in_capture(nbytes: int, stream: Stream | None, error: CudaError) -> OutOfMemoryError:
    """The driver refused a new device allocation because a CUDA graph capture is open (the pool had no
    cached block of that size for the stream): an OutOfMemoryError naming the request, the stream and
    the fix. The pool abandoned the request, so its books are unchanged. Captures begun by
    :class:`CudaGraph` never get here: the native allocator knows them and raises the same error before
    calling the driver (whose refusal would also invalidate the capture); this maps the refusal for a
    capture begun outside pygpukit (another library capturing on this thread)."""
    from .graph import _capturing_streams  # imported here: only this cold path needs it

    if stream is None:
        streams = _current_streams.get()
        stream = streams[-1] if streams else None
    on = "the legacy default stream" if stream is None else f"stream {stream._id:#x}"
    capturing = ", ".join(f"{handle:#x}" for handle in sorted(_capturing_streams)) or "none recorded here"
    stats: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # the numbers are extras: the refusal is what is reported
        stats = memory_stats()
    return OutOfMemoryError(
        f"cannot allocate {nbytes} bytes on {on} during a CUDA graph capture (capturing streams: "
        f"{capturing}): the pool has no cached block for it and the driver refuses new device memory while "
        f"a stream captures ({error.name or error.code}); allocate the arrays before capturing, or run the "
        "captured work once eagerly on the capture stream first so the pool caches its blocks",
        requested=nbytes,
        in_use=int(stats.get("in_use_bytes", 0)),
        cached=int(stats.get("cached_bytes", 0)),
    )


class DeviceBuffer:
    """One pool allocation of ``nbytes`` bytes for work on ``stream``; returned to the pool on free/GC."""

    # _reset: set (to the device ordinal) only when a device reset invalidated the buffer.
    __slots__ = ("__weakref__", "_host", "_live", "_native", "_reset", "_scope", "device", "nbytes", "ptr")
    _reset: int
    _host: np.ndarray[Any, Any] | None
    _native: NativeModule | None

    def __init__(self, nbytes: int, *, stream: Stream | None = None) -> None:
        # Every array allocation passes here: the CUDA branch is kept to the few steps it needs.
        if nbytes < 0:
            raise ArgumentError(f"nbytes must be >= 0, got {nbytes}")
        self.nbytes = nbytes
        self._live = False
        scope = self._scope = _scope.get()
        if scope is not None:
            scope.charge(nbytes)  # may refuse: nothing is allocated then
        try:
            state = _backend._state or backend_state()
            if state.name == "cuda":
                native: NativeModule = state.native  # type: ignore[assignment]  # set on the CUDA backend
                self._native = native
                if nbytes >= 1 << 64:  # past what the native call takes: the pool's own "too large" answer
                    raise OutOfMemoryError(f"request of {nbytes} bytes is too large", requested=nbytes)
                self._host = None
                if stream is None:
                    streams = _current_streams.get()
                    ptr = self.ptr = native.mem_alloc(nbytes, streams[-1]._handle if streams else 0)
                else:
                    ptr = self.ptr = native.mem_alloc(nbytes, stream._handle)
                self.device = _thread_state.device
            else:
                self._native = None
                if stream is not None:
                    stream._handle  # noqa: B018 - the stream's checks, as on the GPU (a reset one raises)
                host = self._host = _cpu_pool.allocate(nbytes)
                ptr = self.ptr = int(host.ctypes.data)
                self.device = -1
        except CudaError as error:  # only raised: no check is added before the native call
            if scope is not None:
                scope.refund(nbytes)
            if error.code != _CAPTURE_UNSUPPORTED:
                raise
            raise _refused_in_capture(nbytes, stream, error) from error
        except BaseException:
            if scope is not None:
                scope.refund(nbytes)
            raise
        _device_sizes[ptr] = nbytes  # _device_map.add, inlined
        _device_map._dirty = True
        _live_buffers[ptr] = weakref.ref(self)
        self._live = True

    @property
    def freed(self) -> bool:
        """True once freed, or invalidated by a device reset."""
        return not self._live

    def free(self) -> None:
        """Return the memory to the pool now. Later use of arrays over it raises."""
        if not self._live:
            what = f"buffer at {self.ptr:#x} ({self.nbytes} bytes)"
            raise reset_error(self, what) or InvalidPointerError(f"{what} was already freed")
        self._release()
        if self._native is None:
            # The host bytes stay until this object goes (arrays over them may still be viewed by a
            # DLPack consumer): meanwhile a raw copy through a stale pointer is recognised and refused.
            _freed_device.add(self.ptr, self.nbytes)

    def _release(self) -> None:
        self._live = False
        ptr = self.ptr
        if _device_sizes.pop(ptr, None) is not None:  # _device_map.remove, inlined
            _device_map._dirty = True
        _live_buffers.pop(ptr, None)
        if self._scope is None:
            if self._native is None:
                _cpu_pool.free(self.nbytes)
            else:
                self._native.mem_free(ptr, self.device)
            return
        try:
            if self._native is None:
                _cpu_pool.free(self.nbytes)
            else:
                self._native.mem_free(ptr, self.device)
        finally:
            self._scope.refund(self.nbytes)

    def __del__(self) -> None:
        try:  # _live is unset when __init__ failed before it (AttributeError)
            if self._live:
                self._release()
            elif self._native is None:
                _freed_device.remove(self.ptr)
        except Exception:  # nothing to report to during garbage collection
            pass

    def host_view(self) -> np.ndarray[Any, Any]:
        """CPU backend only: the host bytes standing in for the device memory."""
        if self._host is None:
            raise PyGPUkitError("host_view() exists only on the CPU backend")
        if not self._live:
            what = f"buffer at {self.ptr:#x} ({self.nbytes} bytes)"
            raise reset_error(self, what) or InvalidPointerError(f"{what} was freed")
        return self._host

    def __repr__(self) -> str:
        where = "cpu" if self.device < 0 else f"cuda:{self.device}"
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={where}, freed={self.freed})"


class ExternalBuffer:
    """Device memory owned by someone else (a DLPack or CUDA-Array-Interface producer).

    Holds ``owner`` alive and calls ``release`` (if given) when garbage-collected; never frees the
    memory through the pool.
    """

    __slots__ = ("__weakref__", "_finalizer", "_live", "_reset", "device", "nbytes", "owner", "ptr")
    _finalizer: weakref.finalize[Any, Any]
    _reset: int  # set only by a reset of the device

    def __init__(self, ptr: int, nbytes: int, device: int, owner: Any, release: Any = None) -> None:
        self._live = True
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)
        self.device = int(device)
        self.owner = owner
        self._finalizer = weakref.finalize(self, release or (lambda: None))
        _live_external.add(self)

    @property
    def freed(self) -> bool:
        """False while the memory can be used (its owner frees it); True after a reset of its device,
        whose context the memory lived in."""
        return not self._live

    def free(self) -> None:
        error = reset_error(self, f"imported memory at {self.ptr:#x} ({self.nbytes} bytes)")
        if error is not None:
            raise error
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
        raise ArgumentError(f"set_memory_limit: limit must be a positive int or None, got {limit!r}")
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
    """Page-locked host memory of ``nbytes`` bytes (fast, truly asynchronous copies), freed on GC or by
    :meth:`free`; use after free raises :class:`InvalidPointerError`."""

    __slots__ = ("__weakref__", "_device", "_finalizer", "_keep", "_live", "_reset", "nbytes", "ptr")
    _finalizer: weakref.finalize[Any, Any]
    _reset: int  # set only by a reset of the device

    def __init__(self, nbytes: int) -> None:
        self.nbytes = _byte_count(nbytes, "PinnedBuffer")
        self._live = False
        native = _native()
        # The device whose context allocated it (a reset of that device frees it); -1: CPU backend.
        self._device = -1 if native is None else _thread_state.device
        if native is None:
            try:
                self._keep: np.ndarray[Any, Any] | None = np.empty(max(self.nbytes, 1), dtype=np.uint8)
            except (MemoryError, ValueError, OverflowError):
                raise OutOfMemoryError(
                    f"out of memory (pinned host memory): requested {self.nbytes} bytes", requested=self.nbytes
                ) from None
            self.ptr = int(self._keep.ctypes.data)
            self._finalizer = weakref.finalize(self, _forget_cpu_pinned, self.ptr)
        else:
            self._keep = None
            self.ptr = int(native.pinned_alloc(self.nbytes))
            self._finalizer = weakref.finalize(self, _free_native_pinned, native, self.ptr)
        _pinned_map.add(self.ptr, self.nbytes)
        _live_pinned.add(self)
        self._live = True

    @property
    def freed(self) -> bool:
        return not self._live

    def numpy(self, dtype: Any = np.uint8, count: int = -1) -> np.ndarray[Any, Any]:
        """A NumPy view of the pinned bytes (valid while this buffer lives, and not after a reset of the
        device that allocated it: the reset frees the memory under the view)."""
        if not self._live:
            what = f"pinned buffer at {self.ptr:#x} ({self.nbytes} bytes)"
            raise reset_error(self, what) or InvalidPointerError(f"{what} was freed")
        if self._keep is not None:
            raw: Any = self._keep[: self.nbytes]  # a view that keeps the bytes alive, unlike an address
        else:
            raw = np.frombuffer(memoryview((ctypes.c_uint8 * self.nbytes).from_address(self.ptr)).cast("B"), np.uint8)
        view: np.ndarray[Any, Any] = raw.view(dtype)
        return view[: None if count < 0 else count]

    def free(self) -> None:
        """Release the memory now; a second free raises :class:`InvalidPointerError`."""
        if not self._live:
            what = f"pinned buffer at {self.ptr:#x} ({self.nbytes} bytes)"
            raise reset_error(self, what) or InvalidPointerError(f"{what} was already freed")
        self._live = False
        if self._keep is None:
            self._finalizer()
            return
        # As for DeviceBuffer.free: the bytes stay until this object goes, so a stale pointer is recognised.
        _pinned_map.remove(self.ptr)
        _freed_pinned.add(self.ptr, self.nbytes)

    def __repr__(self) -> str:
        return f"PinnedBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, freed={self.freed})"


def _forget_cpu_pinned(ptr: int) -> None:
    _pinned_map.remove(ptr)
    _freed_pinned.remove(ptr)


def _free_native_pinned(native: NativeModule, ptr: int) -> None:
    _pinned_map.remove(ptr)  # before the driver may hand the address out again
    native.pinned_free(ptr)


def pinned_malloc(nbytes: int) -> int:
    """Allocate page-locked host memory; returns its address. Free with :func:`pinned_free`."""
    count = _byte_count(nbytes, "pinned_malloc")
    native = _native()
    if native is None:
        buffer = PinnedBuffer(count)
        _cpu_pinned[buffer.ptr] = buffer
        return buffer.ptr
    ptr = int(native.pinned_alloc(count))
    _reset_raw_pinned.pop(ptr, None)  # the address is live again
    _raw_pinned[ptr] = _thread_state.device
    _pinned_map.add(ptr, count)
    return ptr


def pinned_free(ptr: int) -> None:
    """Free memory from :func:`pinned_malloc`. Raises :class:`DeviceResetError` for memory that a
    reset of its device already freed."""
    native = _native()
    if native is None:
        buffer = _cpu_pinned.pop(ptr, None)
        if buffer is None:
            raise InvalidPointerError(f"{ptr:#x} was not allocated by pinned_malloc")
        error = reset_error(buffer, f"pinned memory at {ptr:#x}")
        if error is not None:
            raise error
        return
    device = _reset_raw_pinned.pop(ptr, None)
    if device is not None:
        raise DeviceResetError.of(f"pinned memory at {ptr:#x}", device)
    _raw_pinned.pop(ptr, None)
    _pinned_map.remove(ptr)
    native.pinned_free(ptr)


_cpu_pinned: dict[int, PinnedBuffer] = {}

# No supported platform maps the lowest 64 KiB (Linux's default mmap_min_addr, Windows' reserved
# region): a pointer there is a small integer or an offset passed by mistake.
_LOWEST_ADDRESS = 1 << 16
_COPY_NAMES = {"htod": "host_to_device", "dtoh": "device_to_host", "dtod": "device_to_device"}


def _check_inside(what: str, role: str, ptr: int, nbytes: int, base: int, size: int, kind: str) -> None:
    if ptr + nbytes > base + size:
        raise ArgumentError(
            f"{what}: {role} {ptr:#x} with nbytes {nbytes} runs past the end of its {kind} ({size} bytes at "
            f"{base:#x}; {base + size - ptr} bytes left from {ptr:#x})"
        )


def _check_device(what: str, role: str, ptr: int, nbytes: int, cpu: bool) -> None:
    found = _device_map.find(ptr)
    if found is not None:
        _check_inside(what, role, ptr, nbytes, *found, "device allocation")
        return
    if not cpu:
        return  # memory of another library (DLPack, the C API): only its owner knows its extent
    freed = _freed_device.find(ptr)
    if freed is not None:
        raise InvalidPointerError(
            f"{what}: {role} {ptr:#x} (nbytes {nbytes}) points into a freed device buffer "
            f"({freed[1]} bytes at {freed[0]:#x})"
        )
    if nbytes == 0:
        return  # touches nothing: may be one past the end of an allocation
    pinned = _pinned_map.find(ptr)
    why = (
        f"it is pinned host memory ({pinned[1]} bytes at {pinned[0]:#x})"
        if pinned
        else "the pool never allocated it or already took it back"
    )
    raise InvalidPointerError(f"{what}: {role} {ptr:#x} (nbytes {nbytes}) is not pygpukit device memory: {why}")


def _check_host(what: str, role: str, ptr: int, nbytes: int, cpu: bool) -> None:
    found = _pinned_map.find(ptr)
    if found is not None:
        _check_inside(what, role, ptr, nbytes, *found, "pinned buffer")
        return
    freed = _freed_pinned.find(ptr) if cpu else None
    if freed is not None:
        raise InvalidPointerError(
            f"{what}: {role} {ptr:#x} (nbytes {nbytes}) points into a freed pinned buffer "
            f"({freed[1]} bytes at {freed[0]:#x})"
        )
    device = _device_map.find(ptr) or (_freed_device.find(ptr) if cpu else None)
    if device is not None:
        raise InvalidPointerError(
            f"{what}: {role} {ptr:#x} (nbytes {nbytes}) is device memory ({device[1]} bytes at {device[0]:#x}), "
            "not host memory"
        )
    # Anything else is host memory the caller owns (a NumPy array's data): its extent is unknown here,
    # but a range with unmapped pages (a stray integer, memory already unmapped) would crash the copy.
    if not is_mapped(ptr, nbytes):
        raise InvalidPointerError(
            f"{what}: {role} {ptr:#x} (nbytes {nbytes}) is not host memory of this process: part of the range "
            "is not mapped"
        )


def _copy(kind: str, dst: int, src: int, nbytes: int, stream: Stream | None) -> None:
    what = f"memcpy_{_COPY_NAMES[kind]}_async"
    count = _byte_count(nbytes, what)
    dst, src = operator.index(dst), operator.index(src)
    for role, ptr in (("dst", dst), ("src", src)):
        if not _LOWEST_ADDRESS <= ptr < 1 << 64:
            raise InvalidPointerError(f"{what}: {role} {ptr:#x} (nbytes {count}) is not a valid address")
    native = _native()
    cpu = native is None
    (_check_host if kind == "dtoh" else _check_device)(what, "dst", dst, count, cpu)
    (_check_host if kind == "htod" else _check_device)(what, "src", src, count, cpu)
    if native is None:
        ctypes.memmove(dst, src, count)
        return
    handle = (stream or current_stream()).handle
    if kind == "htod":
        native.memcpy_htod(dst, src, count, handle, True)
    elif kind == "dtoh":
        native.memcpy_dtoh(dst, src, count, handle, True)
    else:
        native.memcpy_dtod(dst, src, count, handle, True)


def memcpy_host_to_device_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` from host address ``src`` to device address ``dst``, ordered on ``stream``.
    Truly asynchronous only when ``src`` is pinned memory.

    Checked before anything is queued, raising :class:`ArgumentError` for ``nbytes < 0`` or a range
    running past the end of its allocation and :class:`InvalidPointerError` for a pointer the pool
    does not know or took back:

    - a device pointer inside a live pygpukit allocation must have ``nbytes`` left in it. On the CPU
      backend every device pointer must be one (except in a 0-byte copy); on the CUDA backend device
      memory of other libraries (DLPack, the C API) is passed on unchecked.
    - a host pointer inside a live :class:`PinnedBuffer` or :func:`pinned_malloc` block is checked
      against it. Any other host address is taken as memory the caller owns, such as a NumPy array's
      data, whose extent cannot be checked beyond its pages being mapped in the process (Linux): a
      range with unmapped pages raises :class:`InvalidPointerError` instead of crashing the copy.
      Device memory is refused.
    """
    _copy("htod", dst, src, nbytes, stream)


def memcpy_device_to_host_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` from device address ``src`` to host address ``dst``, ordered on ``stream``.
    The pointers are checked as in :func:`memcpy_host_to_device_async`."""
    _copy("dtoh", dst, src, nbytes, stream)


def memcpy_device_to_device_async(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    """Copy ``nbytes`` between device addresses, ordered on ``stream``. The pointers are checked as in
    :func:`memcpy_host_to_device_async`."""
    _copy("dtod", dst, src, nbytes, stream)


def invalidate_device(device: int) -> dict[str, int]:
    """Device reset (:func:`pygpukit.reset_device`, before the context is reset): mark every live
    allocation, imported buffer and pinned buffer of ``device`` (-1: the CPU backend) as gone with the
    context, so that using one raises :class:`DeviceResetError` and nothing of the old context is ever
    freed into the new one (their finalizers are dropped; the native pool forgets the blocks itself).
    Returns what was invalidated: ``buffers`` and ``buffer_bytes``, ``external`` and ``pinned``."""
    counts = dict.fromkeys(("buffers", "buffer_bytes", "external", "pinned"), 0)
    for ptr, ref in list(_live_buffers.items()):
        buffer = ref()
        if buffer is None or buffer.device != device or not buffer._live:
            continue
        _live_buffers.pop(ptr, None)
        _device_map.remove(ptr)
        buffer._live = False
        buffer._reset = device
        counts["buffers"] += 1
        counts["buffer_bytes"] += buffer.nbytes
        if buffer._native is None:
            _cpu_pool.free(buffer.nbytes)
            _freed_device.add(ptr, buffer.nbytes)  # the host bytes stay until the object goes, as for free()
        if buffer._scope is not None:
            with contextlib.suppress(Exception):  # a scope's refund must not stop the reset
                buffer._scope.refund(buffer.nbytes)
    for external in list(_live_external):
        if external.device == device and external._live:
            external._live = False
            external._reset = device
            counts["external"] += 1
    for pinned in list(_live_pinned):
        if pinned._device != device or not pinned._live:
            continue
        pinned._live = False
        pinned._reset = device
        counts["pinned"] += 1
        if pinned._keep is None:  # CUDA: the context frees it; never pass the address to the driver again
            pinned._finalizer.detach()
            _pinned_map.remove(pinned.ptr)
        else:  # CPU: the bytes stay until the object goes, as for free()
            _pinned_map.remove(pinned.ptr)
            _freed_pinned.add(pinned.ptr, pinned.nbytes)
    for ptr, owner in list(_raw_pinned.items()):
        if owner == device:
            del _raw_pinned[ptr]
            _pinned_map.remove(ptr)
            _reset_raw_pinned[ptr] = device
            counts["pinned"] += 1
    return counts
