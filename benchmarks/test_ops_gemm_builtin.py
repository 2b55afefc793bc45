"""The built-in GEMM and GEMV kernels (pygpukit.ops.gemm: mma.py, gemv_kernels.py) next to torch in the same run.

Issue 5's bars: the built-in bf16 GEMM at 8192^3 >= 0.6x cuBLAS (torch.matmul); bf16 GEMV at (K, N) =
(4096, 4096), (3584, 18944), (18944, 3584), (8192, 29568) no slower than torch. Each round issues
ITERATIONS calls on one stream and synchronizes once (the wall time a caller sees, Python included);
``extra_info["gpu_us"]`` is the device time per call from events around a CUDA-graph replay of the
same calls, which leaves out the launch cost. GEMV rotates over enough copies of W to exceed the L2
cache, so every call streams W from device memory; ``bytes`` counts W once per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.ops.gemm import mma

pytestmark = pytest.mark.gpu

GEMM_ITERATIONS = 10
GEMM_CASES = [(4096, "nn"), (4096, "nt"), (8192, "nn"), (8192, "nt")]
GEMV_ITERATIONS = 50
GEMV_SHAPES = [(4096, 4096), (3584, 18944), (18944, 3584), (8192, 29568)]
GEMV_CASES = [(k, n, layout) for k, n in GEMV_SHAPES for layout in ("nk", "kn")]
L2_DEFEAT_BYTES = 256 << 20


def _torch() -> Any:
    return pytest.importorskip("torch")


def _gp_graph_time(calls: Callable[[], None], stream: gp.Stream) -> float:
    """Microseconds per call of ``calls`` (GEMV_ITERATIONS or GEMM_ITERATIONS of them) replayed as a graph."""
    graph = gp.CudaGraph()
    with graph.capture(stream=stream):
        calls()
    graph.replay()
    stream.synchronize()
    start, end = gp.Event(), gp.Event()
    start.record(stream)
    for _ in range(5):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / 5


def _torch_graph_time(calls: Callable[[], None]) -> float:
    torch = _torch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1000.0 / 5


# -- GEMM -----------------------------------------------------------------------------------------------
def _gemm_host(size: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(size).standard_normal((size, size), dtype=np.float32)


def _gemm_group(size: int, layout: str) -> str:
    b = "K x N" if layout == "nn" else "N x K (linear weight)"
    return f"built-in gemm bf16 {size}^3, b stored {b} (per {GEMM_ITERATIONS} products)"


@pytest.mark.parametrize("kernel", ["auto", "mma.sync"])
@pytest.mark.parametrize(("size", "layout"), GEMM_CASES, ids=[f"{s}-{lay}" for s, lay in GEMM_CASES])
def test_gemm_builtin_pygpukit(benchmark: Any, size: int, layout: str, kernel: str) -> None:
    """``auto``: the tile gemm_tile_for picks (wgmma on SM 90); ``mma.sync``: the SM 80+ kernel's
    large tile, forced, so its speed is on record on Hopper too."""
    benchmark.group = _gemm_group(size, layout)
    host = _gemm_host(size)
    a = gp.from_numpy(host).astype(gp.bfloat16)
    b = gp.from_numpy(host[::-1].copy()).astype(gp.bfloat16)
    out = gp.empty((size, size), gp.bfloat16)
    tile = None if kernel == "auto" else mma.GEMM_MMA_TILES[0]
    stream = gp.Stream()

    def calls() -> None:
        for _ in range(GEMM_ITERATIONS):
            gp.gemm_mma(a, b, out, trans_b=layout == "nt", tile=tile, stream=stream)

    def run() -> None:
        calls()
        stream.synchronize()

    benchmark.pedantic(run, rounds=5 if size > 4096 else 10, warmup_rounds=1)
    gpu_us = _gp_graph_time(calls, stream) / GEMM_ITERATIONS
    benchmark.extra_info.update(flops=2 * size**3 * GEMM_ITERATIONS, gpu_us=gpu_us, tflops=2 * size**3 / gpu_us / 1e6,
                                tile=str(tile or "auto"))  # fmt: skip


@pytest.mark.parametrize(("size", "layout"), GEMM_CASES, ids=[f"{s}-{lay}" for s, lay in GEMM_CASES])
def test_gemm_builtin_torch(benchmark: Any, size: int, layout: str) -> None:
    torch = _torch()
    benchmark.group = _gemm_group(size, layout)
    host = _gemm_host(size)
    a = torch.from_numpy(host).to("cuda", torch.bfloat16)
    b = torch.from_numpy(host[::-1].copy()).to("cuda", torch.bfloat16)
    b_used = b.t().contiguous().t() if layout == "nt" else b  # same values, stored N x K
    out = torch.empty((size, size), device="cuda", dtype=torch.bfloat16)

    def calls() -> None:
        for _ in range(GEMM_ITERATIONS):
            torch.matmul(a, b_used, out=out)

    def run() -> None:
        calls()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=5 if size > 4096 else 10, warmup_rounds=1)
    gpu_us = _torch_graph_time(calls) / GEMM_ITERATIONS
    benchmark.extra_info.update(flops=2 * size**3 * GEMM_ITERATIONS, gpu_us=gpu_us, tflops=2 * size**3 / gpu_us / 1e6)


# -- GEMV -----------------------------------------------------------------------------------------------
def _gemv_group(k: int, n: int, layout: str) -> str:
    stored = "N x K (linear weight)" if layout == "nk" else "K x N"
    return f"built-in gemv bf16 M=1 K={k} N={n}, W stored {stored} (per {GEMV_ITERATIONS} calls)"


def _weights(k: int, n: int, layout: str) -> list[np.ndarray[Any, Any]]:
    copies = max(1, -(-L2_DEFEAT_BYTES // (2 * k * n)))
    rng = np.random.default_rng(k + n)
    shape = (n, k) if layout == "nk" else (k, n)
    return [rng.standard_normal(shape, dtype=np.float32) for _ in range(copies)]


@pytest.mark.parametrize(("k", "n", "layout"), GEMV_CASES, ids=[f"K{k}-N{n}-{lay}" for k, n, lay in GEMV_CASES])
def test_gemv_builtin_pygpukit(benchmark: Any, k: int, n: int, layout: str) -> None:
    benchmark.group = _gemv_group(k, n, layout)
    weights = [gp.from_numpy(w).astype(gp.bfloat16) for w in _weights(k, n, layout)]
    x = gp.from_numpy(np.random.default_rng(1).standard_normal((1, k), dtype=np.float32)).astype(gp.bfloat16)
    out = gp.empty((1, n), gp.bfloat16)
    stream = gp.Stream()

    def calls() -> None:
        for i in range(GEMV_ITERATIONS):
            gp.gemv(x, weights[i % len(weights)], out, w_layout=layout, stream=stream)

    def run() -> None:
        calls()
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    gpu_us = _gp_graph_time(calls, stream) / GEMV_ITERATIONS
    benchmark.extra_info.update(bytes=2 * k * n * GEMV_ITERATIONS, gpu_us=gpu_us, gbps=2 * k * n / gpu_us / 1e3)


@pytest.mark.parametrize(("k", "n", "layout"), GEMV_CASES, ids=[f"K{k}-N{n}-{lay}" for k, n, lay in GEMV_CASES])
def test_gemv_builtin_torch(benchmark: Any, k: int, n: int, layout: str) -> None:
    torch = _torch()
    benchmark.group = _gemv_group(k, n, layout)
    weights = [torch.from_numpy(w).to("cuda", torch.bfloat16) for w in _weights(k, n, layout)]
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, k), dtype=np.float32)).to("cuda", torch.bfloat16)
    linear = torch.nn.functional.linear

    def calls() -> None:
        for i in range(GEMV_ITERATIONS):
            w = weights[i % len(weights)]
            if layout == "nk":
                linear(x, w)
            else:
                torch.matmul(x, w)

    def run() -> None:
        calls()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    gpu_us = _torch_graph_time(calls) / GEMV_ITERATIONS
    benchmark.extra_info.update(bytes=2 * k * n * GEMV_ITERATIONS, gpu_us=gpu_us, gbps=2 * k * n / gpu_us / 1e3)
