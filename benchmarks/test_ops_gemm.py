"""GEMM through cuBLASLt next to torch in the same run (issue 5's bars: bf16/fp16 >= 0.97x torch at
4096^3 and 8192^3, TF32 >= 0.97x torch with TF32, fp32 exact >= 0.95x, fp8 at 8192 >= 0.95x
torch._scaled_mm). Each round runs ITERATIONS products on one stream and synchronizes once.

The host-cost cases time repeated calls of one call shape from Python (the plan cache's hot path):
the decode path's small-M matmul and linear (the built-in GEMV) and a 1024^3 bf16 cuBLASLt matmul,
HOST_CALLS calls per round, next to torch eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

ITERATIONS = 10
CASES = [("bfloat16", 4096), ("bfloat16", 8192), ("float16", 4096), ("float16", 8192), ("tf32", 4096),
         ("tf32", 8192), ("float32", 4096), ("float32", 8192)]  # fmt: skip


def _torch() -> Any:
    return pytest.importorskip("torch")


def _rounds(size: int) -> int:
    return 10 if size <= 4096 else 5


def _inputs(dtype: str, size: int) -> tuple[gp.GPUArray, gp.GPUArray]:
    storage = "float32" if dtype == "tf32" else dtype
    rng = np.random.default_rng(size)
    host = rng.standard_normal((size, size), dtype=np.float32)
    a = gp.from_numpy(host).astype(storage)
    b = gp.from_numpy(host[::-1].copy()).astype(storage)
    return a, b


@pytest.mark.parametrize(("dtype", "size"), CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_gemm_pygpukit(benchmark: Any, dtype: str, size: int) -> None:
    benchmark.group = f"gemm {dtype} {size}^3"
    a, b = _inputs(dtype, size)
    out = gp.empty((size, size), a.dtype)
    stream = gp.Stream()
    tf32 = dtype == "tf32"

    def run() -> None:
        for _ in range(ITERATIONS):
            gp.matmul(a, b, out=out, use_tf32=tf32, stream=stream)
        stream.synchronize()

    benchmark.pedantic(run, rounds=_rounds(size), warmup_rounds=1)
    benchmark.extra_info["flops"] = 2 * size**3 * ITERATIONS


@pytest.mark.parametrize(("dtype", "size"), CASES, ids=[f"{d}-{s}" for d, s in CASES])
def test_gemm_torch(benchmark: Any, dtype: str, size: int) -> None:
    torch = _torch()
    benchmark.group = f"gemm {dtype} {size}^3"
    storage = {"tf32": torch.float32, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    a = torch.randn(size, size, device="cuda").to(storage[dtype])
    b = torch.randn(size, size, device="cuda").to(storage[dtype])
    out = torch.empty(size, size, device="cuda", dtype=storage[dtype])
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    stream = torch.cuda.Stream()
    try:

        def run() -> None:
            with torch.cuda.stream(stream):
                for _ in range(ITERATIONS):
                    torch.matmul(a, b, out=out)
            stream.synchronize()

        benchmark.pedantic(run, rounds=_rounds(size), warmup_rounds=1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    benchmark.extra_info["flops"] = 2 * size**3 * ITERATIONS


FP8 = 8192


def test_gemm_fp8_pygpukit(benchmark: Any) -> None:
    benchmark.group = f"gemm fp8 e4m3 -> bf16 {FP8}^3"
    rng = np.random.default_rng(1)
    a = gp.from_numpy(rng.standard_normal((FP8, FP8), dtype=np.float32)).astype("float8_e4m3fn")
    w = gp.from_numpy(rng.standard_normal((FP8, FP8), dtype=np.float32)).astype("float8_e4m3fn")
    one = gp.from_numpy(np.ones(1, np.float32))
    stream = gp.Stream()

    def run() -> None:
        for _ in range(ITERATIONS):
            gp.scaled_matmul(a, w.T, one, one, stream=stream)
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["flops"] = 2 * FP8**3 * ITERATIONS


def test_gemm_fp8_torch(benchmark: Any) -> None:
    torch = _torch()
    benchmark.group = f"gemm fp8 e4m3 -> bf16 {FP8}^3"
    a = torch.randn(FP8, FP8, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(FP8, FP8, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        stream.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["flops"] = 2 * FP8**3 * ITERATIONS


# -- host cost of a repeated call shape -----------------------------------------------------------------
HOST_CALLS = 2000
HOST_CASES = ["matmul-1x256-256x256", "matmul-1x256-nk.T", "matmul-out", "linear-1x256-256x256",
              "matmul-1x4096-4096x4096", "matmul-1024^3"]  # fmt: skip


def _host_inputs(case: str) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(7)
    k = 4096 if "4096" in case else 1024 if "1024" in case else 256
    m = 1024 if "1024" in case else 1
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, k), dtype=np.float32)


@pytest.mark.parametrize("case", HOST_CASES)
def test_gemm_host_pygpukit(benchmark: Any, case: str) -> None:
    benchmark.group = f"gemm host per call {case} bf16 (per {HOST_CALLS} calls)"
    x_host, w_host = _host_inputs(case)
    x = gp.from_numpy(x_host).astype(gp.bfloat16)
    w = gp.from_numpy(w_host).astype(gp.bfloat16)
    y = gp.empty((x.shape[0], w.shape[1]), gp.bfloat16)
    call = {
        "matmul-out": lambda: gp.matmul(x, w, out=y),
        "matmul-1x256-nk.T": lambda: gp.matmul(x, w.T),
        "linear-1x256-256x256": lambda: gp.linear(x, w),
    }.get(case, lambda: gp.matmul(x, w))
    call()

    def run() -> None:
        for _ in range(HOST_CALLS):
            call()
        gp.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["calls"] = HOST_CALLS


@pytest.mark.parametrize("case", HOST_CASES)
def test_gemm_host_torch(benchmark: Any, case: str) -> None:
    torch = _torch()
    benchmark.group = f"gemm host per call {case} bf16 (per {HOST_CALLS} calls)"
    x_host, w_host = _host_inputs(case)
    x = torch.from_numpy(x_host).to("cuda", torch.bfloat16)
    w = torch.from_numpy(w_host).to("cuda", torch.bfloat16)
    y = torch.empty((x.shape[0], w.shape[1]), device="cuda", dtype=torch.bfloat16)
    call = {
        "matmul-out": lambda: torch.matmul(x, w, out=y),
        "matmul-1x256-nk.T": lambda: torch.matmul(x, w.t()),
        "linear-1x256-256x256": lambda: torch.nn.functional.linear(x, w),
    }.get(case, lambda: torch.matmul(x, w))
    call()

    def run() -> None:
        for _ in range(HOST_CALLS):
            call()
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["calls"] = HOST_CALLS
