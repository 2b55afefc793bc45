"""Experiment: launch shapes of the K x N GEMV for some (K, N), device time per call from a CUDA-graph
replay rotating over copies of W larger than L2, next to torch: the global-memory split K of gemv_kn
(several lanes per row segment and blocks per SM) and, on SM 90+, the thread-block-cluster split of
gemv_kn_cluster (lanes L, cluster size C, loads in flight U). Run on the GPU machine:
``python benchmarks/tools/gemv_variants.py [K,N ...] [--quick]``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.ops.gemm import gemv_kernels as bg
from pygpukit.ops.gemm._base import PLANS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the suite's graph timers
from test_ops_gemm_builtin import GEMV_ITERATIONS as CALLS
from test_ops_gemm_builtin import L2_DEFEAT_BYTES, _gp_graph_time, _torch_graph_time

SHAPES = ((4096, 4096), (3584, 18944), (18944, 3584), (8192, 29568))


Plan = Callable[..., "bg._GemvPlan | None"]


def _fixed(plan: bg._GemvPlan | None) -> Plan:
    return lambda *args: plan


def _variants(quick: bool) -> list[tuple[str, Plan, Plan]]:
    """(name, _gemv_plan, _gemv_cluster_plan) triples; the first is what gemv does on this device."""
    ns = "pygpukit::ops::gemv::"
    sm90 = bg._gemv_plan(gp.bfloat16, 1, "kn", True)
    out: list[tuple[str, Plan, Plan]] = [
        ("gemv (plan of this device)", bg._gemv_plan, bg._gemv_cluster_plan),
        ("before SM 90 plan", _fixed(bg._gemv_plan(gp.bfloat16, 1, "kn", False)), _fixed(None)),
        ("SM 90 plan, split through global memory", _fixed(sm90), _fixed(None)),
    ]
    if not quick:
        for lanes, target in ((32, 1), (8, 1)):
            expression = f"{ns}gemv_kn<__nv_bfloat16, 1, 8, {lanes}>"
            plan = bg._GemvPlan(expression, lanes * 8, target, 64, 64 * (32 // lanes))
            out.append((f"{expression.split('::')[-1]} target={target}", _fixed(plan), _fixed(None)))
        for cluster, lanes, u in ((8, 16, 8), (8, 32, 8), (4, 16, 4), (2, 16, 4)):
            plan = bg._gemv_cluster_expression_plan(gp.bfloat16, cluster, lanes, u)
            out.append((f"SM 90 plan, split by {plan.expression.split('::')[-1]}", _fixed(sm90), _fixed(plan)))
    return out


def _shape(k: int, n: int, quick: bool, torch: Any) -> None:
    copies = max(1, -(-L2_DEFEAT_BYTES // (2 * k * n)))
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((k, n), dtype=np.float32) for _ in range(copies)]
    ws = [gp.from_numpy(h).astype(gp.bfloat16) for h in host]
    x = gp.from_numpy(rng.standard_normal((1, k), dtype=np.float32)).astype(gp.bfloat16)
    out = gp.empty((1, n), gp.bfloat16)
    stream = gp.Stream()
    tw = [torch.from_numpy(h).cuda().to(torch.bfloat16) for h in host]
    tx = torch.from_numpy(x.astype(gp.float32).to_numpy()).cuda().to(torch.bfloat16)

    def torch_calls() -> None:
        for i in range(CALLS):
            torch.matmul(tx, tw[i % copies])

    torch_us = min(_torch_graph_time(torch_calls) for _ in range(3)) / CALLS
    print(f"K={k} N={n}: torch {torch_us:.2f} us per call", flush=True)
    want = x.astype(gp.float32).to_numpy() @ host[(CALLS - 1) % copies].astype(np.float32)
    original = bg._gemv_plan, bg._gemv_cluster_plan
    try:
        for name, plan, cluster in _variants(quick):
            bg._gemv_plan, bg._gemv_cluster_plan = plan, cluster  # type: ignore[assignment]
            PLANS.clear()

            def calls() -> None:
                for i in range(CALLS):
                    bg.gemv(x, ws[i % copies], out, w_layout="kn", stream=stream)

            out.copy_(gp.full((1, n), float("nan"), gp.bfloat16))
            calls()
            stream.synchronize()
            got = out.astype(gp.float32).to_numpy()
            err = float(np.abs(got - want).max() / np.abs(want).max())
            us = min(_gp_graph_time(calls, stream) for _ in range(3)) / CALLS
            print(f"  {name}: {us:.2f} us ({2 * k * n / us / 1e3:.0f} GB/s, {torch_us / us:.3f}x torch)"
                  f" rel err {err:.1e}", flush=True)  # fmt: skip
    finally:
        bg._gemv_plan, bg._gemv_cluster_plan = original
        PLANS.clear()


def main() -> None:
    import torch

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    shapes = [tuple(int(v) for v in a.split(",")) for a in args] or list(SHAPES)
    for k, n in shapes:
        _shape(k, n, quick, torch)


if __name__ == "__main__":
    main()
