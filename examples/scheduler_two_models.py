"""Two workloads sharing one GPU under VRAM budgets, concurrently with asyncio.

    python examples/scheduler_two_models.py

A "model" here is a chain of element-wise and matmul work on its own context: each context has a
budget (the LLM's is guaranteed), its own stream, and every allocation inside its session is charged
to it. The TTS workload then tries to take more than its budget and is refused, in its context only,
while the LLM keeps running. Works on the CPU backend too (no GPU needed).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

import pygpukit as gp
from pygpukit import scheduler
from pygpukit.scheduler import MB, QuotaExceededError, context_session, create_context, initialize


async def llm(ctx: scheduler.ExecutionContext, steps: int) -> float:
    async with context_session(ctx):
        rng = np.random.default_rng(0)
        w = gp.from_numpy(rng.standard_normal((256, 256)).astype(np.float32))
        x = gp.from_numpy(rng.standard_normal((8, 256)).astype(np.float32))
        for _ in range(steps):
            x = gp.ops.matmul(x, w) * 0.05
            await ctx.wait()  # yields to the event loop until the GPU has finished this step
        return float(x.to_numpy().sum())


async def tts(ctx: scheduler.ExecutionContext, steps: int) -> str:
    async with context_session(ctx):
        audio = gp.zeros(1 << 18)  # 1 MiB of float32 samples
        for _ in range(steps):
            audio = audio + 1.0
            await ctx.wait()
        try:
            gp.empty(64 * MB, gp.uint8)  # over this context's budget
        except QuotaExceededError as error:
            return f"refused as expected: {error}"
        return "not refused?"


async def main() -> None:
    initialize(device_id=0)
    llm_ctx = create_context("llm", max_vram=32 * MB, qos="guaranteed")
    tts_ctx = create_context("tts", max_vram=8 * MB, qos="best_effort")
    start = time.perf_counter()
    total, message = await asyncio.gather(llm(llm_ctx, 20), tts(tts_ctx, 20))
    print(f"llm result {total:.4f}; tts {message}")
    print(f"both finished in {time.perf_counter() - start:.3f} s")
    print(scheduler.stats())


if __name__ == "__main__":
    asyncio.run(main())
