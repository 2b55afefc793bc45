"""Issue 23, items 1-3: budgets kept in Rust, partitions enforced on real allocations and streams,
pacing applied to every launch on a paced stream. CPU-backend tests of each enforcement; the
gpu-marked ones do the same on the device (kernel launches through the JIT fast path)."""

from __future__ import annotations

import functools
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import _pygpukit_rust as rust
import pygpukit as gp
from pygpukit import scheduler as sched
from pygpukit.core import stream as stream_module
from pygpukit.core.errors import DeviceResetError
from pygpukit.scheduler import GB, MB, ContextError, PacedStream, QuotaExceededError


@pytest.fixture(autouse=True)
def fresh_scheduler() -> Iterator[None]:
    sched.shutdown()
    sched.initialize(0, capacity=1 * GB, launch_rate=1000.0)
    yield
    sched.shutdown()


def _manager(total: int = 64 * MB, *, allow_overcommit: bool = False, ratio: float = 1.0) -> rust.PartitionManager:
    config = rust.PartitionConfig(total_memory=total, allow_overcommit=allow_overcommit, overcommit_ratio=ratio)
    return rust.PartitionManager(config)


# -- item 1: budgets, admission and accounting in Rust ----------------------------------------------
def test_context_accounting_is_rusts_and_matches_a_reference_on_random_sizes() -> None:
    ctx = sched.create_context("acct", max_vram=4 * MB)
    assert isinstance(ctx.budget, rust.ContextBudget)
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 512 * 1024, size=200)
    live: list[tuple[gp.GPUArray, int]] = []
    reference = np.int64(0)
    refused: list[tuple[str | None, int, bool]] = []
    with sched.context_session(ctx):
        for size in sizes:
            if live and rng.random() < 0.4:
                array, nbytes = live.pop(int(rng.integers(len(live))))
                del array
                reference -= nbytes
            try:
                live.append((gp.empty(int(size), gp.uint8), int(size)))
                reference += int(size)
            except QuotaExceededError as error:
                refused.append((error.context, error.in_use - int(reference), int(reference) + int(size) > 4 * MB))
            assert ctx.used_bytes == int(reference) <= 4 * MB
    assert refused  # the budget was reached on this data
    assert all(r == ("acct", 0, True) for r in refused)  # refused exactly when the reference says
    usage = ctx.budget.usage()
    assert usage["refused"] == len(refused)
    assert usage["allocations"] == len(sizes) - len(refused)
    live.clear()
    assert ctx.used_bytes == 0


def test_rust_errors_are_the_schedulers_typed_errors() -> None:
    assert sched.QuotaExceededError is rust.BudgetExceededError
    assert issubclass(sched.QuotaExceededError, gp.QuotaExceededError)
    assert sched.ContextError is rust.ContextError
    ctx = sched.create_context("x", max_vram=MB)
    with pytest.raises(QuotaExceededError, match=r"context 'x': allocating 2.00 MiB would exceed its budget"):
        ctx.budget.charge(2 * MB)
    sched.destroy_context(ctx)
    with pytest.raises(ContextError, match="was destroyed"):
        ctx.budget.charge(1)


