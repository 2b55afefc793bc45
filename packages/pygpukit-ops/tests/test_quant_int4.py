"""Group-quantized INT4 weight-only (pygpukit.ops.quant.int4) in the AWQ and GPTQ packings: the packers
against slow reference unpackers written from the format descriptions, the quantizer against a
float64 per-group reference, and linear / matmul (GEMV for M = 1 .. 8, dequantized tiles + GEMM
beyond) against float64 products of the dequantized weights, random data and odd shapes."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from ops_testing import Array, upload
from quant_testing import DTYPES, assert_compiles, check, linear, product_case

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops.quant import ActOrderError, Int4Tensor, int4, quantize_int4
from pygpukit.ops.quant.int4_pack import pack_qweight, pack_qzeros, unpack_qweight, unpack_qzeros

PACKINGS = ["awq", "gptq"]
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: field i of a word holds column 8c + AWQ_PACK_ORDER[i]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


# -- slow references, written from the format descriptions ---------------------------------------------
def field(word: int, i: int) -> int:
    return (int(word) & 0xFFFFFFFF) >> (4 * i) & 15


def slow_unpack(qweight: Array, qzeros: Array, packing: str, offset: int) -> tuple[Array, Array]:
    """(q (K, N), z (G, N)) from the words, one field at a time."""
    if packing == "awq":
        k, words = qweight.shape
        q = np.zeros((k, 8 * words), np.int64)
        for r in range(k):
            for c in range(words):
                for i in range(8):
                    q[r, 8 * c + AWQ_PACK_ORDER[i]] = field(qweight[r, c], i)
        z = np.zeros((qzeros.shape[0], 8 * words), np.int64)
        for g in range(qzeros.shape[0]):
            for c in range(words):
                for i in range(8):
                    z[g, 8 * c + AWQ_PACK_ORDER[i]] = field(qzeros[g, c], i)
        return q, z
    rows, n = qweight.shape
    q = np.zeros((8 * rows, n), np.int64)
    for r in range(rows):
        for c in range(n):
            for i in range(8):
                q[8 * r + i, c] = field(qweight[r, c], i)
    z = np.zeros((qzeros.shape[0], n), np.int64)
    for g in range(qzeros.shape[0]):
        for c in range(n // 8):
            for i in range(8):
                z[g, 8 * c + i] = field(qzeros[g, c], i) + offset
    return q, z


def slow_quantize(w: Array, g: int, symmetric: bool, min_zero: int) -> tuple[Array, Array, Array]:
    """Per row and group of g inputs, in Python floats: (q (K, N), z (G, N), s (G, N) float16)."""
    n, k = w.shape
    q = np.zeros((k, n), np.int64)
    z = np.zeros((k // g, n), np.int64)
    s = np.zeros((k // g, n), np.float16)
    for row in range(n):
        for grp in range(k // g):
            values = [float(v) for v in w[row, grp * g : (grp + 1) * g]]
            if symmetric:
                scale = float(np.float16(2 * max(max(abs(v) for v in values), 1e-5) / 15))
                zero = 8
            else:
                scale = float(np.float16(max(max(values) - min(values), 1e-5) / 15))
                zero = int(min(max(round(-min(values) / scale), min_zero), 15))  # round(): half to even
            s[grp, row], z[grp, row] = scale, zero
            for j, v in enumerate(values):
                q[grp * g + j, row] = min(max(round(v / scale) + zero, 0), 15)
    return q, z, s


def weights64(t: Int4Tensor) -> Array:
    """The (N, K) weight in float64 from the packed words, through the slow unpacker."""
    q, z = slow_unpack(t.qweight.to_numpy(), t.qzeros.to_numpy(), t.packing, t.zero_offset)
    g = t.group_size
    s = t.scales.to_numpy().astype(np.float64)
    result: Array = ((q - np.repeat(z, g, axis=0)) * np.repeat(s, g, axis=0)).T
    return result


def random_int4(rng: np.random.Generator, packing: str, n: int, k: int, g: int) -> Int4Tensor:
    """Random quants, zero points and float16 scales, packed with the module's packers."""
    q = rng.integers(0, 16, size=(k, n))
    offset = 1 if packing == "gptq" else 0
    z = rng.integers(offset, 16, size=(k // g, n))
    s = (rng.standard_normal((k // g, n)) * 10.0 ** rng.uniform(-3, -1, size=(k // g, n))).astype(np.float16)
    return Int4Tensor(pack_qweight(q, packing), pack_qzeros(z, packing, offset), s, packing, g)


# -- packing and quantizing ---------------------------------------------------------------------------
@pytest.mark.parametrize("packing", PACKINGS)
def test_packers_match_the_slow_reference(rng: np.random.Generator, packing: str) -> None:
    k, n, g = 64, 24, 32
    q = rng.integers(0, 16, size=(k, n))
    offset = 1 if packing == "gptq" else 0
    z = rng.integers(offset, 16, size=(k // g, n))
    qweight, qzeros = pack_qweight(q, packing), pack_qzeros(z, packing, offset)
    assert qweight.dtype == np.int32
    assert qzeros.dtype == np.int32
    assert qweight.shape == ((k, n // 8) if packing == "awq" else (k // 8, n))
    assert qzeros.shape == (k // g, n // 8)
    sq, sz = slow_unpack(qweight, qzeros, packing, offset)
    np.testing.assert_array_equal(sq, q)
    np.testing.assert_array_equal(sz, z)
    np.testing.assert_array_equal(unpack_qweight(qweight, packing), q)
    np.testing.assert_array_equal(unpack_qzeros(qzeros, packing, offset), z)
    if packing == "awq":  # one word by hand: columns 0..7 = 1..8 go to fields in the order 0 2 4 6 1 3 5 7
        word = pack_qweight(np.arange(1, 9).reshape(1, 8).repeat(8, axis=0), "awq")[0, 0]
        assert int(word) & 0xFFFFFFFF == 0x86427531
    else:  # GPTQ v1 stores zero - 1: a zero of 8 everywhere is 0x77777777
        assert int(pack_qzeros(np.full((1, 8), 8), "gptq", 1)[0, 0]) == 0x77777777
        with pytest.raises(ArgumentError, match="do not fit"):
            pack_qzeros(np.zeros((1, 8), np.int64), "gptq", 1)


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("g", [32, 64, 128])
def test_quantize_equals_the_reference(rng: np.random.Generator, packing: str, symmetric: bool, g: int) -> None:
    w = (rng.standard_normal((16, 2 * g)) * 10.0 ** rng.uniform(-2, 1, size=(16, 1))).astype(np.float32)
    w[3, :g] = np.abs(w[3, :g])  # a group without negative values: zero point 0 (AWQ) / clipped to 1 (GPTQ)
    t = gp.ops.quantize(w, "int4", group_size=g, packing=packing, symmetric=symmetric)
    assert isinstance(t, Int4Tensor)
    assert (t.shape, t.group_size, t.packing) == ((16, 2 * g), g, packing)
    rq, rz, rs = slow_quantize(w, g, symmetric, 1 if packing == "gptq" else 0)
    q, z = slow_unpack(t.qweight.to_numpy(), t.qzeros.to_numpy(), packing, t.zero_offset)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(z, rz)
    np.testing.assert_array_equal(t.scales.to_numpy().view(np.uint16), rs.view(np.uint16))
    w64 = weights64(t)
    deq = gp.ops.dequantize(t, gp.float32).to_numpy()
    np.testing.assert_array_equal(deq, w64.astype(np.float32))  # exact in float32
    np.testing.assert_array_equal(t.dequantize(gp.bfloat16).to_numpy(), w64.astype(ml_dtypes.bfloat16))
    span = np.abs(w).reshape(16, 2, g).max(axis=-1, keepdims=True)
    assert np.all(np.abs(deq - w).reshape(16, 2, g) <= span * (2.0 / 15.0) * 1.01)  # one step (clipping included)


def test_int4_errors(rng: np.random.Generator) -> None:
    w = rng.standard_normal((16, 64)).astype(np.float32)
    with pytest.raises(ArgumentError, match="group_size"):
        quantize_int4(w, 48)
    with pytest.raises(ArgumentError, match="'marlin'"):
        quantize_int4(w, 32, "marlin")
    with pytest.raises(ShapeError, match=r"\(12, 64\)"):
        quantize_int4(w[:12], 32)
    with pytest.raises(ShapeError, match=r"\(16, 48\)"):
        quantize_int4(w[:, :48], 32)
    with pytest.raises(DTypeError, match="list"):
        quantize_int4(w.tolist(), 32)
    t = quantize_int4(w, 32, "gptq")
    with pytest.raises(ShapeError, match="qweight"):
        Int4Tensor(t.qweight.to_numpy()[:4], t.qzeros, t.scales, "gptq", 32)
    with pytest.raises(DTypeError, match="float16"):
        Int4Tensor(t.qweight, t.qzeros, t.scales.to_numpy().astype(np.float32), "gptq", 32)
    plain = np.arange(64) // 32
    assert Int4Tensor(t.qweight, t.qzeros, t.scales, "gptq", 32, g_idx=plain).shape == (16, 64)
    with pytest.raises(ActOrderError, match="desc_act"):
        Int4Tensor(t.qweight, t.qzeros, t.scales, "gptq", 32, g_idx=rng.permutation(plain))
    with pytest.raises(ShapeError, match="K = 64"):
        linear(upload(np.ones((2, 63), np.float32)), t)
    with pytest.raises(DTypeError, match="float64"):
        linear(upload(np.ones((2, 64))), t)


# -- products -----------------------------------------------------------------------------------------
def _case(rng: np.random.Generator, t: Int4Tensor, dtype: DType, rows: int, bias: bool) -> None:
    product_case(rng, t, weights64(t), dtype, rows, bias=bias)


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_matches_float64_reference(rng: np.random.Generator, packing: str, dtype: DType) -> None:
    for rows, g in ((1, 32), (5, 64), (8, 128), (13, 32)):
        t = random_int4(rng, packing, 40, 3 * g, g)  # N = 40: five AWQ words, not a multiple of the block
        _case(rng, t, dtype, rows, bias=rows == 5)


@pytest.mark.parametrize("packing", PACKINGS)
def test_matmul_transposed_activation_and_batch(rng: np.random.Generator, packing: str) -> None:
    t = random_int4(rng, packing, 24, 96, 32)
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    w = weights64(t)
    got = gp.ops.matmul(upload(x), t.T).to_numpy()
    check(got.reshape(6, 24), x.reshape(6, 96), w, gp.float32)
    relu = linear(upload(x[0]), t, activation="relu").to_numpy()
    ref = np.maximum(x[0].astype(np.float64) @ w.T, 0)
    assert np.all(np.abs(relu - ref) <= 2e-5 * (np.abs(x[0]) @ np.abs(w).T) + 1e-30)
    assert t.T.shape == (96, 24)
    assert t.T.T is t


def test_prefill_tiles(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    t = random_int4(rng, "awq", 48, 64, 32)
    monkeypatch.setattr(int4, "_PREFILL_TILE_BYTES", 16 * 64 * 2)  # three tiles of 16 rows
    x = rng.standard_normal((10, 64)).astype(np.float16)
    b = rng.standard_normal(48).astype(np.float16)
    check(linear(upload(x), t, upload(b)).to_numpy(), x, weights64(t), gp.float16, b, prefill=True)


@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    assert_compiles("quant/int4_gemv.cu", 2 * 3 * 5, only="__nv_bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("packing", PACKINGS)
def test_gpu_every_row_count_dtype_and_group(rng: np.random.Generator, packing: str) -> None:
    # N = 264: 33 AWQ words (word-by-word loads, a partial last block); N = 288: the 16-byte loads.
    for n, g in ((264, 32), (288, 64), (264, 128), (288, 128)):
        t = random_int4(rng, packing, n, 4096 + 3 * g, g)  # K not a multiple of 32 groups
        w = weights64(t)  # the slow unpacker once per weight (seconds for a 4 K-wide one)
        for dtype in DTYPES:
            for rows in range(1, 9):
                product_case(rng, t, w, dtype, rows, bias=rows % 2 == 1)
            product_case(rng, t, w, dtype, 37, bias=True)


@pytest.mark.gpu
@pytest.mark.parametrize("packing", PACKINGS)
def test_gpu_quantized_model_shapes_and_unaligned_x(rng: np.random.Generator, packing: str) -> None:
    w = rng.standard_normal((1024, 4096)).astype(np.float32)
    t = quantize_int4(w, 128, packing)
    x = rng.standard_normal((3, 4097)).astype(np.float16)
    view = upload(x)[:, 1:]
    check(linear(view.contiguous(), t).to_numpy(), x[:, 1:], weights64(t), gp.float16)
    np.testing.assert_array_equal(t.dequantize(gp.float32).to_numpy(), weights64(t).astype(np.float32))
    check(linear(view, t).to_numpy(), x[:, 1:], weights64(t), gp.float16)
