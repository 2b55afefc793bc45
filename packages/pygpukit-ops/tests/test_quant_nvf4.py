"""NVF4 weights (pygpukit.ops.quant.nvf4: e2m1 values, float8_e4m3 scales per 16 values, a float32
tensor scale): the e2m1 rounding against a brute-force nearest-value search, the quantizer against a
NumPy transcription, decoding, linear against float64 products of the decoded weight (random data, odd
shapes, M = 1 .. 8 and prefill sizes), typed errors; GPU twins and the NVRTC compile of the kernels."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
import quant_testing as qt
from ops_testing import upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.ops.quant import NVF4Tensor, quantize_nvf4
from pygpukit.ops.quant.nvf4 import E2M1_VALUES, e2m1_codes

_FILE = "quant/nvf4_gemv.cu"
_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def nearest_code(v: float) -> int:
    """The e2m1 code nearest v, ties to the even code, by trying every magnitude."""
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda c: (abs(_GRID[c] - a), c % 2))
    return best | (8 if v < 0 and best else 0)


def decode(q: NVF4Tensor) -> np.ndarray:
    """The weight in float64 from the raw bytes, nibble by nibble (independent of the module)."""
    raw = q.data.to_numpy()
    n, k = q.shape
    codes = np.empty((n, k), np.int64)
    codes[:, 0::2] = raw & 0xF
    codes[:, 1::2] = raw >> 4
    sign = np.where(codes & 8, -1.0, 1.0)
    mags = np.array(_GRID)[codes & 7]
    scale = np.repeat(q.scale.to_numpy().astype(np.float64), 16, axis=1)
    values = (sign * mags * scale).astype(np.float32) * np.float32(q.global_scale)
    return values.astype(np.float64)


def test_e2m1_rounding_ties_to_even_and_saturates() -> None:
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    probes = ties + [-t for t in ties] + [0.0, -0.0, 0.1, 0.26, 2.49, 2.51, 5.9, 6.0, 7.0, 1e9, -1e9, -0.2]
    values = np.array(probes, np.float32)
    got = e2m1_codes(values)
    assert [int(c) for c in got] == [nearest_code(float(v)) for v in values]
    assert [float(E2M1_VALUES[c]) for c in got[:7]] == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    dense = np.linspace(-8, 8, 4001, dtype=np.float32)
    assert [int(c) for c in e2m1_codes(dense)] == [nearest_code(float(v)) for v in dense]


@pytest.mark.parametrize("shape", [(37, 48), (1, 32), (130, 272)])
def test_quantizer_matches_a_numpy_transcription(rng: np.random.Generator, shape: tuple[int, int]) -> None:
    n, k = shape
    w = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-2, 1, size=(n, 1))).astype(np.float32)
    w[0, :16] = 0.0  # an all-zero block
    q = quantize_nvf4(upload(w))
    assert q.shape == shape
    assert q.data.shape == (n, k // 2)
    assert q.scale.shape == (n, k // 16)
    g = np.float32(np.abs(w).max() / (448.0 * 6.0))
    assert q.global_scale == float(g)
    block_max = np.abs(w.reshape(n, k // 16, 16)).max(axis=2)
    scale = (block_max / np.float32(6) / g).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(q.scale.to_numpy().view(np.uint8), scale.view(np.uint8))
    denominator = np.repeat(scale.astype(np.float32), 16, axis=1) * g
    quotient = (w / np.where(denominator > 0, denominator, 1)).ravel()
    codes = [nearest_code(float(v)) if d > 0 else 0 for v, d in zip(quotient, denominator.ravel(), strict=True)]
    codes_arr = np.array(codes, np.uint8).reshape(n, k)
    np.testing.assert_array_equal(q.data.to_numpy(), codes_arr[:, 0::2] | (codes_arr[:, 1::2] << 4))
    decoded = decode(q)
    np.testing.assert_array_equal(q.dequantize().to_numpy(), decoded.astype(np.float32))
    # Error per element: half the e2m1 spacing at the value (<= 1 * block scale, the step 4 -> 6), or
    # the block scale's own e4m3 rounding (2^-4 relative) of the block maximum.
    full = denominator.astype(np.float64)
    assert np.all(np.abs(decoded - w) <= full * 1.0 + 2.0**-4 * np.repeat(block_max, 16, axis=1) + 1e-30)
    assert np.sqrt(np.mean((decoded - w) ** 2)) <= 0.12 * np.sqrt(np.mean(w.astype(np.float64) ** 2))
    same = gp.quantize(w, "NVF4")
    assert isinstance(same, NVF4Tensor)
    np.testing.assert_array_equal(same.data.to_numpy(), q.data.to_numpy())


@pytest.mark.parametrize("dtype", qt.DTYPES)
def test_dequantize_dtypes(rng: np.random.Generator, dtype: DType) -> None:
    q = quantize_nvf4(rng.standard_normal((20, 64)).astype(np.float32))
    ref = decode(q).astype(np.float32).astype(qt.NP[dtype.name])
    np.testing.assert_array_equal(q.dequantize(dtype).to_numpy().astype(np.float32), ref.astype(np.float32))


def linear_case(rng: np.random.Generator, n: int, k: int, rows: int, dtype: DType, *, bias: bool = False) -> None:
    """Prefill rounds W once to x's dtype (the decoded float32 value) before the GEMM."""
    q = quantize_nvf4(rng.standard_normal((n, k)).astype(np.float32))
    qt.product_case(rng, q, decode(q), dtype, rows, bias=bias, round_prefill=True)


