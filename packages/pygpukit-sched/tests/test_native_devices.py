"""MemoryPool, AsyncTransferEngine and KernelDispatcher bindings.

The CPU tests use the host device (backend="host": host memory, one worker thread per stream) so
they test the same thing on every machine. The GPU tests use backend="cuda", which acts on the
device through pygpukit core's native C API.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

import pytest

import _pygpukit_rust as rust

MB = 1 << 20


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(n))


# --- MemoryPool ---------------------------------------------------------------------------------


def test_seed_memory_pool_snippet() -> None:
    pool = rust.MemoryPool(quota=100 * 1024 * 1024, enable_eviction=True, backend="host")
    block = pool.allocate(4096)
    info = pool.get_block(block)
    assert info["size"] == 4096
    assert info["resident"]
    assert info["device_ptr"] == pool.device_ptr(block)
    assert pool.stats()["used"] == 4096
    assert pool.device.startswith("host")


def test_evict_and_restore_round_trip_bytes_on_the_host_device() -> None:
    pool = rust.MemoryPool(MB, backend="host")
    block = pool.allocate(300_000)
    data = pattern(300_000, 1)
    pool.write(block, data)
    pool.evict(block)
    info = pool.get_block(block)
    assert not info["resident"]
    assert info["device_ptr"] is None
    assert pool.stats()["evicted_bytes"] == 300_000
    with pytest.raises(rust.InvalidTransitionError, match="evicted"):
        pool.read(block)
    with pytest.raises(rust.InvalidTransitionError):
        pool.evict(block)
    pool.restore(block)
    with pytest.raises(rust.InvalidTransitionError, match="resident"):
        pool.restore(block)
    assert pool.read(block) == data
    assert pool.read(block, 1000, 10) == data[1000:1010]
    stats = pool.stats()
    assert (stats["evictions"], stats["restores"], stats["used"], stats["evicted_bytes"]) == (1, 1, 300_000, 0)


def test_quota_pressure_evicts_least_recently_used_blocks() -> None:
    pool = rust.MemoryPool(1000, enable_eviction=True, backend="host")
    a = pool.allocate(400)
    b = pool.allocate(400)
    pool.write(a, b"a" * 400)
    pool.write(b, b"b" * 400)
    pool.touch(a)
    c = pool.allocate(400)
    assert not pool.get_block(b)["resident"], "b was least recently used"
    assert pool.block_ids() == [a, c, b]
    pool.restore(b)  # evicts a, now the least recently used
    assert not pool.get_block(a)["resident"]
    pool.restore(a)
    assert pool.read(a) == b"a" * 400
    assert pool.read(b) == b"b" * 400


def test_quota_errors_and_bad_input_leave_the_pool_consistent() -> None:
    pool = rust.MemoryPool(1000, enable_eviction=False, backend="host")
    a = pool.allocate(600)
    with pytest.raises(rust.QuotaExceededError) as exc:
        pool.allocate(600)
    assert (exc.value.requested, exc.value.in_use, exc.value.quota) == (600, 600, 1000)
    assert isinstance(exc.value, MemoryError)
    with pytest.raises(rust.InvalidArgumentError, match="size: -1"):
        pool.allocate(-1)
    with pytest.raises(rust.InvalidArgumentError, match="size: 2000"):
        pool.allocate(2000)
    with pytest.raises(rust.InvalidArgumentError, match="offset"):
        pool.write(a, b"x" * 10, offset=595)
    with pytest.raises(rust.UnknownIdError):
        pool.free(12345)
    with pytest.raises(rust.InvalidArgumentError, match="quota: -1"):
        rust.MemoryPool(-1, backend="host")
    with pytest.raises(rust.InvalidArgumentError, match="backend"):
        rust.MemoryPool(1000, backend="tpu")  # type: ignore[arg-type]
    pool.free(a)
    with pytest.raises(rust.UnknownIdError):
        pool.free(a)
    assert pool.stats()["used"] == 0
    assert pool.stats()["blocks"] == 0


# --- AsyncTransferEngine ------------------------------------------------------------------------


def test_transfers_in_all_directions_on_the_host_device() -> None:
    pool = rust.MemoryPool(MB, backend="host")
    a, b = pool.allocate(4096), pool.allocate(4096)
    engine = rust.AsyncTransferEngine(2, backend="host")
    data = pattern(4096, 3)
    up = engine.enqueue_h2d(pool.device_ptr(a), data, priority=1)
    assert engine.wait(up) == "completed"
    across = engine.enqueue_d2d(pool.device_ptr(b), pool.device_ptr(a), 4096)
    # Directions run on different streams, unordered with each other: wait before reading b.
    assert engine.wait(across) == "completed"
    down = engine.enqueue_d2h(pool.device_ptr(b), 4096)
    engine.synchronize()
    assert engine.result(down) == data
    with pytest.raises(rust.InvalidTransitionError):
        engine.result(down)
    status = engine.status(up)
    assert status["kind"] == "h2d"
    assert 0 <= status["start_ms"] <= status["end_ms"]
    stats = engine.stats()
    assert {k: v["bytes"] for k, v in stats.items()} == {"h2d": 4096, "d2h": 4096, "d2d": 4096}
    assert len({engine.stream(k) for k in ("h2d", "d2h", "d2d")}) == 3
    assert engine.prune_finished() == 3


def test_bad_transfers_fail_alone_and_unknown_ids_raise() -> None:
    engine = rust.AsyncTransferEngine(1, backend="host")
    bad = engine.enqueue_h2d(0x10, b"x" * 16)
    assert engine.wait(bad) == "failed"
    assert "not inside a live device allocation" in engine.status(bad)["error"]
    with pytest.raises(rust.UnknownIdError):
        engine.status(987654)
    with pytest.raises(rust.InvalidArgumentError, match="max_concurrent: 0"):
        rust.AsyncTransferEngine(0, backend="host")
    with pytest.raises(rust.InvalidArgumentError, match="kind"):
        engine.enqueue_ptr("h2h", 1, 2, 3)  # type: ignore[arg-type]
    with pytest.raises(rust.InvalidArgumentError, match="nbytes: -5"):
        engine.enqueue_d2d(1, 2, -5)


# --- KernelDispatcher ---------------------------------------------------------------------------


def test_dispatcher_limits_in_flight_work_and_resolves_futures() -> None:
    d = rust.KernelDispatcher(2, backend="host")
    s = d.create_stream()
    futures = [d.queue(s, priority=p) for p in (0, 0, 5, 1)]
    ready = d.get_ready()
    assert ready == [(futures[0].id, s), (futures[1].id, s)], "two slots, submission order"
    assert futures[2].state() == rust.KernelState.Queued
    with pytest.raises(rust.InvalidTransitionError):
        futures[0].wait()  # not launched yet: waiting would hang
    for request_id, _ in ready:
        d.mark_launched(request_id)
    assert futures[0].wait() == rust.KernelState.Completed
    assert futures[1].wait() == rust.KernelState.Completed
    ready = d.get_ready()
    assert [r for r, _ in ready] == [futures[2].id, futures[3].id], "then by priority"
    futures[3].cancel()
    d.mark_launched(futures[2].id)
    assert futures[2].wait() == rust.KernelState.Completed
    assert futures[3].try_get() == rust.KernelState.Cancelled
    stats = d.stream_stats(s)
    assert (stats["peak_in_flight"], stats["completed"], stats["cancelled"]) == (2, 3, 1)
    with pytest.raises(rust.InvalidTransitionError):
        d.mark_launched(futures[2].id)
    with pytest.raises(rust.UnknownIdError):
        d.state(10**9)


def test_a_launch_the_device_refuses_fails_its_future_only() -> None:
    d = rust.KernelDispatcher(4, backend="host")
    s = d.create_stream(max_in_flight=1)
    f = d.submit(s, 0xBAD, (1,), (32,), b"\0" * 8, [0])
    assert f.wait() == rust.KernelState.Failed
    assert "unknown host kernel" in d.info(f.id)["error"]
    assert d.stream_stats(s)["in_flight"] == 0
    with pytest.raises(rust.InvalidArgumentError, match="offsets"):
        d.submit(s, 1, (1,), (1,), b"\0" * 4, [4])
    with pytest.raises(rust.InvalidArgumentError, match="grid"):
        d.submit(s, 1, (), (1,), b"", [])
    with pytest.raises(rust.InvalidArgumentError, match="max_in_flight"):
        rust.KernelDispatcher(0, backend="host")


# --- GPU ----------------------------------------------------------------------------------------

SPIN = r"""
extern "C" __global__ void spin(long long cycles, int* out) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    if (threadIdx.x == 0) out[0] = 1;
}
"""

ADD_ONE = r"""
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


