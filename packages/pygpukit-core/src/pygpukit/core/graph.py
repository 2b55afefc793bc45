"""CUDA graphs: record work issued on a stream once, replay it with one launch.

    graph = CudaGraph()
    with graph.capture() as stream:      # work issued here is recorded, not run
        kernel(x, y, n, grid=..., block=...)
    graph.replay()                       # runs it; replays are bitwise identical to eager runs

Arrays used inside the graph must be allocated before the capture and kept alive while the graph can
be replayed: the graph holds their addresses. Capturing again updates the instantiated graph in place
when the topology is unchanged, else re-instantiates it. On the CPU backend work inside ``capture``
runs eagerly once and ``replay`` raises.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from .backend import backend_state
from .errors import DeviceError, PyGPUkitError
from .stream import Stream

__all__ = ["CudaGraph", "is_capturing"]

_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
_capturing_streams: set[int] = set()  # handles of the streams a CudaGraph is capturing now


def is_capturing(stream: Stream) -> bool:
    """Whether a :class:`CudaGraph` is capturing ``stream`` now (work issued on it is recorded, not
    run). Ops whose state must be set up by running work (zeroed counters, for example) check it."""
    return stream.handle in _capturing_streams


def _destroy(native: Any, handles: dict[str, int]) -> None:
    for kind in ("exec", "graph"):
        handle = handles.pop(kind, None)
        if handle:
            try:
                getattr(native, f"graph_{'exec_' if kind == 'exec' else ''}destroy")(handle)
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

    @property
    def is_ready(self) -> bool:
        """True once a capture has been instantiated and can be replayed."""
        return "exec" in self._handles

    @property
    def is_capturing(self) -> bool:
        return self._capturing

    @property
    def num_nodes(self) -> int:
        """Nodes (kernels, copies, memsets) in the last captured graph."""
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
            with stream:
                yield stream
            return
        native.capture_begin(stream.handle, _MODES[mode])
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
            raise
        self._capturing = False
        _capturing_streams.discard(stream.handle)
        graph = int(native.capture_end(stream.handle))
        old = self._handles.pop("graph", None)
        if old:
            native.graph_destroy(old)
        self._handles["graph"] = graph
        exec_handle = self._handles.get("exec")
        if exec_handle and native.graph_exec_update(exec_handle, graph):
            return
        if exec_handle:
            native.graph_exec_destroy(self._handles.pop("exec"))
        self._handles["exec"] = int(native.graph_instantiate(graph))

    def replay(self, stream: Stream | None = None) -> None:
        """Launch the captured work on ``stream`` (the capture stream by default); asynchronous."""
        if self._native is None:
            raise DeviceError("graph replay needs the CUDA backend")
        if not self.is_ready:
            raise PyGPUkitError("nothing captured yet: use `with graph.capture():` first")
        target = stream or self._stream
        assert target is not None
        self._native.graph_launch(self._handles["exec"], target.handle)

    def synchronize(self) -> None:
        """Wait for the capture stream (and so for replays launched on it)."""
        if self._stream is not None:
            self._stream.synchronize()

    def reset(self) -> None:
        """Drop the captured graph and its executable."""
        if self._native is not None:
            _destroy(self._native, self._handles)
        self._handles.clear()
