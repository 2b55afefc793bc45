"""Experiment: launch shapes of the K x N GEMV (gemv_kn) for one (K, N), device time per call from a
CUDA-graph replay rotating over copies of W larger than L2, next to torch. Run on the GPU machine:
``python benchmarks/tools/gemv_variants.py [K N]``."""

from __future__ import annotations

import sys

import numpy as np

import pygpukit as gp
from pygpukit.ops import _builtin_gemm as bg

CALLS = 50


def graph_us(calls, stream) -> float:  # type: ignore[no-untyped-def]
    graph = gp.CudaGraph()
    with graph.capture(stream=stream):
        calls()
    best = float("inf")
    for _ in range(5):
        graph.replay()
        stream.synchronize()
        start, end = gp.Event(), gp.Event()
        start.record(stream)
        for _ in range(4):
            graph.replay()
        end.record(stream)
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0 / 4 / CALLS)
    return best


def main() -> None:
    import torch

    k, n = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (4096, 4096)
    copies = max(1, -(-(256 << 20) // (2 * k * n)))
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((k, n), dtype=np.float32) for _ in range(copies)]
    ws = [gp.from_numpy(h).astype(gp.bfloat16) for h in host]
    x = gp.from_numpy(rng.standard_normal((1, k), dtype=np.float32)).astype(gp.bfloat16)
    out = gp.empty((1, n), gp.bfloat16)
    stream = gp.Stream()
    tw = [torch.from_numpy(h).cuda().to(torch.bfloat16) for h in host]
    tx = torch.from_numpy(x.astype(gp.float32).to_numpy()).cuda().to(torch.bfloat16)
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        for i in range(CALLS):
            torch.matmul(tx, tw[i % copies])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(CALLS):
            torch.matmul(tx, tw[i % copies])
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(4):
        g.replay()
    e.record()
    e.synchronize()
    print(f"K={k} N={n}: torch {s.elapsed_time(e) * 1000 / 4 / CALLS:.2f} us per call", flush=True)
    original = bg._gemv_plan
    plans = [
        bg._GemvPlan(f"pygpukit::ops::gemv::gemv_kn<__nv_bfloat16, 1, {u}, {lanes}>", lanes * 8, target, 64,
                     u * 8 * (32 // lanes))
        for lanes in (32, 16, 8) for u in (4, 8) for target in (1, 2)
    ]  # fmt: skip
    # The tensor-core kernel of 2 to 8 rows, with one row (the other seven are zeros).
    plans += [bg._GemvPlan("pygpukit::ops::gemv::gemv_kn_mma<__nv_bfloat16, 1>", 64, target, 256)
              for target in (1, 2, 4)]  # fmt: skip
    for plan in plans:
        bg._gemv_plan = lambda *a, plan=plan: plan  # type: ignore[misc]
        bg._gemv_launches.clear()

        def calls() -> None:
            for i in range(CALLS):
                bg.gemv(x, ws[i % copies], out, w_layout="kn", stream=stream)

        calls()
        stream.synchronize()
        got = out.astype(gp.float32).to_numpy()
        want = x.astype(gp.float32).to_numpy() @ host[(CALLS - 1) % copies].astype(np.float32)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        us = graph_us(calls, stream)
        name = plan.expression.split("::")[-1]
        print(f"  {name} target={plan.target}: {us:.2f} us ({2 * k * n / us / 1e3:.0f} GB/s) rel err {err:.1e}",
              flush=True)  # fmt: skip
    bg._gemv_plan = original


if __name__ == "__main__":
    main()
