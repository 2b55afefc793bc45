"""A probe of the pool under compute-sanitizer (docs/reliability.md, issue 21): under every tool, a capture
right after an eager run of its body on the same stream found no cached block, and threads left every
allocation they made in use, while the same code frees everything without the sanitizer. This prints the
pool's statistics after each step; run it plainly and under a tool, and compare:

    python ci/sanitize_probe.py
    compute-sanitizer --tool memcheck python ci/sanitize_probe.py
    compute-sanitizer --tool memcheck --show-backtrace no python ci/sanitize_probe.py

Each statistics line: the step, then in-use and cached bytes and blocks, requests, reuse hits, frees and
device allocations, then the DeviceBuffer objects alive and the allocations registered as live. Growing
buffers point at something keeping them alive; the analysis after the eager body says what:

- ``holders``: what holds each leftover buffer, a few levels up (the running frames, the analysis's
  among them, and the analysis's own lists are left out, so every line names the program's objects);
- ``dead frames``: frames of calls that returned but are still alive, and their roots (dead frames that
  no other object refers to). For each root, ``unexplained`` counts the references that no Python object
  holds: above 0, C code (an extension, or a tool injected into the process) owns a reference it never
  released, which no ``gc.collect()`` can free. ``held`` lines name the dead frames that a Python object
  other than a frame holds (a traceback, a generator, a container).
- ``warm body``: the body again, its kernels loaded: how many launches took the general path
  (JITKernel._launch) and, for the first few, why the C fast path declined them;
- ``leaks per path``: N launches of a JIT kernel from a helper holding a fresh array, through the fast
  path, then through the general path, then N device allocations: the buffers and dead frames each left.
"""

from __future__ import annotations

import gc
import sys
import threading
import traceback
import types
from typing import Any, TypeVar

import numpy as np

import pygpukit as gp
from pygpukit.core import backend as _backend
from pygpukit.core import memory
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.jit import JITKernel
from pygpukit.core.memory import DeviceBuffer
from pygpukit.core.stream import _local as _thread_state

KEYS = ("in_use_bytes", "in_use_blocks", "cached_bytes", "cached_blocks", "requests", "reuse_hits", "frees",
        "device_allocations")  # fmt: skip
_mine: set[int] = set()  # ids of the containers the analysis made: never reported as holders


def report(step: str) -> None:
    """One line: the pool's statistics, then the DeviceBuffer objects alive and the allocations still
    registered as live (equal unless a buffer was lost without its finalizer)."""
    gc.collect()
    gp.synchronize()
    stats = gp.memory_stats()
    objects = sum(isinstance(o, DeviceBuffer) for o in gc.get_objects())
    live = len(memory._live_buffers)
    print(f"{step:<40} " + " ".join(f"{key}={stats[key]}" for key in KEYS) + f" buffers={objects} live={live}",
          flush=True)  # fmt: skip


_T = TypeVar("_T")


def _own(container: _T) -> _T:
    _mine.add(id(container))
    return container


def _running() -> set[int]:
    """The ids of the frames executing now, in every thread (the analysis's own among them)."""
    running: set[int] = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back  # type: ignore[assignment]
    return running


def _referrers(obj: object) -> list[object]:
    """gc.get_referrers(obj) without the running frames (the analysis's own) and the analysis's lists."""
    found = _own(gc.get_referrers(obj))
    running = _running()
    return _own([r for r in found if id(r) not in _mine and id(r) not in running])


def _describe(obj: object) -> str:
    """A short name for one referrer: frames and code by file and line, containers by type and size."""
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_filename}:{obj.f_lineno} ({obj.f_code.co_name})"
    if isinstance(obj, types.TracebackType):
        return f"traceback at {obj.tb_frame.f_code.co_filename}:{obj.tb_lineno}"
    if isinstance(obj, BaseException):
        return f"exception {type(obj).__name__}: {str(obj)[:120]}"
    if isinstance(obj, dict):
        return f"dict({len(obj)}) keys {list(obj)[:6]}"
    if isinstance(obj, (list, tuple, set)):
        return f"{type(obj).__name__}({len(obj)})"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def holders(skip: set[int]) -> None:
    """For up to three DeviceBuffers alive other than those in ``skip``: what holds each, four levels up."""
    gc.collect()
    buffers = _own([o for o in _own(gc.get_objects()) if isinstance(o, DeviceBuffer) and id(o) not in skip])
    for buffer in _own(buffers[:3]):
        print(f"  buffer of {buffer.nbytes} bytes held by:", flush=True)
        level: list[object] = _own([buffer])
        for depth in range(4):
            nxt: list[object] = _own([])
            for obj in level:
                for ref in _referrers(obj):
                    print(f"  {'  ' * depth}<- {_describe(ref)}", flush=True)
                    nxt.append(ref)
            level = _own(nxt[:4])
    _mine.clear()


