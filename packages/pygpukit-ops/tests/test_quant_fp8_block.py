"""FP8 e4m3 weights with 128x128 block scales (pygpukit.ops.quant.fp8_block, the HF "fp8" checkpoint
layout): the quantizer against ml_dtypes casts, the decoded weight against a NumPy expansion of the
scales, linear against float64 products of the decoded weight (random data, odd shapes, M = 1 .. 8 and
prefill sizes), typed errors; GPU twins and the NVRTC compile of the kernels."""

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
from pygpukit.ops.quant import BlockFP8Tensor, quantize_block_fp8

_FILE = "quant/fp8_block_gemv.cu"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def expand(scale: np.ndarray, n: int, k: int, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """The per-element scale, written with explicit loops over the blocks (independent of the module)."""
    full = np.empty((n, k), np.float64)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            full[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]] = scale[i, j]
    return full


def stored(bw: BlockFP8Tensor) -> np.ndarray:
    n, k = bw.shape
    return bw.data.to_numpy().astype(np.float64) * expand(bw.scale.to_numpy(), n, k, bw.block)


@pytest.mark.parametrize("shape", [(300, 200), (1, 17), (129, 257), (256, 128)])
def test_quantizer_matches_ml_dtypes_casts(rng: np.random.Generator, shape: tuple[int, int]) -> None:
    n, k = shape
    w = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 2, size=(n, 1))).astype(np.float32)
    if n > 128:
        w[128:256, :128] = 0.0  # an all-zero block: scale 1
    bw = quantize_block_fp8(upload(w))
    grid = (-(-n // 128), -(-k // 128))
    assert bw.scale.shape == grid
    assert bw.block == (128, 128)
    assert bw.shape == shape
    amax = np.zeros(grid, np.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            amax[i, j] = np.abs(w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]).max()
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    np.testing.assert_array_equal(bw.scale.to_numpy(), scale)
    expected = (w / expand(scale, n, k).astype(np.float32)).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(bw.data.to_numpy().view(np.uint8), expected.view(np.uint8))
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal spacing 2^-9 of the scale.
    full = expand(scale, n, k)
    assert np.all(np.abs(stored(bw) - w) <= 2.0**-4 * np.abs(w) + 2.0**-10 * full)
    same = gp.quantize(w, "FP8_BLOCK")
    assert isinstance(same, BlockFP8Tensor)
    np.testing.assert_array_equal(same.data.to_numpy().view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", qt.DTYPES)
def test_dequantize_expands_the_block_scales(rng: np.random.Generator, dtype: DType) -> None:
    n, k = 200, 300
    data = rng.standard_normal((n, k)).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.001, 2.0, (2, 3)).astype(np.float32)
    bw = BlockFP8Tensor(upload(data), upload(scale))
    ref = (data.astype(np.float32) * expand(scale, n, k).astype(np.float32)).astype(qt.NP[dtype.name])
    got = bw.dequantize(dtype).to_numpy()
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))


def linear_case(rng: np.random.Generator, n: int, k: int, rows: int, dtype: DType, *, bias: bool = False,
                block: tuple[int, int] = (128, 128)) -> None:  # fmt: skip
    """Prefill rounds W once to x's dtype (the float32 product of the dequantize kernel) before the GEMM."""
    bw = quantize_block_fp8(rng.standard_normal((n, k)).astype(np.float32), block)
    qt.product_case(rng, bw, stored(bw), dtype, rows, bias=bias, round_prefill=True)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 33])
def test_linear_every_row_count(rng: np.random.Generator, rows: int) -> None:
    linear_case(rng, 45, 300, rows, gp.float32, bias=rows % 2 == 1)


def test_linear_other_blocks_matmul_and_activation(rng: np.random.Generator) -> None:
    linear_case(rng, 40, 96, 4, gp.float32, block=(32, 48))
    w = rng.standard_normal((70, 256)).astype(np.float32)
    bw = quantize_block_fp8(w)
    x = rng.standard_normal((2, 3, 256)).astype(np.float32)
    via_matmul = gp.ops.matmul(upload(x), bw.T).to_numpy()
    qt.check(via_matmul.reshape(6, 70), x.reshape(6, 256), stored(bw), gp.float32)
    relu = gp.ops.linear(upload(x), bw, activation="relu").to_numpy()
    np.testing.assert_array_equal(relu, np.maximum(gp.ops.linear(upload(x), bw).to_numpy(), 0))