def _gpu() -> Any:
    import pygpukit as gp

    return gp


@pytest.mark.gpu
def test_gpu_evict_restore_round_trips_device_memory_bitwise() -> None:
    np = pytest.importorskip("numpy")
    from pygpukit.core import memory as core_memory
    from pygpukit.core.stream import Stream

    pool = rust.MemoryPool(64 * MB, enable_eviction=True, backend="cuda")
    assert pool.device.startswith("cuda")
    data = np.random.default_rng(0).integers(0, 256, size=24 * MB + 13, dtype=np.uint8).tobytes()
    block = pool.allocate(len(data))
    pool.write(block, data)
    in_use = core_memory.memory_stats()["in_use_bytes"]
    pool.evict(block)
    assert core_memory.memory_stats()["in_use_bytes"] <= in_use - len(data), "eviction frees device memory"
    # Quota pressure: two more 24 MiB blocks fit only while the evicted one stays out.
    others = [pool.allocate(24 * MB) for _ in range(2)]
    ptr = pool.restore(block)  # evicts the least recently used of the others
    assert sum(pool.get_block(o)["resident"] for o in others) == 1
    # Read back through core, independently of the pool's own copy path.
    host = np.empty(len(data), dtype=np.uint8)
    stream = Stream()
    core_memory.memcpy_device_to_host_async(int(host.ctypes.data), ptr, len(data), stream)
    stream.synchronize()
    assert host.tobytes() == data
    assert pool.read(block) == data
    for o in others:
        pool.free(o)
    pool.free(block)


