"""CUDA graphs: record work issued on a stream once, replay it with one launch.

    graph = CudaGraph()
    with graph.capture() as stream:      # work issued here is recorded, not run
        kernel(x, y, n, grid=..., block=...)
    graph.replay()                       # runs it; replays are bitwise identical to eager runs

Arrays used inside the graph must be allocated before the capture and kept alive while the graph can
be replayed: the graph holds their addresses. Temporaries the captured work allocates and frees are
the runtime's to keep: a block freed while this thread captures goes to the capture's hold in the pool,
from which only that capture's later allocations take blocks, and returns to the pool when the graph is
destroyed or captured again. Capturing again updates the instantiated graph in place when the topology
is unchanged, else re-instantiates it.

On the CPU simulation backend work inside ``capture`` runs eagerly once and the pygpukit calls made
there are recorded; ``replay`` makes them again, writing into the same output arrays, so replays equal
eager runs there too (:mod:`pygpukit.core._recording`). Custom JIT kernels cannot run on that backend,
inside a capture or not (:class:`DeviceError`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from ._recording import CpuRecorder, Step, active_recorder, replay_steps
from .backend import backend_state
from .errors import DeviceResetError, PyGPUkitError
from .stream import Stream, current_stream, thread_device

__all__ = ["CudaGraph", "is_capturing", "is_capturing_on_cpu"]

_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
_capturing_streams: set[int] = set()  # handles of the streams a CudaGraph is capturing now
_graphs: weakref.WeakSet[CudaGraph] = weakref.WeakSet()  # every graph, for a device reset (core/recovery.py)


def is_capturing(stream: Stream) -> bool:
    """Whether a :class:`CudaGraph` is capturing ``stream`` now (work issued on it is recorded, not
    run). Ops whose state must be set up by running work (zeroed counters, for example) check it."""
    return stream._id in _capturing_streams  # _id: no token taken from a paced stream (pygpukit.scheduler)


def is_capturing_on_cpu() -> bool:
    """Whether a :class:`CudaGraph` capture on the CPU backend is open on this thread."""
    return active_recorder() is not None


_DESTROY = {"exec": "graph_exec_destroy", "graph": "graph_destroy", "before": "event_destroy", "after": "event_destroy"}


def _destroy(native: Any, handles: dict[str, int]) -> None:
    for kind, destroy in _DESTROY.items():
        handle = handles.pop(kind, None)
        if handle:
            try:
                getattr(native, destroy)(handle)
            except Exception:
                return
    # Last: the blocks the capture's own work freed (its temporaries), which every replay may still
    # write, go back to the pool once the graph is gone (native memory.hpp: release_hold).
    hold = handles.pop("hold", None)
    if hold:
        try:
            native.release_hold(hold, handles.get("device", -1))
        except Exception:
            return


class CudaGraph:
    """A captured CUDA graph and its instantiated executable."""

    def __init__(self) -> None:
        state = backend_state()
        self._native = state.native if state.name == "cuda" else None
        self._handles: dict[str, int] = {}
        self._stream: Stream | None = None
        self._capturing = False
        self._finalizer = weakref.finalize(self, _destroy, self._native, self._handles) if self._native else None
        self._device = thread_device() if self._native else -1  # the device whose context owns the graph
        self._reset: int | None = None  # the device, once a reset dropped the captured graph
        self._cpu_steps: list[Step] | None = None  # CPU backend: the recorded calls (core/_recording.py)
        _graphs.add(self)

    @property
    def is_ready(self) -> bool:
        """True once a capture has been instantiated (CPU backend: recorded) and can be replayed."""
        return "exec" in self._handles or self._cpu_steps is not None

    @property
    def is_capturing(self) -> bool:
        return self._capturing

    @property
    def num_nodes(self) -> int:
        """Nodes (kernels, copies, memsets) in the last captured graph (CPU backend: recorded calls)."""
        if self._cpu_steps is not None:
            return len(self._cpu_steps)
        if "graph" not in self._handles or self._native is None:
            return 0
        return int(self._native.graph_node_count(self._handles["graph"]))

    @contextmanager
    def capture(
        self, stream: Stream | None = None, mode: Literal["global", "thread_local", "relaxed"] = "thread_local"
    ) -> Iterator[Stream]:
        """Record the work issued inside the block on ``stream`` (a private stream by default), which is
        the current stream inside the block. The legacy default stream cannot be captured."""
        if self._capturing:
            raise PyGPUkitError("this graph is already capturing")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        stream = stream or self._stream or Stream()
        if stream.handle == 0:
            raise PyGPUkitError("the legacy default stream cannot be captured; pass a Stream()")
        self._stream = stream
        native = self._native
        if native is None:
            yield from self._capture_on_cpu(stream)
            return
        # Blocks this thread frees while capturing (the captured work's temporaries) go to the capture's
        # hold in the pool: kept from every other allocation while the graph can replay, released with
        # it (native memory.hpp).
        hold = int(native.capture_begin(stream.handle, _MODES[mode]))
        self._capturing = True
        _capturing_streams.add(stream.handle)
        try:
            with stream:
                yield stream
        except BaseException:
            self._capturing = False
            _capturing_streams.discard(stream.handle)
            try:
                graph = native.capture_end(stream.handle)
                native.graph_destroy(graph)
            except PyGPUkitError:
                pass  # the capture was already invalidated by whatever failed
            native.release_hold(hold, self._device)  # nothing of this capture will run
            raise
        self._capturing = False
        _capturing_streams.discard(stream.handle)
        try:
            graph = int(native.capture_end(stream.handle))
        except BaseException:
            native.release_hold(hold, self._device)
            raise
        old = self._handles.pop("graph", None)
        if old:
            native.graph_destroy(old)
        self._handles["graph"] = graph
        old_hold = self._handles.get("hold")
        self._handles["hold"] = hold
        self._handles["device"] = self._device
        exec_handle = self._handles.get("exec")
        if not (exec_handle and native.graph_exec_update(exec_handle, graph)):
            if exec_handle:
                native.graph_exec_destroy(self._handles.pop("exec"))
            self._handles["exec"] = int(native.graph_instantiate(graph))
        if old_hold:  # the executable now runs the new capture: the old one's temporaries are free
            native.release_hold(old_hold, self._device)

    def _capture_on_cpu(self, stream: Stream) -> Iterator[Stream]:
        """CPU backend: run the block eagerly and record its pygpukit calls (core/_recording.py)."""
        recorder = CpuRecorder(exclude=(_CAPTURE_CODE, CudaGraph._capture_on_cpu.__code__))
        with stream:
            recorder.start()
            self._capturing = True
            _capturing_streams.add(stream.handle)
            try:
                yield stream
            finally:
                recorder.stop()
                self._capturing = False
                _capturing_streams.discard(stream.handle)
        recorder.check()
        self._cpu_steps = recorder.steps

    def replay(self, stream: Stream | None = None) -> None:
        """Launch the captured work; asynchronous. Without ``stream`` it runs on the capture stream,
        ordered like work on the current stream: after everything already issued there (e.g. a
        ``copy_`` of new inputs), and before anything issued there afterwards (e.g. ``to_numpy``), by an
        event each way when the two streams differ. With ``stream`` it is simply launched there, and
        ordering it against other streams is the caller's. On the CPU backend: make the recorded calls
        again, in order (synchronous, like all work there)."""
        if self._reset is not None and not self.is_ready:
            raise DeviceResetError.of("this graph's capture", self._reset)
        if self._native is None:
            if self._cpu_steps is None:
                raise PyGPUkitError("nothing captured yet: use `with graph.capture():` first")
            with stream or self._stream or Stream():
                replay_steps(self._cpu_steps)
            return
        if not self.is_ready:
            raise PyGPUkitError("nothing captured yet: use `with graph.capture():` first")
        native = self._native
        handles = self._handles
        if stream is not None:
            native.graph_launch(handles["exec"], stream.handle)
            return
        target = self._stream
        assert target is not None
        current = current_stream().handle
        if current == target._id:  # not .handle: one graph launch takes one token from a paced stream
            native.graph_launch(handles["exec"], current)
            return
        before = handles.get("before") or self._event("before")
        after = handles.get("after") or self._event("after")
        native.event_record(before, current)
        native.stream_wait_event(target.handle, before)
        native.graph_launch(handles["exec"], target.handle)
        native.event_record(after, target.handle)
        native.stream_wait_event(current, after)

    def _event(self, kind: str) -> int:
        """The graph's ordering event ``kind`` (created on first use, destroyed with the graph)."""
        assert self._native is not None
        handle = self._handles[kind] = int(self._native.event_create(False, False))
        return handle

    def synchronize(self) -> None:
        """Wait for the capture stream (and so for replays launched on it)."""
        if self._stream is not None:
            self._stream.synchronize()

    def reset(self) -> None:
        """Drop the captured graph and its executable."""
        if self._native is not None:
            _destroy(self._native, self._handles)
        self._handles.clear()
        self._cpu_steps = None


_CAPTURE_CODE = CudaGraph.capture.__wrapped__.__code__  # type: ignore[attr-defined]  # the generator


def forget_device(device: int) -> int:
    """Device reset (core/recovery.py, before the context is reset): the graphs of ``device`` (-1:
    the CPU backend) drop their captured graph and executable, which died with the context, without
    destroying them; replay then raises :class:`DeviceResetError` until the graph is captured again.
    Returns the number of graphs that held a capture."""
    dropped = 0
    for graph in list(_graphs):
        if graph._device != device:
            continue
        if graph._capturing and graph._stream is not None:
            _capturing_streams.discard(graph._stream._id)
            graph._capturing = False
        if graph._handles or graph._cpu_steps is not None:
            dropped += 1
            graph._reset = device
        graph._handles.clear()
        graph._cpu_steps = None
        graph._stream = None
    return dropped
