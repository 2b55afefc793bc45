"""Mixture-of-experts ops (pygpukit.ops.moe) against float64 NumPy references.

Every test without a marker runs on the active backend (the kernels on a GPU, the NumPy CPU backend
otherwise); ``gpu`` tests need the kernels (CUDA graph replays, the tile shapes of the grouped GEMM at
sizes the CPU backend would take long over). Outputs are poisoned with NaN/garbage first; data is
fresh random per test. Grouped GEMM errors are relative Frobenius norms per expert against float64
products of the same (already rounded) inputs: fp16 out <= 1e-3, bf16 <= 6e-3 (one output rounding
plus float32 accumulation), float32 <= 2e-5.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import backend_state
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops import _kernels
from pygpukit.ops import moe as moe_module

Array = np.ndarray[Any, Any]

FLOATS = [gp.float32, gp.float16, gp.bfloat16]
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
GEMM_BOUND = {"float32": 2e-5, "float16": 1e-3, "bfloat16": 6e-3}
# The whole block rounds gate/up, h, the down projection and the result to the dtype.
MLP_BOUND = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _random(rng: np.random.Generator, shape: Any, dtype: DType, scale: float = 1.0) -> Array:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(NUMPY[dtype.name])


def _poison(shape: Any, dtype: Any) -> gp.GPUArray:
    dt = gp.dtypes.as_dtype(dtype)
    return gp.full(shape, np.nan if dt.is_floating else -7, dt)


def _relative_error(actual: Array, expected: Array) -> float:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    norm = np.linalg.norm(expected)
    return float(np.linalg.norm(actual - expected) / (norm if norm > 0 else 1.0))


# -- references ---------------------------------------------------------------------------------------
def _gating_reference(logits: Array, k: int, renormalize: bool, scoring: str) -> tuple[Array, Array]:
    """HF Mixtral / Qwen3-MoE routing in float64: scores over all experts, top-k with ties to the lower
    expert id, optional renormalisation."""
    values = logits.astype(np.float64)
    _tokens, experts = values.shape
    index = np.broadcast_to(np.arange(experts), values.shape)
    ids = np.lexsort((index, -values), axis=-1)[:, :k]
    if scoring == "softmax":
        exp = np.exp(values - values.max(axis=-1, keepdims=True))
        scores = exp / exp.sum(axis=-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-values))
    weights = np.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights, ids


def _silu(v: Array) -> Array:
    return v / (1.0 + np.exp(-v))


def _moe_reference(
    x: Array, logits: Array, w_gate: Array, w_up: Array, w_down: Array, k: int, renormalize: bool
) -> Array:
    """The HF MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock forward in float64 (nn.Linear weights)."""
    weights, ids = _gating_reference(logits, k, renormalize, "softmax")
    xs = x.astype(np.float64)
    out = np.zeros_like(xs)
    g, u, d = (w.astype(np.float64) for w in (w_gate, w_up, w_down))
    for t in range(xs.shape[0]):
        for j in range(k):
            e = ids[t, j]
            h = _silu(g[e] @ xs[t]) * (u[e] @ xs[t])
            out[t] += weights[t, j] * (d[e] @ h)
    return out


def _stable_positions(ids: Array, experts: int) -> tuple[Array, Array]:
    flat = ids.reshape(-1)
    bucket = np.where((flat >= 0) & (flat < experts), flat, experts)
    order = np.argsort(bucket, kind="stable")
    permutation = np.empty(flat.size, np.int64)
    permutation[order] = np.arange(flat.size)
    counts = np.bincount(bucket, minlength=experts + 1)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]), permutation


def _offsets_for(counts: list[int]) -> Array:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


# -- gating -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(
    ("tokens", "experts", "k", "renormalize"),
    [(1, 8, 2, True), (37, 8, 2, False), (5, 128, 8, True), (300, 64, 8, True), (3, 1000, 5, False), (4, 33, 33, True)],
)
def test_gating_matches_float64(
    rng: np.random.Generator, dtype: DType, tokens: int, experts: int, k: int, renormalize: bool
) -> None:
    logits = _random(rng, (tokens, experts), dtype, 2.0)
    out_w, out_i = _poison((tokens, k), gp.float32), _poison((tokens, k), gp.int32)
    weights, ids = gp.moe_topk_gating(gp.from_numpy(logits), k, renormalize, out_weights=out_w, out_ids=out_i)
    assert weights is out_w
    assert ids is out_i
    ref_w, ref_i = _gating_reference(logits, k, renormalize, "softmax")
    np.testing.assert_array_equal(ids.to_numpy(), ref_i)
    assert weights.dtype == gp.float32
    assert ids.dtype == gp.int32
    np.testing.assert_allclose(weights.to_numpy(), ref_w, rtol=2e-6 * max(8, experts) ** 0.5, atol=1e-7)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("renormalize", [False, True])
def test_gating_ties_go_to_the_lower_expert(rng: np.random.Generator, dtype: DType, renormalize: bool) -> None:
    # Integer logits from a small range: most rows have ties inside and at the edge of the top k.
    logits = rng.integers(-2, 3, size=(257, 64)).astype(NUMPY[dtype.name])
    logits[0] = 1  # all equal: experts 0..k-1
    weights, ids = gp.moe_topk_gating(gp.from_numpy(logits), 8, renormalize)
    ref_w, ref_i = _gating_reference(logits, 8, renormalize, "softmax")
    np.testing.assert_array_equal(ids.to_numpy(), ref_i)
    np.testing.assert_array_equal(ids.to_numpy()[0], np.arange(8))
    np.testing.assert_allclose(weights.to_numpy(), ref_w, rtol=2e-5, atol=1e-7)


def test_gating_sigmoid_and_special_values(rng: np.random.Generator) -> None:
    logits = _random(rng, (9, 16), gp.float32, 3.0)
    weights, ids = gp.moe_topk_gating(gp.from_numpy(logits), 4, True, scoring="sigmoid")
    ref_w, ref_i = _gating_reference(logits, 4, True, "sigmoid")
    np.testing.assert_array_equal(ids.to_numpy(), ref_i)
    np.testing.assert_allclose(weights.to_numpy(), ref_w, rtol=1e-5)
    # -0.0 ties with +0.0 (lower id first), -inf is chosen last, a NaN logit first.
    special = np.full((2, 4), -np.inf, np.float32)
    special[0, :3] = [-0.0, 0.0, -1.0]
    special[1] = [1.0, np.nan, 2.0, -np.inf]
    _, ids = gp.moe_topk_gating(gp.from_numpy(special), 4, False)
    np.testing.assert_array_equal(ids.to_numpy(), [[0, 1, 2, 3], [1, 2, 0, 3]])


# -- permutation --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("tokens", "hidden", "experts", "k"), [(1, 256, 8, 2), (37, 100, 8, 2), (3001, 24, 128, 8),
                                                                 (9000, 8, 4, 3), (6, 7, 1000, 3)])  # fmt: skip
def test_permute_is_a_stable_counting_sort(
    rng: np.random.Generator, dtype: DType, tokens: int, hidden: int, experts: int, k: int
) -> None:
    x = _random(rng, (tokens, hidden), dtype)
    # Distinct experts per token (as top-k gives), some experts left empty.
    ids = np.argsort(rng.random((tokens, experts)), axis=-1)[:, :k].astype(np.int32)
    ids[ids == experts // 2] = 0 if k == 1 else ids[ids == experts // 2]
    slots = tokens * k
    out = _poison((slots, hidden), dtype)
    offs = _poison((experts + 1,), gp.int32)
    perm = _poison((slots,), gp.int32)
    x_perm, offsets, permutation = gp.moe_permute(gp.from_numpy(x), gp.from_numpy(ids), experts, out, offs, perm)
    assert x_perm is out
    assert offsets is offs
    assert permutation is perm
    ref_offsets, ref_perm = _stable_positions(ids, experts)
    np.testing.assert_array_equal(offsets.to_numpy(), ref_offsets)
    np.testing.assert_array_equal(permutation.to_numpy(), ref_perm)
    expected = np.empty((slots, hidden), x.dtype)
    expected[ref_perm] = x[np.arange(slots) // k]
    assert x_perm.to_numpy().tobytes() == expected.tobytes()


def test_permute_puts_invalid_ids_last(rng: np.random.Generator) -> None:
    ids = np.array([[3, -1], [0, 3], [4, 1], [2, 99]], np.int32)
    x = _random(rng, (4, 16), gp.float32)
    x_perm, offsets, permutation = gp.moe_permute(gp.from_numpy(x), gp.from_numpy(ids), 4)
    np.testing.assert_array_equal(offsets.to_numpy(), [0, 1, 2, 3, 5])  # 3 rows outside every expert
    np.testing.assert_array_equal(permutation.to_numpy(), [3, 5, 0, 4, 6, 1, 2, 7])
    np.testing.assert_array_equal(x_perm.to_numpy()[5:], x[[0, 2, 3]])


def test_permute_of_non_contiguous_rows(rng: np.random.Generator) -> None:
    wide = _random(rng, (10, 64), gp.bfloat16)
    ids = rng.integers(0, 5, size=(10, 2)).astype(np.int32)
    x_perm, _, perm = gp.moe_permute(gp.from_numpy(wide)[:, :40], gp.from_numpy(ids), 5)
    expected = np.empty((20, 40), wide.dtype)
    expected[perm.to_numpy()] = wide[np.arange(20) // 2, :40]
    assert x_perm.to_numpy().tobytes() == expected.tobytes()


# -- unpermute ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("tokens", "hidden", "k"), [(1, 4096, 2), (33, 256, 8), (7, 13, 3), (500, 64, 1)])
def test_unpermute_sums_weighted_slots(
    rng: np.random.Generator, dtype: DType, tokens: int, hidden: int, k: int
) -> None:
    experts = 16
    ids = np.argsort(rng.random((tokens, experts)), axis=-1)[:, :k].astype(np.int32)
    _, perm = _stable_positions(ids, experts)
    y = _random(rng, (tokens * k, hidden), dtype)
    w = rng.random((tokens, k)).astype(np.float32)
    out = _poison((tokens, hidden), dtype)
    result = gp.moe_unpermute(gp.from_numpy(y), gp.from_numpy(perm.astype(np.int32)), gp.from_numpy(w), out)
    assert result is out
    expected = np.einsum("tj,tjh->th", w.astype(np.float64), y.astype(np.float64)[perm.reshape(tokens, k)])
    rtol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype.name]
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), expected, rtol=rtol, atol=rtol * k)


# -- grouped GEMM -------------------------------------------------------------------------------------
def _grouped_reference(x: Array, w: Array, offsets: Array, layout: str) -> list[tuple[int, int, Array]]:
    result = []
    for e in range(w.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        matrix = w[e].astype(np.float64)
        result.append((lo, hi, x[lo:hi].astype(np.float64) @ (matrix.T if layout == "nk" else matrix)))
    return result


def _check_grouped(
    rng: np.random.Generator, dtype: DType, counts: list[int], n: int, k: int, layout: str, extra_rows: int = 0
) -> None:
    experts = len(counts)
    offsets = _offsets_for(counts)
    rows = int(offsets[-1]) + extra_rows
    x = _random(rng, (rows, k), dtype)
    w = _random(rng, (experts, n, k) if layout == "nk" else (experts, k, n), dtype, 0.1)
    out = _poison((rows, n), dtype)
    result = gp.grouped_gemm(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(offsets), layout, out)
    assert result is out
    got = out.to_numpy().astype(np.float64)
    for e, (lo, hi, expected) in enumerate(_grouped_reference(x, w, offsets, layout)):
        if hi > lo:
            error = _relative_error(got[lo:hi], expected)
            assert error <= GEMM_BOUND[dtype.name], (e, lo, hi, error)
    assert np.isnan(got[int(offsets[-1]) :]).all()  # rows outside every group are left alone


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize(
    ("counts", "n", "k"),
    [
        ([1, 0, 1, 0, 0, 0, 0, 0], 256, 512),  # decode: two rows, six idle experts
        ([3, 0, 17, 1, 0, 44, 2, 9], 200, 136),  # group sizes off every tile multiple
        ([0, 70, 130, 0, 33], 72, 64),
        ([0, 0, 0, 0], 64, 32),  # nothing routed
        ([5], 40, 24),
    ],
)
def test_grouped_gemm_matches_per_expert_products(
    rng: np.random.Generator, dtype: DType, layout: str, counts: list[int], n: int, k: int
) -> None:
    _check_grouped(rng, dtype, counts, n, k, layout)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_grouped_gemm_odd_sizes_and_untouched_rows(rng: np.random.Generator, dtype: DType) -> None:
    # K and N not multiples of 8 (element-wise loads), and rows after offsets[E] left unwritten.
    _check_grouped(rng, dtype, [7, 0, 19, 2], 37, 45, "nk", extra_rows=5)
    _check_grouped(rng, dtype, [1, 30], 13, 9, "kn", extra_rows=3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize(
    ("counts", "n", "k"),
    [
        ([300, 0, 241, 450, 301], 320, 256),  # mean above 256 rows: the 128 x 256 tile
        ([100, 90, 0, 130, 140, 7, 101, 200], 264, 128),  # the 128 x 128 tile
        ([40, 3, 60, 0, 35], 136, 96),  # the 64 x 128 tile
        ([1] * 64 + [0] * 64, 1536, 2048),  # Qwen3-30B-A3B decode: 8 tokens x top-8, gate_up
    ],
)
def test_grouped_gemm_tiles(
    rng: np.random.Generator, dtype: DType, layout: str, counts: list[int], n: int, k: int
) -> None:
    _check_grouped(rng, dtype, counts, n, k, layout)


def test_grouped_gemm_clamps_ill_formed_offsets(rng: np.random.Generator) -> None:
    # Offsets read on the device cannot raise: a running maximum clamped to [0, rows] is used.
    x = _random(rng, (10, 8), gp.float32)
    w = _random(rng, (4, 6, 8), gp.float32)
    offsets = np.array([-3, 4, 2, 7, 50], np.int32)
    out = _poison((10, 6), gp.float32)
    gp.grouped_gemm(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(offsets), out=out)
    got = out.to_numpy()
    bounds = [(0, 4), (4, 4), (4, 7), (7, 10)]
    for e, (lo, hi) in enumerate(bounds):
        np.testing.assert_allclose(got[lo:hi], x[lo:hi].astype(np.float64) @ w[e].T.astype(np.float64), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip


def test_grouped_gemm_into_a_strided_out(rng: np.random.Generator) -> None:
    x = _random(rng, (12, 16), gp.bfloat16)
    w = _random(rng, (3, 8, 16), gp.bfloat16)
    offsets = _offsets_for([5, 0, 7])
    wide = _poison((12, 24), gp.bfloat16)
    gp.grouped_gemm(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(offsets), out=wide[:, 8:16])
    got = wide.to_numpy().astype(np.float64)
    assert np.isnan(got[:, :8]).all()
    assert np.isnan(got[:, 16:]).all()
    for _, (lo, hi, expected) in enumerate(_grouped_reference(x, w, offsets, "nk")):
        if hi > lo:
            assert _relative_error(got[lo:hi, 8:16], expected) <= GEMM_BOUND["bfloat16"]


# -- the MoE MLP --------------------------------------------------------------------------------------
def _mlp_case(
    rng: np.random.Generator, dtype: DType, tokens: int, hidden: int, inter: int, experts: int
) -> tuple[Array, Array, Array, Array, Array]:
    x = _random(rng, (tokens, hidden), dtype)
    logits = _random(rng, (tokens, experts), dtype)
    scale = 1.0 / np.sqrt(hidden)
    w_gate = _random(rng, (experts, inter, hidden), dtype, scale)
    w_up = _random(rng, (experts, inter, hidden), dtype, scale)
    w_down = _random(rng, (experts, hidden, inter), dtype, 1.0 / np.sqrt(inter))
    return x, logits, w_gate, w_up, w_down


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(
    ("name", "tokens", "hidden", "inter", "experts", "k", "renormalize"),
    [
        ("mixtral-like", 19, 256, 384, 8, 2, True),
        ("mixtral-like decode", 1, 256, 384, 8, 2, True),
        ("qwen3-moe-like", 23, 128, 96, 64, 8, True),
        ("no renormalisation", 6, 64, 40, 16, 4, False),
    ],
)
@pytest.mark.parametrize("stacked", [True, False], ids=["gate_up", "pair"])
def test_moe_mlp_matches_the_hf_block(
    rng: np.random.Generator,
    dtype: DType,
    name: str,
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    k: int,
    renormalize: bool,
    stacked: bool,
) -> None:
    x, logits, w_gate, w_up, w_down = _mlp_case(rng, dtype, tokens, hidden, inter, experts)
    expected = _moe_reference(x, logits, w_gate, w_up, w_down, k, renormalize)
    gate_up: Any = (
        gp.from_numpy(np.concatenate([w_gate, w_up], axis=1))
        if stacked
        else (gp.from_numpy(w_gate), gp.from_numpy(w_up))
    )
    out = _poison((tokens, hidden), dtype)
    result = gp.moe_mlp(
        gp.from_numpy(x), gp.from_numpy(logits), gate_up, gp.from_numpy(w_down), k, renormalize, out=out
    )
    assert result is out
    assert result.dtype == dtype
    assert _relative_error(out.to_numpy(), expected) <= MLP_BOUND[dtype.name], name


@pytest.mark.parametrize("dtype", [gp.float32, gp.bfloat16], ids=str)
def test_moe_mlp_kn_layout_and_gelu(rng: np.random.Generator, dtype: DType) -> None:
    x, logits, w_gate, w_up, w_down = _mlp_case(rng, dtype, 9, 64, 48, 8)
    stacked_kn = np.ascontiguousarray(np.concatenate([w_gate, w_up], axis=1).transpose(0, 2, 1))
    down_kn = np.ascontiguousarray(w_down.transpose(0, 2, 1))
    got = gp.moe_mlp(gp.from_numpy(x), gp.from_numpy(logits), gp.from_numpy(stacked_kn), gp.from_numpy(down_kn), 2,
                     True, layout="kn")  # fmt: skip
    expected = _moe_reference(x, logits, w_gate, w_up, w_down, 2, True)
    assert _relative_error(got.to_numpy(), expected) <= MLP_BOUND[dtype.name]
    # GeGLU (tanh GELU) through the same path.
    gelu = gp.moe_mlp(gp.from_numpy(x), gp.from_numpy(logits), gp.from_numpy(np.concatenate([w_gate, w_up], axis=1)),
                      gp.from_numpy(w_down), 2, True, "gelu_tanh")  # fmt: skip
    assert not np.allclose(gelu.to_numpy().astype(np.float64), got.to_numpy().astype(np.float64))


def test_moe_mlp_with_workspace_is_deterministic(rng: np.random.Generator) -> None:
    x, logits, w_gate, w_up, w_down = _mlp_case(rng, gp.bfloat16, 40, 128, 64, 16)
    args = (gp.from_numpy(x), gp.from_numpy(logits), gp.from_numpy(np.concatenate([w_gate, w_up], axis=1)),
            gp.from_numpy(w_down), 4, True)  # fmt: skip
    size = gp.moe_workspace_size(40, 128, 64, 16, 4, gp.bfloat16)
    workspace = gp.full((size,), 255, gp.uint8)
    first = gp.moe_mlp(*args, out=_poison((40, 128), gp.bfloat16), workspace=workspace).to_numpy()
    for _ in range(3):
        again = gp.moe_mlp(*args, out=_poison((40, 128), gp.bfloat16), workspace=workspace).to_numpy()
        assert again.tobytes() == first.tobytes()
    assert gp.moe_mlp(*args).to_numpy().tobytes() == first.tobytes()  # own allocations


# -- bad input ----------------------------------------------------------------------------------------
def test_gating_rejects_bad_input() -> None:
    logits = gp.from_numpy(np.zeros((4, 8), np.float32) + 0.5)
    out_w = _poison((4, 2), gp.float32)
    with pytest.raises(ArgumentError, match="k=9"):
        gp.moe_topk_gating(logits, 9, out_weights=out_w)
    with pytest.raises(ArgumentError, match="k=0"):
        gp.moe_topk_gating(logits, 0)
    with pytest.raises(ShapeError, match=r"\(4, 2\)"):
        gp.moe_topk_gating(logits, 2, out_weights=_poison((4, 3), gp.float32))
    with pytest.raises(DTypeError, match="int32"):
        gp.moe_topk_gating(logits, 2, out_weights=out_w, out_ids=_poison((4, 2), gp.int64))
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.moe_topk_gating(gp.from_numpy(np.zeros((4, 8), np.int32)), 2)
    with pytest.raises(ShapeError, match="2-D"):
        gp.moe_topk_gating(gp.from_numpy(np.zeros(8, np.float32)), 2)
    with pytest.raises(ArgumentError, match="1024"):
        gp.moe_topk_gating(gp.from_numpy(np.zeros((1, 1025), np.float32)), 2)
    with pytest.raises(ValueError, match="scoring"):
        gp.moe_topk_gating(logits, 2, scoring="softmin")  # type: ignore[arg-type]
    assert np.isnan(out_w.to_numpy()).all()


def test_permute_and_unpermute_reject_bad_input() -> None:
    x = gp.from_numpy(np.ones((4, 8), np.float16))
    ids = gp.from_numpy(np.zeros((4, 2), np.int32))
    offsets = _poison((5,), gp.int32)
    with pytest.raises(ShapeError, match=r"\(4, 8\) and \(3, 2\)"):
        gp.moe_permute(x, gp.from_numpy(np.zeros((3, 2), np.int32)), 4, offsets=offsets)
    with pytest.raises(DTypeError, match="int32"):
        gp.moe_permute(x, gp.from_numpy(np.zeros((4, 2), np.int64)), 4, offsets=offsets)
    with pytest.raises(ShapeError, match=r"\(5,\)"):
        gp.moe_permute(x, ids, 4, offsets=_poison((4,), gp.int32))
    with pytest.raises(DTypeError, match="float16"):
        gp.moe_permute(x, ids, 4, out=_poison((8, 8), gp.float32), offsets=offsets)
    with pytest.raises(ArgumentError, match="num_experts=0"):
        gp.moe_permute(x, ids, 0)
    assert (offsets.to_numpy() == -7).all()
    y = gp.from_numpy(np.ones((8, 8), np.float16))
    perm = gp.from_numpy(np.arange(8, dtype=np.int32))
    w = gp.from_numpy(np.ones((4, 2), np.float32))
    out = _poison((4, 8), gp.float16)
    with pytest.raises(ShapeError, match="tokens"):
        gp.moe_unpermute(y, gp.from_numpy(np.arange(6, dtype=np.int32)), w, out)
    with pytest.raises(DTypeError, match="float32"):
        gp.moe_unpermute(y, perm, gp.from_numpy(np.ones((4, 2), np.float16)), out)
    with pytest.raises(DTypeError, match="float16"):
        gp.moe_unpermute(y, perm, w, _poison((4, 8), gp.bfloat16))
    assert np.isnan(out.to_numpy().astype(np.float32)).all()


def test_grouped_gemm_rejects_bad_input() -> None:
    x = gp.from_numpy(np.ones((6, 16), np.float16))
    w = gp.from_numpy(np.ones((3, 8, 16), np.float16))
    offsets = gp.from_numpy(_offsets_for([2, 2, 2]))
    out = _poison((6, 8), gp.float16)
    with pytest.raises(ShapeError, match=r"\(4,\) for 3 experts"):
        gp.grouped_gemm(x, w, gp.from_numpy(_offsets_for([2, 4])), out=out)
    with pytest.raises(DTypeError, match="int32"):
        gp.grouped_gemm(x, w, gp.from_numpy(_offsets_for([2, 2, 2]).astype(np.int64)), out=out)
    with pytest.raises(DTypeError, match="x's dtype float16"):
        gp.grouped_gemm(x, gp.from_numpy(np.ones((3, 8, 16), np.float32)), offsets, out=out)
    with pytest.raises(ShapeError, match="K=16"):
        gp.grouped_gemm(x, gp.from_numpy(np.ones((3, 8, 12), np.float16)), offsets, out=out)
    with pytest.raises(ShapeError, match="K=16"):
        gp.grouped_gemm(x, w, offsets, "kn", out=out)
    with pytest.raises(ShapeError, match=r"\(6, 8\)"):
        gp.grouped_gemm(x, w, offsets, out=_poison((6, 9), gp.float16))
    with pytest.raises(ValueError, match="layout"):
        gp.grouped_gemm(x, w, offsets, "mk", out=out)  # type: ignore[arg-type]
    assert np.isnan(out.to_numpy().astype(np.float32)).all()


def test_moe_mlp_rejects_bad_input(rng: np.random.Generator) -> None:
    x, logits, w_gate, w_up, w_down = _mlp_case(rng, gp.float16, 4, 32, 16, 8)
    xs, ls, gu, wd = (gp.from_numpy(a) for a in (x, logits, np.concatenate([w_gate, w_up], axis=1), w_down))
    out = _poison((4, 32), gp.float16)
    workspace = gp.full((gp.moe_workspace_size(4, 32, 16, 8, 2, gp.float16),), 255, gp.uint8)
    before = workspace.to_numpy()
    with pytest.raises(ArgumentError, match="k=9"):
        gp.moe_mlp(xs, ls, gu, wd, 9, out=out, workspace=workspace)
    with pytest.raises(ShapeError, match="workspace"):
        gp.moe_mlp(xs, ls, gu, wd, 2, out=out, workspace=workspace[:100])
    with pytest.raises(ShapeError, match="w_gate_up"):
        gp.moe_mlp(xs, ls, gp.from_numpy(w_gate), wd, 2, out=out, workspace=workspace)
    with pytest.raises(DTypeError, match="w_down"):
        gp.moe_mlp(xs, ls, gu, gp.from_numpy(w_down.astype(np.float32)), 2, out=out, workspace=workspace)
    with pytest.raises(ShapeError, match="router_logits"):
        gp.moe_mlp(xs, gp.from_numpy(logits[:3]), gu, wd, 2, out=out, workspace=workspace)
    with pytest.raises(ValueError, match="activation"):
        gp.moe_mlp(xs, ls, gu, wd, 2, activation="relu", out=out, workspace=workspace)  # type: ignore[arg-type]
    assert np.isnan(out.to_numpy().astype(np.float32)).all()
    assert workspace.to_numpy().tobytes() == before.tobytes()


def test_workspace_size_covers_every_part() -> None:
    size = gp.moe_workspace_size(2048, 4096, 14336, 8, 2, gp.bfloat16)
    slots = 2048 * 2
    assert size >= slots * (4096 + 3 * 14336) * 2 + slots * 12
    assert size < slots * (4096 + 3 * 14336) * 2 + slots * 12 + 4096


# -- CUDA graphs --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize(("tokens", "experts", "k", "hidden", "inter"), [(1, 8, 2, 256, 384), (77, 64, 8, 128, 96)])
def test_moe_mlp_graph_replays_new_logits_bitwise(
    rng: np.random.Generator, dtype: DType, tokens: int, experts: int, k: int, hidden: int, inter: int
) -> None:
    x, logits, w_gate, w_up, w_down = _mlp_case(rng, dtype, tokens, hidden, inter, experts)
    other_logits = _random(rng, (tokens, experts), dtype)
    xs, gu, wd = gp.from_numpy(x), gp.from_numpy(np.concatenate([w_gate, w_up], axis=1)), gp.from_numpy(w_down)
    ls = gp.from_numpy(logits)
    out = gp.empty((tokens, hidden), dtype)
    workspace = gp.empty((gp.moe_workspace_size(tokens, hidden, inter, experts, k, dtype),), gp.uint8)
    with gp.Stream() as stream:
        eager = []
        for values in (logits, other_logits):
            ls.copy_(values)
            gp.moe_mlp(xs, ls, gu, wd, k, True, out=out, workspace=workspace)
            eager.append(out.to_numpy())
        graph = gp.CudaGraph()
        with graph.capture(stream):
            gp.moe_mlp(xs, ls, gu, wd, k, True, out=out, workspace=workspace)
        for values, expected in [(other_logits, eager[1]), (logits, eager[0]), (other_logits, eager[1])]:
            ls.copy_(values)
            out.copy_(np.full((tokens, hidden), np.nan, NUMPY[dtype.name]))
            graph.replay(stream)
            stream.synchronize()
            assert out.to_numpy().tobytes() == expected.tobytes()
    assert eager[0].tobytes() != eager[1].tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_each_op_replays_in_a_graph_bitwise(rng: np.random.Generator, dtype: DType) -> None:
    tokens, experts, k, hidden, n = 300, 16, 4, 64, 96
    logits = gp.from_numpy(_random(rng, (tokens, experts), dtype))
    x = gp.from_numpy(_random(rng, (tokens, hidden), dtype))
    w = gp.from_numpy(_random(rng, (experts, n, hidden), dtype, 0.1))
    slots = tokens * k
    weights, ids = gp.empty((tokens, k), gp.float32), gp.empty((tokens, k), gp.int32)
    x_perm, offsets, perm = (
        gp.empty((slots, hidden), dtype),
        gp.empty((experts + 1,), gp.int32),
        gp.empty((slots,), gp.int32),
    )
    y, out = gp.empty((slots, n), dtype), gp.empty((tokens, n), dtype)
    outputs = (weights, ids, x_perm, offsets, perm, y, out)

    def pipeline() -> None:
        gp.moe_topk_gating(logits, k, True, out_weights=weights, out_ids=ids)
        gp.moe_permute(x, ids, experts, x_perm, offsets, perm)
        gp.grouped_gemm(x_perm, w, offsets, out=y)
        gp.moe_unpermute(y, perm, weights, out)

    with gp.Stream() as stream:
        pipeline()
        eager = [a.to_numpy() for a in outputs]
        graph = gp.CudaGraph()
        with graph.capture(stream):
            pipeline()
        for a in outputs:
            a.copy_(np.zeros(a.shape, a.dtype.numpy))
        graph.replay(stream)
        stream.synchronize()
    for a, expected in zip(outputs, eager, strict=True):
        assert a.to_numpy().tobytes() == expected.tobytes()


# -- compile checks -----------------------------------------------------------------------------------
def test_every_launched_kernel_is_registered() -> None:
    routing = _kernels.name_expressions("moe/moe.cu")
    gemm = _kernels.name_expressions("gemm/grouped_gemm.cu")
    assert len(routing) == 3 * 10 - 2  # moe_positions is shared by the dtype groups
    assert len(gemm) == 4 * 2 * 2 + 2
    for tile in moe_module._TILES:
        for dtype in (gp.float16, gp.bfloat16):
            assert tile.expression(dtype, True) in gemm
            assert tile.expression(dtype, False) in gemm


@pytest.mark.nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["80", "90"])
def test_moe_kernels_compile(arch: str) -> None:
    groups = _kernels.all_groups()
    work = [(file, exprs) for file in ("moe/moe.cu", "gemm/grouped_gemm.cu") for exprs in groups[file]]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda item: _kernels.group(*item).compile(arch), work))


def test_names_are_exported() -> None:
    for name in moe_module.__all__:
        assert getattr(gp, name) is getattr(moe_module, name)
    assert backend_state().name in ("cpu", "cuda")
