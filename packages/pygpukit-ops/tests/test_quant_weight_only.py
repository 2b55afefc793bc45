"""FP8 e4m3 (W8A16) and INT8 weight-only linear with per-channel scales (pygpukit.ops.quant.weight_only):
against a float64 product of the stored values and scales, random data, odd shapes, M = 1 .. 8 and
prefill sizes; the quantizer against NumPy/ml_dtypes casts."""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
from ops_testing import upload
from quant_testing import DTYPES, assert_compiles, check, product_case

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops.quant import ChannelQuantizedTensor, quantize_per_channel

KINDS = ["fp8_e4m3", "int8"]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def stored(cw: ChannelQuantizedTensor) -> np.ndarray:
    """The weight the tensor stands for, in float64."""
    return cw.data.to_numpy().astype(np.float64) * cw.scale.to_numpy().astype(np.float64)[:, None]


@pytest.mark.parametrize("kind", KINDS)
def test_quantizer_matches_numpy_casts(rng: np.random.Generator, kind: str) -> None:
    w = (rng.standard_normal((9, 70)) * 10.0 ** rng.uniform(-3, 2, size=(9, 1))).astype(np.float32)
    w[3] = 0.0
    cw = quantize_per_channel(upload(w), kind)
    limit = 448.0 if kind == "fp8_e4m3" else 127.0
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(limit), np.float32(1)).astype(np.float32)
    np.testing.assert_array_equal(cw.scale.to_numpy(), scale)
    quotient = w / scale[:, None]
    cast = np.int8 if kind == "int8" else ml_dtypes.float8_e4m3fn
    expected = (np.rint(quotient) if kind == "int8" else quotient).astype(cast)
    np.testing.assert_array_equal(cw.data.to_numpy().view(np.uint8), expected.view(np.uint8))
    assert np.abs(stored(cw) - w).max() <= (0.07 if kind == "fp8_e4m3" else 0.005) * amax.max()
    same = gp.ops.quantize(w, "fp8" if kind == "fp8_e4m3" else "INT8")
    assert isinstance(same, ChannelQuantizedTensor)
    np.testing.assert_array_equal(same.data.to_numpy().view(np.uint8), expected.view(np.uint8))


def test_weight_only_errors(rng: np.random.Generator) -> None:
    w = rng.standard_normal((4, 32)).astype(np.float32)
    with pytest.raises(ArgumentError, match="'int4'"):
        quantize_per_channel(w, "int4")
    with pytest.raises(ShapeError, match="2-D"):
        quantize_per_channel(w.reshape(2, 2, 32), "int8")
    cw = quantize_per_channel(w, "int8")
    with pytest.raises(ShapeError, match=r"\(4,\)"):
        ChannelQuantizedTensor(cw.data, upload(np.ones(3, np.float32)))
    with pytest.raises(DTypeError, match="float32"):
        ChannelQuantizedTensor(upload(w), cw.scale)
    with pytest.raises(DTypeError, match="does not match"):
        ChannelQuantizedTensor(cw.data, cw.scale, "fp8")
    with pytest.raises(ShapeError, match="K = 32"):
        gp.ops.linear(upload(np.ones((2, 31), np.float32)), cw)
    with pytest.raises(DTypeError, match="float64"):
        gp.ops.linear(upload(np.ones((2, 32))), cw)


def _case(rng: np.random.Generator, kind: str, dtype: DType, rows: int, n: int, k: int, bias: bool) -> None:
    cw = quantize_per_channel(rng.standard_normal((n, k)).astype(np.float32), kind)
    product_case(rng, cw, stored(cw), dtype, rows, bias=bias)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_linear_matches_float64_reference(rng: np.random.Generator, kind: str, dtype: DType) -> None:
    for rows in (1, 5, 12):
        _case(rng, kind, dtype, rows, 37, 96 + 16 * rows, bias=rows == 5)


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize(rng: np.random.Generator, kind: str) -> None:
    cw = quantize_per_channel(rng.standard_normal((5, 48)).astype(np.float32), kind)
    np.testing.assert_allclose(cw.dequantize().to_numpy(), stored(cw), rtol=1e-7)


def test_dequantize_and_prefill_on_a_stream(rng: np.random.Generator) -> None:
    """dequantize(stream=) and the prefill path (more than 8 rows) of linear(stream=) on a side stream: the
    same values as on the current stream."""
    cw = quantize_per_channel(rng.standard_normal((40, 64)).astype(np.float32), "int8")
    x = rng.standard_normal((12, 64)).astype(np.float32)
    side = gp.Stream()
    on_side = cw.dequantize(gp.float16, stream=side)
    side.synchronize()
    np.testing.assert_array_equal(on_side.to_numpy(), cw.dequantize(gp.float16).to_numpy())
    got = gp.ops.linear(upload(x), cw, stream=side)
    side.synchronize()
    check(got.to_numpy(), x, stored(cw), gp.float32)


