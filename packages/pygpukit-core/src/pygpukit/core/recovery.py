"""Recovering a device after a kernel fault: :func:`reset_device`.

A kernel that faults (an illegal or misaligned address, an illegal instruction, a device-side assert)
leaves its device's CUDA context unusable: every later call on that device fails with the same
"sticky" error (a :class:`CudaError` whose ``context_lost`` is True and whose message names
``pygpukit.reset_device()``). The memory, streams, events, graphs and loaded kernels of the context
are gone with it. :func:`reset_device` discards all of it and asks the driver for a new context:

1. it invalidates every pygpukit object of the device, so that using one raises
   :class:`DeviceResetError` and nothing of the old context is ever freed or destroyed in the new one:
   GPUArrays and DeviceBuffers (and imported DLPack memory), PinnedBuffers and ``pinned_malloc``
   blocks allocated there, Streams and Events, captured CudaGraphs, and the kernel modules loaded
   there (JIT kernels load again from the kernel cache on their next launch, without compiling);
2. it empties every launch-plan cache (:func:`pygpukit.core.plans.clear_plan_caches`);
3. the native runtime synchronizes what it can, makes the memory pool, the staging buffers and the
   cuBLASLt handle, plans and workspaces forget the device, resets the primary context
   (``cuDevicePrimaryCtxReset``) and retains a fresh one, which every thread uses from its next call.

New arrays, kernels and matmuls then work as before. Whether the driver grants the new context
depends on the fault: NVIDIA documents a device-side assert (``CUDA_ERROR_ASSERT``) as recoverable by
destroying the context, but the memory faults and the other sticky errors as needing a process
restart. When the driver refuses (an H100 with driver 580 does after ``CUDA_ERROR_ILLEGAL_ADDRESS``),
:func:`reset_device` raises :class:`CudaError` (``context_lost`` True, ``call``
``"cuDevicePrimaryCtxRetain"``) saying that the process must be restarted, and every later call on the
device says the same; steps 1 and 2 have run, so nothing stale is used or freed meanwhile.

The reset is process-wide: other threads must not use the device meanwhile, and other libraries
sharing the primary context (PyTorch, CuPy) lose their state on that device too. On the CPU backend the
same bookkeeping runs (step 3 has nothing to reset), so code and tests behave alike.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass

from . import graph as _graph
from . import memory as _memory
from . import stream as _stream
from .backend import backend_state
from .errors import DeviceError
from .jit import forget_device as _forget_kernel_modules  # (pygpukit.core.jit is the jit() function)
from .plans import clear_plan_caches, plan_cache_stats

__all__ = ["DeviceResetReport", "reset_device"]

_lock = threading.Lock()


@dataclass(frozen=True)
class DeviceResetReport:
    """What :func:`reset_device` did.

    ``sync_error`` is the error that synchronizing the old context reported (the sticky error of the
    fault, e.g. ``"CUDA_ERROR_ILLEGAL_ADDRESS"``), None when it completed. The counts are of the
    objects invalidated; ``pool_blocks`` / ``pool_bytes`` what the device's memory pool forgot (in use
    and cached), ``gemm_plans`` the cuBLASLt plans dropped. ``generation`` counts the resets of this
    process so far, this one included.
    """

    device: int
    sync_error: str | None
    buffers: int
    buffer_bytes: int
    external_buffers: int
    pinned_buffers: int
    streams: int
    events: int
    graphs: int
    kernel_modules: int
    plan_cache_entries: int
    pool_blocks: int
    pool_bytes: int
    gemm_plans: int
    generation: int


_cpu_generation = 0


def reset_device(device: int | None = None) -> DeviceResetReport:
    """Reset ``device`` (the calling thread's current device by default) after a kernel fault left its
    CUDA context unusable, invalidating every pygpukit object that lived in it (see the module
    documentation, and docs/core.md "Kernel faults and device reset"). Afterwards old arrays, streams,
    events and graphs raise :class:`DeviceResetError`; new work runs normally.

    Also works on a healthy device (everything of it is discarded). Raises :class:`DeviceError` for a
    device that does not exist (on the CPU backend the only device is 0), and :class:`CudaError` when
    the driver refuses a new context after the fault (the process must then be restarted).
    """
    global _cpu_generation
    state = backend_state()
    cuda = state.name == "cuda" and state.native is not None
    if device is None:
        device = _stream.thread_device() if cuda else 0
    try:
        ordinal = operator.index(device)
    except TypeError:
        raise TypeError(f"reset_device: device must be an int or None, got {type(device).__name__}") from None
    count = int(state.native.device_count()) if cuda and state.native is not None else 1
    if not 0 <= ordinal < count:
        where = f"{count} CUDA device(s) available" if cuda else "CPU simulation backend: device 0 only"
        raise DeviceError(f"device {ordinal} does not exist ({where})")
    key = ordinal if cuda else -1  # the CPU backend's objects carry device -1
    with _lock:
        # Python first: once the context is gone, no finalizer may destroy or free one of its handles.
        graphs = _graph.forget_device(key)
        modules = _forget_kernel_modules(key)
        memory = _memory.invalidate_device(key)
        streams, events = _stream.invalidate_device(key)
        entries = sum(size for size, _ in plan_cache_stats().values())
        clear_plan_caches()
        if cuda and state.native is not None:
            native = dict(state.native.reset_device(ordinal))
        else:
            _cpu_generation += 1
            native = {
                "sync_error": "",
                "pool_blocks": memory["buffers"],
                "pool_bytes": memory["buffer_bytes"],
                "gemm_plans": 0,
                "generation": _cpu_generation,
            }
    return DeviceResetReport(
        device=ordinal,
        sync_error=str(native["sync_error"]) or None,
        buffers=memory["buffers"],
        buffer_bytes=memory["buffer_bytes"],
        external_buffers=memory["external"],
        pinned_buffers=memory["pinned"],
        streams=streams,
        events=events,
        graphs=graphs,
        kernel_modules=modules,
        plan_cache_entries=entries,
        pool_blocks=int(native["pool_blocks"]),
        pool_bytes=int(native["pool_bytes"]),
        gemm_plans=int(native["gemm_plans"]),
        generation=int(native["generation"]),
    )