def _dead_frames() -> list[types.FrameType]:
    running = _running()
    dead: list[types.FrameType] = [o for o in _own(gc.get_objects()) if isinstance(o, types.FrameType)
                                   and id(o) not in running]  # fmt: skip
    return _own(dead)


def dead_frames(show: int = 6) -> int:
    """Frames of returned calls still alive; their roots, each with its unexplained references and the
    frames it keeps alive through f_back. Returns the number of dead frames."""
    gc.collect()
    dead = _dead_frames()
    control = [object()]  # the references the analysis itself holds to an object in `dead`, measured
    base = 0
    for item in control:
        base = sys.getrefcount(item)
    print(f"  {len(dead)} frames of returned calls alive", flush=True)
    roots: dict[str, list[int]] = {}
    held: dict[str, int] = {}  # frames held by something other than a frame: "frame <- holder" -> count
    for frame in dead:
        visible = _referrers(frame)
        for holder in visible:
            if not isinstance(holder, types.FrameType):
                line = f"{_describe(frame)} <- {_describe(holder)}"
                held[line] = held.get(line, 0) + 1
        if visible:
            continue
        unexplained = sys.getrefcount(frame) - base
        key = _describe(frame)
        chain: list[str] = []
        back = frame.f_back
        while back is not None and len(chain) < 5:
            chain.append(f"{back.f_code.co_name}:{back.f_lineno}")
            back = back.f_back
        roots.setdefault(f"{key}, keeping {' <- '.join(chain) or 'nothing'}", []).append(unexplained)
    for shown, (key, counts) in enumerate(sorted(roots.items(), key=lambda kv: -len(kv[1]))):
        if shown == show:
            print(f"  ... {len(roots) - show} more root kinds", flush=True)
            break
        print(f"  root x{len(counts)}: {key}; unexplained references: {sorted(set(counts))}", flush=True)
    for line, times in list(held.items())[:show]:
        print(f"  held x{times}: {line}", flush=True)
    count = len(dead)
    del dead
    _mine.clear()
    return count


def _why_declined(kernel: JITKernel, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: Any,
                  stream: Any) -> str:  # fmt: skip
    """What the C fast path (native/bindings/launcher.cpp) would have declined, checked in its order."""
    if kernel._fast is None:
        return "no fast path (first launch, or no Launcher for this kernel)"
    if kernel._fast_state is not _backend._state:
        return "backend state changed since the kernel was prepared"
    info = kernel._launch_info
    if info is None:
        return "no launch info"

    def dims(value: Any) -> tuple[int, ...] | None:
        if type(value) is int:
            return (value,)
        if type(value) is tuple and 1 <= len(value) <= 3 and all(type(v) is int and v >= 1 for v in value):
            return value
        return None

    g, b = dims(grid), dims(block)
    if g is None or b is None:
        return f"grid {grid!r} / block {block!r} not ints or tuples of ints"
    if type(shared_mem) is not int or not 0 <= shared_mem <= info[3]:
        return f"shared_mem {shared_mem!r} vs the Launcher's max_shared {info[3]}"
    threads = int(np.prod(b))
    if threads > info[2]:
        return f"block {b} = {threads} threads > the Launcher's max_threads {info[2]}"
    if _thread_state.device != info[0]:
        return f"thread device {_thread_state.device!r} != the Launcher's {info[0]}"
    for i, (param, value) in enumerate(zip(kernel.params or (), args, strict=False)):
        if param.kind == "pointer" and type(value) is GPUArray:
            buffer = value._buffer
            checks = {"live": buffer._live is True, "contiguous": value._contiguous is True,
                      "device": type(buffer.device) is int and buffer.device == info[0],
                      "ptr int": type(buffer.ptr) is int, "offset int": type(value._offset) is int,
                      "dtype": not param.element or value._dtype.ctype == param.element}  # fmt: skip
            failed = [name for name, ok in checks.items() if not ok]
            if failed:
                return f"argument {i} ({param.name}): {', '.join(failed)} (device {buffer.device!r})"
        elif param.kind == "pointer" and not (value is None or type(value) is int):
            return f"argument {i} ({param.name}): a {type(value).__name__}, not a GPUArray/int/None"
    handle = getattr(stream if stream is not None else (gp.current_stream()), "_handle", None)
    if type(handle) is not int:
        return f"stream handle {handle!r}"
    return "nothing found: the C side declined for a reason this check does not model (scalar kinds?)"