@pytest.mark.gpu
def test_gpu_transfer_engine_overlaps_copies_with_compute() -> None:
    gp = _gpu()
    from pygpukit.core.memory import PinnedBuffer
    from pygpukit.core.stream import Event, Stream

    spin = gp.jit(SPIN, func="spin")
    flag = gp.zeros((1,), dtype=gp.int32)
    nbytes = 256 * MB
    pinned = PinnedBuffer(nbytes)
    dst = gp.empty((nbytes,), dtype=gp.uint8)
    engine = rust.AsyncTransferEngine(4, backend="cuda")
    compute = Stream()
    begin, end = Event(timing=True), Event(timing=True)
    begin.record(compute)
    spin(200_000_000, flag, grid=1, block=32, stream=compute)  # about 0.1 s
    end.record(compute)
    copies = [
        engine.enqueue_ptr("h2d", dst.device_ptr + i * (nbytes // 4), pinned.ptr + i * (nbytes // 4), nbytes // 4)
        for i in range(4)
    ]
    engine.synchronize()
    end.synchronize()
    k0, k1 = engine.event_time_ms(begin.handle), engine.event_time_ms(end.handle)
    spans = [(engine.status(c)["start_ms"], engine.status(c)["end_ms"]) for c in copies]
    c0, c1 = min(s for s, _ in spans), max(e for _, e in spans)
    overlap = min(k1, c1) - max(k0, c0)
    print(f"kernel [{k0:.2f}, {k1:.2f}] ms, copies [{c0:.2f}, {c1:.2f}] ms, overlap {overlap:.2f} ms")
    assert k1 - k0 > 20.0, "the kernel should run long enough to overlap"
    assert overlap >= 0.9 * (c1 - c0), "the copies ran while the kernel was running"
    assert flag.to_numpy()[0] == 1


@pytest.mark.gpu
def test_gpu_best_effort_stream_is_held_to_its_bandwidth_share_within_10_percent() -> None:
    gp = _gpu()
    chunk = 64 * MB
    src = gp.empty((chunk,), dtype=gp.uint8)
    dst = gp.empty((chunk,), dtype=gp.uint8)
    engine = rust.AsyncTransferEngine(2, backend="cuda")
    for _ in range(20):  # full speed, timed by the device's events
        engine.enqueue_d2d(dst.device_ptr, src.device_ptr, chunk)
    engine.synchronize()
    full = engine.stats()["d2d"]["bandwidth"]
    assert full > 0
    stream = engine.stream("d2d")
    pacer = rust.KernelPacingEngine(rust.PacingConfig(total_bandwidth=full, window_ms=5.0))
    share = 0.25
    pacer.allocate_stream(stream, share)
    moved = 0
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0:
        pacer.acquire(stream, chunk)
        engine.enqueue_d2d(dst.device_ptr, src.device_ptr, chunk)
        moved += chunk
    engine.synchronize()
    achieved = moved / (time.perf_counter() - start)
    ratio = achieved / (share * full)
    print(f"full {full / 1e9:.1f} GB/s, paced {achieved / 1e9:.1f} GB/s = {ratio:.3f} of the share")
    assert abs(ratio - 1.0) <= 0.10


@pytest.mark.gpu
def test_gpu_dispatcher_launches_kernels_under_the_limit_and_futures_resolve_by_events() -> None:
    gp = _gpu()
    np = pytest.importorskip("numpy")
    kernel = gp.jit(ADD_ONE, func="add_one")
    n = 4096
    x = gp.from_numpy(np.arange(n, dtype=np.float32))
    _, function, _ = kernel.load()
    params, packed = kernel.pack_arguments([x, n])
    offsets = list(struct.unpack(f"{len(packed) // 4}I", packed))
    d = rust.KernelDispatcher(2, backend="cuda")
    s = d.create_stream()
    futures = [d.submit(s, function, (n // 256,), (256,), params, offsets) for _ in range(6)]
    assert d.stream_stats(s)["in_flight"] <= 2
    assert [f.wait() for f in futures] == [rust.KernelState.Completed] * 6
    assert d.stream_stats(s)["peak_in_flight"] == 2
    np.testing.assert_array_equal(x.to_numpy(), np.arange(n, dtype=np.float32) + 6)


def test_cuda_backend_is_refused_without_a_gpu() -> None:
    from pygpukit.core.backend import current_backend

    if current_backend() == "cuda" or os.environ.get("PYGPUKIT_BACKEND") == "cuda":
        pytest.skip("a GPU is present")
    with pytest.raises(rust.InvalidArgumentError, match="cpu backend"):
        rust.MemoryPool(MB, backend="cuda")
