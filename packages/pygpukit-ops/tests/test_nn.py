"""pygpukit.ops.nn (norms, gated, embeddings, convolution) against float64 NumPy references:
normalisations, gated activations, embedding gathers and conv1d, for float32, float16 and bfloat16;
their kernel argument structs and mode codes, each defined once.

Unmarked tests run on whichever backend is active (the CPU simulation in CI) at small shapes; the
``gpu`` tests use the shapes of real models (SmolLM2-135M, Qwen2.5-7B, Llama-3-8B, Whisper tiny) and
odd ones (unaligned rows, strided views, rows too long for registers), replay each op from a CUDA
graph and compare it bitwise with eager execution, and check that repeated runs are bitwise equal.
Outputs are poisoned (NaN) before every op so that unwritten elements fail.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ops_testing import Array, assert_matches, poison, sample, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.testing import assert_bitwise_equal

F64 = np.float64
NN_DTYPES = [gp.float32, gp.float16, gp.bfloat16]
ROW_SHAPES = [(1, 8), (3, 37), (2, 3, 64), (4, 576)]
GPU_ROW_SHAPES: list[tuple[int, ...]] = [
    (1, 576),
    (33, 576),
    (5, 3584),
    (16, 4096),
    (3, 8192),
    (2048, 4096),
    (7, 18944),
    (9, 384),  # fp16/bf16: 16 lanes x 3 packs, several rows a block, the last block partly idle
    (4, 14336),  # fp16/bf16: 896 lanes x 2 packs exactly
    (3, 24576),  # fp16/bf16: the longest register row (1024 lanes x 3 packs); float32 streams
    (2, 24584),  # fp16/bf16: just too long for registers, the streaming kernel
    (257, 576),  # fp16/bf16: 8 lanes x 9 packs (raw words), 32 rows a block, the last block one row
    (9, 896),  # fp16/bf16: 16 lanes x 7 packs
    (5, 640),  # fp16/bf16: 16 lanes x 5 packs
    (3, 1152),  # 16 lanes x 9 packs (float32 576 is 16 x 9 too)
    (3, 1536),
    (2, 2048),
    (3, 5120),
]
ODD_ROW_SHAPES: list[tuple[int, ...]] = [(3, 1001), (2, 7), (1, 1), (3, 5, 64), (6, 128), (2, 40000)]
_erf = np.vectorize(math.erf, otypes=[F64])


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def host(values: Array) -> Array:
    return np.asarray(values).astype(F64)


def rounded(values: Array, dtype: DType) -> Array:
    return np.asarray(values).astype(dtype.numpy).astype(F64)


# -- references -------------------------------------------------------------------------------------
def rms_ref(x: Array, w: Array | None, eps: float) -> Array:
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def layer_ref(x: Array, w: Array | None, b: Array | None, eps: float) -> Array:
    centred = x - x.mean(axis=-1, keepdims=True)
    y = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    return y + b if b is not None else y


def l2_ref(x: Array, eps: float) -> Array:
    return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), eps)


def group_ref(x: Array, groups: int, w: Array | None, b: Array | None, eps: float) -> Array:
    n, c = x.shape[:2]
    rows = x.reshape(n * groups, -1)
    centred = rows - rows.mean(axis=-1, keepdims=True)
    y = (centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)).reshape(n, c, -1)
    if w is not None:
        y = y * w[:, None]
    if b is not None:
        y = y + b[:, None]
    return y.reshape(x.shape)


def silu_ref(x: Array) -> Array:
    return x / (1.0 + np.exp(-x))


def gelu_ref(x: Array, approximate: str = "none") -> Array:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


ACTIVATION_REFS: dict[str, Callable[[Array], Array]] = {
    "gelu": gelu_ref,
    "gelu_tanh": lambda x: gelu_ref(x, "tanh"),
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": silu_ref,
}


def conv_ref(x: Array, w: Array, b: Array | None, stride: int, left: int, right: int, dilation: int,
             groups: int) -> Array:  # fmt: skip
    n, _, length = x.shape
    c_out, c_in_group, k = w.shape
    padded = np.pad(x, ((0, 0), (0, 0), (left, right)))
    l_out = (length + left + right - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, c_out, l_out))
    per_out = c_out // groups
    for g in range(groups):
        for o in range(g * per_out, (g + 1) * per_out):
            for ci in range(c_in_group):
                for kk in range(k):
                    start = kk * dilation
                    taps = padded[:, g * c_in_group + ci, start : start + stride * (l_out - 1) + 1 : stride]
                    out[:, o] += w[o, ci, kk] * taps
    if b is not None:
        out += b[None, :, None]
    return out


def conv_bound(x: Array, w: Array, stride: int, left: int, right: int, dilation: int, groups: int) -> Array:
    """sum |w| |x| per output: the scale of float32 accumulation error."""
    return conv_ref(np.abs(x), np.abs(w), None, stride, left, right, dilation, groups)


# -- data -------------------------------------------------------------------------------------------
def data(rng: np.random.Generator, shape: Any, dtype: DType, low: float = -3.0, high: float = 3.0) -> Array:
    return sample(rng, shape, dtype, low, high)


def wide_view(values: Array, pad: int, offset: int) -> gp.GPUArray:
    """A device view holding the 2-D ``values`` whose rows sit inside wider rows (row stride = cols +
    pad), starting ``offset`` elements in: not contiguous, and unaligned for odd offsets."""
    rows = values.reshape(-1, values.shape[-1])
    wide = np.zeros((rows.shape[0], rows.shape[1] + pad), dtype=values.dtype)
    wide[:, offset : offset + rows.shape[1]] = rows
    return upload(wide)[:, offset : offset + rows.shape[1]]


# -- normalisations ---------------------------------------------------------------------------------
def check_rmsnorm(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, weight_dtype: DType | None = None,
                  strided: int | None = None) -> None:  # fmt: skip
    weight_dtype = weight_dtype or dtype
    hx = data(rng, shape, dtype)
    hw = data(rng, shape[-1], weight_dtype, 0.5, 1.5)
    x = wide_view(hx, 8, strided) if strided is not None else upload(hx)
    out = poison(shape, dtype)
    result = gp.rmsnorm(x, upload(hw), 1e-6, out=out)
    assert result is out
    assert_matches(out.to_numpy(), rms_ref(host(hx), host(hw), 1e-6), dtype, 64, f"rmsnorm {shape}")


def check_layernorm(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, with_bias: bool = True,
                    strided: int | None = None) -> None:  # fmt: skip
    hx = data(rng, shape, dtype, -2.0, 4.0)
    hw = data(rng, shape[-1], dtype, 0.5, 1.5)
    hb = data(rng, shape[-1], dtype, -1.0, 1.0) if with_bias else None
    x = wide_view(hx, 8, strided) if strided is not None else upload(hx)
    out = poison(shape, dtype)
    gp.layernorm(x, upload(hw), upload(hb) if hb is not None else None, 1e-5, out=out)
    expected = layer_ref(host(hx), host(hw), host(hb) if hb is not None else None, 1e-5)
    assert_matches(out.to_numpy(), expected, dtype, 64, f"layernorm {shape}")


def check_add_rmsnorm(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, in_place: bool) -> None:
    hx, hr = data(rng, shape, dtype), data(rng, shape, dtype)
    hw = data(rng, shape[-1], dtype, 0.5, 1.5)
    x, residual = upload(hx), upload(hr)
    out = poison(shape, dtype)
    residual_out = residual if in_place else poison(shape, dtype)
    normed, new_residual = gp.add_rmsnorm(x, residual, upload(hw), 1e-6, out=out, residual_out=residual_out)
    assert normed is out
    assert new_residual is residual_out
    summed = rounded(host(hx) + host(hr), dtype)
    assert_bitwise_equal(new_residual.to_numpy(), summed.astype(dtype.numpy))
    assert_matches(out.to_numpy(), rms_ref(summed, host(hw), 1e-6), dtype, 64, f"add_rmsnorm {shape}")


def check_l2norm(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> None:
    hx = data(rng, shape, dtype)
    out = poison(shape, dtype)
    gp.l2norm(upload(hx), out=out)
    assert_matches(out.to_numpy(), l2_ref(host(hx), 1e-12), dtype, 64, f"l2norm {shape}")


def check_group_norm(rng: np.random.Generator, shape: tuple[int, ...], groups: int, dtype: DType) -> None:
    hx = data(rng, shape, dtype, -2.0, 4.0)
    hw = data(rng, shape[1], dtype, 0.5, 1.5)
    hb = data(rng, shape[1], dtype, -1.0, 1.0)
    out = poison(shape, dtype)
    gp.group_norm(upload(hx), groups, upload(hw), upload(hb), 1e-5, out=out)
    expected = group_ref(host(hx), groups, host(hw), host(hb), 1e-5)
    assert_matches(out.to_numpy(), expected, dtype, 64, f"group_norm {shape} / {groups}")


@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_norms(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> None:
    check_rmsnorm(rng, shape, dtype)
    check_layernorm(rng, shape, dtype)
    check_layernorm(rng, shape, dtype, with_bias=False)
    check_l2norm(rng, shape, dtype)
    check_add_rmsnorm(rng, shape, dtype, in_place=False)
    check_add_rmsnorm(rng, shape, dtype, in_place=True)


@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_norm_strided_rows_and_float32_weight(rng: np.random.Generator, dtype: DType) -> None:
    check_rmsnorm(rng, (5, 64), dtype, strided=0)
    check_rmsnorm(rng, (5, 64), dtype, strided=3)
    check_rmsnorm(rng, (3, 40), dtype, weight_dtype=gp.float32)
    check_layernorm(rng, (5, 48), dtype, strided=1)


@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_group_norm(rng: np.random.Generator, dtype: DType) -> None:
    check_group_norm(rng, (2, 6, 5), 3, dtype)
    check_group_norm(rng, (1, 8, 4, 4), 2, dtype)
    check_group_norm(rng, (3, 4), 4, dtype)


def test_rmsnorm_without_weight_and_in_place(rng: np.random.Generator) -> None:
    hx = data(rng, (4, 24), gp.float32)
    x = upload(hx)
    gp.rmsnorm(x, None, out=x)
    assert_matches(x.to_numpy(), rms_ref(host(hx), None, 1e-6), gp.float32, 64)


def test_norm_empty_rows() -> None:
    x = gp.empty((0, 16), gp.float16)
    assert gp.rmsnorm(x, gp.ones(16, gp.float16)).shape == (0, 16)
    normed, residual = gp.add_rmsnorm(x, x, None)
    assert normed.shape == residual.shape == (0, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [*GPU_ROW_SHAPES, *ODD_ROW_SHAPES], ids=str)
def test_norms_gpu(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> None:
    test_norms(rng, shape, dtype)
    if len(shape) == 2 and shape[0] <= 64:
        check_rmsnorm(rng, shape, dtype, strided=0)
        check_rmsnorm(rng, shape, dtype, strided=1)
        check_rmsnorm(rng, shape, dtype, weight_dtype=gp.float32)
        check_layernorm(rng, shape, dtype, strided=3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_group_norm_gpu(rng: np.random.Generator, dtype: DType) -> None:
    check_group_norm(rng, (2, 64, 32, 32), 32, dtype)  # a diffusion block: 2048-element rows
    check_group_norm(rng, (1, 512, 16, 16), 32, dtype)
    check_group_norm(rng, (1, 256, 64, 64), 4, dtype)  # 262144-element rows: the streaming kernel
    check_group_norm(rng, (3, 6, 7), 3, dtype)  # spatial not a multiple of the pack
    check_group_norm(rng, (2, 384, 1500), 1, dtype)


# Plans (packs a thread, lanes) of the widths of SmolLM2, Whisper, Qwen2.5 and Llama rows: the row
# exactly fills its group wherever a power-of-two group can (576 and 896 only with 5 to 9 packs a thread).
NORM_PLANS = {
    2: {384: (3, 16), 576: (9, 8), 640: (5, 16), 896: (7, 16), 1152: (9, 16), 1536: (2, 96), 2048: (2, 128),
        3584: (2, 224), 4096: (2, 256), 5120: (2, 320), 8192: (2, 512), 14336: (2, 896)},
    4: {384: (3, 32), 576: (9, 16), 896: (1, 224), 1536: (4, 96), 2048: (4, 128), 3584: (4, 224), 4096: (4, 256),
        5120: (4, 320), 8192: (4, 512), 14336: (4, 896)},
}  # fmt: skip


@pytest.mark.parametrize("itemsize", [2, 4])
def test_norm_plans_fill_their_groups(itemsize: int) -> None:
    from pygpukit.ops import norms

    width = 16 // itemsize
    choices = norms._NORM_PACKS if itemsize == 4 else norms._NORM_NARROW_PACKS
    for count, expected in NORM_PLANS[itemsize].items():
        packs = count // width
        per_thread, lanes = norms._norm_plan(packs, width, choices, norms._NORM_EXACT_PACKS)
        assert (per_thread, lanes) == expected, count
        assert per_thread * lanes == packs
    # Unaligned rows never take the raw-word kernels: the best group of at most 4 packs a thread.
    assert norms._norm_plan(72, 8, norms._NORM_NARROW_PACKS) == (3, 32)
    assert norms._norm_plan(144, 4, norms._NORM_PACKS) == (1, 160)
    # Rows that no choice fills keep the fewest slots (18944 fp16/bf16: 800 lanes x 3 packs).
    assert norms._norm_plan(2368, 8, norms._NORM_NARROW_PACKS, norms._NORM_EXACT_PACKS) == (3, 800)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_norm_repeated_calls_gpu(rng: np.random.Generator, dtype: DType) -> None:
    """Calls that repeat a key take the cached plan: the same bits as the checked first call, fresh
    outputs each time, and every error still raised (nothing written)."""
    for shape in [(1, 4096), (16, 576), (4, 3, 896)]:
        hx, hr = data(rng, shape, dtype), data(rng, shape, dtype)
        hw, hb = data(rng, shape[-1], dtype, 0.5, 1.5), data(rng, shape[-1], dtype)
        x, residual, w, b = upload(hx), upload(hr), upload(hw), upload(hb)
        first = [gp.rmsnorm(x, w).to_numpy(), gp.layernorm(x, w, b).to_numpy(), gp.l2norm(x).to_numpy()]
        normed, summed = gp.add_rmsnorm(x, residual, w)
        first += [normed.to_numpy(), summed.to_numpy()]
        assert_matches(first[0], rms_ref(host(hx), host(hw), 1e-6), dtype, 64, f"rmsnorm {shape}")
        for _ in range(2):
            again = [gp.rmsnorm(x, w), gp.layernorm(x, w, b), gp.l2norm(x), *gp.add_rmsnorm(x, residual, w)]
            assert len({id(a) for a in again}) == len(again)
            for a, e in zip(again, first, strict=True):
                assert a.shape == shape
                assert a.dtype == dtype
                assert_bitwise_equal(a.to_numpy(), e)
        out, res_out = poison(shape, dtype), poison(shape, dtype)
        for _ in range(2):
            assert gp.rmsnorm(x, w, out=out) is out
            assert_bitwise_equal(out.to_numpy(), first[0])
            normed, summed = gp.add_rmsnorm(x, residual, w, out=out, residual_out=res_out)
            assert normed is out
            assert summed is res_out
            assert_bitwise_equal(out.to_numpy(), first[3])
            assert_bitwise_equal(res_out.to_numpy(), first[4])
        # In place (out is x; residual_out is residual), twice: the second call takes the cached plan.
        for _ in range(2):
            y, r = upload(hx), upload(hr)
            assert gp.rmsnorm(y, w, out=y) is y
            assert_bitwise_equal(y.to_numpy(), first[0])
            y = upload(hx)
            normed, summed = gp.add_rmsnorm(y, r, w, residual_out=r)
            assert summed is r
            assert_bitwise_equal(normed.to_numpy(), first[3])
            assert_bitwise_equal(r.to_numpy(), first[4])
        # The same key with arguments that must fail: nothing is written.
        poisoned = poison(shape, dtype)
        with pytest.raises(ArgumentError, match="eps"):
            gp.rmsnorm(x, w, -1.0, out=poisoned)
        with pytest.raises(ArgumentError, match="eps"):
            gp.rmsnorm(x, w, math.nan, out=poisoned)
        with pytest.raises(ArgumentError, match="overlaps"):
            gp.add_rmsnorm(x, residual, w, out=poisoned, residual_out=poisoned)
        assert np.isnan(poisoned.to_numpy().astype(np.float32)).all()
    wide = upload(data(rng, (3, 16), dtype))
    x8, w8 = wide[:, :8], upload(data(rng, 8, dtype))
    other = poison((3, 16), dtype)
    for _ in range(2):  # the second call takes the cached plan of these shapes, strides and alignments
        gp.rmsnorm(x8, w8, out=other[:, 4:12])
    with pytest.raises(ArgumentError, match="overlaps"):
        gp.rmsnorm(x8, w8, out=wide[:, 4:12])  # the same key, but out overlaps x


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_norm_cache_follows_alignment_gpu(rng: np.random.Generator, dtype: DType) -> None:
    """Views of one shape and strides whose addresses differ in alignment take different plans."""
    for count in (576, 896, 4096):
        hx = data(rng, (5, count + 8), dtype)
        hw = data(rng, count, dtype, 0.5, 1.5)
        wide, w = upload(hx), upload(hw)
        for _ in range(2):
            for offset in (0, 1, 0, 8, 3):
                out = poison((5, count), dtype)
                gp.rmsnorm(wide[:, offset : offset + count], w, out=out)
                expected = rms_ref(host(hx[:, offset : offset + count]), host(hw), 1e-6)
                assert_matches(out.to_numpy(), expected, dtype, 64, f"rmsnorm {count} at {offset}")


# -- gated activations ------------------------------------------------------------------------------
def check_gated(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, strided: bool = False) -> None:
    hg, hu = data(rng, shape, dtype, -6.0, 6.0), data(rng, shape, dtype)
    g64, u64 = host(hg), host(hu)
    gate = wide_view(hg, 8, 1) if strided else upload(hg)
    up = wide_view(hu, 16, 0) if strided else upload(hu)
    cases: list[tuple[str, Callable[[gp.GPUArray], Any], Array]] = [
        ("swiglu", lambda out: gp.swiglu(gate, up, out=out), silu_ref(g64) * u64),
        ("geglu", lambda out: gp.geglu(gate, up, out=out), gelu_ref(g64) * u64),
        ("geglu tanh", lambda out: gp.geglu(gate, up, approximate="tanh", out=out), gelu_ref(g64, "tanh") * u64),
        ("relu2", lambda out: gp.relu2(gate, out=out), np.maximum(g64, 0.0) ** 2),
    ]
    for what, run, expected in cases:
        out = poison(shape, dtype)
        assert run(out) is out
        assert_matches(out.to_numpy(), expected, dtype, 16, f"{what} {shape}")
    if not strided:
        both = upload(np.concatenate([hg, hu], axis=-1))
        out = poison(shape, dtype)
        gp.swiglu(both, out=out)
        assert_matches(out.to_numpy(), silu_ref(g64) * u64, dtype, 16, f"swiglu concatenated {shape}")
        out = poison(shape, dtype)
        gp.geglu(both, approximate="tanh", out=out)
        assert_matches(out.to_numpy(), gelu_ref(g64, "tanh") * u64, dtype, 16, f"geglu concatenated {shape}")


@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 8), (3, 37), (2, 3, 64), (4, 1536)], ids=str)
def test_gated(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> None:
    check_gated(rng, shape, dtype)
    if len(shape) == 2:
        check_gated(rng, shape, dtype, strided=True)


def test_relu2_keeps_nan() -> None:
    x = gp.from_numpy(np.array([np.nan, -1.0, 2.0], np.float32))
    result = gp.relu2(x).to_numpy()
    assert np.isnan(result[0])
    np.testing.assert_array_equal(result[1:], [0.0, 4.0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 18944), (7, 14336), (512, 1536), (3, 1001), (5, 7), (2, 4, 8960)], ids=str)
def test_gated_gpu(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> None:
    test_gated(rng, shape, dtype)


# -- embedding --------------------------------------------------------------------------------------
def check_embedding(rng: np.random.Generator, vocab: int, hidden: int, ids_shape: tuple[int, ...], dtype: DType,
                    index: Any = np.int32) -> None:  # fmt: skip
    table = data(rng, (vocab, hidden), dtype)
    ids = rng.integers(0, vocab, size=ids_shape).astype(index)
    out = poison((*ids_shape, hidden), dtype)
    device_ids = upload(ids) if ids.ndim else upload(ids.reshape(1))[0]
    assert gp.embedding(upload(table), device_ids, out=out) is out
    assert_bitwise_equal(out.to_numpy(), table[ids])


@pytest.mark.parametrize("dtype", [*NN_DTYPES, gp.int8, gp.float64], ids=str)
def test_embedding(rng: np.random.Generator, dtype: DType) -> None:
    check_embedding(rng, 50, 24, (3, 5), dtype)
    check_embedding(rng, 7, 3, (4,), dtype, np.int64)
    check_embedding(rng, 9, 16, (), dtype)


def test_embedding_strided_ids_and_table(rng: np.random.Generator) -> None:
    table = data(rng, (20, 12), gp.bfloat16)
    ids = rng.integers(0, 20, size=(6, 4)).astype(np.int64)
    device_table = wide_view(table, 5, 2)
    device_ids = upload(ids).T  # non-contiguous ids
    out = gp.embedding(device_table, device_ids)
    assert_bitwise_equal(out.to_numpy(), table[ids.T])


@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_embedding_ids_of_several_strided_axes(rng: np.random.Generator, index: Any) -> None:
    """ids whose axes do not merge: read in place through GatherArgs' ids_shape and ids_strides."""
    table = data(rng, (30, 8), gp.float16)
    ids = rng.integers(0, 30, size=(3, 4, 6)).astype(index)
    device_ids = upload(ids).transpose(2, 0, 1)[::2, :, 1:]
    expected = table[ids.transpose(2, 0, 1)[::2, :, 1:]]
    out = poison(expected.shape, gp.float16)
    assert gp.embedding(upload(table), device_ids, out=out) is out
    assert_bitwise_equal(out.to_numpy(), expected)


