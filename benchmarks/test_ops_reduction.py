"""Reductions and softmax on 2**26 elements next to torch and CuPy in the same run (issue 5's bar:
full and per-row reductions >= 0.85x the copy bandwidth of test_ops_elementwise.py and >= torch).
``bytes`` counts what each op reads and writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

N = 2**26
ROW = 1024
ITERATIONS = 20


def _torch() -> Any:
    return pytest.importorskip("torch")


def _cupy() -> Any:
    return pytest.importorskip("cupy")


# name: (dtype, shape, bytes per element, pygpukit op, torch op, CuPy op or None)
Case = tuple[str, tuple[int, ...], int, Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]
CASES: dict[str, Case] = {
    "full sum": ("float32", (N,), 4, lambda x: gp.sum(x), lambda x: x.sum(), lambda x: x.sum()),
    "full sum bf16": ("bfloat16", (N,), 2, lambda x: gp.sum(x), lambda x: x.sum(), None),
    "per-row sum": ("float32", (N // ROW, ROW), 4, lambda x: gp.sum(x, axis=-1), lambda x: x.sum(dim=-1),
                    lambda x: x.sum(axis=-1)),
    "column sum": ("float32", (ROW, N // ROW), 4, lambda x: gp.sum(x, axis=0), lambda x: x.sum(dim=0),
                   lambda x: x.sum(axis=0)),
    "per-row max": ("float32", (N // ROW, ROW), 4, lambda x: gp.max(x, axis=-1), lambda x: x.amax(dim=-1),
                    lambda x: x.max(axis=-1)),
    "argmax rows bf16": ("bfloat16", (N // 32768, 32768), 2, lambda x: gp.argmax(x, axis=-1),
                         lambda x: x.argmax(dim=-1), None),
    "softmax rows": ("float32", (N // ROW, ROW), 8, lambda x: gp.softmax(x, axis=-1),
                     lambda x: _torch().softmax(x, dim=-1), None),
    "softmax rows bf16": ("bfloat16", (N // ROW, ROW), 4, lambda x: gp.softmax(x, axis=-1),
                          lambda x: _torch().softmax(x, dim=-1), None),
}  # fmt: skip


def _group(name: str) -> str:
    dtype, shape = CASES[name][:2]
    return f"reduction {name} ({dtype}, shape {shape}, per {ITERATIONS} ops)"


def _host(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.random.default_rng(1).uniform(-4, 4, shape).astype(np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_reduction_pygpukit(benchmark: Any, name: str) -> None:
    dtype, shape, per_element, op, _, _ = CASES[name]
    benchmark.group = _group(name)
    x = gp.from_numpy(_host(shape)).astype(dtype)
    stream = gp.Stream()

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                op(x)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS


@pytest.mark.parametrize("name", list(CASES))
def test_reduction_torch(benchmark: Any, name: str) -> None:
    torch = _torch()
    dtype, shape, per_element, _, op, _ = CASES[name]
    benchmark.group = _group(name)
    x = torch.from_numpy(_host(shape)).to("cuda").to(getattr(torch, dtype))
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                op(x)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[5] is not None])
def test_reduction_cupy(benchmark: Any, name: str) -> None:
    cupy = _cupy()
    _, shape, per_element, _, _, op = CASES[name]
    assert op is not None
    benchmark.group = _group(name)
    x = cupy.asarray(_host(shape))
    stream = cupy.cuda.Stream(non_blocking=True)

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                op(x)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = per_element * N * ITERATIONS