@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    assert_compiles("quant/wo_gemv.cu", 2 * 3 * 4, only="__nv_bfloat16")
    assert_compiles("quant/wo_gemv_mma.cu", 2 * 2)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_every_row_count_dtype_and_tail(rng: np.random.Generator, kind: str) -> None:
    for dtype in DTYPES:
        for rows in range(1, 9):
            _case(rng, kind, dtype, rows, 45 + rows, 4096 + 8 * (rows % 3), bias=rows % 2 == 1)  # K % 16 != 0 too


@pytest.mark.gpu
def test_gpu_unaligned_x_takes_the_scalar_path(rng: np.random.Generator) -> None:
    w = rng.standard_normal((300, 512)).astype(np.float32)
    cw = quantize_per_channel(w, "fp8")
    x = rng.standard_normal((3, 513)).astype(np.float16)
    got = gp.ops.linear(upload(x)[:, 1:].contiguous(), cw).to_numpy()
    check(got, x[:, 1:], stored(cw), gp.float16)
    view = upload(x)[:, 1:]  # not contiguous: linear copies it
    check(gp.ops.linear(view, cw).to_numpy(), x[:, 1:], stored(cw), gp.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_tensor_core_gemv_on_every_stored_value(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                                    kind: str) -> None:  # fmt: skip
    """The tensor-core GEMV (fp16 / bf16 x, K a multiple of 64) on raw random bytes: every FP8 value but
    NaN (subnormals, the largest, both signs) and every INT8 value, odd N, rows 1 .. 8, bias; the same
    bound as the SIMT kernel's, which it is also compared with, and deterministic."""
    from pygpukit.ops.quant import weight_only

    monkeypatch.setattr(weight_only, "MMA_MIN_ROWS", 1)  # the tensor-core kernel at M = 1 too
    n, k = 45, 1088
    raw = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    if kind == "fp8_e4m3":
        raw[(raw & 0x7F) == 0x7F] ^= 0x01  # no NaN patterns
        data = raw.view(ml_dtypes.float8_e4m3fn)
    else:
        data = raw.view(np.int8)
    # |y| stays within fp16's range: |q| <= 448 over 1088 terms
    scale = (rng.uniform(0.5, 2.0, size=n) * 10.0 ** rng.uniform(-5, -2, size=n)).astype(np.float32)
    cw = ChannelQuantizedTensor(gp.from_numpy(data), gp.from_numpy(scale), kind)
    want = data.astype(np.float64) * scale.astype(np.float64)[:, None]
    for dtype in (gp.float16, gp.bfloat16):
        for rows in (1, 3, 8):
            xd = upload(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
            bd = upload(rng.standard_normal(n).astype(np.float32)).astype(dtype)
            x, b = xd.to_numpy().astype(np.float64), bd.to_numpy().astype(np.float64)
            got = gp.ops.linear(xd, cw, bd).to_numpy()
            check(got, x, want, dtype, b)
            assert np.array_equal(got, gp.ops.linear(xd, cw, bd).to_numpy())
            monkeypatch.setattr(weight_only, "USE_MMA_GEMV", False)
            simt = gp.ops.linear(xd, cw, bd).to_numpy()
            monkeypatch.setattr(weight_only, "USE_MMA_GEMV", True)
            check(simt, x, want, dtype, b)


def _w8a8_reference(x: np.ndarray, cw: ChannelQuantizedTensor, bias: np.ndarray | None) -> np.ndarray:
    """The per-channel W8A8 product from first principles: x quantized per row (scale = amax / 448, 1 for an
    all-zero row; e4m3 round to nearest even), times the stored weight, in float64."""
    part = x.astype(np.float32)
    amax = np.abs(part).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    q = np.clip(part / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    y = (q.astype(np.float64) * scale) @ stored(cw).T
    return y + bias if bias is not None else y


@pytest.mark.parametrize(("rows", "n", "k"), [(9, 32, 48), (33, 208, 384), (70, 400, 1040)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_w8a8_prefill_of_dynamic_fp8_weights(rng: np.random.Generator, rows: int, n: int, k: int, dtype: str) -> None:
    """activation_scheme="dynamic": the prefill (more than 8 rows) quantizes x per row to e4m3 and runs one
    fp8 GEMM with the per-row and per-channel scales (cuBLASLt's outer-vector mode or the device fallback);
    decode rows (up to 8) stay W8A16, bitwise equal to the weight without the scheme."""
    if gp.backend_state().name == "cuda" and gp.get_device_capabilities().compute_capability < (8, 9):
        pytest.skip("fp8 GEMMs need compute capability 8.9 (elsewhere the prefill is W8A16, tested above)")
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[3] = 0.0  # an all-zero channel
    cw = quantize_per_channel(w, "fp8")
    dyn = quantize_per_channel(w, "fp8", activation_scheme="dynamic")
    assert dyn.activation_scheme == "dynamic"
    assert "dynamic" in repr(dyn)
    np.testing.assert_array_equal(dyn.data.to_numpy().view(np.uint8), cw.data.to_numpy().view(np.uint8))
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero token: scale 1, zeros out
    bias = rng.standard_normal(n).astype(np.float32)
    xs = upload(x.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else x)
    bs = upload(bias.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else bias)
    got = gp.ops.linear(xs, dyn, bs).to_numpy().astype(np.float64)
    w8a16 = gp.ops.linear(xs, cw, bs).to_numpy().astype(np.float64)  # same weight, x unquantized
    host_x = xs.to_numpy().astype(np.float32)
    want = _w8a8_reference(host_x, cw, bs.to_numpy().astype(np.float64))
    out_eps = 2.0**-8 if dtype == "bfloat16" else 2.0**-22  # one output rounding
    # the accumulation: float32 on the CPU simulation; the fp8 tensor cores keep about 14 mantissa bits
    # between cuBLASLt's promotions to float32 (test_scaled_matmul_scales._accumulation)
    acc = 2.0**-13 if gp.backend_state().name == "cuda" else 1e-5
    mag = np.abs(host_x).astype(np.float64) @ np.abs(stored(cw)).T
    excess = np.abs(got - want) - (out_eps * np.abs(want) + acc * mag + 1e-6)
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 0, f"excess {excess.max()} at {worst}: got {got[worst]}, want {want[worst]}"
    assert not np.array_equal(got, w8a16)
    silu = gp.ops.linear(xs, dyn, bs, "silu").to_numpy().astype(np.float64)
    ref = got / (1 + np.exp(-got))
    assert np.all(np.abs(silu - ref) <= 2 * out_eps * np.abs(ref) + 1e-5 * mag + 1e-6)
    decode = gp.ops.linear(xs[:8], dyn, bs).to_numpy()
    assert np.array_equal(decode, gp.ops.linear(xs[:8], cw, bs).to_numpy())


def test_w8a8_prefill_falls_back_where_the_fp8_gemm_cannot_run(rng: np.random.Generator) -> None:
    """N not a multiple of 16: the dynamic weight's prefill is W8A16 (the product of x unquantized)."""
    w = rng.standard_normal((37, 64)).astype(np.float32)
    dyn = quantize_per_channel(w, "fp8", activation_scheme="dynamic")
    x = rng.standard_normal((12, 64)).astype(np.float32)
    check(gp.ops.linear(upload(x), dyn).to_numpy(), x, stored(dyn), gp.float32)


def test_dynamic_scheme_is_checked(rng: np.random.Generator) -> None:
    cw = quantize_per_channel(rng.standard_normal((16, 32)).astype(np.float32), "fp8")
    with pytest.raises(ArgumentError, match="activation_scheme"):
        ChannelQuantizedTensor(cw.data, cw.scale, activation_scheme="static")
    iw = quantize_per_channel(rng.standard_normal((16, 32)).astype(np.float32), "int8")
    with pytest.raises(ArgumentError, match="FP8 weights"):
        ChannelQuantizedTensor(iw.data, iw.scale, activation_scheme="dynamic")
    views = cw.with_rows(cw.data[:8], cw.scale[:8])
    assert views.shape == (8, 32)
    assert views.activation_scheme is None


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_repeated_decode_calls_take_the_checked_plan(rng: np.random.Generator, kind: str) -> None:
    """A decode call shape seen before skips the checks (quant._linear's plan cache): the same values as the
    first call for 3-D x with a bias and an activation, x at an address only 2-byte aligned (the scalar
    kernel, chosen per call), and the checks still run for a call shape not seen before."""
    from pygpukit.ops.quant import _linear

    cw = quantize_per_channel(rng.standard_normal((96, 512)).astype(np.float32), kind)
    x = upload(rng.standard_normal((1, 3, 512)).astype(np.float16))
    bias = upload(rng.standard_normal(96).astype(np.float16))
    first = gp.ops.linear(x, cw, bias, "silu").to_numpy()
    assert len(_linear._DECODE._plans) > 0
    again = gp.ops.linear(x, cw, bias, "silu")
    assert again.shape == (1, 3, 96)
    np.testing.assert_array_equal(again.to_numpy(), first)
    values = rng.standard_normal(3 * 512 + 1).astype(np.float16)
    shifted = upload(values)[1:].reshape(3, 512)  # contiguous, 2 bytes past a 16-byte boundary
    assert shifted.is_contiguous
    aligned = upload(values[1:].reshape(3, 512))
    want = gp.ops.linear(aligned, cw).to_numpy()  # the call shape's plan made here
    check(want, values[1:].reshape(3, 512), stored(cw), gp.float16)
    check(gp.ops.linear(shifted, cw).to_numpy(), values[1:].reshape(3, 512), stored(cw), gp.float16)
    with pytest.raises(ShapeError, match="K = 512"):
        gp.ops.linear(upload(np.ones((3, 511), np.float16)), cw)
