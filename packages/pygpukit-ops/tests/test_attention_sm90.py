"""The SM 90 (wgmma) prefill attention kernel (attention_prefill_sm90.cu): on an SM 90 device, against a
float64 NumPy reference on random data (odd lengths, batch > 1, grouped-query heads, head dimensions 64
and 128, fp16 and bf16, causal, windowed, non-causal and cross attention, keys from a cache), against
the SM 80 kernel on the same inputs, and bitwise determinism. The GPU tests skip on other devices; the
argument checks of set_prefill_kernel run everywhere."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from ops_testing import poison, sample, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError
from pygpukit.ops import _attention_sm90, attention
from pygpukit.testing import assert_bitwise_equal

Array = np.ndarray[Any, Any]
DTYPES = [gp.bfloat16, gp.float16]
# Outputs are weighted means of values in [-1, 1]: one rounding of the result plus the probabilities
# rounded to the input type before P @ V (test_attention.py's tolerances).
ATOL = {"float16": 4e-3, "bfloat16": 3e-2}
H100_SHARED_OPTIN = 232448  # bytes of shared memory a block may opt in to on an H100


def reference(q: Array, k: Array, v: Array, *, causal: bool, window: int | None = None,
              kv_lens: Any = None) -> Array:  # fmt: skip
    """float64 softmax(q k^T / sqrt(d) + mask) v per (batch, head): q (B, Sq, H, D), k/v (B, Skv, Hkv, D);
    queries aligned to the end of the keys (kv_lens[b] keys of sequence b when given)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, seq_q, heads, dim = q.shape
    group = heads // k.shape[2]
    out = np.zeros(q.shape)
    for b in range(batch):
        n = k.shape[1] if kv_lens is None else int(kv_lens[b])
        pos = n - seq_q + np.arange(seq_q)[:, None]
        j = np.arange(n)[None, :]
        visible = np.ones((seq_q, n), bool)
        if causal:
            visible = j <= pos
            if window is not None:
                visible &= j > pos - window
        for h in range(heads):
            scores = q[b, :, h] @ k[b, :n, h // group].T / math.sqrt(dim)
            scores = np.where(visible, scores, -np.inf)
            top = scores.max(axis=1, keepdims=True)
            weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
            total = weights.sum(axis=1, keepdims=True)
            out[b, :, h] = (weights / np.where(total > 0, total, 1.0)) @ v[b, :n, h // group]
    return out


def close(actual: gp.GPUArray, expected: Array, dtype: DType, what: str = "") -> None:
    got = actual.to_numpy()
    assert got.shape == expected.shape, (got.shape, expected.shape)
    atol = ATOL[dtype.name]
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=atol, atol=atol, err_msg=what)


def qkv(seed: int, batch: int, seq_q: int, seq_kv: int, heads: int, kv_heads: int, dim: int,
        dtype: DType) -> tuple[Array, Array, Array]:  # fmt: skip
    rng = np.random.default_rng(seed)
    q = sample(rng, (batch, seq_q, heads, dim), dtype, -2.0, 2.0)
    k = sample(rng, (batch, seq_kv, kv_heads, dim), dtype, -2.0, 2.0)
    v = sample(rng, (batch, seq_kv, kv_heads, dim), dtype, -1.0, 1.0)
    return q, k, v


def kernels_planned() -> list[str]:
    """'sm90' or 'sm80' for every prefill plan made since the plan cache was last cleared."""
    plans = attention._PLANS._plans.items()
    return [_attention_sm90.describe(plan) for key, plan in plans if isinstance(key, tuple) and key[0] == "rows"]


# -- everywhere --------------------------------------------------------------------------------------
def test_set_prefill_kernel_checks_its_argument() -> None:
    with pytest.raises(ArgumentError, match="'sm70'"):
        gp.set_prefill_kernel("sm70")
    with pytest.raises(ArgumentError, match="int"):
        gp.set_prefill_kernel(90)
    assert _attention_sm90.CHOICE.kind in _attention_sm90.KINDS


def test_every_tiling_fits_an_h100_and_is_compiled() -> None:
    """A tiling over the H100's shared memory would never run; each one the planner can pick is in the
    compile check's list (so CI compiles it for sm_90a)."""
    listed = {e for (e,) in _attention_sm90.enumerate_kernels()[_attention_sm90.FILE]}
    for head_dim in _attention_sm90.HEAD_DIMS:
        for tiling in _attention_sm90.CONFIGS[head_dim] + _attention_sm90.ALTERNATIVES.get(head_dim, []):
            assert _attention_sm90.shared_bytes(head_dim, tiling) <= H100_SHARED_OPTIN, (head_dim, tiling)
            for dtype in DTYPES:
                assert _attention_sm90.expression(dtype, head_dim, tiling) in listed


@pytest.mark.nvrtc
def test_every_sm90_kernel_compiles_for_sm90a() -> None:
    """The instantiations the planner can launch, with AttentionArgs' layout asserts appended, in one NVRTC
    compilation for sm_90a (the runtime and the compile check build this file for sm_90a on SM 90)."""
    from pygpukit.core.abi import static_asserts_for
    from pygpukit.core.compiler import compile_source
    from pygpukit.ops._kernels import SM90A_FILES, kernel_root

    assert _attention_sm90.FILE in SM90A_FILES
    path = kernel_root() / _attention_sm90.FILE
    expressions = [e for (e,) in _attention_sm90.enumerate_kernels()[_attention_sm90.FILE]]
    assert len(expressions) >= 8
    program = compile_source(path.read_text() + static_asserts_for(_attention_sm90.FILE), arch="90a",
                             include_dirs=[path.parent], name_expressions=expressions)  # fmt: skip
    assert len(program.binary) > 100_000  # real kernel bodies, not the empty ones of other targets


# -- SM 90 -------------------------------------------------------------------------------------------
@pytest.fixture
def sm90() -> Iterator[None]:
    """Skips unless the SM 90 kernel runs here; restores the kernel choice afterwards."""
    if not gp.is_cuda_available():
        pytest.skip("needs a CUDA device")
    from pygpukit.ops.gemm._base import device_props

    if not device_props(gp.get_device()).wgmma:
        pytest.skip("the SM 90 prefill kernel needs a device of compute capability 9.0")
    before = _attention_sm90.CHOICE.kind
    gp.set_prefill_kernel("auto")
    yield
    gp.set_prefill_kernel(before)


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
def test_routes_to_the_sm90_kernel_and_back() -> None:
    q, k, v = (upload(x) for x in qkv(1, 1, 130, 130, 4, 2, 128, gp.bfloat16))
    attention._PLANS.clear()
    gp.sdpa_causal(q, k, v)
    assert kernels_planned() == ["sm90"]
    gp.set_prefill_kernel("sm80")
    gp.sdpa_causal(q, k, v)
    assert sorted(kernels_planned()) == ["sm80", "sm90"]
    attention._PLANS.clear()
    gp.set_prefill_kernel("auto")
    q96, k96, v96 = (upload(x) for x in qkv(1, 1, 130, 130, 4, 2, 96, gp.bfloat16))
    gp.sdpa_causal(q96, k96, v96)  # head_dim 96: the SM 80 kernel
    assert kernels_planned() == ["sm80"]


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("seq", [1, 17, 127, 1000, 2049])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_self_attention_against_float64(dtype: DType, dim: int, seq: int, causal: bool) -> None:
    q, k, v = qkv(seq * 7 + dim, 2, seq, seq, 8, 2, dim, dtype)
    out = poison(q.shape, dtype)
    gp.sdpa(upload(q), upload(k), upload(v), causal=causal, out=out)
    close(out, reference(q, k, v, causal=causal), dtype, f"seq {seq}")


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize(("seq_q", "seq_kv", "causal", "window"), [
    (37, 1000, True, None), (129, 300, True, None), (255, 257, True, 1), (200, 1000, True, 100),
    (1000, 1000, True, 129), (129, 300, False, None), (1500, 77, False, None), (3, 2049, False, None),
])  # fmt: skip
def test_cross_windowed_and_mqa_against_float64(dtype: DType, dim: int, seq_q: int, seq_kv: int, causal: bool,
                                                window: int | None) -> None:  # fmt: skip
    heads, kv_heads = (6, 1) if seq_q % 2 else (4, 4)  # multi-query and plain multi-head
    q, k, v = qkv(seq_q + seq_kv, 3, seq_q, seq_kv, heads, kv_heads, dim, dtype)
    if causal:
        out = gp.sdpa_causal(upload(q), upload(k), upload(v), window=window)
    else:
        out = gp.sdpa(upload(q), upload(k), upload(v))
    close(out, reference(q, k, v, causal=causal, window=window), dtype)


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 128])
def test_prefill_from_cache_and_strided_views(dtype: DType, dim: int) -> None:
    """Keys from a (batch, kv_heads, max_len, dim) cache with device start positions; q, k, v as views
    of one fused projection with the output written into a wider view."""
    rng = np.random.default_rng(dim)
    batch, seq_q, max_len, heads, kv_heads = 3, 300, 1200, 8, 2
    starts = np.array([0, 131, 899], np.int32)
    q = sample(rng, (batch, seq_q, heads, dim), dtype, -2.0, 2.0)
    k_cache = sample(rng, (batch, kv_heads, max_len, dim), dtype, -2.0, 2.0)
    v_cache = sample(rng, (batch, kv_heads, max_len, dim), dtype, -1.0, 1.0)
    out = poison(q.shape, dtype)
    gp.prefill_attention(upload(q), upload(k_cache), upload(v_cache), upload(starts), out=out)
    expected = reference(q, k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3), causal=True,
                         kv_lens=starts + seq_q)  # fmt: skip
    close(out, expected, dtype)

    fused = sample(rng, (2, 333, 3, 4, dim), dtype, -1.0, 1.0)
    device = upload(fused)
    wide = poison((2, 333, 4, 2 * dim), dtype)
    gp.sdpa_causal(device[:, :, 0], device[:, :, 1], device[:, :, 2], out=wide[..., :dim])
    close(wide[..., :dim], reference(fused[:, :, 0], fused[:, :, 1], fused[:, :, 2], causal=True), dtype)
    assert np.isnan(wide.to_numpy()[..., dim:].astype(np.float64)).all()


