"""fused_gemv (one-row GEMV with an RMSNorm or SwiGLU prologue, a bias and a residual-add epilogue):
against float64 NumPy references on random data, bit for bit against the op chain it replaces
(rmsnorm or swiglu, matmul, add, add) on the CPU backend, typed errors; on the GPU, within the dtype's
tolerance of the op chain, in a CUDA graph, for the SmolLM2 and 7B-class shapes."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
import pygpukit.ops as ops
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

DTYPES = [gp.float32, gp.float16, gp.bfloat16]
TOLERANCE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}
CUDA = gp.backend_state().name == "cuda"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _values(rng: np.random.Generator, shape: Any, dtype: DType, scale: float = 1.0) -> Any:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype.numpy)


def _reference(x: Any, w: Any, prologue: str | None, norm_w: Any, eps: float, bias: Any, residual: Any) -> Any:
    """Float64, no intermediate rounding."""
    v = x.astype(np.float64)
    k = w.shape[1]
    if prologue == "rmsnorm":
        v = v / np.sqrt((v * v).mean() + eps) * norm_w.astype(np.float64)
    elif prologue == "swiglu":
        g, u = v[:k], v[k:]
        v = g / (1 + np.exp(-g)) * u
    y = w.astype(np.float64) @ v
    if bias is not None:
        y = y + bias.astype(np.float64)
    if residual is not None:
        y = y + residual.astype(np.float64)
    return y


def _chain(x: Any, w: Any, prologue: str | None, norm_w: Any, eps: float, bias: Any, residual: Any) -> Any:
    """The op chain the decoder's unfused step runs (device arrays in, host result out)."""
    p = x
    if prologue == "rmsnorm":
        p = ops.rmsnorm(x, norm_w, eps)
    elif prologue == "swiglu":
        p = ops.swiglu(x.reshape(1, -1))
    y = ops.matmul(p.reshape(1, -1), w.T)
    if bias is not None:
        y = ops.add(y, bias)
    if residual is not None:
        y, _ = ops.add_rmsnorm(y, residual.reshape(1, -1), None)
        y = _  # the residual sum, not its norm
    return y.to_numpy().reshape(-1)


CASES = [  # (prologue, bias, residual)
    (None, False, False), ("rmsnorm", False, False), ("rmsnorm", True, False), ("swiglu", False, True),
    (None, False, True), (None, True, True),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("prologue", "has_bias", "has_residual"), CASES)
@pytest.mark.parametrize(("n", "k"), [(960, 576), (37, 64), (576, 1536)])
def test_matches_float64_and_the_op_chain(rng: np.random.Generator, dtype: DType, prologue: str | None,
                                          has_bias: bool, has_residual: bool, n: int, k: int) -> None:  # fmt: skip
    hw = _values(rng, (n, k), dtype, 1 / np.sqrt(k))
    hx = _values(rng, 2 * k if prologue == "swiglu" else k, dtype)
    hn = (_values(rng, k, dtype, 0.2).astype(np.float32) + 1).astype(dtype.numpy) if prologue == "rmsnorm" else None
    hb = _values(rng, n, dtype, 0.1) if has_bias else None
    hr = _values(rng, n, dtype) if has_residual else None
    w, x = gp.from_numpy(hw), gp.from_numpy(hx)
    norm = None if hn is None else gp.from_numpy(hn)
    bias = None if hb is None else gp.from_numpy(hb)
    residual = None if hr is None else gp.from_numpy(hr)
    out = gp.empty((1, 1, n), dtype)
    got = ops.fused_gemv(x, w, prologue=prologue, norm_weight=norm, eps=1e-5, bias=bias, residual=residual, out=out)
    assert got is out
    host = got.to_numpy().reshape(-1)
    want = _reference(hx, hw, prologue, hn, 1e-5, hb, hr)
    err = np.abs(host.astype(np.float64) - want)
    assert (err <= TOLERANCE[dtype.name] * (1.0 + np.abs(want))).all(), err.max()
    chain = _chain(x, w, prologue, norm, 1e-5, bias, residual)
    if CUDA:  # float32 sums in another order
        err = np.abs(host.astype(np.float64) - chain.astype(np.float64))
        assert (err <= TOLERANCE[dtype.name] * (1.0 + np.abs(chain.astype(np.float64)))).all(), err.max()
    else:  # each step rounds where the chain rounds: equal
        assert host.tobytes() == chain.tobytes()


def test_in_place_residual_and_fresh_output(rng: np.random.Generator) -> None:
    hw, hx, hr = _values(rng, (64, 32), gp.bfloat16), _values(rng, 32, gp.bfloat16), _values(rng, 64, gp.bfloat16)
    w, x, residual = gp.from_numpy(hw), gp.from_numpy(hx), gp.from_numpy(hr)
    fresh = ops.fused_gemv(x, w, residual=residual)
    assert fresh.shape == (64,)
    assert ops.fused_gemv(x, w, residual=residual, out=residual) is residual
    assert residual.to_numpy().tobytes() == fresh.to_numpy().tobytes()