def test_embedding_out_of_range_ids_give_zero_rows_and_set_the_flag(rng: np.random.Generator) -> None:
    table = data(rng, (10, 8), gp.float16)
    ids = np.array([[1, -1], [10, 9]], np.int32)
    flag = gp.zeros(1, gp.int32)
    out = gp.embedding(upload(table), upload(ids), error_flag=flag).to_numpy()
    np.testing.assert_array_equal(out[0, 0], table[1])
    np.testing.assert_array_equal(out[1, 1], table[9])
    assert not out[0, 1].any()
    assert not out[1, 0].any()
    assert flag.to_numpy()[0] == 1
    clean = gp.zeros(1, gp.int32)
    gp.embedding(upload(table), upload(np.array([0, 9], np.int32)), error_flag=clean)
    assert clean.to_numpy()[0] == 0


def test_gather_last(rng: np.random.Generator) -> None:
    for dtype in NN_DTYPES:
        x = data(rng, (4, 6, 10), dtype)
        lengths = np.array([1, 6, 3, 2], np.int32)
        out = poison((4, 10), dtype)
        assert gp.gather_last(upload(x), upload(lengths), out=out) is out
        assert_bitwise_equal(out.to_numpy(), x[np.arange(4), lengths - 1])
        assert_bitwise_equal(gp.gather_last(upload(x)).to_numpy(), x[:, -1])
    flag = gp.zeros(1, gp.int32)
    x = data(rng, (2, 3, 4), gp.float32)
    got = gp.gather_last(upload(x), upload(np.array([0, 4], np.int64)), error_flag=flag).to_numpy()
    assert not got.any()
    assert flag.to_numpy()[0] == 1


