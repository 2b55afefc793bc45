"""Sampling from logits (Qwen2.5's vocabulary, 152064) next to torch in the same run (issue 6's bar:
top-p at most the time of torch's softmax + sort(descending) + cumsum + mask + multinomial).

Cases: top-p 0.9, top-k 50 and greedy over (1, 152064) and (8, 152064) logits, float32 and bfloat16.
pygpukit runs :class:`pygpukit.Sampler` eagerly (``out`` preallocated) and as a replayed CUDA graph
(the device time without Python launch overhead); greedy also runs the workspace-free
:func:`pygpukit.greedy`. torch runs the usual eager implementations written below. ``bytes`` is the
size of the logits (what one pass reads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

VOCAB = 152064
ITERATIONS = 20
SHAPES = [(1, VOCAB), (8, VOCAB)]
DTYPES = ["float32", "bfloat16"]
MODES = ["top_p", "top_k", "greedy"]
SETTINGS: dict[str, dict[str, Any]] = {
    "top_p": {"top_p": 0.9},
    "top_k": {"top_k": 50},
    "greedy": {"temperature": 0.0},
}
CASES = [(mode, shape, dtype) for mode in MODES for shape in SHAPES for dtype in DTYPES]
IDS = [f"{mode}-{shape[0]}x{shape[1]}-{dtype}" for mode, shape, dtype in CASES]


def _torch() -> Any:
    return pytest.importorskip("torch")


def _host(shape: tuple[int, int]) -> np.ndarray[Any, Any]:
    return (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)


def _group(mode: str, shape: tuple[int, int], dtype: str) -> str:
    return f"sampling {mode} ({dtype}, logits {shape}, per {ITERATIONS} draws)"


def _bytes(shape: tuple[int, int], dtype: str) -> int:
    return shape[0] * shape[1] * (4 if dtype == "float32" else 2) * ITERATIONS


# -- torch references ------------------------------------------------------------------------------
def torch_top_p(torch: Any, logits: Any, top_p: float, generator: Any) -> Any:
    """Nucleus sampling the usual way: softmax, sort descending, cumsum, mask, multinomial."""
    probs = torch.softmax(logits.float(), dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    sorted_probs = sorted_probs.masked_fill(cumulative - sorted_probs > top_p, 0.0)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return order.gather(-1, choice).squeeze(-1)


def torch_top_k(torch: Any, logits: Any, k: int, generator: Any) -> Any:
    values, indices = torch.topk(logits, k, dim=-1)
    probs = torch.softmax(values.float(), dim=-1)
    return indices.gather(-1, torch.multinomial(probs, 1, generator=generator)).squeeze(-1)


def torch_greedy(torch: Any, logits: Any, generator: Any) -> Any:
    return torch.argmax(logits, dim=-1)


def _torch_op(mode: str) -> Callable[[Any, Any, Any], Any]:
    if mode == "top_p":
        return lambda torch, x, g: torch_top_p(torch, x, 0.9, g)
    if mode == "top_k":
        return lambda torch, x, g: torch_top_k(torch, x, 50, g)
    return torch_greedy


# -- benchmarks ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "shape", "dtype"), CASES, ids=IDS)
def test_sampling_pygpukit(benchmark: Any, mode: str, shape: tuple[int, int], dtype: str) -> None:
    benchmark.group = _group(mode, shape, dtype)
    x = gp.from_numpy(_host(shape)).astype(dtype)
    sampler = gp.Sampler(0, shape[0], shape[1], dtype)
    out = gp.empty(shape[0], gp.int32)
    stream = gp.Stream()
    settings = SETTINGS[mode]

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                sampler.sample(x, out, **settings)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _bytes(shape, dtype)


@pytest.mark.parametrize(("mode", "shape", "dtype"), CASES, ids=IDS)
def test_sampling_pygpukit_graph(benchmark: Any, mode: str, shape: tuple[int, int], dtype: str) -> None:
    benchmark.group = _group(mode, shape, dtype)
    x = gp.from_numpy(_host(shape)).astype(dtype)
    sampler = gp.Sampler(0, shape[0], shape[1], dtype)
    out = gp.empty(shape[0], gp.int32)
    stream = gp.Stream()
    settings = SETTINGS[mode]
    with stream:
        sampler.sample(x, out, **settings)  # compile and load before the capture
        stream.synchronize()
    graph = gp.CudaGraph()
    with graph.capture(stream):
        for _ in range(ITERATIONS):
            sampler.sample(x, out, **settings)

    def run() -> None:
        graph.replay(stream)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _bytes(shape, dtype)


@pytest.mark.parametrize(("shape", "dtype"), [(s, d) for s in SHAPES for d in DTYPES])
def test_sampling_pygpukit_greedy_function(benchmark: Any, shape: tuple[int, int], dtype: str) -> None:
    benchmark.group = _group("greedy", shape, dtype)
    x = gp.from_numpy(_host(shape)).astype(dtype)
    out = gp.empty(shape[0], gp.int32)
    stream = gp.Stream()

    def run() -> None:
        with stream:
            for _ in range(ITERATIONS):
                gp.greedy(x, out)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _bytes(shape, dtype)


@pytest.mark.parametrize(("mode", "shape", "dtype"), CASES, ids=IDS)
def test_sampling_torch(benchmark: Any, mode: str, shape: tuple[int, int], dtype: str) -> None:
    torch = _torch()
    benchmark.group = _group(mode, shape, dtype)
    x = torch.from_numpy(_host(shape)).to("cuda").to(getattr(torch, dtype))
    generator = torch.Generator(device="cuda")
    generator.manual_seed(0)
    op = _torch_op(mode)
    stream = torch.cuda.Stream()

    def run() -> None:
        with torch.cuda.stream(stream):
            for _ in range(ITERATIONS):
                op(torch, x, generator)
        stream.synchronize()

    benchmark.pedantic(run, rounds=10, warmup_rounds=2)
    benchmark.extra_info["bytes"] = _bytes(shape, dtype)


def test_top_p_agrees_with_torch_in_distribution() -> None:
    """Not a timing: both implementations keep the same nucleus on these float32 logits (a sanity check
    that the two sides of the comparison do the same work; bf16 has large tie groups, which torch's
    sort splits arbitrarily and pygpukit keeps whole)."""
    torch = _torch()
    host = _host((1, VOCAB))
    probs = gp.filtered_probs(gp.from_numpy(host), top_p=0.9).to_numpy()[0]
    logits = torch.from_numpy(host).to("cuda")
    sorted_probs, order = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True)
    kept = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs <= 0.9).cpu().numpy()[0]
    torch_set = set(order.cpu().numpy()[0][kept].tolist())
    ours = set(np.flatnonzero(probs > 0).tolist())
    assert len(ours ^ torch_set) <= 2  # float32 cumsum order may move the boundary by a token