def test_supported_and_errors(rng: np.random.Generator) -> None:
    w = gp.from_numpy(_values(rng, (16, 64), gp.bfloat16))
    x = gp.from_numpy(_values(rng, 64, gp.bfloat16))
    assert ops.fused_gemv_supported(w)
    assert ops.fused_gemv_supported(w, gp.bfloat16)
    assert not ops.fused_gemv_supported(w, gp.float16)
    assert not ops.fused_gemv_supported(w[:, :60])  # 120-byte rows
    assert not ops.fused_gemv_supported(w.T)
    assert not ops.fused_gemv_supported(gp.zeros((4, 64), gp.float64))
    assert not ops.fused_gemv_supported(gp.zeros((4, 32768), gp.float32))  # 128 KiB of shared memory
    with pytest.raises(ArgumentError, match="prologue must be"):
        ops.fused_gemv(x, w, prologue="gelu")
    with pytest.raises(ShapeError, match="weight must be a dense"):
        ops.fused_gemv(x, w[:, :60])
    with pytest.raises(ShapeError, match=r"x must be contiguous with 128 elements"):
        ops.fused_gemv(x, w, prologue="swiglu")
    with pytest.raises(ArgumentError, match="needs norm_weight"):
        ops.fused_gemv(x, w, prologue="rmsnorm")
    with pytest.raises(ArgumentError, match="only for prologue 'rmsnorm'"):
        ops.fused_gemv(x, w, norm_weight=x)
    with pytest.raises(DTypeError, match="bias must be bfloat16"):
        ops.fused_gemv(x, w, bias=gp.zeros(16, gp.float32))
    with pytest.raises(ShapeError, match="residual must be contiguous with 16 elements"):
        ops.fused_gemv(x, w, residual=gp.zeros(17, gp.bfloat16))
    with pytest.raises(ArgumentError, match="must not share memory with x"):
        ops.fused_gemv(x[:16], gp.from_numpy(_values(rng, (16, 16), gp.bfloat16)), out=x[16:32])
    with pytest.raises(ArgumentError, match="eps must be"):
        ops.fused_gemv(x, w, prologue="rmsnorm", norm_weight=x, eps=-1.0)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(4608, 4096), (28672, 4096), (4096, 14336)])
def test_gpu_7b_shapes_and_graph_replay(rng: np.random.Generator, n: int, k: int) -> None:
    dtype = gp.bfloat16
    hw, hx = _values(rng, (n, k), dtype, 1 / np.sqrt(k)), _values(rng, k, dtype)
    hn, hr = (_values(rng, k, dtype, 0.2).astype(np.float32) + 1).astype(dtype.numpy), _values(rng, n, dtype)
    w, x, norm, residual = gp.from_numpy(hw), gp.from_numpy(hx), gp.from_numpy(hn), gp.from_numpy(hr)
    out = gp.empty(n, dtype)
    eager = ops.fused_gemv(x, w, prologue="rmsnorm", norm_weight=norm, residual=residual)
    stream = gp.Stream()
    graph = gp.CudaGraph()
    with stream:
        ops.fused_gemv(x, w, prologue="rmsnorm", norm_weight=norm, residual=residual, out=out)
        with graph.capture(stream):
            ops.fused_gemv(x, w, prologue="rmsnorm", norm_weight=norm, residual=residual, out=out)
        out.copy_(np.zeros(n, dtype.numpy))
        graph.replay(stream)
    stream.synchronize()
    assert out.to_numpy().tobytes() == eager.to_numpy().tobytes()
    want = _reference(hx, hw, "rmsnorm", hn, 1e-6, None, hr)
    err = np.abs(out.to_numpy().astype(np.float64) - want)
    assert (err <= TOLERANCE["bfloat16"] * (1.0 + np.abs(want))).all(), err.max()


@pytest.mark.gpu
@pytest.mark.parametrize("k", [576, 1024, 1536])
@pytest.mark.parametrize("prologue", [None, "rmsnorm", "swiglu"])
def test_gpu_rows_held_in_registers_give_the_streamed_bits(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                                         k: int, prologue: str | None) -> None:  # fmt: skip
    """The kernel's N: a short row's chunks loaded into registers before the prologue (N = 4, 8) against
    the streamed loop (N = 0), bitwise, every lane adding its chunks in the same order."""
    from pygpukit.ops import gemv_fusions

    dtype, n = gp.bfloat16, 333
    hw = _values(rng, (n, k), dtype, 1 / np.sqrt(k))
    hx = _values(rng, 2 * k if prologue == "swiglu" else k, dtype)
    hn = (_values(rng, k, dtype, 0.2).astype(np.float32) + 1).astype(dtype.numpy)
    w, x, norm = gp.from_numpy(hw), gp.from_numpy(hx), gp.from_numpy(hn)
    bias, residual = gp.from_numpy(_values(rng, n, dtype)), gp.from_numpy(_values(rng, n, dtype))
    results = {}
    for held in (0, 4, 8):
        if k * dtype.itemsize // 16 > 32 * held > 0:
            continue  # the row does not fit N's registers
        monkeypatch.setattr(gemv_fusions, "_held", lambda k, itemsize, blocks, held=held: held)
        out = ops.fused_gemv(x, w, prologue=prologue, norm_weight=norm if prologue == "rmsnorm" else None,
                             bias=bias, residual=residual)  # fmt: skip
        results[held] = out.to_numpy().tobytes()
    assert len(results) >= 2
    assert len(set(results.values())) == 1


@pytest.mark.nvrtc
def test_every_fused_gemv_kernel_compiles() -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()["nn/fused_gemv.cu"]
    assert len({e for g in groups for e in g}) == 27  # 3 dtypes x 3 prologues x N in (0, 4, 8)
    for expressions in groups:
        group("nn/fused_gemv.cu", expressions).compile("80")
