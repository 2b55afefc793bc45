"""A probe of the pool under compute-sanitizer (docs/reliability.md, the sanitizer run of 2026-11-24): there,
a capture right after an eager run of its body on the same stream found no cached block, and 8 threads left
every allocation they made in use, while the same tests pass without the sanitizer. This prints the pool's
statistics after each step; run it plainly and under a tool, and compare:

    python ci/sanitize_probe.py
    compute-sanitizer --tool synccheck python ci/sanitize_probe.py

Each line: the step, then in-use and cached bytes and blocks, requests, reuse hits, frees and device
allocations, then the DeviceBuffer objects alive and the allocations registered as live. In-use bytes
that grow while the buffers do not point at frees that fail (DeviceBuffer's finalizer hides their
errors; the explicit free below prints one); growing buffers point at something keeping them alive.
"""

from __future__ import annotations

import gc
import threading
import traceback

import numpy as np

import pygpukit as gp
from pygpukit.core import memory
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.memory import DeviceBuffer

KEYS = ("in_use_bytes", "in_use_blocks", "cached_bytes", "cached_blocks", "requests", "reuse_hits", "frees",
        "device_allocations")  # fmt: skip


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


def _describe(obj: object) -> str:
    """A short name for one referrer: frames and code by file and line, containers by type and size."""
    import types

    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_filename}:{obj.f_lineno} ({obj.f_code.co_name})"
    if isinstance(obj, types.TracebackType):
        return f"traceback at {obj.tb_frame.f_code.co_filename}:{obj.tb_lineno}"
    if isinstance(obj, BaseException):
        return f"exception {type(obj).__name__}: {str(obj)[:120]}"
    if isinstance(obj, dict):
        keys = list(obj)[:6]
        return f"dict({len(obj)}) keys {keys}"
    if isinstance(obj, (list, tuple, set)):
        return f"{type(obj).__name__}({len(obj)})"
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def referrers(skip: set[int]) -> None:
    """For each DeviceBuffer alive other than those in ``skip``, print what holds it, three levels up
    (the question of the sanitizer runs: what keeps an eager body's temporaries alive there)."""
    import sys

    here = sys._getframe()
    buffers = [o for o in gc.get_objects() if isinstance(o, DeviceBuffer) and id(o) not in skip]
    for buffer in buffers[:3]:
        print(f"  buffer of {buffer.nbytes} bytes held by:", flush=True)
        level: list[object] = [buffer]
        for depth in range(4):
            nxt: list[object] = []
            for obj in level:
                for ref in gc.get_referrers(obj):
                    if ref is here or ref is buffers or ref is level or ref is nxt:
                        continue
                    print(f"  {'  ' * depth}<- {_describe(ref)}", flush=True)
                    nxt.append(ref)
            level = nxt[:4]
    del buffers


def dead_frames() -> None:
    """Frames of returned calls that are still alive, and what holds each one that is not another
    frame (a traceback, a generator, a container), three levels up: the root of the buffers above."""
    import sys
    import types

    running = set()
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        running.add(id(frame))
        frame = frame.f_back
    dead = [o for o in gc.get_objects() if isinstance(o, types.FrameType) and id(o) not in running]
    print(f"  {len(dead)} frames of returned calls alive", flush=True)
    shown = 0
    for frame in dead:
        holders = [r for r in gc.get_referrers(frame) if not isinstance(r, types.FrameType) and r is not dead]
        if not holders:
            continue
        print(f"  {_describe(frame)} held by:", flush=True)
        level: list[object] = holders
        for depth in range(3):
            nxt: list[object] = []
            for obj in level[:4]:
                print(f"  {'  ' * depth}<- {_describe(obj)}", flush=True)
                nxt.extend(r for r in gc.get_referrers(obj) if r is not level and r is not nxt and r is not dead
                           and r is not holders)  # fmt: skip
            level = nxt
        shown += 1
        if shown == 4:
            break
    del dead


def body(x: gp.GPUArray, out: gp.GPUArray) -> None:
    y = gp.exp(x * 0.5)
    gp.add(y, gp.sum(y * y, axis=1, keepdims=True), out=out)


def main() -> int:
    print(f"backend {gp.current_backend()}")
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
    referrers({id(x._buffer), id(out._buffer)} if hasattr(x, "_buffer") else set())
    dead_frames()
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
    report("4 threads, each with a closed stream")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
