"""Issue 21, item 5: concurrency of the runtime. Many threads launching ops on their own streams, asyncio
tasks with their own current streams, and a graph capture while another thread allocates and computes:
every result is checked against NumPy (no cross-talk), every thread finishes within a time limit (no
deadlock), and the pool's in-use bytes come back to where they started (every allocation returned).

Runs on both backends: on the CPU simulation here, and unchanged on the GPU, where the streams are real
and the capture is a CUDA graph captured in thread-local mode.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit import testing

TIMEOUT = 120.0  # seconds for a whole test's threads; a deadlock fails instead of hanging


def run_threads(workers: list[Callable[[], None]], timeout: float = TIMEOUT) -> None:
    testing.run_threads(workers, timeout)


def in_use() -> int:
    gc.collect()
    gp.synchronize()
    return int(gp.memory_stats()["in_use_bytes"])


def pool_report(before: int) -> str:
    """What an in-use check that failed saw: the pool's statistics, and the live Streams (a stream's
    per-stream memory, its cuBLASLt workspace and completion counters, goes when it is destroyed)."""
    streams = sum(isinstance(o, gp.Stream) for o in gc.get_objects())
    return f"in use {in_use()} bytes, {before} before; {streams} live Stream objects; {gp.memory_stats()}"


def test_threads_on_their_own_streams_do_not_cross_talk() -> None:
    count, rounds = 8, 12
    start = threading.Barrier(count)
    before = in_use()

    def worker(index: int) -> Callable[[], None]:
        def run() -> None:
            rng = np.random.default_rng(index)
            stream = gp.Stream()
            start.wait(TIMEOUT)
            with stream:
                for step in range(rounds):
                    assert gp.current_stream() is stream
                    a = rng.standard_normal((24, 16 + index)).astype(np.float32)
                    b = rng.standard_normal((16 + index, 8)).astype(np.float32)
                    x, y = gp.from_numpy(a), gp.from_numpy(b)
                    z = gp.matmul(x, y, use_tf32=False) * float(index + 1) + float(step)
                    s = gp.sum(gp.exp(x * 0.25), axis=1)
                    big = gp.full((1 << 16) + index, index, gp.int32)  # pool blocks of many sizes
                    want = (a.astype(np.float64) @ b.astype(np.float64)) * (index + 1) + step
                    np.testing.assert_allclose(z.to_numpy(stream=stream), want, rtol=2e-5, atol=2e-4)
                    np.testing.assert_allclose(s.to_numpy(), np.exp(a.astype(np.float64) * 0.25).sum(1), rtol=1e-5)
                    assert int(gp.max(big).to_numpy()) == index
                    assert int(gp.min(big).to_numpy()) == index
                stream.synchronize()
            # Destroyed here, not whenever the collector gets to it: the stream's own memory (its cuBLASLt
            # workspace, completion counters) goes back now, so the check below does not depend on timing.
            stream.close()

        return run

    run_threads([worker(i) for i in range(count)])
    assert in_use() == before, f"allocations of the threads were not returned: {pool_report(before)}"


def test_current_stream_is_per_thread() -> None:
    count = 6
    inside = threading.Barrier(count)
    streams = [gp.Stream() for _ in range(count)]

    def worker(index: int) -> Callable[[], None]:
        def run() -> None:
            with streams[index]:
                inside.wait(TIMEOUT)  # every thread is inside its own block at once
                assert gp.current_stream() is streams[index]
                x = gp.arange(1000, dtype=gp.float32) + float(index)
                inside.wait(TIMEOUT)
                assert gp.current_stream() is streams[index]
                assert float(x.to_numpy()[0]) == index
            assert gp.current_stream() is not streams[index]

        return run

    run_threads([worker(i) for i in range(count)])


def test_asyncio_tasks_keep_their_own_current_stream() -> None:
    count, rounds = 12, 6
    streams = [gp.Stream() for _ in range(count)]

    async def task(index: int) -> float:
        total = 0.0
        with streams[index]:
            for step in range(rounds):
                await asyncio.sleep(0)  # let every other task run in between
                assert gp.current_stream() is streams[index]
                x = gp.full(512, float(index), gp.float32)
                total += float(gp.sum(x + float(step)).to_numpy())
        return total

    async def main() -> list[float]:
        return await asyncio.wait_for(asyncio.gather(*(task(i) for i in range(count))), TIMEOUT)

    results = asyncio.run(main())
    assert results == [float(sum(512 * (i + s) for s in range(rounds))) for i in range(count)]


def _capture(stream: gp.Stream, x: gp.GPUArray, out: gp.GPUArray) -> gp.CudaGraph:
    """A graph of a few ops writing ``out`` from ``x`` (eager once first, as captures need)."""

    def body() -> None:
        y = gp.exp(x * 0.5)
        z = gp.sum(y * y, axis=1, keepdims=True)
        gp.add(y, z, out=out)

    with stream:
        body()
        stream.synchronize()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            body()
    return graph


def _expected(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    y = np.exp(values.astype(np.float64) * 0.5)
    result: np.ndarray[Any, Any] = y + (y * y).sum(axis=1, keepdims=True)
    return result


def test_graph_capture_while_another_thread_allocates_and_computes() -> None:
    rng = np.random.default_rng(5)
    shape = (32, 64)
    stream = gp.Stream()
    x, out = gp.from_numpy(rng.standard_normal(shape).astype(np.float32)), gp.empty(shape)
    solo = _capture(stream, x, out)  # the same capture with nothing else running, for the node count
    solo_nodes = solo.num_nodes
    del solo
    before = in_use()

    captured: list[gp.CudaGraph] = []
    capturing = threading.Event()
    done = threading.Event()
    allocated = [0]

    def capturer() -> None:
        capturing.set()
        for _ in range(5):  # several captures while the other thread runs
            captured.append(_capture(stream, x, out))
        done.set()

    def allocator() -> None:
        own = gp.Stream()
        local = np.random.default_rng(9)
        capturing.wait(TIMEOUT)
        with own:
            while not done.is_set() or allocated[0] < 20:
                size = int(local.integers(1, 4 << 20))  # up to 16 MiB of float32: model-sized blocks
                block = gp.full(size, 2.0, gp.float32)
                assert float(gp.max(block * 0.5).to_numpy()) == 1.0
                values = local.standard_normal(257).astype(np.float32)
                np.testing.assert_allclose(gp.neg(gp.from_numpy(values)).to_numpy(), -values)
                del block
                allocated[0] += 1
            own.synchronize()

    run_threads([capturer, allocator])
    assert allocated[0] >= 20
    for graph in captured:
        assert graph.num_nodes == solo_nodes, "the capture recorded another thread's work"
        values = rng.standard_normal(shape).astype(np.float32)
        x.copy_(values)
        with stream:
            out.copy_(np.full(shape, np.nan, np.float32))
            graph.replay()
            stream.synchronize()
        np.testing.assert_allclose(out.to_numpy(), _expected(values), rtol=2e-5, atol=1e-5)
    del graph
    captured.clear()  # the graphs hold their intermediate arrays until they go
    assert in_use() == before, "allocations were not returned"


def test_global_mode_capture_while_another_thread_allocates_new_memory() -> None:
    """A capture in global mode forbids every thread's unsafe calls, cuMemAlloc among them (the driver
    refuses them and invalidates the capture). The allocator makes another thread's allocation in
    relaxed mode, which the CUDA documentation allows for work that is not part of the capture: blocks
    of sizes never allocated before (nothing cached) succeed while the capture is open, hold what is
    written to them afterwards, and the capture replays the right result."""
    rng = np.random.default_rng(12)
    shape = (16, 32)
    stream, own = gp.Stream(), gp.Stream()
    x, out = gp.from_numpy(rng.standard_normal(shape).astype(np.float32)), gp.empty(shape)
    inside, allocated = threading.Event(), threading.Event()
    graphs: list[gp.CudaGraph] = []
    blocks: list[gp.GPUArray] = []
    sizes = [(1 << 20) + 4099 * i for i in range(1, 9)]  # float32 elements: about 4 MiB each, new sizes
    gc.collect()  # no garbage stream or event whose destruction (an unsafe call) would fall in the capture

    def capturer() -> None:
        def body() -> None:
            y = gp.exp(x * 0.5)
            gp.add(y, gp.sum(y * y, axis=1, keepdims=True), out=out)

        with stream:
            body()
            stream.synchronize()
        graph = gp.CudaGraph()
        with graph.capture(stream, mode="global"):
            inside.set()
            body()
            assert allocated.wait(TIMEOUT), "the other thread did not allocate"
        graphs.append(graph)

    def allocator() -> None:
        assert inside.wait(TIMEOUT)
        with own:
            blocks.extend(gp.empty(size, gp.float32) for size in sizes)  # only allocations: no copy, no sync
        allocated.set()

    run_threads([capturer, allocator])
    assert [b.shape for b in blocks] == [(size,) for size in sizes]
    for index, block in enumerate(blocks):
        values = np.full(block.shape, float(index), np.float32)
        block.copy_(values)
        np.testing.assert_array_equal(block.to_numpy(), values)
    values = rng.standard_normal(shape).astype(np.float32)
    x.copy_(values)
    with stream:
        out.copy_(np.full(shape, np.nan, np.float32))
        graphs[0].replay()
        stream.synchronize()
    np.testing.assert_allclose(out.to_numpy(), _expected(values), rtol=2e-5, atol=1e-5)


def test_pool_statistics_stay_consistent_under_threads() -> None:
    count, rounds = 6, 40
    before = in_use()
    stop = threading.Event()
    seen: list[dict[str, Any]] = []

    def sampler() -> None:
        while not stop.is_set():
            stats = gp.memory_stats()
            seen.append(stats)
            assert stats["in_use_bytes"] >= 0
            assert stats["peak_in_use_bytes"] >= stats["in_use_bytes"]

    def worker(index: int) -> Callable[[], None]:
        def run() -> None:
            local = np.random.default_rng(100 + index)
            held = []
            for _ in range(rounds):
                held.append(gp.empty(int(local.integers(1, 1 << 20)), gp.uint8))
                if len(held) > 4:
                    held.pop(int(local.integers(0, len(held))))
            held.clear()

        return run

    sample_thread = threading.Thread(target=sampler, daemon=True)
    sample_thread.start()
    try:
        run_threads([worker(i) for i in range(count)])
    finally:
        stop.set()
        sample_thread.join(TIMEOUT)
    assert seen
    assert in_use() == before