@pytest.mark.parametrize("rows", [1, 2, 4, 7, 8, 12])
def test_linear_every_row_count(rng: np.random.Generator, rows: int) -> None:
    linear_case(rng, 29, 80, rows, gp.float32, bias=rows % 2 == 0)


def test_matmul_transposed_and_activation(rng: np.random.Generator) -> None:
    q = quantize_nvf4(rng.standard_normal((33, 64)).astype(np.float32))
    x = rng.standard_normal((2, 2, 64)).astype(np.float32)
    got = gp.ops.matmul(upload(x), q.T).to_numpy()
    qt.check(got.reshape(4, 33), x.reshape(4, 64), decode(q), gp.float32)
    silu = gp.ops.linear(upload(x), q, activation="silu").to_numpy()
    plain = gp.ops.linear(upload(x), q).to_numpy().astype(np.float64)
    np.testing.assert_allclose(silu, plain / (1 + np.exp(-plain)), rtol=1e-6, atol=1e-6)


def test_all_zero_weight() -> None:
    q = quantize_nvf4(np.zeros((3, 16), np.float32))
    assert q.global_scale == 1.0
    assert not q.dequantize().to_numpy().any()


def test_nvf4_errors(rng: np.random.Generator) -> None:
    w = rng.standard_normal((4, 32)).astype(np.float32)
    q = quantize_nvf4(w)
    with pytest.raises(ShapeError, match="K = 40"):
        quantize_nvf4(rng.standard_normal((4, 40)).astype(np.float32))
    with pytest.raises(ShapeError, match="2-D"):
        quantize_nvf4(w.reshape(2, 2, 32))
    with pytest.raises(DTypeError, match="int32"):
        quantize_nvf4(w.astype(np.int32))
    with pytest.raises(ShapeError, match=r"\(4, 1\)"):
        NVF4Tensor(q.data, q.scale[:, :1], 1.0)
    with pytest.raises(DTypeError, match="float8_e4m3fn"):
        NVF4Tensor(q.data, q.data, 1.0)
    with pytest.raises(ShapeError, match="global_scale"):
        NVF4Tensor(q.data, q.scale, float("nan"))
    with pytest.raises(ShapeError, match="K = 32"):
        gp.ops.linear(upload(np.ones((2, 31), np.float32)), q)
    with pytest.raises(DTypeError, match="float64"):
        gp.ops.linear(upload(np.ones((2, 32))), q)


def test_every_kernel_is_enumerated_for_the_compile_check() -> None:
    qt.enumerated(
        _FILE, 3 * 5, "pygpukit::ops::nvf4::nvf4_gemv<float, 1>", "pygpukit::ops::nvf4::nvf4_dequant<__nv_bfloat16>"
    )


@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    qt.assert_compiles(_FILE, 3 * 5)


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_gemv_every_row_count_and_dtype(rng: np.random.Generator) -> None:
    qt.gpu_gemv_cases(linear_case, rng, 80)  # K = 80: not a multiple of 32


@pytest.mark.gpu
def test_gpu_large_unaligned_and_prefill(rng: np.random.Generator) -> None:
    qt.gpu_unaligned_and_prefill(rng, quantize_nvf4, decode, linear_case)
