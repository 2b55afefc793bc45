"""Elementwise ops on 2**26 elements next to torch and CuPy in the same run, with a device-to-device
copy as the bandwidth reference (issue 5's bar: >= 0.9x copy bandwidth and >= torch), and the per-op
cost of a 16-element add from Python (bar: <= CuPy). Each round runs ITERATIONS ops on one stream
and synchronizes once; ``bytes`` counts what the ops read and write, so the report shows GB/s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

N = 2**26
ITERATIONS = 20
TINY = 16
TINY_OPS = 200


def _torch() -> Any:
    return pytest.importorskip("torch")


def _cupy() -> Any:
    return pytest.importorskip("cupy")


def _host(dtype: str) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).uniform(-4, 4, N).astype(np.float32)


# name: (dtype, bytes moved per element and op, pygpukit op, torch op, CuPy op or None), each op
# called as op(a, b, out). Ops without an out= form in a peer allocate their result in every library.
def _torch_gelu(a: Any, b: Any, out: Any) -> Any:
    return _torch().nn.functional.gelu(a)


CASES: dict[str, tuple[str, int, Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]] = {
    "copy": ("float32", 8, lambda a, b, out: out.copy_(a), lambda a, b, out: out.copy_(a),
             lambda a, b, out: out.__setitem__(Ellipsis, a)),
    "add": ("float32", 12, lambda a, b, out: gp.add(a, b, out=out),
            lambda a, b, out: _torch().add(a, b, out=out), lambda a, b, out: _cupy().add(a, b, out=out)),
    "add bf16": ("bfloat16", 6, lambda a, b, out: gp.add(a, b, out=out),
                 lambda a, b, out: _torch().add(a, b, out=out), None),
    "mul by scalar": ("float32", 8, lambda a, b, out: gp.mul(a, 1.5, out=out),
                      lambda a, b, out: _torch().mul(a, 1.5, out=out),
                      lambda a, b, out: _cupy().multiply(a, 1.5, out=out)),
    "exp": ("float32", 8, lambda a, b, out: gp.exp(a, out=out), lambda a, b, out: _torch().exp(a, out=out),
            lambda a, b, out: _cupy().exp(a, out=out)),
    "gelu bf16 (allocating)": ("bfloat16", 4, lambda a, b, out: gp.gelu(a), _torch_gelu, None),
    "cast f32->f16 (allocating)": ("float32", 6, lambda a, b, out: gp.astype(a, gp.float16),
                                   lambda a, b, out: a.to(_torch().float16),
                                   lambda a, b, out: a.astype(_cupy().float16)),
    "cast f32->bf16 (GPUArray.astype)": ("float32", 6, lambda a, b, out: a.astype(gp.bfloat16),
                                         lambda a, b, out: a.to(_torch().bfloat16), None),
    "cast bf16->f32 (allocating)": ("bfloat16", 6, lambda a, b, out: gp.astype(a, gp.float32),
                                    lambda a, b, out: a.to(_torch().float32), None),
}  # fmt: skip


def _group(name: str) -> str:
    dtype = CASES[name][0]
    return f"elementwise {name} ({dtype}, 2^26 elements, per {ITERATIONS} ops)"


@pytest.mark.parametrize("name", list(CASES))
def test_elementwise_pygpukit(benchmark: Any, name: str) -> None:
    dtype, per_element, op, _, _ = CASES[name]
    benchmark.group = _group(name)
    host = _host(dtype)
    a = gp.from_numpy(host).astype(dtype)
    b = gp.from_numpy(host[::-1].copy()).astype(dtype)
    out = gp.empty(N, dtype)
    stream = gp.Stream()

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                op(a, b, out)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS


@pytest.mark.parametrize("name", list(CASES))
def test_elementwise_torch(benchmark: Any, name: str) -> None:
    torch = _torch()
    dtype, per_element, _, op, _ = CASES[name]
    benchmark.group = _group(name)
    host = _host(dtype)
    tdtype = getattr(torch, dtype)
    a = torch.from_numpy(host).to("cuda").to(tdtype)
    b = torch.from_numpy(host[::-1].copy()).to("cuda").to(tdtype)
    out = torch.empty(N, dtype=tdtype, device="cuda")
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                op(a, b, out)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[4] is not None])
def test_elementwise_cupy(benchmark: Any, name: str) -> None:
    cupy = _cupy()
    dtype, per_element, _, _, op = CASES[name]
    assert op is not None
    benchmark.group = _group(name)
    host = _host(dtype)
    a = cupy.asarray(host)
    b = cupy.asarray(host[::-1].copy())
    out = cupy.empty(N, dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                op(a, b, out)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS


# -- a 16-element add from Python: per-op overhead ---------------------------------------------------
TINY_GROUP = f"add of {TINY} float32 elements from Python, result allocated (per {TINY_OPS} ops)"


@pytest.mark.benchmark(group=TINY_GROUP)
def test_tiny_add_pygpukit(benchmark: Any) -> None:
    a, b = gp.ones(TINY), gp.ones(TINY)
    stream = gp.Stream()

    def run() -> None:
        with stream:
            for _ in range(TINY_OPS):
                a + b
        stream.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


@pytest.mark.benchmark(group=TINY_GROUP)
def test_tiny_add_torch(benchmark: Any) -> None:
    torch = _torch()
    a, b = torch.ones(TINY, device="cuda"), torch.ones(TINY, device="cuda")
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(TINY_OPS):
                a + b
        stream.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


@pytest.mark.benchmark(group=TINY_GROUP)
def test_tiny_add_cupy(benchmark: Any) -> None:
    cupy = _cupy()
    a, b = cupy.ones(TINY, dtype=cupy.float32), cupy.ones(TINY, dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def run() -> None:
        with stream:
            for _ in range(TINY_OPS):
                a + b
        stream.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)
