"""Programmatic dependent launch (SM90+, pygpukit.core.jit.set_programmatic_launch): the decode step's
kernels (fused_gemv, the built-in GEMVs, rope_kv_append, decode attention) may start while the kernel
before them finishes and wait for it with griddepcontrol.wait. Nothing they compute may change: long
chains of dependent launches, eager and captured, and the decode strategies' tokens and logits are
bitwise equal with it on and off. GPU only (the CPU backend has no launches)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llm_testing import sibling

import pygpukit as gp
import pygpukit.ops as ops
from pygpukit.core.backend import native_module
from pygpukit.core.graph import CudaGraph
from pygpukit.core.jit import programmatic_launch, set_programmatic_launch
from pygpukit.core.stream import Stream, current_stream
from pygpukit.llm import DecodeM1, DecodeM1Graph

pytestmark = pytest.mark.gpu

_ds = sibling("test_decode_strategies")
CUDA = gp.backend_state().name == "cuda"


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    if not CUDA:
        pytest.skip("programmatic launch needs the CUDA backend")
    before = programmatic_launch()
    yield
    set_programmatic_launch(before)


def _sm90() -> bool:
    return gp.get_device_capabilities().compute_capability[0] >= 9


def test_the_decode_kernels_are_marked_on_sm90_only() -> None:
    from pygpukit.ops.gemv_fusions import _kernel

    kernel = _kernel(gp.bfloat16, 1)
    function = kernel.load()[1]
    set_programmatic_launch(True)
    assert native_module().function_programmatic(function) == _sm90()
    set_programmatic_launch(False)
    assert not native_module().function_programmatic(function)


def _chain(x: Any, weights: list[Any], norm: Any, outs: list[Any]) -> Any:
    """Each fused GEMV reads the previous launch's output as its input and as its residual, and the
    built-in GEMV (ops.matmul of one row) reads the fused one's: every launch depends on the one
    before it. The RMSNorm keeps the values bounded (the residual sums grow like a random walk)."""
    h = x
    for i, w in enumerate(weights):
        y = outs[i % 2]
        ops.fused_gemv(h, w, prologue="rmsnorm", norm_weight=norm, residual=h, out=y)
        ops.matmul(y.reshape(1, -1), w.T, out=outs[2].reshape(1, -1))
        h = outs[2]
    return h


def _chain_values(enabled: bool, graph: bool) -> np.ndarray[Any, Any]:
    set_programmatic_launch(enabled)
    rng = np.random.default_rng(5)
    k = 896
    weights = [gp.from_numpy((rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32).astype(gp.bfloat16.numpy))
               for _ in range(4)]  # fmt: skip
    norm = gp.from_numpy((1 + 0.1 * rng.standard_normal(k)).astype(gp.bfloat16.numpy))
    x = gp.from_numpy(rng.standard_normal(k).astype(gp.bfloat16.numpy))
    outs = [gp.zeros(k, gp.bfloat16) for _ in range(3)]
    if not graph:
        for _ in range(50):
            x.copy_(_chain(x, weights, norm, outs))
        return np.asarray(x.to_numpy()).astype(np.float32)
    g = CudaGraph()
    stream = Stream()
    current_stream().synchronize()
    with stream:
        _chain(x, weights, norm, outs)  # warm-up: plans and kernels
    stream.synchronize()
    x.copy_(gp.from_numpy(np.random.default_rng(5).standard_normal(k).astype(gp.bfloat16.numpy)))
    with g.capture(stream):
        x.copy_(_chain(x, weights, norm, outs))
    for _ in range(50):
        g.replay(stream)
    stream.synchronize()
    return np.asarray(x.to_numpy()).astype(np.float32)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_dependent_chains_are_bitwise_equal_with_and_without(graph: bool) -> None:
    on = _chain_values(True, graph)
    off = _chain_values(False, graph)
    assert np.isfinite(on).all()
    assert np.abs(on).max() > 0
    assert np.array_equal(on, off)


@pytest.mark.parametrize("fuse", [True, "all"], ids=["fuse", "fuse-all"])
def test_decode_graph_tokens_and_logits_do_not_change(fuse: bool | str, tmp_path: Path) -> None:
    model = _ds._model(tmp_path, "qwen2", dtype="bfloat16")
    steps = 64
    results = []
    for enabled in (True, False):
        set_programmatic_launch(enabled)
        for kind in (DecodeM1Graph, DecodeM1):
            decoder = kind(model, 1, 6 + steps + 1, fuse=fuse)
            tokens = _ds._run(decoder, _ds.PROMPT, steps)
            results.append((tokens, np.asarray(decoder.logits.to_numpy()).astype(np.float32)))
    first_tokens, first_logits = results[0]
    for tokens, logits in results[1:]:
        assert np.array_equal(tokens, first_tokens)
        assert np.array_equal(logits, first_logits)


def test_a_forgotten_device_leaves_no_marked_handle() -> None:
    """A device reset forgets the loaded modules; their function handles are unmarked, so a function
    loaded later at the same handle value is never launched programmatically by mistake."""
    from pygpukit.core import jit
    from pygpukit.core.stream import thread_device
    from pygpukit.ops.gemv_fusions import _kernel

    set_programmatic_launch(True)
    kernel = _kernel(gp.bfloat16, 2)
    function = kernel.load()[1]
    assert native_module().function_programmatic(function) == _sm90()
    jit.forget_device(thread_device())
    assert not native_module().function_programmatic(function)
    assert native_module().function_programmatic(kernel.load()[1]) == _sm90()  # loaded and marked again
