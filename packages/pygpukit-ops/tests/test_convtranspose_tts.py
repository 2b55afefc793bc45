"""pygpukit.ops.tts_ops (conv_transpose1d, instance_norm, adain, snake, leaky_relu) against float64 NumPy
references written independently of the op (conv_transpose1d as a stride-1 convolution of the
zero-stuffed input with the flipped kernel), on random data and odd shapes, float32/float16/bfloat16.
Unmarked tests run on whichever backend is active; ``gpu`` tests use the shapes of Kokoro's decoder."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import Array, poison, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

DTYPES = [gp.float32, gp.float16, gp.bfloat16]
RTOL = {gp.float32: 2e-6, gp.float16: 2e-3, gp.bfloat16: 1.6e-2}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def data(rng: np.random.Generator, shape: Any, dtype: DType, low: float = -1.0, high: float = 1.0) -> Array:
    return rng.uniform(low, high, size=shape).astype(np.float32).astype(dtype.numpy)


def f64(values: Any) -> Array:
    return np.asarray(values).astype(np.float64)


def convt_ref(x: Array, w: Array, b: Array | None, stride: int, padding: int, output_padding: int, groups: int,
              dilation: int) -> Array:  # fmt: skip
    """Zero-stuff x by the stride, pad by dilation * (K - 1) - padding, correlate with the flipped kernel."""
    n, c_in, length = x.shape
    _, c_og, k = w.shape
    stuffed = np.zeros((n, c_in, (length - 1) * stride + 1))
    stuffed[:, :, ::stride] = x
    edge = dilation * (k - 1)
    padded = np.zeros((n, c_in, stuffed.shape[2] + 2 * edge + output_padding))
    padded[:, :, edge : edge + stuffed.shape[2]] = stuffed
    l_out = (length - 1) * stride - 2 * padding + edge + output_padding + 1
    cg = c_in // groups
    out = np.zeros((n, c_og * groups, l_out))
    for g in range(groups):
        for o in range(c_og):
            for ci in range(cg):
                for kk in range(k):
                    tap = w[g * cg + ci, o, k - 1 - kk]
                    start = padding + kk * dilation
                    out[:, g * c_og + o] += tap * padded[:, g * cg + ci, start : start + l_out]
    if b is not None:
        out += b[None, :, None]
    return out


def check_close(actual: gp.GPUArray, expected: Array, dtype: DType, scale: Array | float = 1.0) -> None:
    got = f64(actual.to_numpy())
    assert got.shape == expected.shape
    tol = RTOL[dtype] * (np.abs(expected) + scale) + 1e-6
    bad = np.flatnonzero(~(np.abs(got - expected) <= tol))
    assert bad.size == 0, f"{dtype}: {bad.size} of {got.size} outside tolerance, first {bad[:5]}"


def check_convt(rng: np.random.Generator, n: int, c_in: int, length: int, c_out_g: int, k: int, dtype: DType,
                stride: int = 1, padding: int = 0, output_padding: int = 0, groups: int = 1, dilation: int = 1,
                bias: bool = True, strided_x: bool = False) -> None:  # fmt: skip
    hx = data(rng, (n, c_in, length), dtype)
    hw = data(rng, (c_in, c_out_g, k), dtype, -0.5, 0.5)
    hb = data(rng, c_out_g * groups, dtype) if bias else None
    x = upload(hx)
    if strided_x:
        x = upload(np.ascontiguousarray(hx.transpose(0, 2, 1))).transpose(0, 2, 1)
    expected = convt_ref(f64(hx), f64(hw), None if hb is None else f64(hb), stride, padding, output_padding,
                         groups, dilation)  # fmt: skip
    out = poison(expected.shape, dtype)
    result = gp.conv_transpose1d(x, upload(hw), None if hb is None else upload(hb), stride, padding, output_padding,
                                 groups, dilation, out=out)  # fmt: skip
    assert result is out
    bound = convt_ref(np.abs(f64(hx)), np.abs(f64(hw)), None, stride, padding, output_padding, groups, dilation)
    check_close(out, expected, dtype, bound * np.sqrt(c_in // groups * k) * 0.1 + 1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_transpose1d(rng: np.random.Generator, dtype: DType) -> None:
    check_convt(rng, 2, 5, 7, 3, 3, dtype)
    check_convt(rng, 1, 4, 9, 2, 4, dtype, stride=2, padding=1, output_padding=1)
    check_convt(rng, 2, 6, 5, 2, 3, dtype, stride=3, padding=2, groups=3, bias=False)
    check_convt(rng, 1, 6, 8, 1, 3, dtype, stride=2, padding=1, output_padding=1, groups=6)  # Kokoro's depthwise pool
    check_convt(rng, 1, 3, 6, 4, 3, dtype, dilation=2, padding=1, strided_x=True)
    check_convt(rng, 1, 8, 5, 3, 20, dtype, stride=10, padding=5)  # Kokoro's ups.0 (k 20, s 10, p 5)


def test_conv_transpose1d_unbatched_and_errors(rng: np.random.Generator) -> None:
    hx = data(rng, (3, 10), gp.float32)
    hw = data(rng, (3, 2, 3), gp.float32)
    out = gp.conv_transpose1d(upload(hx), upload(hw), stride=2)
    np.testing.assert_allclose(out.to_numpy(), convt_ref(f64(hx)[None], f64(hw), None, 2, 0, 0, 1, 1)[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    with pytest.raises(ShapeError, match="C_in = 3"):
        gp.conv_transpose1d(upload(hx), upload(data(rng, (4, 2, 3), gp.float32)))
    with pytest.raises(ArgumentError, match="output_padding 2"):
        gp.conv_transpose1d(upload(hx), upload(hw), stride=2, output_padding=2)
    with pytest.raises(DTypeError, match="float16"):
        gp.conv_transpose1d(upload(hx), upload(hw.astype(np.float16)))
    with pytest.raises(ShapeError, match="groups=2"):
        gp.conv_transpose1d(upload(hx), upload(hw), groups=2)


def norm_ref(x: Array, eps: float) -> Array:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 3, 7), (2, 5, 1), (3, 4, 300), (2, 1, 1025)])
def test_instance_norm_and_adain(rng: np.random.Generator, dtype: DType, shape: tuple[int, int, int]) -> None:
    n, c, _ = shape
    hx = data(rng, shape, dtype, -2.0, 3.0)
    hw, hb = data(rng, c, dtype, 0.5, 1.5), data(rng, c, dtype)
    gamma, beta = data(rng, (n, c), dtype), data(rng, (n, c), dtype)
    normed = norm_ref(f64(hx), 1e-5)
    out = poison(shape, dtype)
    assert gp.instance_norm(upload(hx), upload(hw), upload(hb), out=out) is out
    check_close(out, normed * f64(hw)[None, :, None] + f64(hb)[None, :, None], dtype, 4.0)
    check_close(gp.instance_norm(upload(hx), eps=1e-3), norm_ref(f64(hx), 1e-3), dtype, 4.0)
    expected = (1 + f64(gamma)[:, :, None]) * normed + f64(beta)[:, :, None]
    check_close(gp.adain(upload(hx), upload(gamma), upload(beta)), expected, dtype, 4.0)


def test_adain_strided_inplace_and_errors(rng: np.random.Generator) -> None:
    hx = data(rng, (2, 4, 9), gp.float32)
    x = upload(np.ascontiguousarray(hx.transpose(0, 2, 1))).transpose(0, 2, 1)  # (N, C, L) with L strided
    style = data(rng, (2, 8), gp.float32)
    s = upload(style)
    gamma, beta = s[:, :4], s[:, 4:]  # the two halves of a style projection, strided rows
    expected = (1 + f64(style[:, :4])[:, :, None]) * norm_ref(f64(hx), 1e-5) + f64(style[:, 4:])[:, :, None]
    assert gp.adain(x, gamma, beta, out=x) is x
    check_close(x, expected, gp.float32, 4.0)
    unbatched = gp.adain(upload(hx[0]), upload(style[0, :4]), upload(style[0, 4:]))
    check_close(unbatched, expected[0], gp.float32, 4.0)
    with pytest.raises(ShapeError, match=r"\(2, 4\)"):
        gp.adain(upload(hx), upload(style), upload(style))
    with pytest.raises(ShapeError, match="no elements"):
        gp.instance_norm(gp.zeros((1, 2, 0)))
    with pytest.raises(ArgumentError, match="eps"):
        gp.instance_norm(upload(hx), eps=-1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_snake_and_leaky_relu(rng: np.random.Generator, dtype: DType) -> None:
    for shape in [(1, 3, 5), (2, 7, 33), (4, 129)]:
        hx = data(rng, shape, dtype, -4.0, 4.0)
        ha = data(rng, shape[-2], dtype, 0.2, 2.0)
        a = f64(ha).reshape(-1, 1)
        expected = f64(hx) + np.sin(a * f64(hx)) ** 2 / a
        check_close(gp.snake(upload(hx), upload(ha)), expected, dtype, 4.0)
        check_close(gp.leaky_relu(upload(hx), 0.2), np.where(f64(hx) >= 0, f64(hx), 0.2 * f64(hx)), dtype, 1.0)
    x = upload(data(rng, (2, 3, 4), gp.float32))
    with pytest.raises(ShapeError, match=r"\(3,\)"):
        gp.snake(x, upload(data(rng, 4, gp.float32)))
    with pytest.raises(ArgumentError, match="negative_slope"):
        gp.leaky_relu(x, "0.1")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tts_ops_gpu_kokoro_shapes(rng: np.random.Generator, dtype: DType) -> None:
    check_convt(rng, 1, 64, 41, 1, 3, dtype, stride=2, padding=1, output_padding=1, groups=64)
    check_convt(rng, 1, 64, 37, 32, 20, dtype, stride=10, padding=5)
    check_convt(rng, 1, 32, 123, 16, 12, dtype, stride=6, padding=3)
    hx = data(rng, (1, 256, 4011), dtype, -2.0, 3.0)
    gamma, beta = data(rng, (1, 256), dtype), data(rng, (1, 256), dtype)
    expected = (1 + f64(gamma)[:, :, None]) * norm_ref(f64(hx), 1e-5) + f64(beta)[:, :, None]
    check_close(gp.adain(upload(hx), upload(gamma), upload(beta)), expected, dtype, 4.0)
    ha = data(rng, 256, dtype, 0.2, 2.0)
    a = f64(ha).reshape(-1, 1)
    check_close(gp.snake(upload(hx), upload(ha)), f64(hx) + np.sin(a * f64(hx)) ** 2 / a, dtype, 4.0)
