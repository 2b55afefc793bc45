"""pygpukit.scheduler execution contexts: budgets on real allocations, admission, sessions (sync and
async), stats, and bad input. Runs on the CPU backend in CI; the gpu-marked tests need the GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import scheduler as sched
from pygpukit.core.errors import ArgumentError
from pygpukit.scheduler import GB, MB, AdmissionError, ContextError, QuotaExceededError


@pytest.fixture(autouse=True)
def fresh_scheduler() -> Iterator[None]:
    sched.shutdown()
    sched.initialize(0, capacity=1 * GB)
    yield
    sched.shutdown()


def test_budget_holds_for_real_allocations_and_only_in_its_context() -> None:
    small = sched.create_context("small", max_vram=2 * MB)
    big = sched.create_context("big", max_vram=64 * MB)
    with sched.context_session(small):
        keep = gp.empty(MB, gp.uint8)
        assert small.used_bytes == MB
        with pytest.raises(QuotaExceededError) as caught:
            gp.empty(2 * MB, gp.uint8)
        assert caught.value.context == "small"
        assert caught.value.requested == 2 * MB
        assert caught.value.in_use == MB
        assert caught.value.limit == 2 * MB
        assert isinstance(caught.value, gp.OutOfMemoryError)
    with sched.context_session(big):
        other = gp.empty(16 * MB, gp.uint8)  # the other context is unaffected
    assert big.used_bytes == 16 * MB
    assert small.used_bytes == MB
    del keep, other
    assert small.used_bytes == 0
    assert big.used_bytes == 0
    outside = gp.empty(8 * MB, gp.uint8)  # outside any session nothing is charged
    assert small.used_bytes == 0
    del outside


def test_async_sessions_charge_each_task_to_its_own_context() -> None:
    llm = sched.create_context("llm", max_vram=8 * MB, qos="guaranteed")
    tts = sched.create_context("tts", max_vram=4 * MB)

    async def workload(ctx: sched.ExecutionContext, nbytes: int) -> gp.GPUArray:
        async with sched.context_session(ctx):
            await asyncio.sleep(0)
            array = gp.full(nbytes, 3, gp.uint8)
            assert gp.current_stream() is ctx.stream
            await ctx.wait()
            await asyncio.sleep(0)
            return array

    async def main() -> list[gp.GPUArray]:
        return list(await asyncio.gather(workload(llm, 3 * MB), workload(tts, 2 * MB)))

    arrays = asyncio.run(main())
    assert (llm.used_bytes, tts.used_bytes) == (3 * MB, 2 * MB)
    assert int(arrays[0].to_numpy()[-1]) == 3
    snapshot = {c["name"]: c for c in sched.stats().contexts}
    assert snapshot["llm"]["peak_bytes"] == 3 * MB
    assert snapshot["tts"]["allocations"] == 1


def test_guaranteed_admission_against_capacity() -> None:
    sched.create_context("a", max_vram=600 * MB, qos="guaranteed")
    with pytest.raises(AdmissionError, match="insufficient memory") as caught:
        sched.create_context("b", max_vram=600 * MB, qos="guaranteed")
    assert caught.value.reason == "insufficient_memory"
    sched.create_context("c", max_vram=600 * MB, qos="burstable")  # reserves nothing
    assert [c.name for c in sched.list_contexts()] == ["a", "c"]
    sched.destroy_context("a")
    sched.create_context("b", max_vram=600 * MB, qos="guaranteed")  # the reservation was released


def test_stats_table_is_readable() -> None:
    sched.create_context("llm", max_vram=GB // 2, qos="guaranteed", priority=2)
    sched.create_context("bg", max_vram=16 * MB, qos="best_effort")
    text = str(sched.stats())
    assert "capacity 1.00 GiB" in text
    assert "guaranteed reservations 512.00 MiB" in text
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["context", "qos", "prio"]
    assert lines[3].startswith("llm")
    assert lines[4].startswith("bg")


def test_bad_input_gives_typed_errors_and_changes_nothing() -> None:
    ctx = sched.create_context("x", max_vram=MB)
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ContextError, match="max_vram"):
            sched.create_context("y", max_vram=bad)  # type: ignore[arg-type]
    with pytest.raises(AdmissionError, match="exceeds the device's capacity"):
        sched.create_context("y", max_vram=2 * GB)
    with pytest.raises(AdmissionError, match="already exists"):
        sched.create_context("x", max_vram=MB)
    with pytest.raises(ContextError, match="qos"):
        sched.create_context("y", max_vram=MB, qos="platinum")  # type: ignore[arg-type]
    with pytest.raises(ContextError, match="non-empty name"):
        sched.create_context("", max_vram=MB)
    with pytest.raises(ContextError, match="no context named 'nope'"):
        sched.get_context("nope")
    assert [c.name for c in sched.list_contexts()] == ["x"]
    sched.destroy_context(ctx)
    with pytest.raises(ContextError, match="already destroyed"):
        sched.destroy_context("x")
    with pytest.raises(ContextError, match="was destroyed"):
        sched.context_session(ctx)
    with pytest.raises(ContextError, match="device_id"):
        sched.initialize(-1)


def test_destroyed_context_refuses_allocations_in_a_running_session() -> None:
    ctx = sched.create_context("gone", max_vram=8 * MB)
    with sched.context_session(ctx):
        gp.empty(MB, gp.uint8)
        sched.destroy_context(ctx)
        with pytest.raises(ContextError, match="was destroyed"):
            gp.empty(MB, gp.uint8)


def test_destroying_a_stale_context_leaves_the_newer_one_of_its_name_alive() -> None:
    old = sched.create_context("x", max_vram=600 * MB, qos="guaranteed")
    sched.destroy_context(old)
    new = sched.create_context("x", max_vram=600 * MB, qos="guaranteed")
    with pytest.raises(ContextError, match="already destroyed; the live context of that name is a newer one"):
        sched.destroy_context(old)
    assert sched.get_context("x") is new
    assert not new.destroyed
    with sched.context_session(new):
        keep = gp.empty(MB, gp.uint8)  # still charged to, and allowed by, the newer context
    assert new.used_bytes == MB
    with pytest.raises(AdmissionError, match="insufficient memory"):  # its reservation still holds
        sched.create_context("y", max_vram=600 * MB, qos="guaranteed")
    del keep
    sched.destroy_context(new)
    assert sched.list_contexts() == []


def test_a_context_from_before_shutdown_cannot_destroy_its_successor() -> None:
    before = sched.create_context("x", max_vram=MB)
    sched.shutdown()
    sched.initialize(0, capacity=1 * GB)
    after = sched.create_context("x", max_vram=MB)
    with pytest.raises(ContextError, match="already destroyed"):
        sched.destroy_context(before)
    assert sched.get_context("x") is after
    stranger = sched.ExecutionContext("x", MB, "burstable", 0, 0)  # never admitted
    with pytest.raises(ContextError, match="not the scheduler's context of that name"):
        sched.destroy_context(stranger)
    assert not after.destroyed


def test_wrong_argument_types_are_typed_errors() -> None:
    ctx = sched.create_context("x", max_vram=MB)
    for bad in ("x", None, 3, ctx):
        with pytest.raises(ArgumentError, match="wait needs a pygpukit Event or Stream, got"):
            asyncio.run(sched.wait(bad))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="get_context"):
        asyncio.run(sched.wait("x"))  # type: ignore[arg-type]
    for interval in (0, -1.0, "1", float("nan"), float("inf"), True):
        with pytest.raises(ArgumentError, match="poll_interval must be a positive, finite number"):
            asyncio.run(sched.wait(gp.Stream(), poll_interval=interval))  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match="max_interval must be a positive, finite number"):
            asyncio.run(sched.wait(gp.Stream(), max_interval=interval))  # type: ignore[arg-type]
    asyncio.run(sched.wait(gp.Stream(), poll_interval=1e-4, max_interval=1e-5))  # max below poll: fine
    for bad_ctx in (3, None, b"x"):
        with pytest.raises(ContextError, match="destroy_context needs an ExecutionContext or its name"):
            sched.destroy_context(bad_ctx)  # type: ignore[arg-type]
        with pytest.raises(ContextError, match="get_context needs a context name"):
            sched.get_context(bad_ctx)  # type: ignore[arg-type]
    with pytest.raises(ContextError, match="capacity"):
        sched.initialize(0, capacity=True)  # type: ignore[arg-type]
    assert [c.name for c in sched.list_contexts()] == ["x"]  # nothing changed


def test_uninitialised_scheduler_is_a_clear_error() -> None:
    sched.shutdown()
    with pytest.raises(ContextError, match="initialize"):
        sched.create_context("a", max_vram=MB)


def test_seed_example_runs_as_written() -> None:
    from pygpukit.scheduler import GB, context_session, create_context, initialize

    sched.shutdown()
    initialize(device_id=0)
    llm_ctx = create_context("llm", max_vram=4 * GB if sched.stats().capacity >= 6 * GB else 64 * MB)
    tts_ctx = create_context("tts", max_vram=2 * GB if sched.stats().capacity >= 6 * GB else 32 * MB)

    async def run_llm_inference() -> str:
        x = gp.from_numpy(np.arange(1024, dtype=np.float32))
        return f"llm {float(x.to_numpy().sum())}"

    async def run_tts_synthesis() -> str:
        return f"tts {gp.ones(256).to_numpy().size}"

    async def run_parallel() -> tuple[str, str]:
        async with context_session(llm_ctx), context_session(tts_ctx):
            llm_task = asyncio.create_task(run_llm_inference())
            tts_task = asyncio.create_task(run_tts_synthesis())
            text, audio = await asyncio.gather(llm_task, tts_task)
            return text, audio

    assert asyncio.run(run_parallel()) == ("llm 523776.0", "tts 256")


# -- GPU ----------------------------------------------------------------------------------------------
SPIN = r"""
extern "C" __global__ void spin(long long cycles, float* out) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}
"""


@pytest.mark.gpu
def test_gpu_kernels_of_two_contexts_overlap_in_time() -> None:
    kernel = gp.jit(SPIN, "spin")
    first = sched.create_context("first", max_vram=64 * MB)
    second = sched.create_context("second", max_vram=64 * MB)
    cycles = 200_000_000  # ~0.1 s at H100 clocks, one block: the GPU has room for both
    outs = []
    events = []
    for ctx in (first, second):
        with sched.context_session(ctx):
            out = gp.zeros(1)
            start, end = gp.Event(), gp.Event()
            start.record(ctx.stream)
            kernel(cycles, out, grid=1, block=32)
            end.record(ctx.stream)
            outs.append(out)
            events.append((start, end))
    for ctx in (first, second):
        ctx.synchronize()
    (s1, e1), (s2, _e2) = events
    alone = s1.elapsed_time(e1)
    # Overlap: the second kernel started before the first ended.
    assert s1.elapsed_time(s2) < alone * 0.5, (s1.elapsed_time(s2), alone)
    assert all(float(o.to_numpy()[0]) == 1.0 for o in outs)