def test_block_fp8_errors(rng: np.random.Generator) -> None:
    w = rng.standard_normal((130, 140)).astype(np.float32)
    bw = quantize_block_fp8(w)
    with pytest.raises(ShapeError, match=r"\(2, 2\)"):
        BlockFP8Tensor(bw.data, upload(np.ones((1, 2), np.float32)))
    with pytest.raises(DTypeError, match="float8_e4m3fn"):
        BlockFP8Tensor(upload(w), bw.scale)
    with pytest.raises(ShapeError, match="block"):
        BlockFP8Tensor(bw.data, bw.scale, (128, 0))
    with pytest.raises(ShapeError, match="2-D"):
        quantize_block_fp8(w.reshape(2, 65, 140))
    with pytest.raises(DTypeError, match="int32"):
        quantize_block_fp8(w.astype(np.int32))
    with pytest.raises(ShapeError, match="K = 140"):
        gp.ops.linear(upload(np.ones((2, 139), np.float32)), bw)
    with pytest.raises(DTypeError, match="float64"):
        gp.ops.linear(upload(np.ones((2, 140))), bw)
    with pytest.raises(DTypeError, match="int8"):
        bw.dequantize(gp.int8)


def test_every_kernel_is_enumerated_for_the_compile_check() -> None:
    gemv = "pygpukit::ops::fp8block::fp8_block_gemv<__nv_bfloat16, 8>"
    qt.enumerated(_FILE, 3 * 5, gemv, "pygpukit::ops::fp8block::fp8_block_dequant<__half>")


@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    qt.assert_compiles(_FILE, 3 * 5)


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_gemv_every_row_count_and_dtype(rng: np.random.Generator) -> None:
    qt.gpu_gemv_cases(linear_case, rng, 300)  # K = 300: not a multiple of 16


@pytest.mark.gpu
def test_gpu_large_unaligned_and_prefill(rng: np.random.Generator) -> None:
    qt.gpu_unaligned_and_prefill(rng, quantize_block_fp8, stored, linear_case)


def _w8a8_reference(x: np.ndarray, bw: BlockFP8Tensor, bias: np.ndarray | None) -> np.ndarray:
    """The W8A8 product from first principles: x quantized per row and 128 columns (scale = amax / 448,
    e4m3 round to nearest even), times the stored weight, in float64."""
    rows, k = x.shape
    xq = np.empty((rows, k), np.float64)
    for g in range(0, k, 128):
        part = x[:, g : g + 128].astype(np.float32)
        amax = np.abs(part).max(axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
        q = np.clip(part / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        xq[:, g : g + 128] = q.astype(np.float64) * scale
    y = xq @ stored(bw).T
    return y + bias if bias is not None else y


@pytest.mark.parametrize(("rows", "n", "k"), [(9, 128, 128), (33, 256, 384), (70, 400, 1040)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_w8a8_prefill_of_dynamic_weights(rng: np.random.Generator, rows: int, n: int, k: int, dtype: str) -> None:
    """activation_scheme="dynamic": the prefill (more than 8 rows) quantizes x per 1x128 group and runs
    one block-scaled fp8 GEMM; decode rows (up to 8) stay W8A16."""
    if gp.get_device_capabilities().compute_capability[0] not in (0, 9) and gp.backend_state().name == "cuda":
        pytest.skip("the W8A8 prefill runs on Hopper (elsewhere it is W8A16, tested above)")
    bw = quantize_block_fp8(rng.standard_normal((n, k)).astype(np.float32))
    dyn = BlockFP8Tensor(bw.data, bw.scale, activation_scheme="dynamic")
    x = rng.standard_normal((rows, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    xs = upload(x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x)
    bs = upload(bias.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else bias)
    got = gp.ops.linear(xs, dyn, bs).to_numpy().astype(np.float64)
    w8a16 = gp.ops.linear(xs, bw, bs).to_numpy().astype(np.float64)  # same weight, x unquantized
    if gp.backend_state().name == "cuda":
        from pygpukit.core.stream import thread_device
        from pygpukit.ops.gemm.scaled import native_unsupported

        if native_unsupported("block", thread_device()):
            # this cuBLASLt has no 128-block scaling (before 12.9, or not for this GPU): after the first
            # refusal the prefill is W8A16 (the device fallback of the block GEMM would be slower)
            again = gp.ops.linear(xs, dyn, bs).to_numpy().astype(np.float64)
            assert np.array_equal(again, w8a16)
            return
    host_x = xs.to_numpy().astype(np.float32)
    want = _w8a8_reference(host_x, bw, bs.to_numpy().astype(np.float64))
    # fp32 accumulation of exact fp8 products, one output rounding
    out_eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-22
    mag = np.abs(host_x).astype(np.float64) @ np.abs(stored(bw)).T
    assert np.all(np.abs(got - want) <= out_eps * np.abs(want) + 1e-5 * mag + 1e-6)
    assert not np.array_equal(got, w8a16)
    decode = gp.ops.linear(xs[:8], dyn, bs).to_numpy()
    assert np.array_equal(decode, gp.ops.linear(xs[:8], bw, bs).to_numpy())


def test_dynamic_scheme_is_checked(rng: np.random.Generator) -> None:
    bw = quantize_block_fp8(rng.standard_normal((128, 128)).astype(np.float32))
    with pytest.raises(gp.ArgumentError, match="activation_scheme"):
        BlockFP8Tensor(bw.data, bw.scale, activation_scheme="static")