def warm_body(stream: gp.Stream, x: gp.GPUArray, out: gp.GPUArray) -> None:
    """The body again, its kernels loaded: general-path launches counted, the first three explained."""
    calls: list[str] = []
    original = JITKernel._launch

    def counting(self: JITKernel, args: tuple[Any, ...], grid: Any, block: Any, shared_mem: int,
                 stream_: Any) -> None:  # fmt: skip
        if len(calls) < 3:
            calls.append(f"{self.name}: {_why_declined(self, args, grid, block, shared_mem, stream_)}")
        else:
            calls.append("")
        original(self, args, grid, block, shared_mem, stream_)

    JITKernel._launch = counting  # type: ignore[method-assign, assignment]
    try:
        with stream:
            body(x, out)
            stream.synchronize()
    finally:
        JITKernel._launch = original  # type: ignore[method-assign]
    print(f"  warm body: {len(calls)} launches took the general path", flush=True)
    for line in calls[:3]:
        print(f"    {line}", flush=True)


SCALE = r"""
extern "C" __global__ void probe_scale(float* x, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}
"""


def _launch_once(kernel: JITKernel, n: int) -> None:
    array = gp.from_numpy(np.ones(n, np.float32))
    kernel(array, 2.0, n, grid=(n + 255) // 256, block=256)
    gp.synchronize()


def _allocate_once(nbytes: int) -> None:
    buffer = DeviceBuffer(nbytes)
    del buffer


def leaks_per_path(count: int = 5) -> None:
    """Buffers and dead frames left by ``count`` launches through each path and by ``count`` allocations."""
    kernel = gp.jit(SCALE, "probe_scale")
    _launch_once(kernel, 64)  # loads and prepares: later launches can take the fast path

    def measure(label: str, step: Any) -> None:
        gc.collect()
        before = (sum(isinstance(o, DeviceBuffer) for o in gc.get_objects()), len(_dead_frames()))
        for i in range(count):
            step(i)
        gc.collect()
        after = (sum(isinstance(o, DeviceBuffer) for o in gc.get_objects()), len(_dead_frames()))
        _mine.clear()
        print(f"  {label:<36} +{after[0] - before[0]} buffers, +{after[1] - before[1]} dead frames", flush=True)

    measure(f"{count} launches, fast path", lambda i: _launch_once(kernel, 64 + i))
    saved = kernel._fast
    kernel._fast = None  # the general path (JITKernel._launch) for this kernel
    try:
        measure(f"{count} launches, general path", lambda i: _launch_once(kernel, 64 + i))
    finally:
        kernel._fast = saved
    measure(f"{count} device allocations", lambda i: _allocate_once((1 << 20) * (i + 3)))


def body(x: gp.GPUArray, out: gp.GPUArray) -> None:
    y = gp.exp(x * 0.5)
    gp.add(y, gp.sum(y * y, axis=1, keepdims=True), out=out)


def main() -> int:
    print(f"backend {gp.current_backend()}, Python {sys.version.split()[0]}")
    report("start")
    try:
        buffer = DeviceBuffer(8192)
        report("one 8192-byte buffer")
        buffer.free()
        report("freed explicitly")
        buffer = DeviceBuffer(8192)
        del buffer
        report("one more, dropped (finalizer)")
    except PyGPUkitError:
        traceback.print_exc()
    stream = gp.Stream()
    x = gp.from_numpy(np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32))
    out = gp.empty((32, 64))
    report("inputs")
    with stream:
        body(x, out)
        stream.synchronize()
    report("eager body on a new stream")
    holders({id(x._buffer), id(out._buffer)})
    dead_frames()
    if gp.current_backend() == "cuda":
        warm_body(stream, x, out)
        report("warm body")
    graph = gp.CudaGraph()
    try:
        with graph.capture(stream):
            body(x, out)
        print("capture: ok", flush=True)
    except PyGPUkitError as error:
        print(f"capture: {type(error).__name__}: {error}", flush=True)
    report("after the capture")
    del graph

    def worker() -> None:
        own = gp.Stream()
        with own:
            for _ in range(3):
                a = gp.from_numpy(np.ones((24, 16), np.float32))
                (gp.matmul(a, a.T) * 2.0).to_numpy()
            own.synchronize()
        own.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    del threads, thread
    report("4 threads, each with a closed stream")
    if gp.current_backend() == "cuda":
        leaks_per_path()
        report("after the leaks per path")
    dead_frames()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
