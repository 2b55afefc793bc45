"""pygpukit.profiling: named ranges (context manager and decorator, nesting, streams), per-kernel
records through the JITKernel launch hook (installed only while a profiler records kernels), pool
memory snapshots, the summary and the chrome-trace export. On the CPU backend events carry host
times; the GPU-marked tests time real kernels, a graph capture and a second stream."""

from __future__ import annotations

import importlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import profiling
from pygpukit.core.errors import ArgumentError, DeviceError
from pygpukit.core.stream import current_stream
from pygpukit.profiling import Profiler, ProfilerError

JIT = importlib.import_module("pygpukit.core.jit")  # the module (pygpukit.core.jit is also a function)


@pytest.fixture(autouse=True)
def _no_profiler_left() -> Any:
    yield
    assert profiling.active_profiler() is None
    assert JIT._launch_hook is None


def test_ranges_nest_and_time_the_work() -> None:
    with Profiler() as prof, profiling.range("outer"):
        time.sleep(0.02)
        with profiling.range("inner"):
            time.sleep(0.01)
    outer, inner = prof.ranges
    assert (outer.name, outer.depth, outer.parent) == ("outer", 0, None)
    assert (inner.name, inner.depth, inner.parent) == ("inner", 1, "outer")
    assert outer.duration_ms is not None
    assert inner.duration_ms is not None
    assert outer.duration_ms >= 30.0 * 0.9
    assert 10.0 * 0.9 <= inner.duration_ms <= outer.duration_ms
    assert outer.start_ms is not None
    assert inner.start_ms is not None
    assert outer.start_ms <= inner.start_ms <= outer.start_ms + outer.duration_ms
    assert outer.stream == current_stream()._id


def test_range_as_a_decorator_records_every_call_and_keeps_the_result() -> None:
    @profiling.range("work")
    def work(x: int) -> int:
        return x * 2

    assert work(1) == 2  # no profiler: nothing recorded, no error
    with Profiler(memory=False) as prof:
        assert [work(i) for i in range(3)] == [0, 2, 4]
    assert [r.name for r in prof.ranges] == ["work"] * 3
    assert all(r.duration_ms is not None and r.duration_ms >= 0 for r in prof.ranges)


def test_a_range_on_an_explicit_stream_and_threads() -> None:
    stream = gp.Stream()
    together = threading.Barrier(3)  # all three alive at once: distinct thread ids

    def worker(i: int) -> None:
        with profiling.range(f"thread-{i}"):
            together.wait(timeout=30)

    with Profiler(memory=False) as prof:
        with profiling.range("on-stream", stream=stream):
            pass
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    by_name = {r.name: r for r in prof.ranges}
    assert by_name["on-stream"].stream == stream._id
    for i in range(3):
        assert by_name[f"thread-{i}"].depth == 0  # each thread has its own nesting
    assert len({by_name[f"thread-{i}"].thread for i in range(3)}) == 3


def test_memory_snapshots_follow_the_pool() -> None:
    with Profiler() as prof:
        with profiling.range("alloc"):
            kept = gp.empty((1 << 20,), gp.uint8)
        snap = prof.snapshot("holding 1 MiB")
        assert profiling.snapshot("module-level") is not None
    assert profiling.snapshot("off") is None
    labels = [s.label for s in prof.memory]
    assert labels == ["start", "end of alloc", "holding 1 MiB", "module-level", "stop"]
    assert snap.in_use_bytes >= prof.memory[0].in_use_bytes + (1 << 20)
    assert snap.stats["in_use_bytes"] == snap.in_use_bytes
    del kept


def test_the_kernel_hook_is_installed_only_while_recording() -> None:
    assert JIT._launch_hook is None
    with Profiler(kernels=False):
        assert JIT._launch_hook is None
    with Profiler():
        assert JIT._launch_hook is profiling._kernel_hook
    assert JIT._launch_hook is None
    with pytest.raises(RuntimeError, match="boom"), Profiler():
        raise RuntimeError("boom")
    assert JIT._launch_hook is None


class _FakeKernel:
    """A stand-in JITKernel: what the hook reads (name) and calls (_launch_unhooked)."""

    name = "fake_kernel"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.launches: list[tuple[Any, ...]] = []

    def _launch_unhooked(self, args: Any, grid: Any, block: Any, shared_mem: int, stream: Any) -> None:
        if self.fail:
            raise DeviceError("no device")
        self.launches.append((args, grid, block, shared_mem, stream))


def test_kernel_records_through_the_hook() -> None:
    kernel = _FakeKernel()
    with Profiler(memory=False) as prof, profiling.range("step"):
        for i in range(4):
            profiling._kernel_hook(kernel, (i,), 8, 256, 0, None)
        with pytest.raises(DeviceError):
            profiling._kernel_hook(_FakeKernel(fail=True), (), 1, 1, 0, None)  # a failed launch: no record
    assert len(kernel.launches) == 4
    assert [k.name for k in prof.kernels] == ["fake_kernel"] * 4
    record = prof.kernels[0]
    assert (record.grid, record.block, record.range, record.captured) == (8, 256, "step", False)
    assert all(k.duration_ms is not None and k.duration_ms >= 0 for k in prof.kernels)
    profiling._kernel_hook(kernel, (9,), 1, 1, 0, None)  # no profiler: launched, not recorded
    assert len(kernel.launches) == 5
    assert len(prof.kernels) == 4


