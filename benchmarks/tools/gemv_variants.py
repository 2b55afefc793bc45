"""Experiment: launch shapes of the K x N GEMV (gemv_kn) for one (K, N), device time per call from a
CUDA-graph replay rotating over copies of W larger than L2, next to torch. Run on the GPU machine:
``python benchmarks/tools/gemv_variants.py [K N]``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import pygpukit as gp
from pygpukit.ops import _builtin_gemm as bg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the suite's graph timers
from test_ops_gemm_builtin import GEMV_ITERATIONS as CALLS
from test_ops_gemm_builtin import _gp_graph_time, _torch_graph_time


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
    torch_us = _torch_graph_time(lambda: [torch.matmul(tx, tw[i % copies]) for i in range(CALLS)]) / CALLS
    print(f"K={k} N={n}: torch {torch_us:.2f} us per call", flush=True)
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
        us = _gp_graph_time(calls, stream) / CALLS
        name = plan.expression.split("::")[-1]
        print(f"  {name} target={plan.target}: {us:.2f} us ({2 * k * n / us / 1e3:.0f} GB/s) rel err {err:.1e}",
              flush=True)  # fmt: skip
    bg._gemv_plan = original


if __name__ == "__main__":
    main()