def test_position_ids(rng: np.random.Generator) -> None:
    np.testing.assert_array_equal(gp.position_ids(2, 4).to_numpy(), np.tile(np.arange(4, dtype=np.int32), (2, 1)))
    np.testing.assert_array_equal(gp.position_ids(1, 3, start=7).to_numpy(), [[7, 8, 9]])
    starts = np.array([0, 5, 11], np.int32)
    out = poison((3, 2), gp.int32)
    assert gp.position_ids(3, 2, start=upload(starts), out=out) is out
    np.testing.assert_array_equal(out.to_numpy(), starts[:, None] + np.arange(2)[None, :])
    assert gp.position_ids(2, 4).dtype == gp.int32


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_embedding_gpu(rng: np.random.Generator, dtype: DType) -> None:
    check_embedding(rng, 49152, 576, (4, 77), dtype)  # SmolLM2
    check_embedding(rng, 152064, 3584, (2, 300), dtype, np.int64)  # Qwen2.5-7B
    check_embedding(rng, 1000, 1001, (37,), dtype)  # odd row: element copies
    x = data(rng, (8, 300, 4096), dtype)
    lengths = rng.integers(1, 301, size=8).astype(np.int32)
    assert_bitwise_equal(gp.gather_last(upload(x), upload(lengths)).to_numpy(), x[np.arange(8), lengths - 1])
    starts = rng.integers(0, 10000, size=64).astype(np.int32)
    np.testing.assert_array_equal(gp.position_ids(64, 4096, start=upload(starts)).to_numpy(),
                                  starts[:, None] + np.arange(4096)[None, :])  # fmt: skip


