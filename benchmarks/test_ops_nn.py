"""nn ops (pygpukit.ops.nn) next to torch eager in the same run, on the same inputs: rmsnorm,
add_rmsnorm, layernorm and swiglu at LLM shapes, embedding, and Whisper tiny's conv1d front end.

Issue 6's bars: the norms >= 0.85x the copy bandwidth of test_ops_elementwise.py and >= torch eager.
``extra_info["bytes"]`` counts what each op must read and write per run (``ITERATIONS`` ops), and
``extra_info["flops"]`` the multiply-adds of conv1d (2 per MAC), so GB/s and TFLOP/s follow from the
mean time. pygpukit writes into preallocated outputs (``out=``); torch allocates, as eager code does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

ITERATIONS = 20
_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _torch() -> Any:
    return pytest.importorskip("torch")


def _host(shape: tuple[int, ...], low: float = -2.0, high: float = 2.0, seed: int = 1) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


# name: (dtype, input shapes, bytes per run, pygpukit op factory, torch op factory, flops per run)
# A factory gets the inputs (pygpukit or torch arrays) and returns the op to time.
Factory = Callable[[list[Any]], Callable[[], Any]]
Case = tuple[str, list[tuple[int, ...]], int, Factory, Factory, int]


def _norm_bytes(rows: int, cols: int, dtype: str, streams: int) -> int:
    return streams * rows * cols * _SIZES[dtype] + cols * _SIZES[dtype]


def _rms_torch(x: Any, w: Any) -> Any:
    torch = _torch()
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
    variance = x.float().pow(2).mean(-1, keepdim=True)  # the Hugging Face module
    return w * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)


def _rms_case(rows: int, cols: int, dtype: str) -> Case:
    def ours(a: list[Any]) -> Callable[[], Any]:
        out = gp.empty(a[0].shape, a[0].dtype)
        return lambda: gp.rmsnorm(a[0], a[1], 1e-6, out=out)

    return (dtype, [(rows, cols), (cols,)], _norm_bytes(rows, cols, dtype, 2), ours,
            lambda a: lambda: _rms_torch(a[0], a[1]), 0)  # fmt: skip


def _add_rms_case(rows: int, cols: int, dtype: str) -> Case:
    def ours(a: list[Any]) -> Callable[[], Any]:
        out = gp.empty(a[0].shape, a[0].dtype)
        return lambda: gp.add_rmsnorm(a[0], a[1], a[2], 1e-6, out=out, residual_out=a[1])  # residual in place

    def theirs(a: list[Any]) -> Callable[[], Any]:
        def run() -> Any:
            residual = a[0] + a[1]
            return _rms_torch(residual, a[2]), residual

        return run

    return (dtype, [(rows, cols), (rows, cols), (cols,)], _norm_bytes(rows, cols, dtype, 4), ours, theirs, 0)


def _layer_case(rows: int, cols: int, dtype: str) -> Case:
    def ours(a: list[Any]) -> Callable[[], Any]:
        out = gp.empty(a[0].shape, a[0].dtype)
        return lambda: gp.layernorm(a[0], a[1], a[2], 1e-5, out=out)

    def theirs(a: list[Any]) -> Callable[[], Any]:
        torch = _torch()
        return lambda: torch.nn.functional.layer_norm(a[0], (a[0].shape[-1],), a[1], a[2], 1e-5)

    return (dtype, [(rows, cols), (cols,), (cols,)], _norm_bytes(rows, cols, dtype, 2) + cols * _SIZES[dtype], ours,
            theirs, 0)  # fmt: skip


def _swiglu_case(rows: int, inter: int, dtype: str) -> Case:
    def ours(a: list[Any]) -> Callable[[], Any]:
        out = gp.empty((rows, inter), a[0].dtype)
        return lambda: gp.swiglu(a[0], out=out)

    def theirs(a: list[Any]) -> Callable[[], Any]:
        torch = _torch()

        def run() -> Any:
            gate, up = a[0].chunk(2, dim=-1)
            return torch.nn.functional.silu(gate) * up

        return run

    return (dtype, [(rows, 2 * inter)], 3 * rows * inter * _SIZES[dtype], ours, theirs, 0)


def _embedding_case(tokens: int, vocab: int, hidden: int, dtype: str) -> Case:
    def ours(a: list[Any]) -> Callable[[], Any]:
        ids = gp.from_numpy(np.random.default_rng(2).integers(0, vocab, tokens).astype(np.int32))
        out = gp.empty((tokens, hidden), a[0].dtype)
        return lambda: gp.embedding(a[0], ids, out=out)

    def theirs(a: list[Any]) -> Callable[[], Any]:
        torch = _torch()
        ids = torch.from_numpy(np.random.default_rng(2).integers(0, vocab, tokens).astype(np.int64)).cuda()
        return lambda: torch.nn.functional.embedding(ids, a[0])

    return (dtype, [(vocab, hidden)], 2 * tokens * hidden * _SIZES[dtype], ours, theirs, 0)


def _conv_case(batch: int, c_in: int, length: int, c_out: int, stride: int, dtype: str) -> Case:
    l_out = (length + 2 - 3) // stride + 1

    def ours(a: list[Any]) -> Callable[[], Any]:
        out = gp.empty((batch, c_out, l_out), a[0].dtype)
        return lambda: gp.conv1d(a[0], a[1], a[2], stride, 1, activation="gelu", out=out)

    def theirs(a: list[Any]) -> Callable[[], Any]:
        torch = _torch()
        return lambda: torch.nn.functional.gelu(torch.nn.functional.conv1d(a[0], a[1], a[2], stride, 1))

    size = _SIZES[dtype]
    moved = (batch * c_in * length + c_out * c_in * 3 + c_out + batch * c_out * l_out) * size
    return (dtype, [(batch, c_in, length), (c_out, c_in, 3), (c_out,)], moved, ours, theirs,
            2 * batch * c_out * l_out * c_in * 3)  # fmt: skip


CASES: dict[str, Case] = {
    "rmsnorm 4096x4096 bf16": _rms_case(4096, 4096, "bfloat16"),
    "rmsnorm 16384x3584 bf16": _rms_case(16384, 3584, "bfloat16"),
    "rmsnorm 16384x576 bf16": _rms_case(16384, 576, "bfloat16"),
    "rmsnorm 1x4096 bf16 (decode)": _rms_case(1, 4096, "bfloat16"),
    "rmsnorm 4096x8192 fp32": _rms_case(4096, 8192, "float32"),
    "add_rmsnorm 4096x4096 bf16": _add_rms_case(4096, 4096, "bfloat16"),
    "add_rmsnorm 16384x3584 bf16": _add_rms_case(16384, 3584, "bfloat16"),
    "layernorm 4096x4096 bf16": _layer_case(4096, 4096, "bfloat16"),
    "layernorm 16384x3584 fp16": _layer_case(16384, 3584, "float16"),
    "swiglu 4096x14336 bf16": _swiglu_case(4096, 14336, "bfloat16"),
    "swiglu 2048x18944 bf16": _swiglu_case(2048, 18944, "bfloat16"),
    "embedding 8192 tokens 152064x3584 bf16": _embedding_case(8192, 152064, 3584, "bfloat16"),
    "conv1d whisper 80->384 s1 fp16": _conv_case(1, 80, 3000, 384, 1, "float16"),
    "conv1d whisper 384->384 s2 fp16": _conv_case(1, 384, 3000, 384, 2, "float16"),
    "conv1d whisper 80->384 s1 bf16 batch 8": _conv_case(8, 80, 3000, 384, 1, "bfloat16"),
    "conv1d whisper 384->384 s2 bf16 batch 8": _conv_case(8, 384, 3000, 384, 2, "bfloat16"),
    "conv1d whisper 384->384 s2 fp32": _conv_case(1, 384, 3000, 384, 2, "float32"),
}


def _group(name: str) -> str:
    return f"nn {name} (per {ITERATIONS} ops)"


def _info(benchmark: Any, name: str) -> None:
    case = CASES[name]
    benchmark.extra_info["bytes"] = case[2] * ITERATIONS
    if case[5]:
        benchmark.extra_info["flops"] = case[5] * ITERATIONS


@pytest.mark.parametrize("name", list(CASES))
def test_nn_pygpukit(benchmark: Any, name: str) -> None:
    dtype, shapes, _, factory, _, _ = CASES[name]
    benchmark.group = _group(name)
    inputs = [gp.from_numpy(_host(s, seed=i)).astype(dtype) for i, s in enumerate(shapes)]
    op = factory(inputs)
    stream = gp.Stream()
    with stream:
        op()  # compile outside the timing
    stream.synchronize()

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                op()
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    _info(benchmark, name)


@pytest.mark.parametrize("name", list(CASES))
def test_nn_torch(benchmark: Any, name: str) -> None:
    torch = _torch()
    dtype, shapes, _, _, factory, _ = CASES[name]
    benchmark.group = _group(name)
    inputs = [torch.from_numpy(_host(s, seed=i)).to("cuda").to(getattr(torch, dtype)) for i, s in enumerate(shapes)]
    op = factory(inputs)
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                op()
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    _info(benchmark, name)