# -- item 2: partitions ---------------------------------------------------------------------------
def test_an_allocation_past_a_partition_limit_fails_there_only_and_usage_is_real() -> None:
    manager = _manager()
    manager.create_partition("llm", "LLM", rust.PartitionLimits().memory(8 * MB).compute(0.5))
    manager.create_partition("tts", "TTS", rust.PartitionLimits().memory(8 * MB).compute(0.25))
    with sched.partition_session(manager, "llm"):
        keep = gp.full(6 * MB, 1, gp.uint8)
        assert manager.get_partition("llm")["memory_used"] == 6 * MB
        with pytest.raises(QuotaExceededError) as caught:
            gp.empty(4 * MB, gp.uint8)
        assert (caught.value.partition, caught.value.context) == ("llm", None)
        assert (caught.value.requested, caught.value.in_use, caught.value.limit) == (4 * MB, 6 * MB, 8 * MB)
        assert isinstance(caught.value, gp.OutOfMemoryError)
    with sched.partition_session(manager, "tts"):
        other = gp.full(7 * MB, 2, gp.uint8)  # the other partition is intact
    assert manager.get_partition("llm")["memory_used"] == 6 * MB
    assert manager.get_partition("tts")["memory_used"] == 7 * MB
    assert manager.stats()["memory_used"] == 13 * MB
    assert int(keep.to_numpy().sum()) == 6 * MB  # the refused allocation left the data alone
    assert int(other.to_numpy()[-1]) == 2
    del keep, other
    assert manager.stats()["memory_used"] == 0
    gp.empty(32 * MB, gp.uint8)  # outside any session nothing is charged
    assert manager.stats()["memory_used"] == 0


def test_overcommit_lets_limits_exceed_the_device_but_never_real_use() -> None:
    manager = _manager(16 * MB, allow_overcommit=True, ratio=1.5)
    for pid in ("a", "b", "c"):
        manager.create_partition(pid, pid, rust.PartitionLimits().memory(8 * MB))  # 24 MiB of limits
    held = []
    for pid in ("a", "b"):
        with sched.partition_session(manager, pid):
            held.append(gp.empty(8 * MB, gp.uint8))
    with sched.partition_session(manager, "c"), pytest.raises(QuotaExceededError, match="exceed the device"):
        gp.empty(MB, gp.uint8)  # within c's limit, past the device
    held.pop()
    with sched.partition_session(manager, "c"):
        held.append(gp.empty(8 * MB, gp.uint8))
    assert [manager.get_partition(p)["memory_used"] for p in "abc"] == [8 * MB, 0, 8 * MB]
    strict = _manager(16 * MB)
    strict.create_partition("a", "a", rust.PartitionLimits().memory(12 * MB))
    with pytest.raises(rust.InvalidArgumentError, match="add up"):
        strict.create_partition("b", "b", rust.PartitionLimits().memory(8 * MB))


def test_a_context_in_a_partition_is_held_to_both() -> None:
    manager = _manager()
    manager.create_partition("p", "P", rust.PartitionLimits().memory(10 * MB))
    a = sched.create_context("a", max_vram=8 * MB, partition=(manager, "p"))
    b = sched.create_context("b", max_vram=8 * MB, partition=(manager, "p"))
    with pytest.raises(sched.AdmissionError) as caught:
        sched.create_context("big", max_vram=16 * MB, partition=(manager, "p"))
    assert caught.value.reason == "partition_limit"
    with pytest.raises(ContextError, match=r"unknown partition id \"zzz\""):
        sched.create_context("nowhere", max_vram=MB, partition=(manager, "zzz"))
    with sched.context_session(a):
        keep = gp.empty(6 * MB, gp.uint8)
    with sched.context_session(b), pytest.raises(QuotaExceededError) as refused:
        gp.empty(6 * MB, gp.uint8)  # fits b's budget, not the partition
    assert (refused.value.context, refused.value.partition) == ("b", "p")
    assert (a.used_bytes, b.used_bytes, manager.get_partition("p")["memory_used"]) == (6 * MB, 0, 6 * MB)
    del keep
    assert manager.get_partition("p")["memory_used"] == 0


def test_partition_streams_are_prioritised_and_paced_by_compute_share() -> None:
    manager = _manager()
    manager.create_partition("fast", "F", rust.PartitionLimits().memory(MB).compute(0.8))
    manager.create_partition("none", "N", rust.PartitionLimits().memory(MB))
    with sched.partition_session(manager, "fast") as stream:
        assert gp.current_stream() is stream
        assert isinstance(stream, PacedStream)
        assert stream.share == 0.8
        assert stream.priority == -4
    assert sched.partition_stream(manager, "fast") is stream
    plain = sched.partition_stream(manager, "none")
    assert type(plain) is gp.Stream
    with pytest.raises(ContextError, match="no partition 'zzz'"):
        sched.partition_session(manager, "zzz")
    with pytest.raises(ContextError, match="needs a PartitionManager"):
        sched.partition_session("m", "fast")


