"""quantize / dequantize (pygpukit.ops.quant): bytes equal to the gguf package's reference quantizers,
decoding equal to its dequantizer, typed errors for what has no reference."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from ops_testing import upload

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops.quant import QUANT_FORMATS, QuantizedTensor
from pygpukit.ops.quant.quantizers import QUANTIZE_FORMATS, dequantize, quantize

gguf = pytest.importorskip("gguf")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def weights(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random rows of every scale, plus the awkward blocks: all zero, constant, ties of +-max."""
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-4, 2, size=(n, 1))).astype(np.float32)
    w[0, :32] = 0.0
    w[1, :32] = 0.75
    w[2, :32] = rng.choice([-1.0, 1.0], size=32).astype(np.float32)
    w[3, 32:64] = np.round(w[3, 32:64] * 4) / 4  # exact halves: rounding ties
    return w


@pytest.mark.parametrize("fmt", [f for f in QUANTIZE_FORMATS if not f.endswith("_K")])  # k-quants: test_quant_kquants
def test_quantize_equals_the_gguf_reference(rng: np.random.Generator, fmt: str) -> None:
    w = weights(rng, 37, 32 * 41)
    expected = gguf.quants.quantize(w, gguf.GGMLQuantizationType[fmt])
    q = quantize(upload(w), fmt)
    assert isinstance(q, QuantizedTensor)
    assert (q.format, q.shape) == (fmt, w.shape)
    np.testing.assert_array_equal(q.data.to_numpy().reshape(expected.shape), expected)
    decoded = gguf.quants.dequantize(expected, gguf.GGMLQuantizationType[fmt])
    np.testing.assert_array_equal(dequantize(q).to_numpy(), decoded)
    np.testing.assert_array_equal(gp.ops.quantize(w, fmt.lower()).data.to_numpy(), q.data.to_numpy())


def test_quantize_from_bfloat16_device_array(rng: np.random.Generator) -> None:
    w = weights(rng, 5, 256)
    wb = upload(w).astype(gp.bfloat16)
    expected = gguf.quants.quantize(wb.to_numpy().astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(quantize(wb, "Q8_0").data.to_numpy().reshape(expected.shape), expected)


def test_quantize_errors(rng: np.random.Generator) -> None:
    w = weights(rng, 4, 256)
    for fmt in sorted(set(QUANT_FORMATS) - set(QUANTIZE_FORMATS)):
        with pytest.raises(ArgumentError, match=fmt):
            quantize(w, fmt)
    with pytest.raises(ArgumentError, match="'Q7_0'"):
        quantize(w, "Q7_0")
    with pytest.raises(ShapeError, match="K = 100"):
        quantize(w[:, :100], "Q8_0")
    with pytest.raises(ShapeError, match="2-D"):
        quantize(w.reshape(2, 2, 256), "Q8_0")
    with pytest.raises(DTypeError, match="int32"):
        quantize(upload(w.astype(np.int32)), "Q8_0")
    with pytest.raises(DTypeError, match="list"):
        quantize([[1.0] * 32], "Q8_0")
    with pytest.raises(DTypeError, match="QuantizedTensor"):
        dequantize(upload(w))  # type: ignore[arg-type]
