"""The finiteness check of the audio functions: :class:`ArgumentError` for a NaN or an infinity in their input.

librosa refuses non-finite audio; so do the pygpukit.audio functions. Where the check runs and when it
raises (docs/audio.md, "Finiteness checks"):

- The CPU simulation backend: a scan of the array's memory (a float64 sum, and a count only when the sum is
  not finite); the call itself raises.
- NumPy input on the CUDA backend (copied to the device by the call, which waits for the copy anyway), a
  GPUArray in "sync" mode (``set_finite_check("sync")``) or in a call that has not opted in: one counting
  kernel and a read of its 8-byte count (a host round trip); the call itself raises.
- A GPUArray on the CUDA backend in "deferred" mode (the default) in the calls that opted in (``stft``,
  ``istft``, ``resample`` and what calls them: ``melspectrogram``, ``mfcc``, ``StreamingSTFT``, ...): the
  counting kernel adds to a running total on the device, an asynchronous copy puts the total in pinned
  host memory and an event marks it; nothing waits. The error is raised by the first later checked call on
  the same stream that finds that event complete (before that call queues any work), or by
  :func:`check_pending`, which waits; its message names the call and argument that held the values. The
  result of the call that got the bad input holds NaNs (the kernels of those calls only do arithmetic on
  the values, so bad input cannot make them read or write out of bounds). Inside a CudaGraph capture of
  such a call the deferred check is left out: the graph holds the call's own kernels only.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pygpukit.core.array import GPUArray, zeros
from pygpukit.core.dtypes import uint64
from pygpukit.core.errors import ArgumentError
from pygpukit.core.graph import is_capturing
from pygpukit.core.memory import PinnedBuffer, memcpy_device_to_host_async
from pygpukit.core.stream import Event, current_stream, thread_device

from . import _kernels as kern
from ._common import Array, host, is_cuda

__all__ = ["MODES", "check_finite", "check_pending", "finite_check_mode", "set_finite_check"]

MODES = ("deferred", "sync")
_SLOTS = 64  # checks in flight per stream; the 65th waits for the oldest
_mode = "deferred"
# Tests set this to run the deferred bookkeeping on the CPU backend (the count added on the host).
device_path_on_cpu = False


def set_finite_check(mode: str) -> None:
    """How the checks of device arrays run on the CUDA backend: "deferred" (the default: no host round
    trip; the error comes from a later call or :func:`check_pending`) or "sync" (each call waits for its own
    count and raises itself). NumPy inputs are always checked on the host, in the call."""
    global _mode
    if mode not in MODES:
        raise ArgumentError(f"set_finite_check: mode must be 'deferred' or 'sync', got {mode!r}")
    _mode = mode


def finite_check_mode() -> str:
    """The mode :func:`set_finite_check` set ("deferred" or "sync")."""
    return _mode


def _message(name: str, what: str, bad: int, late: bool) -> str:
    text = f"{name}: {what} holds {bad} non-finite value(s) (NaN or infinity); audio must be finite"
    if late:
        text += (" (found by the deferred device check of that earlier call and raised here; "
                 "pygpukit.audio.set_finite_check('sync') makes each call raise itself)")  # fmt: skip
    return text


def _host_count(values: Array) -> int:
    """Non-finite values of a host array: a float64 sum first (finite for finite float32 data; a sum that
    overflows on finite float64 data falls through to the exact count, which then finds none)."""
    if values.size == 0:
        return 0
    with np.errstate(all="ignore"):
        if np.isfinite(np.add.reduce(values, axis=None, dtype=np.float64)):
            return 0
    return int(values.size - np.count_nonzero(np.isfinite(values)))


class _Pending:
    """The deferred checks of one (device, stream): a running total of non-finite values on the device,
    copies of it in pinned memory and one event per check in flight, consumed in stream order."""

    def __init__(self) -> None:
        self.total = zeros(1, uint64)
        self.pinned = PinnedBuffer(8 * _SLOTS)
        self.events = [Event(timing=False) for _ in range(_SLOTS)]
        self.queue: deque[tuple[int, str, str]] = deque()  # (slot, function, argument)
        self.next = 0
        self.seen = 0  # the total up to the last consumed check

    def consume(self, wait: bool) -> None:
        """Consume the completed checks in order (waiting for all when ``wait``); raise the first failure."""
        while self.queue:
            slot, name, what = self.queue[0]
            event = self.events[slot]
            if wait:
                event.synchronize()
            elif not event.query():
                return
            self.queue.popleft()
            total = int(self.pinned.numpy(np.uint64, _SLOTS)[slot])  # a view per read: refused after a reset
            bad, self.seen = total - self.seen, total
            if bad:
                raise ArgumentError(_message(name, what, bad, late=True))

    def add(self, name: str, what: str, x: GPUArray) -> None:
        if len(self.queue) == _SLOTS:
            slot, *_ = self.queue[0]
            self.events[slot].synchronize()
            self.consume(wait=False)
        slot = self.next
        self.next = (slot + 1) % _SLOTS
        if is_cuda():
            data = x if x.is_contiguous else x.contiguous()
            kern.kernel("count_nonfinite", x.dtype, _COUNT_PARAMS)(
                data.device_ptr, x.size, self.total.device_ptr, grid=kern.grid_for(x.size), block=kern.BLOCK
            )
        else:  # device_path_on_cpu: the kernel's addition, on the host
            host(self.total)[0] += np.uint64(_host_count(host(x)))
        memcpy_device_to_host_async(self.pinned.ptr + 8 * slot, self.total.device_ptr, 8)
        self.events[slot].record()
        self.queue.append((slot, name, what))


_COUNT_PARAMS = (kern.pointer("x"), kern.c_param("n", "long long"), kern.pointer("count"))
_pending: dict[tuple[int, int], _Pending] = {}


def _state() -> _Pending:
    key = (thread_device(), current_stream().handle)
    found = _pending.get(key)
    if found is None or found.pinned.freed:  # a reset of the device freed the pinned copies: start over
        found = _pending[key] = _Pending()
    return found


def check_pending() -> None:
    """Wait for the deferred finiteness checks of this thread's device (every stream) and raise
    :class:`ArgumentError` for the first that found a NaN or an infinity."""
    device = thread_device()
    for (owner, _), state in list(_pending.items()):
        if owner == device:
            state.consume(wait=True)


def check_finite(name: str, what: str, x: GPUArray, *, deferred: bool = False) -> None:
    """:class:`ArgumentError` when ``x`` holds a NaN or an infinity; ``deferred``: the call may defer the check
    (it passes True when its argument was already a GPUArray, False for NumPy input; see the module's
    docstring)."""
    if x.size == 0:
        return
    if deferred and _mode == "deferred" and (device_path_on_cpu or is_cuda()):
        if is_capturing(current_stream()):
            return  # a CudaGraph capture records the call's own kernels only (docs/audio.md)
        state = _state()
        state.consume(wait=False)
        state.add(name, what, x)
        return
    if not is_cuda():
        bad = _host_count(host(x))
    else:
        data = x if x.is_contiguous else x.contiguous()
        count = zeros(1, uint64)
        kern.kernel("count_nonfinite", x.dtype, _COUNT_PARAMS)(
            data.device_ptr, x.size, count.device_ptr, grid=kern.grid_for(x.size), block=kern.BLOCK
        )
        bad = int(count.to_numpy()[0])
    if bad:
        raise ArgumentError(_message(name, what, bad, late=False))