# -- item 3: pacing ---------------------------------------------------------------------------------
def _run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> None:
    """Runs each target in its own thread and joins them. An exception in a worker is re-raised here,
    in the test's thread (pytest would only warn about it, leaving the counts at zero), and a worker
    still running after ``timeout`` seconds fails the test with the stack it is stuck in."""
    errors: list[tuple[str, BaseException]] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # handed to the test's thread below
            errors.append((threading.current_thread().name, error))

    threads = [threading.Thread(target=guarded, args=(t,), name=f"worker-{i}") for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + timeout
    for t in threads:
        t.join(max(deadline - time.perf_counter(), 0.0))
    stuck = [t for t in threads if t.is_alive()]
    if stuck:
        frames = sys._current_frames()
        stacks = "\n".join(
            f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}" for t in stuck if t.ident in frames
        )
        raise AssertionError(f"{len(stuck)} worker thread(s) still running after {timeout} s:\n{stacks}")
    if errors:
        name, error = errors[0]
        raise AssertionError(f"worker thread {name} raised {type(error).__name__}: {error}") from error


def _launch_counts(streams: list[gp.Stream], seconds: float, window: float) -> list[list[int]]:
    """Each stream issues 'launches' as fast as it may from its own thread: every launch path
    resolves the stream's handle (the JIT launcher reads ``_handle``, cuBLASLt and graph launches
    ``handle``), which is where a paced stream takes its token. Counts per window."""
    counts = [[0] * int(seconds / window) for _ in streams]
    start = time.perf_counter() + 0.05
    barrier = threading.Barrier(len(streams))

    def run(i: int, stream: gp.Stream) -> None:
        barrier.wait()
        while True:
            stream._handle  # noqa: B018
            t = time.perf_counter() - start
            if t >= seconds:
                return
            if t >= 0:
                counts[i][int(t / window)] += 1

    _run_threads([functools.partial(run, i, s) for i, s in enumerate(streams)])
    return counts


def test_paced_shares_hold_within_ten_percent_over_two_second_windows() -> None:
    fg = sched.create_context("fg", max_vram=MB, qos="guaranteed", compute_share=0.6)
    bg = sched.create_context("bg", max_vram=MB, qos="best_effort", compute_share=0.25)
    streams = [fg.stream, bg.stream]
    assert all(isinstance(s, PacedStream) for s in streams)
    counts = _launch_counts(streams, 4.0, 2.0)
    for share, per_window in zip((0.6, 0.25), counts, strict=True):
        expected = share * 1000.0 * 2.0
        burst = share * 1000.0 * 0.1  # the bucket starts full (100 ms of the rate)
        first, second = per_window
        assert abs(first - burst - expected) <= 0.1 * expected, (share, per_window)
        assert abs(second - expected) <= 0.1 * expected, (share, per_window)
    stats = {c["name"]: c for c in sched.stats().contexts}
    assert stats["bg"]["throttled"] > 0
    assert stats["bg"]["launches"] >= sum(counts[1])
    table = str(sched.stats()).splitlines()
    assert table[1].split()[-3:] == ["share", "launches", "throttled"]
    assert table[3].split()[-3:] == ["0.6", str(stats["fg"]["launches"]), str(stats["fg"]["throttled"])]


def test_a_worker_exception_is_reraised_in_the_test_thread() -> None:
    def bad() -> None:
        raise QuotaExceededError("over budget: 4096 bytes")

    with pytest.raises(AssertionError, match=f"worker-1 raised {QuotaExceededError.__name__}: over budget: 4096 bytes"):
        _run_threads([lambda: None, bad])