def test_max_kernels_bounds_the_records() -> None:
    with Profiler(memory=False, max_kernels=2) as prof:
        for _ in range(5):
            profiling._kernel_hook(_FakeKernel(), (), 1, 1, 0, None)
    assert len(prof.kernels) == 2
    assert prof.dropped_kernels == 3
    assert "3 not kept" in prof.summary()


def test_a_jit_kernel_on_the_cpu_backend_raises_and_is_not_recorded() -> None:
    if gp.backend_state().name == "cuda":
        pytest.skip("the CPU backend's refusal")
    kernel = gp.jit('extern "C" __global__ void k(float* x, int n) { }', "k")
    with Profiler(memory=False) as prof, pytest.raises(DeviceError, match="CUDA backend"):
        kernel(gp.zeros(4, gp.float32), 4, grid=1, block=32)
    assert len(prof.kernels) == 0


def test_summary_and_chrome_trace(tmp_path: Path) -> None:
    with Profiler() as prof:
        with profiling.range("prefill"):
            profiling._kernel_hook(_FakeKernel(), (), 2, 64, 0, None)
        for _ in range(3):
            with profiling.range("decode"):
                pass
    text = prof.summary()
    assert "prefill" in text
    assert "decode" in text
    assert "fake_kernel" in text
    assert "pool:" in text
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    device = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert sorted(e["name"] for e in device if e["cat"] == "range") == ["decode"] * 3 + ["prefill"]
    kernels = [e for e in device if e["cat"] == "kernel"]
    assert [(e["name"], e["args"]["grid"], e["args"]["block"], e["args"]["range"]) for e in kernels] == [
        ("fake_kernel", 2, 64, "prefill")
    ]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in device)
    prefill = next(e for e in device if e["name"] == "prefill")
    kernel = kernels[0]
    assert prefill["ts"] <= kernel["ts"] <= prefill["ts"] + prefill["dur"]
    assert sum(e["ph"] == "C" for e in events) == len(prof.memory)
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)
    assert sum(e["ph"] == "X" and e["pid"] == 1 for e in events) == 4  # the host track


def test_misuse_raises_profiler_error() -> None:
    prof = Profiler()
    with pytest.raises(ProfilerError, match="stop the profiler first"):
        prof.summary()
    with pytest.raises(ProfilerError, match="not recording"):
        prof.stop()
    with prof:
        with pytest.raises(ProfilerError, match="another profiler is recording"):
            Profiler().start()
        with pytest.raises(ProfilerError, match="stop the profiler first"):
            prof.to_chrome_trace()
    with pytest.raises(ProfilerError, match="already recorded"):
        prof.start()
    with pytest.raises(ArgumentError, match="name must be a non-empty str"):
        profiling.range("")
    with pytest.raises(ArgumentError, match="max_kernels"):
        Profiler(max_kernels=-1)


def test_the_docs_page_examples_run() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "profiling.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, str(page), "exec"), {"__name__": "docs_example"})


# -- on the GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_op_kernels_are_recorded_and_timed() -> None:
    x = gp.from_numpy(np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32))
    gp.add(x, x)  # compiled and planned before profiling
    with Profiler(memory=False) as prof, profiling.range("ops"):
        for _ in range(5):
            y = gp.add(x, x)
            gp.mul(y, x, out=y)
    assert len(prof.kernels) >= 10
    assert all(k.duration_ms is not None and k.duration_ms > 0 for k in prof.kernels)
    assert all(k.range == "ops" for k in prof.kernels)
    (ops,) = prof.ranges
    assert ops.duration_ms is not None
    assert ops.duration_ms >= sum(k.duration_ms or 0.0 for k in prof.kernels) * 0.5
    np.testing.assert_allclose(y.to_numpy(), (x.to_numpy() * 2) * x.to_numpy(), rtol=1e-6)


@pytest.mark.gpu
def test_gpu_captured_launches_are_recorded_without_timing() -> None:
    x = gp.zeros(1024, gp.float32)
    stream = gp.Stream()
    with stream:
        gp.add(x, 1.0, out=x)
    stream.synchronize()
    graph = gp.CudaGraph()
    with Profiler(memory=False) as prof:
        with graph.capture(stream):
            gp.add(x, 1.0, out=x)
        with profiling.range("replay", stream=stream):
            graph.replay(stream)
    captured = [k for k in prof.kernels if k.captured]
    assert captured
    assert all(k.duration_ms is None for k in captured)
    (replay,) = prof.ranges
    assert replay.duration_ms is not None
    assert replay.duration_ms > 0
    stream.synchronize()
    assert float(x.to_numpy()[0]) == 2.0


@pytest.mark.gpu
def test_gpu_profiling_off_leaves_the_fast_path() -> None:
    x = gp.zeros(1024, gp.float32)
    gp.add(x, 1.0, out=x)
    with Profiler(memory=False) as prof:
        gp.add(x, 1.0, out=x)
    count = len(prof.kernels)
    gp.add(x, 1.0, out=x)  # after stop: launched, not recorded
    assert len(prof.kernels) == count >= 1
    assert float(x.to_numpy()[0]) == 3.0