# -- conv1d -----------------------------------------------------------------------------------------
def check_conv1d(rng: np.random.Generator, n: int, c_in: int, length: int, c_out: int, k: int, dtype: DType,
                 stride: int = 1, padding: Any = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 activation: str | None = None, strided_x: bool = False) -> None:  # fmt: skip
    hx = data(rng, (n, c_in, length), dtype, -1.0, 1.0)
    hw = data(rng, (c_out, c_in // groups, k), dtype, -0.5, 0.5)
    hb = data(rng, c_out, dtype, -1.0, 1.0) if bias else None
    if padding == "same":
        total = dilation * (k - 1)
        left, right = total // 2, total - total // 2
    else:
        left = right = 0 if padding == "valid" else int(padding)
    x = upload(hx)
    if strided_x:  # (N, L, C) storage seen as (N, C, L)
        x = upload(np.ascontiguousarray(hx.transpose(0, 2, 1))).transpose(0, 2, 1)
    l_out = (length + left + right - dilation * (k - 1) - 1) // stride + 1
    out = poison((n, c_out, l_out), dtype)
    result = gp.conv1d(x, upload(hw), upload(hb) if hb is not None else None, stride, padding, dilation, groups,
                       activation=activation, out=out)  # fmt: skip
    assert result is out
    x64, w64 = host(hx), host(hw)
    expected = conv_ref(x64, w64, host(hb) if hb is not None else None, stride, left, right, dilation, groups)
    if activation is not None:
        expected = ACTIVATION_REFS[activation](expected)
    actual = host(out.to_numpy())
    bound = conv_bound(x64, w64, stride, left, right, dilation, groups)
    if hb is not None:
        bound = bound + np.abs(host(hb))[None, :, None]
    rtol = {gp.float32: 2e-7, gp.float16: 9.8e-4, gp.bfloat16: 7.9e-3}[dtype]
    tolerance = rtol * np.abs(expected) + 4e-7 * np.sqrt(c_in // groups * k) * bound + 1e-6
    bad = np.flatnonzero(~(np.abs(actual - expected) <= tolerance))
    assert bad.size == 0, f"conv1d {dtype}: {bad.size} of {actual.size} outside tolerance, first {bad[:5]}"


@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_conv1d(rng: np.random.Generator, dtype: DType) -> None:
    check_conv1d(rng, 2, 5, 17, 7, 3, dtype, padding=1)
    check_conv1d(rng, 1, 8, 30, 6, 3, dtype, stride=2, padding=1, activation="gelu")
    check_conv1d(rng, 2, 6, 20, 4, 5, dtype, dilation=2, groups=2, bias=False)
    check_conv1d(rng, 1, 4, 9, 4, 4, dtype, padding="same")
    check_conv1d(rng, 3, 3, 11, 5, 1, dtype, strided_x=True)
    check_conv1d(rng, 1, 4, 12, 4, 3, dtype, groups=4, padding="valid")


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_conv1d_activations(rng: np.random.Generator, activation: str) -> None:
    """Activation "gelu" is the exact (erf) GELU, "gelu_tanh" the tanh approximation, both before the rounding."""
    for dtype in NN_DTYPES:
        check_conv1d(rng, 2, 4, 13, 6, 3, dtype, padding=1, activation=activation)


def test_conv1d_gelu_forms_differ() -> None:
    x = gp.from_numpy(np.full((1, 1, 4), 1.5, np.float32))
    w = gp.ones((1, 1, 1), gp.float32)
    exact = gp.conv1d(x, w, activation="gelu").to_numpy()
    approximate = gp.conv1d(x, w, activation="gelu_tanh").to_numpy()
    np.testing.assert_allclose(exact, gelu_ref(np.full((1, 1, 4), 1.5)), rtol=1e-6)
    np.testing.assert_allclose(approximate, gelu_ref(np.full((1, 1, 4), 1.5), "tanh"), rtol=1e-6)
    assert not np.array_equal(exact, approximate)


def test_conv1d_unbatched(rng: np.random.Generator) -> None:
    hx = data(rng, (3, 10), gp.float32)
    hw = data(rng, (2, 3, 3), gp.float32)
    out = gp.conv1d(upload(hx), upload(hw), padding=1)
    assert out.shape == (2, 10)
    expected = conv_ref(host(hx)[None], host(hw), None, 1, 1, 1, 1, 1)[0]
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_conv1d_gpu(rng: np.random.Generator, dtype: DType) -> None:
    # Whisper tiny's front end: 80 -> 384 (k3 s1 p1) on 3000 frames, then 384 -> 384 (k3 s2 p1).
    check_conv1d(rng, 1, 80, 3000, 384, 3, dtype, padding=1, activation="gelu")
    check_conv1d(rng, 2, 384, 3000, 384, 3, dtype, stride=2, padding=1, activation="gelu")
    check_conv1d(rng, 3, 37, 101, 70, 5, dtype, stride=3, padding=4, dilation=2)  # ragged tiles
    check_conv1d(rng, 2, 64, 200, 96, 4, dtype, groups=4, padding="same", bias=False)
    check_conv1d(rng, 2, 48, 77, 48, 3, dtype, groups=48, padding=1)  # depthwise
    check_conv1d(rng, 1, 80, 300, 64, 3, dtype, padding=1, strided_x=True)
    for activation in ("gelu_tanh", "relu", "silu"):
        check_conv1d(rng, 2, 40, 150, 72, 3, dtype, padding=1, activation=activation)


# -- graphs and determinism (GPU) -------------------------------------------------------------------
def _done(*_: Any) -> None:
    return None


def _gpu_cases(rng: np.random.Generator, dtype: DType) -> dict[str, tuple[Callable[[], None], list[gp.GPUArray]]]:
    """name: (run, its preallocated outputs): every op writing into outputs allocated up front."""
    x = upload(data(rng, (33, 3584), dtype))
    residual = upload(data(rng, (33, 3584), dtype))
    w = upload(data(rng, 3584, dtype, 0.5, 1.5))
    b = upload(data(rng, 3584, dtype))
    long_x = upload(data(rng, (2, 40000), dtype))
    long_w = upload(data(rng, 40000, dtype))
    gate_up = upload(data(rng, (17, 2 * 18944), dtype))
    image = upload(data(rng, (2, 64, 32, 32), dtype))
    gw, gb = upload(data(rng, 64, dtype)), upload(data(rng, 64, dtype))
    table = upload(data(rng, (49152, 576), dtype))
    ids = upload(rng.integers(0, 49152, size=(4, 33)).astype(np.int32))
    lengths = upload(rng.integers(1, 34, size=4).astype(np.int32))
    mel = upload(data(rng, (1, 80, 3000), dtype, -1.0, 1.0))
    cw1, cb1 = upload(data(rng, (384, 80, 3), dtype, -0.2, 0.2)), upload(data(rng, 384, dtype))
    cw2 = upload(data(rng, (384, 384, 3), dtype, -0.1, 0.1))
    starts = upload(rng.integers(0, 100, size=4).astype(np.int32))

    o_norm, o_norm2, o_res = gp.empty(x.shape, dtype), gp.empty(x.shape, dtype), gp.empty(x.shape, dtype)
    o_long = gp.empty(long_x.shape, dtype)
    o_gate = gp.empty((17, 18944), dtype)
    o_relu = gp.empty(gate_up.shape, dtype)
    o_image = gp.empty(image.shape, dtype)
    o_embed = gp.empty((4, 33, 576), dtype)
    o_last = gp.empty((4, 576), dtype)
    o_pos = gp.empty((4, 33), gp.int32)
    o_conv1 = gp.empty((1, 384, 3000), dtype)
    o_conv2 = gp.empty((1, 384, 1500), dtype)
    return {
        "rmsnorm": (lambda: _done(gp.rmsnorm(x, w, out=o_norm)), [o_norm]),
        "layernorm": (lambda: _done(gp.layernorm(x, w, b, out=o_norm)), [o_norm]),
        "l2norm": (lambda: _done(gp.l2norm(x, out=o_norm)), [o_norm]),
        "add_rmsnorm": (lambda: _done(gp.add_rmsnorm(x, residual, w, out=o_norm2, residual_out=o_res)),
                        [o_norm2, o_res]),
        "rmsnorm long rows": (lambda: _done(gp.rmsnorm(long_x, long_w, out=o_long)), [o_long]),
        "group_norm": (lambda: _done(gp.group_norm(image, 32, gw, gb, out=o_image)), [o_image]),
        "swiglu": (lambda: _done(gp.swiglu(gate_up, out=o_gate)), [o_gate]),
        "geglu": (lambda: _done(gp.geglu(gate_up, approximate="tanh", out=o_gate)), [o_gate]),
        "relu2": (lambda: _done(gp.relu2(gate_up, out=o_relu)), [o_relu]),
        "embedding": (lambda: _done(gp.embedding(table, ids, out=o_embed)), [o_embed]),
        "gather_last": (lambda: _done(gp.gather_last(o_embed, lengths, out=o_last)), [o_last]),
        "position_ids": (lambda: _done(gp.position_ids(4, 33, start=starts, out=o_pos)), [o_pos]),
        "conv1d whisper": (lambda: _done(gp.conv1d(mel, cw1, cb1, 1, 1, activation="gelu", out=o_conv1),
                                          gp.conv1d(o_conv1, cw2, cb1, 2, 1, activation="gelu", out=o_conv2)),
                           [o_conv1, o_conv2]),
    }  # fmt: skip


GRAPH_CASES = ["rmsnorm", "layernorm", "l2norm", "add_rmsnorm", "rmsnorm long rows", "group_norm", "swiglu", "geglu",
               "relu2", "embedding", "gather_last", "position_ids", "conv1d whisper"]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_graph_replay_is_bitwise_eager(rng: np.random.Generator, dtype: DType) -> None:
    cases = _gpu_cases(rng, dtype)
    for name in GRAPH_CASES:
        run, outputs = cases[name]
        run()  # compiles, and gives the eager result
        eager = [o.to_numpy() for o in outputs]
        for o in outputs:
            o.copy_(np.full(o.shape, 77 if o.dtype == gp.int32 else np.nan).astype(o.dtype.numpy))
        graph = gp.CudaGraph()
        with graph.capture():
            run()
        for _ in range(2):
            graph.replay()
            graph.synchronize()
            for o, e in zip(outputs, eager, strict=True):
                try:
                    assert_bitwise_equal(o.to_numpy(), e)
                except AssertionError as exc:
                    raise AssertionError(f"{name}: graph replay differs from eager: {exc}") from None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NN_DTYPES, ids=str)
def test_deterministic_over_runs(rng: np.random.Generator, dtype: DType) -> None:
    cases = _gpu_cases(rng, dtype)
    for name in GRAPH_CASES:
        run, outputs = cases[name]
        run()
        first = [o.to_numpy() for o in outputs]
        for _ in range(3):
            for o in outputs:
                o.copy_(np.full(o.shape, 77 if o.dtype == gp.int32 else np.nan).astype(o.dtype.numpy))
            run()
            for o, e in zip(outputs, first, strict=True):
                assert_bitwise_equal(o.to_numpy(), e)


# -- bad input --------------------------------------------------------------------------------------
def test_norm_bad_inputs() -> None:
    x = gp.ones((3, 8), gp.bfloat16)
    w = gp.ones(8, gp.bfloat16)
    out = poison((3, 8), gp.bfloat16)
    with pytest.raises(ShapeError, match=r"weight must have shape \(8,\)"):
        gp.rmsnorm(x, gp.ones(7, gp.bfloat16), out=out)
    with pytest.raises(DTypeError, match="weight must be bfloat16 or float32"):
        gp.rmsnorm(x, gp.ones(8, gp.float16), out=out)
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.rmsnorm(gp.ones((3, 8), gp.int32), w)
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.layernorm(gp.ones((3, 8), gp.float64), None)
    with pytest.raises(ShapeError, match="0-d"):
        gp.rmsnorm(gp.ones((), gp.bfloat16), None)
    with pytest.raises(ShapeError, match=r"out has shape \(3, 9\)"):
        gp.rmsnorm(x, w, out=gp.empty((3, 9), gp.bfloat16))
    with pytest.raises(DTypeError, match="out has dtype float32"):
        gp.rmsnorm(x, w, out=gp.empty((3, 8), gp.float32))
    with pytest.raises(ArgumentError, match="eps"):
        gp.rmsnorm(x, w, -1.0, out=out)
    with pytest.raises(ShapeError, match="unit stride along its last axis"):
        gp.rmsnorm(gp.ones((8, 3), gp.bfloat16).T, w, out=out)
    with pytest.raises(DTypeError, match="same dtype"):
        gp.layernorm(x, w, gp.ones(8, gp.float32))
    with pytest.raises(DTypeError, match="GPUArray"):
        gp.rmsnorm(np.ones((3, 8), np.float32), w)
    assert np.isnan(out.to_numpy().astype(np.float32)).all()  # nothing was written


def test_add_rmsnorm_bad_inputs() -> None:
    x = gp.ones((3, 8), gp.float16)
    w = gp.ones(8, gp.float16)
    with pytest.raises(ShapeError, match="residual has shape"):
        gp.add_rmsnorm(x, gp.ones((3, 9), gp.float16), w)
    with pytest.raises(DTypeError, match="residual has dtype"):
        gp.add_rmsnorm(x, gp.ones((3, 8), gp.float32), w)
    same = gp.empty((3, 8), gp.float16)
    with pytest.raises(ArgumentError, match="overlaps"):
        gp.add_rmsnorm(x, gp.ones((3, 8), gp.float16), w, out=same, residual_out=same)
    wide = gp.ones((3, 16), gp.float16)
    with pytest.raises(ArgumentError, match="overlaps"):
        gp.add_rmsnorm(wide[:, :8], gp.ones((3, 8), gp.float16), w, out=wide[:, 4:12])


def test_group_norm_bad_inputs() -> None:
    x = gp.ones((2, 6, 4), gp.float32)
    with pytest.raises(ShapeError, match="does not divide"):
        gp.group_norm(x, 4)
    with pytest.raises(ArgumentError, match="num_groups"):
        gp.group_norm(x, 0)
    with pytest.raises(ShapeError, match=r"weight must have shape \(6,\)"):
        gp.group_norm(x, 3, gp.ones(4, gp.float32))
    with pytest.raises(ShapeError, match=r"\(N, C, \*spatial\)"):
        gp.group_norm(gp.ones(6, gp.float32), 3)
    with pytest.raises(ShapeError, match="contiguous"):
        gp.group_norm(gp.ones((4, 6, 2), gp.float32).transpose(2, 1, 0), 3)


def test_gated_bad_inputs() -> None:
    g = gp.ones((3, 8), gp.float16)
    with pytest.raises(ShapeError, match="up has shape"):
        gp.swiglu(g, gp.ones((3, 7), gp.float16))
    with pytest.raises(DTypeError, match="up has dtype"):
        gp.swiglu(g, gp.ones((3, 8), gp.bfloat16))
    with pytest.raises(ShapeError, match="even last axis"):
        gp.swiglu(gp.ones((3, 7), gp.float16))
    with pytest.raises(ArgumentError, match="approximate"):
        gp.geglu(g, g, approximate="fast")
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.relu2(gp.ones(4, gp.int8))
    with pytest.raises(ShapeError, match="out has shape"):
        gp.swiglu(gp.ones((3, 8), gp.float16), out=gp.empty((3, 8), gp.float16))


def test_embedding_bad_inputs() -> None:
    table = gp.ones((10, 4), gp.float32)
    with pytest.raises(DTypeError, match="ids must be int32 or int64"):
        gp.embedding(table, gp.ones(3, gp.float32))
    with pytest.raises(ShapeError, match="2-D"):
        gp.embedding(gp.ones(10, gp.float32), gp.zeros(3, gp.int32))
    with pytest.raises(DTypeError, match="error_flag"):
        gp.embedding(table, gp.zeros(3, gp.int32), error_flag=gp.zeros(1, gp.int64))
    with pytest.raises(ShapeError, match="out has shape"):
        gp.embedding(table, gp.zeros(3, gp.int32), out=gp.empty((3, 5), gp.float32))
    with pytest.raises(ShapeError, match="3-D"):
        gp.gather_last(gp.ones((2, 4), gp.float32))
    with pytest.raises(ShapeError, match=r"lengths must have shape \(2,\)"):
        gp.gather_last(gp.ones((2, 3, 4), gp.float32), gp.ones(3, gp.int32))
    with pytest.raises(DTypeError, match="lengths must be int32 or int64"):
        gp.gather_last(gp.ones((2, 3, 4), gp.float32), gp.ones(2, gp.float32))
    with pytest.raises(ArgumentError, match="do not fit in int32"):
        gp.position_ids(1, 4, start=2**31 - 2)
    with pytest.raises(ShapeError, match=r"start must have shape \(2,\)"):
        gp.position_ids(2, 4, start=gp.zeros(3, gp.int32))
    with pytest.raises(ArgumentError, match="batch"):
        gp.position_ids(-1, 4)
    with pytest.raises(DTypeError, match="out has dtype"):
        gp.position_ids(2, 4, out=gp.empty((2, 4), gp.int64))


def test_conv1d_bad_inputs() -> None:
    x = gp.ones((1, 4, 10), gp.float16)
    w = gp.ones((6, 4, 3), gp.float16)
    out = poison((1, 6, 8), gp.float16)
    with pytest.raises(ShapeError, match="input channels"):
        gp.conv1d(x, gp.ones((6, 3, 3), gp.float16), out=out)
    with pytest.raises(ShapeError, match="groups=3 must divide"):
        gp.conv1d(x, w, groups=3, out=out)
    with pytest.raises(DTypeError, match="weight has dtype"):
        gp.conv1d(x, gp.ones((6, 4, 3), gp.float32), out=out)
    with pytest.raises(DTypeError, match="bias must be float16"):
        gp.conv1d(x, w, gp.ones(6, gp.float32), out=out)
    with pytest.raises(ShapeError, match="shorter than the dilated kernel"):
        gp.conv1d(gp.ones((1, 4, 2), gp.float16), w)
    with pytest.raises(ArgumentError, match="stride"):
        gp.conv1d(x, w, stride=0, out=out)
    with pytest.raises(ArgumentError, match="'same' needs stride 1"):
        gp.conv1d(x, w, stride=2, padding="same")
    with pytest.raises(ArgumentError, match="activation"):
        gp.conv1d(x, w, activation="tanh", out=out)
    with pytest.raises(ShapeError, match=r"out has shape \(1, 6, 8\)"):
        gp.conv1d(x, w, padding=1, out=out)
    with pytest.raises(ShapeError, match="weight must be"):
        gp.conv1d(x, gp.ones((6, 12), gp.float16))
    with pytest.raises(ArgumentError, match="overlaps"):
        gp.conv1d(x, gp.ones((4, 4, 1), gp.float16), out=x)
    assert np.isnan(out.to_numpy().astype(np.float32)).all()


# -- one definition of the kernel argument structs and mode codes ------------------------------------
NN_STRUCTS = {"nn/norm.cu": "NormArgs", "nn/gated.cu": "GatedArgs", "nn/embedding.cu": "GatherArgs",
              "nn/conv1d.cu": "ConvArgs"}  # fmt: skip


def test_nn_structs_and_modes_are_declared_once() -> None:
    from pygpukit.core.abi import registered_structs
    from pygpukit.core.codes import enum_values
    from pygpukit.ops import gated, norms
    from pygpukit.ops._kernels import kernel_root

    declared = {s.ctype.rsplit("::", 1)[-1]: s for s in registered_structs()}
    for file, name in NN_STRUCTS.items():
        text = (kernel_root() / file).read_text()
        assert text.count(f"struct {name} {{") == 1, file
        assert file in declared[name].file
        for field, _, _ in declared[name].fields:
            assert f" {field}" in text, f"{name}.{field} is not in {file}"
    for file, enum in (("nn/norm.cu", "NormMode"), ("nn/gated.cu", "GatedMode")):
        assert f"enum {enum}" not in (kernel_root() / file).read_text()  # only in common/codes.cuh
    norm_modes = (norms._RMS, norms._LAYER, norms._L2, norms._ADD_RMS, norms._GROUP)
    assert tuple(enum_values("NormMode").values()) == norm_modes
    gated_modes = (gated._SWIGLU, gated._GEGLU, gated._GEGLU_TANH, gated._RELU2)
    assert tuple(enum_values("GatedMode").values()) == gated_modes


@pytest.mark.nvrtc
def test_nn_structs_match_their_kernels() -> None:
    """The static_asserts of the Python declarations compile with the kernels; a field moved on the C++
    side fails them."""
    from pygpukit.core.abi import offsets_checked, static_asserts_for
    from pygpukit.core.compiler import compile_source
    from pygpukit.core.errors import NvrtcError
    from pygpukit.ops._kernels import kernel_root, name_expressions

    for file in ("nn/gated.cu", "nn/embedding.cu"):
        path = kernel_root() / file
        asserts = static_asserts_for(file)
        assert "static_assert(sizeof(" in asserts
        expressions = name_expressions(file)
        compile_source(path.read_text() + asserts, arch="80", name=file, include_dirs=[str(path.parent)],
                       name_expressions=expressions)  # fmt: skip
        if not offsets_checked():
            continue  # this NVRTC (12.x, 13.0) has no __builtin_offsetof: sizes only, checked above
        moved = path.read_text().replace("  int lanes;\n  int vector;", "  int vector;\n  int lanes;")
        moved = moved.replace("  int mode;\n  int aligned;", "  int aligned;\n  int mode;")
        assert moved != path.read_text()
        with pytest.raises(NvrtcError, match="offset differs from its Python KernelStruct"):
            compile_source(moved + asserts, arch="80", name=file, include_dirs=[str(path.parent)],
                           name_expressions=expressions)  # fmt: skip


def test_norm_plans_live_in_a_registered_plan_cache() -> None:
    from pygpukit.core.plans import PlanCache, plan_cache_stats
    from pygpukit.ops import norms

    assert isinstance(norms._plans, PlanCache)
    assert plan_cache_stats()["ops.norms"][1] == norms._plans.maxsize