TILINGS = [(dim, tiling) for dim in _attention_sm90.HEAD_DIMS
           for tiling in _attention_sm90.CONFIGS[dim] + _attention_sm90.ALTERNATIVES.get(dim, [])]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize(("dim", "tiling"), TILINGS, ids=lambda x: str(x).replace(" ", ""))
def test_every_tiling_against_float64(dtype: DType, dim: int, tiling: _attention_sm90.Tiling,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Each compiled tiling (the defaults and the benchmarked alternatives) on causal, windowed, cross
    and non-causal attention with odd lengths."""
    monkeypatch.setitem(_attention_sm90.CONFIGS, dim, [tiling])
    attention._PLANS.clear()
    for seq_q, seq_kv, causal, window in [(1000, 1000, True, None), (77, 301, True, 45), (129, 300, False, None)]:
        q, k, v = qkv(seq_q + dim, 2, seq_q, seq_kv, 8, 2, dim, dtype)
        out = gp.sdpa(upload(q), upload(k), upload(v), causal=causal) if window is None else gp.sdpa_causal(
            upload(q), upload(k), upload(v), window=window)  # fmt: skip
        close(out, reference(q, k, v, causal=causal, window=window), dtype, f"{tiling} {seq_q} {seq_kv}")
    assert set(kernels_planned()) == {"sm90"}
    attention._PLANS.clear()


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_agrees_with_the_sm80_kernel(dtype: DType, dim: int, causal: bool) -> None:
    """Same inputs through both kernels: each within tolerance of float64, and of each other."""
    q, k, v = qkv(dim + causal, 2, 1000, 1000, 8, 2, dim, dtype)
    dq, dk, dv = upload(q), upload(k), upload(v)
    attention._PLANS.clear()
    new = gp.sdpa(dq, dk, dv, causal=causal).to_numpy().astype(np.float64)
    gp.set_prefill_kernel("sm80")
    old = gp.sdpa(dq, dk, dv, causal=causal).to_numpy().astype(np.float64)
    assert sorted(kernels_planned()) == ["sm80", "sm90"]
    expected = reference(q, k, v, causal=causal)
    atol = ATOL[dtype.name]
    np.testing.assert_allclose(new, expected, rtol=atol, atol=atol)
    np.testing.assert_allclose(old, expected, rtol=atol, atol=atol)
    np.testing.assert_allclose(new, old, rtol=atol, atol=atol)


@pytest.mark.gpu
@pytest.mark.usefixtures("sm90")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 128])
def test_deterministic_and_graph_replay_bitwise(dtype: DType, dim: int) -> None:
    q, k, v = (upload(x) for x in qkv(dim, 2, 2049, 2049, 8, 2, dim, dtype))
    first = gp.sdpa_causal(q, k, v).to_numpy()
    second = gp.sdpa_causal(q, k, v).to_numpy()
    assert_bitwise_equal(second, first)
    out = gp.empty(q.shape, dtype)
    graph = gp.CudaGraph()
    with graph.capture():
        gp.sdpa_causal(q, k, v, out=out)
    graph.replay()
    graph.synchronize()
    assert_bitwise_equal(out.to_numpy(), first)
