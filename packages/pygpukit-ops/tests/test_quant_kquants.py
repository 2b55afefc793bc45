"""quantize(w, "q2_k" .. "q6_k") (pygpukit.ops.quant.kquants): the gguf package (0.19) has no k-quant
quantizer, so the bytes are compared with a scalar float32 transcription of llama.cpp's reference
algorithm (kquant_reference.py), decoding with the gguf package's dequantizer, the round-trip error
with per-format bounds, and products against float64 references of the dequantized weights."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from kquant_reference import quantize_scalar
from ops_testing import upload

import pygpukit as gp
from pygpukit.core.errors import ShapeError
from pygpukit.ops.quant import QuantizedTensor
from pygpukit.ops.quant.quantizers import QUANTIZE_FORMATS, dequantize, quantize, quantize_host

gguf = pytest.importorskip("gguf")

KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# Worst error of a super-block over its range (max - min), and RMS error over the standard deviation
# of Gaussian weights: measured on random data at about 0.8x these (llama.cpp's algorithm has no
# closed-form bound: its scales are least-squares fits).
_RANGE_BOUND = {"Q2_K": 0.26, "Q3_K": 0.14, "Q4_K": 0.062, "Q5_K": 0.036, "Q6_K": 0.019}
_RMS_BOUND = {"Q2_K": 0.32, "Q3_K": 0.165, "Q4_K": 0.078, "Q5_K": 0.04, "Q6_K": 0.02}
_ULP = {"float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.9e-3}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def awkward_blocks(rng: np.random.Generator) -> np.ndarray:
    """Super-blocks of several distributions plus zero, constant, one-outlier and all-positive ones."""
    rows = [
        rng.standard_normal((3, 256)),
        rng.uniform(0.5, 2.0, (1, 256)),
        rng.standard_t(2, (2, 256)) * 0.02,
        rng.laplace(size=(1, 256)) * 1e-3,
        np.zeros((1, 256)),
        np.full((1, 256), -0.3),
    ]
    blocks = np.concatenate(rows).astype(np.float32)
    blocks[0, :40] = 0.0  # zero sub-blocks inside a non-zero block
    blocks[1, 17] = 50.0  # one outlier
    return blocks


@pytest.mark.parametrize("fmt", KQUANTS)
def test_bytes_equal_the_scalar_llama_cpp_algorithm(rng: np.random.Generator, fmt: str) -> None:
    blocks = awkward_blocks(rng)
    got = quantize_host(blocks, fmt)  # one super-block per row
    for i, block in enumerate(blocks):
        np.testing.assert_array_equal(got[i], quantize_scalar(block, fmt), err_msg=f"{fmt} super-block {i}")


@pytest.mark.parametrize("fmt", KQUANTS)
def test_round_trip_within_bounds(rng: np.random.Generator, fmt: str) -> None:
    w = (rng.standard_normal((37, 768)) * 10.0 ** rng.uniform(-3, 2, size=(37, 1))).astype(np.float32)
    w[5] = 0.0
    q = quantize(upload(w), fmt.lower())
    assert isinstance(q, QuantizedTensor)
    assert (q.format, q.shape) == (fmt, w.shape)
    raw = q.data.to_numpy()
    np.testing.assert_array_equal(raw.reshape(37, -1), quantize_host(w, fmt))
    decoded = gguf.quants.dequantize(raw.reshape(37, -1), gguf.GGMLQuantizationType[fmt])
    np.testing.assert_array_equal(dequantize(q).to_numpy(), decoded)
    assert np.all(decoded[5] == 0.0)
    err = np.abs(decoded.astype(np.float64) - w).reshape(-1, 256).max(axis=1)
    blocks = w.reshape(-1, 256).astype(np.float64)
    span = blocks.max(axis=1) - blocks.min(axis=1)
    assert np.all(err <= _RANGE_BOUND[fmt] * span), float(np.max(err / np.maximum(span, 1e-300)))
    g = rng.standard_normal((16, 1024)).astype(np.float32)
    gd = gguf.quants.dequantize(quantize_host(g, fmt), gguf.GGMLQuantizationType[fmt])
    assert np.sqrt(np.mean((gd.astype(np.float64) - g) ** 2)) <= _RMS_BOUND[fmt] * g.std()


def test_finer_formats_are_more_accurate(rng: np.random.Generator) -> None:
    g = rng.standard_normal((8, 2048)).astype(np.float32)
    rms = []
    for fmt in KQUANTS:
        gd = gguf.quants.dequantize(quantize_host(g, fmt), gguf.GGMLQuantizationType[fmt])
        rms.append(float(np.sqrt(np.mean((gd.astype(np.float64) - g) ** 2))))
    assert rms == sorted(rms, reverse=True), rms
    q4_0 = gguf.quants.dequantize(quantize_host(g, "Q4_0"), gguf.GGMLQuantizationType.Q4_0)
    assert rms[2] < np.sqrt(np.mean((q4_0.astype(np.float64) - g) ** 2))  # Q4_K beats Q4_0


@pytest.mark.parametrize("fmt", KQUANTS)
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_linear_on_quantized_weights(rng: np.random.Generator, fmt: str, rows: int) -> None:
    linear_check(rng, fmt, rows, gp.float32)


def linear_check(rng: np.random.Generator, fmt: str, rows: int, dtype: gp.DType) -> None:
    n, k = 45, 512
    w = rng.standard_normal((n, k)).astype(np.float32)
    q = gp.quantize(w, fmt)
    wd = gguf.quants.dequantize(q.data.to_numpy().reshape(n, -1), gguf.GGMLQuantizationType[fmt]).astype(np.float64)
    x = upload(rng.standard_normal((rows, k)).astype(np.float32)).astype(dtype)
    got = gp.ops.linear(x, q).to_numpy().astype(np.float64)
    xs = x.to_numpy().astype(np.float64)
    ref = xs @ wd.T
    weight_rounding = _ULP[dtype.name] if rows > 8 and dtype != gp.float32 else 0.0
    bound = (2e-5 + weight_rounding) * (np.abs(xs) @ np.abs(wd).T) + _ULP[dtype.name] * np.abs(ref) + 1e-30
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))


def test_kquant_errors(rng: np.random.Generator) -> None:
    assert set(KQUANTS) <= set(QUANTIZE_FORMATS)
    w = rng.standard_normal((4, 288)).astype(np.float32)
    with pytest.raises(ShapeError, match=r"K = 288 .*256-element blocks of Q4_K"):
        quantize(w, "q4_k")
    with pytest.raises(ShapeError, match="2-D"):
        quantize(w.reshape(2, 2, 288)[:, :, :256], "Q6_K")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", KQUANTS)
def test_gpu_linear_on_quantized_weights(rng: np.random.Generator, fmt: str) -> None:
    for dtype in (gp.float32, gp.float16, gp.bfloat16):
        for rows in (1, 2, 5, 8, 19):
            linear_check(rng, fmt, rows, dtype)
