"""Issue 21, item 5: concurrency of the scheduler's execution contexts. Many asyncio tasks and threads
working at once in sessions of several contexts: each task's results are checked (no cross-talk), each
allocation is charged to its own session's context and to no other, no budget is exceeded at any time,
a refusal in one context leaves the others running, nothing deadlocks (time limits), and every charge is
refunded at the end. Runs on the CPU backend in CI and unchanged on the GPU.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import traceback
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import pygpukit as gp
from pygpukit import scheduler as sched
from pygpukit.scheduler import GB, MB, QuotaExceededError

TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def fresh_scheduler() -> Iterator[None]:
    sched.shutdown()
    sched.initialize(0, capacity=1 * GB)
    yield
    sched.shutdown()


def _contexts() -> list[sched.ExecutionContext]:
    return [
        sched.create_context("llm", max_vram=32 * MB, qos="guaranteed"),
        sched.create_context("asr", max_vram=16 * MB, qos="burstable"),
        sched.create_context("tts", max_vram=8 * MB, qos="burstable"),
        sched.create_context("batch", max_vram=4 * MB, qos="best_effort"),
    ]


def test_many_asyncio_tasks_in_several_contexts() -> None:
    contexts = _contexts()
    per_context, rounds = 8, 6
    peaks = {c.name: 0 for c in contexts}
    refusals = {c.name: 0 for c in contexts}

    async def task(ctx: sched.ExecutionContext, index: int) -> float:
        rng = np.random.default_rng(index)
        held: list[gp.GPUArray] = []
        total = 0.0
        async with sched.context_session(ctx):
            for step in range(rounds):
                # At most two blocks of budget/32 per task: 8 tasks stay within the budget.
                nbytes = int(rng.integers(1, ctx.max_vram // 32 // 4)) * 4
                held.append(gp.full(nbytes // 4, float(index + step), gp.float32))
                if len(held) > 2:
                    held.pop(0)
                values = rng.standard_normal((16, 16)).astype(np.float32)
                x = gp.from_numpy(values)
                # Elementwise ops and reductions only: a GEMM may take a per-stream cuBLASLt workspace
                # (32 MiB) larger than the small budgets here.
                y = gp.sum(gp.exp(x * 0.5) * x, axis=0)
                await ctx.wait()
                assert gp.current_stream() is ctx.stream
                wide = values.astype(np.float64)
                np.testing.assert_allclose(y.to_numpy(), (np.exp(wide * 0.5) * wide).sum(axis=0), rtol=1e-5, atol=1e-5)
                total += float(gp.max(held[-1]).to_numpy())
                peaks[ctx.name] = max(peaks[ctx.name], ctx.used_bytes)
                assert ctx.used_bytes <= ctx.max_vram
                if step == rounds // 2 and index % 4 == 0:  # over the budget: refused here only
                    with pytest.raises(QuotaExceededError) as caught:
                        gp.empty(ctx.max_vram, gp.uint8)
                    assert caught.value.context == ctx.name
                    refusals[ctx.name] += 1
                await asyncio.sleep(0)
        return total

    async def main() -> list[float]:
        jobs = [task(c, i) for c in contexts for i in range(per_context)]
        return await asyncio.wait_for(asyncio.gather(*jobs), TIMEOUT)

    results = asyncio.run(main())
    expected = [float(sum(i + s for s in range(rounds))) for _ in contexts for i in range(per_context)]
    # Each task's result is the sum of the last fill value it read, which is i + step every step.
    assert results == expected
    gc.collect()
    for ctx in contexts:
        assert ctx.used_bytes == 0, f"{ctx.name}: {ctx.used_bytes} bytes still charged"
        assert 0 < peaks[ctx.name] <= ctx.max_vram
        assert refusals[ctx.name] == per_context // 4
        assert ctx.snapshot()["refused"] == refusals[ctx.name]


def run_threads(workers: list[Callable[[], None]]) -> None:
    errors: list[str] = []

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException:
                errors.append(traceback.format_exc())

        return run

    threads = [threading.Thread(target=guarded(w), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not [t for t in threads if t.is_alive()], f"threads still running after {TIMEOUT} s (deadlock?)"
    assert not errors, "\n".join(errors)


def test_threads_charge_their_own_context_only() -> None:
    contexts = _contexts()
    start = threading.Barrier(len(contexts) + 1)
    baseline = gp.memory_stats()["in_use_bytes"]

    def in_session(ctx: sched.ExecutionContext) -> Callable[[], None]:
        def run() -> None:
            rng = np.random.default_rng(len(ctx.name))
            start.wait(TIMEOUT)
            with sched.context_session(ctx):
                for _ in range(50):
                    held = [gp.empty(int(rng.integers(1, 64)) * 1024, gp.uint8) for _ in range(3)]
                    # Only this thread charges this context, so its usage is exactly what it holds.
                    assert ctx.used_bytes == sum(a.nbytes for a in held)
                    assert gp.current_stream() is ctx.stream
                    del held
                    assert ctx.used_bytes == 0

        return run

    def outside() -> None:  # allocations outside any session are charged to no context
        start.wait(TIMEOUT)
        for _ in range(50):
            block = gp.empty(2 * MB, gp.uint8)
            assert block.nbytes == 2 * MB

    run_threads([*(in_session(c) for c in contexts), outside])
    gc.collect()
    for ctx in contexts:
        assert ctx.used_bytes == 0
        assert ctx.snapshot()["sessions"] == 0
    assert gp.memory_stats()["in_use_bytes"] == baseline


def test_event_loops_in_threads_share_contexts_without_deadlock() -> None:
    contexts = _contexts()

    def loop_thread(seed: int) -> Callable[[], None]:
        async def job(ctx: sched.ExecutionContext) -> None:
            async with sched.context_session(ctx):
                for step in range(10):
                    x = gp.full(1024, float(step + seed), gp.float32)
                    await ctx.wait()
                    assert float(gp.sum(x).to_numpy()) == 1024.0 * (step + seed)

        def run() -> None:
            async def main() -> None:
                await asyncio.wait_for(asyncio.gather(*(job(c) for c in contexts)), TIMEOUT)

            asyncio.run(main())

        return run

    run_threads([loop_thread(s) for s in range(4)])
    gc.collect()
    assert all(c.used_bytes == 0 for c in contexts)