def test_unpaced_contexts_keep_plain_streams_and_synchronising_takes_no_token() -> None:
    ctx = sched.create_context("free", max_vram=MB)
    assert type(ctx.stream) is gp.Stream  # nothing on the launch path of an unpaced context
    paced = sched.create_context("paced", max_vram=MB, compute_share=0.001)  # 1 launch/s
    stream = paced.stream
    assert isinstance(stream, PacedStream)
    stream._handle  # noqa: B018 - one launch: the next one would wait about a second
    begin = time.perf_counter()
    for _ in range(100):
        stream.synchronize()
        stream.query()
        with stream:
            pass
    assert time.perf_counter() - begin < 0.5  # none of these waited for a token
    with pytest.raises(rust.InvalidArgumentError):
        PacedStream(1.5, 1000.0)
    with pytest.raises(ContextError, match="compute_share"):
        sched.create_context("bad", max_vram=MB, compute_share=2.0)
    with pytest.raises(ContextError, match="launch_rate"):
        sched.initialize(0, launch_rate=0)


def test_a_paced_stream_can_still_be_invalidated_by_a_device_reset() -> None:
    stream: gp.Stream = PacedStream(0.5, 1000.0)
    stream._reset = -1
    del stream._handle
    stream.__class__ = stream_module._ResetStream  # what invalidate_device does
    with pytest.raises(DeviceResetError):
        stream.handle  # noqa: B018


# -- 10k tasks with random cancels ------------------------------------------------------------------
def test_ten_thousand_tasks_with_random_cancels_lose_nothing() -> None:
    manager = _manager(256 * MB)
    manager.create_partition("p", "P", rust.PartitionLimits().memory(24 * MB))
    contexts = [
        sched.create_context("g", max_vram=16 * MB, qos="guaranteed", partition=(manager, "p")),
        sched.create_context("b", max_vram=8 * MB, qos="burstable"),
        sched.create_context("e", max_vram=4 * MB, qos="best_effort", partition=(manager, "p")),
    ]
    tally = {"done": 0, "cancelled": 0, "refused": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        held: list[gp.GPUArray] = []
        for _ in range(2500):
            ctx = contexts[int(rng.integers(3))]
            outcome = "done"
            with sched.context_session(ctx):
                try:
                    array = gp.empty(int(rng.integers(1, 256 * 1024)), gp.uint8)
                except QuotaExceededError:
                    outcome = "refused"
                else:
                    if rng.random() < 0.2:
                        outcome = "cancelled"  # dropped at once
                    else:
                        held.append(array)
                    del array
            if len(held) > 8 or (held and rng.random() < 0.3):
                held.pop(int(rng.integers(len(held))))
            with lock:
                tally[outcome] += 1
        held.clear()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(tally.values()) == 10_000
    assert tally["cancelled"] > 0
    usages = [c.budget.usage() for c in contexts]
    assert sum(u["allocations"] for u in usages) == tally["done"] + tally["cancelled"]
    assert sum(u["refused"] for u in usages) == tally["refused"]
    assert all(u["used_bytes"] == 0 for u in usages)
    assert manager.stats()["memory_used"] == 0


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_partition_limit_refuses_real_device_allocations_in_that_partition_only() -> None:
    manager = _manager(512 * MB)
    manager.create_partition("a", "A", rust.PartitionLimits().memory(64 * MB))
    manager.create_partition("b", "B", rust.PartitionLimits().memory(64 * MB))
    with sched.partition_session(manager, "a"):
        x = gp.from_numpy(np.ones(12 * MB, np.float32))  # 48 MiB on the device
        with pytest.raises(QuotaExceededError):
            gp.empty(32 * MB, gp.uint8)
    with sched.partition_session(manager, "b"):
        y = gp.from_numpy(np.full(12 * MB, 2.0, np.float32))
    assert manager.get_partition("a")["memory_used"] == 48 * MB
    assert manager.get_partition("b")["memory_used"] == 48 * MB
    np.testing.assert_array_equal((x + y).to_numpy()[:4], np.full(4, 3.0, np.float32))
    del x, y
    assert manager.stats()["memory_used"] == 0
