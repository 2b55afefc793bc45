"""Where the host time of a tiny op goes: per-call cost of gp.add on 16 float32 elements and of its parts
(allocation, launch), then a cProfile of the calls. Run on the GPU machine:
``python benchmarks/tools/profile_tiny_ops.py``."""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable

import numpy as np

import pygpukit as gp
from pygpukit.ops._kernels import grid_for

CALLS = 20000


def per_call(label: str, fn: Callable[[], object]) -> None:
    for _ in range(200):
        fn()
    gp.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        gp.synchronize()
        best = min(best, (time.perf_counter() - start) / CALLS)
    print(f"{label:<40} {best * 1e6:7.2f} us")


def main() -> None:
    a = gp.from_numpy(np.arange(16, dtype=np.float32))
    b = gp.from_numpy(np.ones(16, dtype=np.float32))
    out = gp.empty(16, gp.float32)
    gp.add(a, b)
    per_call("gp.add(a, b)", lambda: gp.add(a, b))
    per_call("a + b", lambda: a + b)
    per_call("gp.add(a, b, out=out)", lambda: gp.add(a, b, out=out))
    per_call("gp.empty(16, float32)", lambda: gp.empty(16, gp.float32))
    per_call("grid_for(4)", lambda: grid_for(4))
    # The benchmark's form: ``a + b`` inside ``with stream:`` (a non-default stream).
    stream = gp.Stream()
    with stream:
        per_call("a + b, with stream", lambda: a + b)
        per_call("gp.empty(16), with stream", lambda: gp.empty(16, gp.float32))
        per_call("gp.add(a, b, out=out), with stream", lambda: gp.add(a, b, out=out))
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(CALLS):
            a + b
        profile.disable()
    stream.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    try:
        import cupy as cp

        ca = cp.arange(16, dtype=cp.float32)
        cb = cp.ones(16, dtype=cp.float32)
        per_call("cupy.add(a, b)", lambda: cp.add(ca, cb))
        per_call("cupy.empty(16)", lambda: cp.empty(16, cp.float32))
        cstream = cp.cuda.Stream(non_blocking=True)
        with cstream:
            per_call("cupy a + b, with stream", lambda: ca + cb)
        cstream.synchronize()
    except ImportError:
        pass
    try:
        import torch

        ta = torch.arange(16, dtype=torch.float32, device="cuda")
        tb = torch.ones(16, dtype=torch.float32, device="cuda")
        per_call("torch.add(a, b)", lambda: torch.add(ta, tb))
    except ImportError:
        pass
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        gp.add(a, b)
    profile.disable()
    gp.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)

    # The decode GEMV's host path: is a 4096 x 4096 bf16 GEMV (about 15 us on the GPU) host-bound?
    rng = np.random.default_rng(0)
    x = gp.from_numpy(rng.standard_normal((1, 4096), dtype=np.float32)).astype(gp.bfloat16)
    w = gp.from_numpy(rng.standard_normal((4096, 4096), dtype=np.float32)).astype(gp.bfloat16)
    y = gp.empty((1, 4096), gp.bfloat16)
    per_call("gemv kn 4096x4096 bf16 (host + GPU)", lambda: gp.gemv(x, w, y, w_layout="kn"))
    per_call("gp.matmul (1, 4096) @ (4096, 4096) bf16", lambda: gp.matmul(x, w))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        gp.gemv(x, w, y, w_layout="kn")
    profile.disable()
    gp.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)

    # The same with a weight small enough for the host path to be all of it.
    xs = gp.from_numpy(rng.standard_normal((1, 256), dtype=np.float32)).astype(gp.bfloat16)
    ws = gp.from_numpy(rng.standard_normal((256, 256), dtype=np.float32)).astype(gp.bfloat16)
    ys = gp.empty((1, 256), gp.bfloat16)
    per_call("gemv kn 256x256 bf16, out given", lambda: gp.gemv(xs, ws, ys, w_layout="kn"))
    per_call("gp.matmul (1, 256) @ (256, 256) bf16", lambda: gp.matmul(xs, ws))
    per_call("gp.matmul (1, 256) @ (256, 256).T bf16", lambda: gp.matmul(xs, ws.T))
    per_call("gp.matmul, out given", lambda: gp.matmul(xs, ws, out=ys))
    per_call("x @ w", lambda: xs @ ws)
    wt = gp.from_numpy(rng.standard_normal((256, 256), dtype=np.float32)).astype(gp.bfloat16)
    per_call("gp.linear(x, w (256, 256))", lambda: gp.linear(xs, wt))
    per_call("gp.empty((1, 256), bfloat16)", lambda: gp.empty((1, 256), gp.bfloat16))
    try:
        import torch

        txs = torch.from_numpy(xs.astype(gp.float32).to_numpy()).cuda().to(torch.bfloat16)
        tws = torch.from_numpy(ws.astype(gp.float32).to_numpy()).cuda().to(torch.bfloat16)
        per_call("torch x @ w (1, 256) @ (256, 256)", lambda: txs @ tws)
    except ImportError:
        pass
    try:
        import cupy as cp

        cxs, cws = cp.asarray(xs.astype(gp.float32).to_numpy()), cp.asarray(ws.astype(gp.float32).to_numpy())
        per_call("cupy x @ w float32 (1, 256) @ (256, 256)", lambda: cxs @ cws)
    except ImportError:
        pass
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        gp.matmul(xs, ws)
    profile.disable()
    gp.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)

    # Host cost of a reduction's Python path (on a tiny input the GPU time is negligible).
    small = gp.from_numpy(rng.standard_normal(1024, dtype=np.float32)).astype(gp.bfloat16)
    per_call("gp.sum(1024 bf16)", lambda: gp.sum(small))
    per_call("gp.softmax(1024 bf16)", lambda: gp.softmax(small))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        gp.sum(small)
    profile.disable()
    gp.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
