"""GEMV and linear on GGUF block-quantized weights (pygpukit.ops.quant): against a float64 reference
computed from the weights the ``gguf`` package decodes, on random blocks (random quants, random
float16 scales), odd N, K an odd number of blocks, M = 1 .. 8 and prefill sizes."""

from __future__ import annotations

import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from ops_testing import Array, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops.quant import QUANT_FORMATS, QuantizedTensor, quantized_gemv, quantized_linear

gguf = pytest.importorskip("gguf")

# format: (elements per block, bytes per block, byte offsets of its float16 scale fields)
FORMATS: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "Q4_0": (32, 18, (0,)), "Q4_1": (32, 20, (0, 2)), "Q5_0": (32, 22, (0,)), "Q5_1": (32, 24, (0, 2)),
    "Q8_0": (32, 34, (0,)), "Q2_K": (256, 84, (80, 82)), "Q3_K": (256, 110, (108,)), "Q4_K": (256, 144, (0, 2)),
    "Q5_K": (256, 176, (0, 2)), "Q6_K": (256, 210, (208,)),
}  # fmt: skip
NAMES = list(FORMATS)
DTYPES = [gp.float32, gp.float16, gp.bfloat16]
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
_ULP = {"float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.9e-3}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def weight_bytes(rng: np.random.Generator, name: str, n: int, k: int) -> Array:
    """(n, k) elements of ``name`` as raw blocks: random quant bytes, random float16 scales."""
    elems, nbytes, scales = FORMATS[name]
    blocks = n * k // elems
    data = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    top = 0.0 if elems == 32 else -2.0  # k-quants multiply d by 6-bit/8-bit sub-block scales
    for offset in scales:
        values = (rng.standard_normal(blocks) * 10.0 ** rng.uniform(top - 3, top, size=blocks)).astype(np.float16)
        data[:, offset : offset + 2] = values.view(np.uint8).reshape(blocks, 2)
    return data.reshape(-1)


def decoded(name: str, data: Array, n: int, k: int) -> Array:
    return np.asarray(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[name]), np.float64).reshape(n, k)


def activations(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Array:
    return rng.standard_normal(shape).astype(np.float32).astype(_NP[dtype.name])


def check(got: Array, x: Array, w: Array, dtype: DType, bias: Array | None = None, *, prefill: bool = False) -> None:
    """|got - x @ w.T| within float32 accumulation error of the dot products plus one rounding; with
    ``prefill`` also half an ulp of ``dtype`` per weight (the prefill GEMM reads W rounded to x's dtype)."""
    xs = x.astype(np.float64)
    ref = xs @ w.T
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    scale = np.abs(xs) @ np.abs(w).T
    weight_rounding = _ULP[dtype.name] / 2 if prefill and dtype != gp.float32 else 0.0
    bound = (2e-5 + weight_rounding) * scale + _ULP[dtype.name] * np.abs(ref) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), f"{worst}: got {got[worst]}, expected {ref[worst]} (bound {bound[worst]})"


# -- QuantizedTensor and errors ---------------------------------------------------------------------
def test_quantized_tensor_checks_its_arguments(rng: np.random.Generator) -> None:
    raw = weight_bytes(rng, "Q4_K", 3, 512)
    q = QuantizedTensor.from_raw(raw, "q4_k", (3, 512))
    assert (q.format, q.shape, q.nbytes, q.row_bytes) == ("Q4_K", (3, 512), raw.size, 288)
    assert QuantizedTensor.from_raw(raw, 12, (3, 512)).format == "Q4_K"
    with pytest.raises(ArgumentError, match="IQ2_XS"):
        QuantizedTensor.from_raw(raw, "IQ2_XS", (3, 512))
    with pytest.raises(ShapeError, match="K = 500"):
        QuantizedTensor.from_raw(raw, "Q4_K", (3, 500))
    with pytest.raises(ShapeError, match=r"576 bytes.*takes 864"):
        QuantizedTensor.from_raw(raw[:576], "Q4_K", (3, 512))
    with pytest.raises(ShapeError, match="2-D"):
        QuantizedTensor.from_raw(raw, "Q4_K", (3, 2, 256))
    with pytest.raises(DTypeError, match="uint8"):
        QuantizedTensor(upload(raw.astype(np.int32)), "Q4_K", (3, 512))
    x = upload(activations(rng, (2, 512), gp.float32))
    with pytest.raises(ShapeError, match="at most 8"):
        quantized_gemv(upload(activations(rng, (9, 512), gp.float32)), q)
    with pytest.raises(ShapeError, match="K = 512"):
        quantized_gemv(upload(activations(rng, (2, 256), gp.float32)), q)
    with pytest.raises(DTypeError, match="float64"):
        quantized_gemv(upload(np.zeros((2, 512))), q)
    with pytest.raises(DTypeError, match="QuantizedTensor"):
        quantized_gemv(x, upload(np.zeros((3, 512), np.float32)))  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match=r"\(2, 3\)"):
        quantized_gemv(x, q, gp.empty((3, 2), gp.float32))
    rows = q.rows(1, 3)
    assert rows.shape == (2, 512)
    np.testing.assert_array_equal(rows.data.to_numpy(), raw[288:])


# -- the decode GEMV -------------------------------------------------------------------------------
def _gemv_case(rng: np.random.Generator, name: str, dtype: DType, m: int, n: int, blocks: int, bias: bool) -> None:
    k = blocks * FORMATS[name][0]
    raw = weight_bytes(rng, name, n, k)
    q = QuantizedTensor.from_raw(raw, name, (n, k))
    x = activations(rng, (m, k), dtype)
    b = activations(rng, (n,), dtype) if bias else None
    got = quantized_gemv(upload(x), q, bias=None if b is None else upload(b)).to_numpy()
    assert got.shape == (m, n)
    assert got.dtype == _NP[dtype.name]
    check(got, x, decoded(name, raw, n, k), dtype, b)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemv_matches_float64_reference(rng: np.random.Generator, name: str, dtype: DType) -> None:
    for m in (1, 3, 8):
        _gemv_case(rng, name, dtype, m, 37, 37 if FORMATS[name][0] == 32 else 5, bias=m == 3)


def test_gemv_vector_input_and_output(rng: np.random.Generator) -> None:
    raw = weight_bytes(rng, "Q8_0", 5, 96)
    q = QuantizedTensor.from_raw(raw, "Q8_0", (5, 96))
    x = activations(rng, (96,), gp.bfloat16)
    out = gp.empty((5,), gp.bfloat16)
    assert quantized_gemv(upload(x), q, out) is out
    check(out.to_numpy()[None], x[None], decoded("Q8_0", raw, 5, 96), gp.bfloat16)


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 40])
def test_linear_dispatches_quantized_weights(rng: np.random.Generator, rows: int) -> None:
    """ops.linear takes a QuantizedTensor: GEMV up to 8 rows, dequantized tiles through the GEMM beyond."""
    n, k = 19, 512
    raw = weight_bytes(rng, "Q4_1", n, k)
    q = QuantizedTensor.from_raw(raw, "Q4_1", (n, k))
    x = activations(rng, (rows, k), gp.float32)
    b = activations(rng, (n,), gp.float32)
    w = decoded("Q4_1", raw, n, k)
    got = gp.ops.linear(upload(x.reshape(1, rows, k)), q, upload(b)).to_numpy()
    assert got.shape == (1, rows, n)
    check(got.reshape(rows, n), x, w, gp.float32, b)
    relu = quantized_linear(upload(x), q, upload(b), "relu").to_numpy()
    ref = np.maximum(x.astype(np.float64) @ w.T + b, 0)
    assert np.all(np.abs(relu - ref) <= 2e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6 * np.abs(ref))


@pytest.mark.parametrize("rows", [2, 11])
def test_matmul_with_the_transpose_of_a_quantized_weight(rng: np.random.Generator, rows: int) -> None:
    from pygpukit.ops.quant import quantize_per_channel

    n, k = 13, 256
    raw = weight_bytes(rng, "Q5_1", n, k)
    q = QuantizedTensor.from_raw(raw, "Q5_1", (n, k))
    assert q.T.shape == (k, n)
    assert q.T.T is q
    x = activations(rng, (rows, k), gp.float32)
    got = gp.matmul(upload(x), q.T).to_numpy()
    check(got, x, decoded("Q5_1", raw, n, k), gp.float32)
    out = gp.empty((rows, n), gp.float32)
    assert gp.matmul(upload(x), q.T, out=out) is out
    np.testing.assert_array_equal(out.to_numpy(), got)
    with pytest.raises(ShapeError, match="out must have shape"):
        gp.matmul(upload(x), q.T, out=gp.empty((rows, n + 1), gp.float32))
    cw = quantize_per_channel(rng.standard_normal((n, k)).astype(np.float32), "int8")
    np.testing.assert_array_equal(gp.matmul(upload(x), cw.T).to_numpy(), gp.ops.linear(upload(x), cw).to_numpy())


def test_prefill_tiles(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.ops.quant import gemv as module

    monkeypatch.setattr(module, "PREFILL_TILE_BYTES", 7 * 256 * 2)  # 7 rows of W per tile
    n, k = 23, 256
    raw = weight_bytes(rng, "Q6_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q6_K", (n, k))
    x = activations(rng, (12, k), gp.bfloat16)
    b = activations(rng, (n,), gp.bfloat16)
    got = quantized_linear(upload(x), q, upload(b)).to_numpy()
    check(got, x, decoded("Q6_K", raw, n, k), gp.bfloat16, b, prefill=True)
    # The tiles (offsets, bias slices, concatenation) against one whole-weight product.
    monkeypatch.setattr(module, "PREFILL_TILE_BYTES", 256 << 20)
    whole = quantized_linear(upload(x), q, upload(b)).to_numpy()
    np.testing.assert_allclose(got.astype(np.float64), whole.astype(np.float64), rtol=_ULP["bfloat16"], atol=1e-2)


def _rounded(w: Array, dtype: DType) -> Array:
    return w.astype(np.float32).astype(_NP[dtype.name]).astype(np.float64)


@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=str)
def test_prefill_multiplies_the_weight_rounded_to_x_dtype(rng: np.random.Generator, dtype: DType) -> None:
    """Issue 18: beyond 8 rows the GEMM reads W dequantized to x's dtype, on every backend: the result
    is x @ round(W).T within float32 accumulation, and the decode GEMV (float32 weights) is not."""
    n, k = 300, 1024
    raw = weight_bytes(rng, "Q5_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q5_K", (n, k))
    w = decoded("Q5_K", raw, n, k)
    x = activations(rng, (130, k), dtype)
    got = gp.ops.linear(upload(x), q).to_numpy()
    check(got, x, w, dtype, prefill=True)
    np.testing.assert_array_equal(got, gp.ops.linear(upload(x), q.dequantize(dtype)).to_numpy())
    # The weight the GEMM actually multiplies, with its float32 accumulation bound (the GEMM's own
    # precision: on the GPU this isolates cuBLASLt / the MMA kernels from the dequantization).
    check(got, x, _rounded(w, dtype), dtype)
    decode = gp.ops.linear(upload(x[:8]), q).to_numpy()
    check(decode, x[:8], w, dtype)  # float32 weights: the tight bound


def test_every_format_is_enumerated_for_the_compile_check() -> None:
    from pygpukit.ops._kernels import name_expressions

    expressions = name_expressions("quant/gguf_gemv.cu")
    assert len(expressions) == len(QUANT_FORMATS) * 3 * 4
    assert "pygpukit::ops::qgemv::gguf_gemv<12, __nv_bfloat16, 1>" in expressions


@pytest.mark.parametrize("bucket", [1, 2, 4, 8])
def test_split_keeps_the_x_staging_within_static_launch_limits(monkeypatch: pytest.MonkeyPatch, bucket: int) -> None:
    """Warps per row: more for short products on a 132-SM device, never past 8 / rows of x (the kernel
    stages rows * split segments of x: with its static shared memory under 48 KiB)."""
    from pygpukit.ops.quant import gemv as module

    monkeypatch.setattr(module, "sm_count", lambda: 132)
    for n, k, wide in ((7, 8192, 8), (1024, 4096, 4), (4096, 4096, 1), (14336, 4096, 1), (3, 1024, 1)):
        split = module._split(n, k, bucket)
        assert split == min(wide, 8 // bucket), (n, k, split)
        assert bucket * split * module._X_STAGE_BYTES <= 8 * (4096 + 256)  # + <= 13.3 KiB static: < 48 KiB


def test_benchmark_compare_lines() -> None:
    """quant_gemv --compare: old / new per case present in both runs, graph times where both have them."""
    from pygpukit.benchmark.quant_gemv import compare

    old = {"cases": [{"format": "Q4_K", "m": 1, "n": 64, "k": 256, "us": 30.0},
                     {"format": "Q8_0", "m": 8, "n": 64, "k": 256, "us": 10.0, "device_us": 8.0}]}  # fmt: skip
    new = {"cases": [{"format": "Q4_K", "m": 1, "n": 64, "k": 256, "us": 15.0, "device_us": 5.0},
                     {"format": "Q8_0", "m": 8, "n": 64, "k": 256, "us": 20.0, "device_us": 2.0},
                     {"format": "Q6_K", "m": 1, "n": 64, "k": 256, "us": 1.0, "device_us": 1.0}]}  # fmt: skip
    header, q4k, q80 = compare(new, old)
    assert header.split()[:3] == ["format", "M", "N"]
    assert q4k.split() == ["Q4_K", "1", "64x256", "30.00", "15.00", "2.00", "-", "5.00", "-"]
    assert q80.split() == ["Q8_0", "8", "64x256", "10.00", "20.00", "0.50", "8.00", "2.00", "4.00"]


# -- NVRTC ------------------------------------------------------------------------------------------
@pytest.mark.nvrtc
@pytest.mark.parametrize("file", ["gguf_gemv.cu", "gguf_gemv_mma.cu"])
def test_kernels_compile_without_warnings(file: str) -> None:
    from pygpukit.core.compiler import compile_source
    from pygpukit.ops._kernels import name_expressions

    source = Path(__file__).resolve().parents[3] / "native" / "kernels" / "quant" / file
    chosen = [e for e in name_expressions(f"quant/{file}") if "__nv_bfloat16" in e]
    assert chosen
    for arch in ("80", "90"):
        program = compile_source(source.read_text(), arch=arch, name=source.name, include_dirs=[source.parent],
                                 name_expressions=chosen)  # fmt: skip
        assert program.log.strip() == "", program.log


def test_mma_gemv_launch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensor-core GEMV's launch layout on an H100's figures (132 SMs, 228 KiB of shared memory per
    SM, 227 per block, 80 registers per thread): warps per tile (8, 4 for Q4_K / Q5_K beyond 4 rows,
    never more than the blocks of a row, halved until a block fits) and blocks (at most those resident
    at once, each walking tiles), and its shared memory:
    3 stages of 16 rows padded to a stride of 8 or 24 words modulo 32, plus two buffers of sums."""
    from pygpukit.ops.quant import gemv as module

    h100 = module._Device(132, 228 * 1024, 227 * 1024, 80)
    monkeypatch.setattr(module, "PERSISTENT_MMA", True)  # at most the resident blocks, walking tiles
    assert h100.blocks_per_sm(8, module._mma_shared("Q4_K", 8, 1)) == 2
    assert h100.blocks_per_sm(8, module._mma_shared("Q4_K", 8, 8)) == 1
    assert h100.blocks_per_sm(8, module._mma_shared("Q4_K", 8, 8, stages=4)) == 0  # over the 227 KiB of a block
    assert module._mma_layout(h100, "Q4_K", 1, 14336, 4096) == (8, 264)  # 896 tiles walked by 2 blocks per SM
    assert module._mma_layout(h100, "Q4_K", 8, 14336, 4096) == (4, 264)
    assert module._mma_layout(h100, "Q4_K", 1, 1024, 4096) == (8, 64)  # a block per tile
    assert module._mma_layout(h100, "Q6_K", 8, 14336, 4096) == (8, 132)  # x staged: one block of 8 per SM
    assert module._mma_layout(h100, "Q8_0", 3, 1000, 1024) == (4, 63)  # four steps of 8 blocks
    assert module._mma_layout(h100, "Q4_K", 1, 512, 512) == (2, 32)  # two blocks per row
    assert module._mma_layout(h100, "Q5_K", 1, 21, 256) == (2, 2)
    monkeypatch.setattr(module, "PERSISTENT_MMA", False)  # a block per tile
    assert module._mma_layout(h100, "Q4_K", 1, 14336, 4096) == (8, 896)
    monkeypatch.setattr(module, "_MMA_WARPS_FOR_TESTS", 16)
    assert module._mma_layout(h100, "Q4_K", 8, 14336, 4096) == (8, 896)  # at most 8 warps per block
    assert h100.blocks_per_sm(8, module._mma_shared("Q4_K", 8, 1, stages=2)) == 3  # two stages: three per SM
    monkeypatch.setattr(module, "_MMA_WARPS_FOR_TESTS", 2)
    monkeypatch.setattr(module, "_MMA_GRID_FOR_TESTS", 1)
    assert module._mma_layout(h100, "Q4_K", 1, 14336, 4096) == (2, 1)
    assert module._mma_shared("Q4_K", 8) == 8 * (3 * 16 * 160 + 1024)
    assert module._mma_shared("Q4_K", 4, 2) == 4 * (3 * (16 * 160 + 2 * 576) + 1024)
    assert module._mma_shared("Q5_K", 4) == 4 * (3 * 16 * 224 + 1024)
    assert module._mma_shared("Q5_K", 8, 8) <= 227 * 1024  # one block per SM at worst on Hopper
    assert module._mma_shared("Q6_K", 8) == 8 * (3 * 16 * 224 + 1024)
    assert module._mma_shared("Q8_0", 8) == 8 * (3 * 16 * 288 + 1024)


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_gemv_every_row_count_and_dtype(rng: np.random.Generator, name: str) -> None:
    for dtype in DTYPES:
        for m in range(1, 9):
            _gemv_case(rng, name, dtype, m, 37 + 8 * m, 37 if FORMATS[name][0] == 32 else 5, bias=m % 2 == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K", "Q2_K"])
def test_gpu_gemv_large_and_unaligned(rng: np.random.Generator, name: str) -> None:
    """A 4096-wide weight, and an x whose rows do not start 16-byte aligned (the scalar x loads)."""
    n, k = 1000, 4096
    raw = weight_bytes(rng, name, n, k)
    q = QuantizedTensor.from_raw(raw, name, (n, k))
    w = decoded(name, raw, n, k)
    x = activations(rng, (4, k + 1), gp.float16)
    xs = upload(x)[:, 1:]
    got = quantized_gemv(xs, q).to_numpy()
    check(got, x[:, 1:], w, gp.float16)


@pytest.mark.gpu
def test_gpu_prefill_matches(rng: np.random.Generator) -> None:
    n, k = 300, 1024
    raw = weight_bytes(rng, "Q5_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q5_K", (n, k))
    x = activations(rng, (130, k), gp.bfloat16)
    got = gp.ops.linear(upload(x), q).to_numpy()
    check(got, x, decoded("Q5_K", raw, n, k), gp.bfloat16, prefill=True)


@pytest.mark.gpu
def test_gpu_linear_repeated_decode_calls_use_fresh_addresses(rng: np.random.Generator) -> None:
    """The second call of a shape takes the cached decode plan: new x, new bias, activation, results
    as from the checked path."""
    n, k = 77, 1024
    raw = weight_bytes(rng, "Q4_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q4_K", (n, k))
    w = decoded("Q4_K", raw, n, k)
    for _ in range(3):
        x = activations(rng, (1, 3, k), gp.bfloat16)
        b = activations(rng, (n,), gp.bfloat16)
        got = gp.ops.linear(upload(x), q, upload(b), "silu").to_numpy().astype(np.float64)
        assert got.shape == (1, 3, n)
        pre = x.reshape(3, k).astype(np.float64) @ w.T + b.astype(np.float64)
        ref = pre / (1 + np.exp(-pre))
        bound = 2e-5 * (np.abs(x.reshape(3, k)).astype(np.float64) @ np.abs(w).T) + 2e-2 * np.abs(ref) + 1e-3
        assert np.all(np.abs(got.reshape(3, n) - ref) <= bound)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_gpu_gemv_warps_per_row(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, split: int) -> None:
    """Every warps-per-row split (the kernel's shared-memory sum), rows past N in the last block."""
    from pygpukit.ops.quant import gemv as module

    monkeypatch.setattr(module, "_SPLIT_FOR_TESTS", split)
    for name, n, blocks in (("Q4_K", 21, 13), ("Q8_0", 19, 101), ("Q3_K", 5, 3)):
        for m in (1, 2, 3, 6):  # buckets 1, 2, 4, 8: the split is capped at 8 / bucket
            _gemv_case(rng, name, gp.bfloat16, m, n, blocks, bias=m == 6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q4_0", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("offset", [0, 4, 8, 1, 2, 14])
def test_gpu_gemv_weight_at_any_byte_offset(rng: np.random.Generator, name: str, offset: int) -> None:
    """Blocks that start 16-byte aligned (Q4_K and Q5_K then read their quants with 64-bit loads) and
    blocks that do not (a weight viewed at an offset inside a larger buffer: the funnel-shift reads)."""
    n, k = 45, 2304
    raw = weight_bytes(rng, name, n, k)
    padded = np.zeros(raw.size + 16, np.uint8)
    padded[offset : offset + raw.size] = raw
    q = QuantizedTensor(upload(padded)[offset : offset + raw.size], name, (n, k))
    w = decoded(name, raw, n, k)
    for m in (1, 3, 8):
        x = activations(rng, (m, k), gp.bfloat16)
        check(quantized_gemv(upload(x), q).to_numpy(), x, w, gp.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q4_1", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_gemv_many_x_steps(rng: np.random.Generator, name: str, dtype: DType) -> None:
    """K over several staging steps of x with a partial last segment (the next step's x loaded while
    one is decoded), every row bucket, rows past N, 16-byte aligned and unaligned x."""
    n, k = 203, 4864  # 19 * 256: 5 segments of 1024, the last one partial
    raw = weight_bytes(rng, name, n, k)
    q = QuantizedTensor.from_raw(raw, name, (n, k))
    w = decoded(name, raw, n, k)
    for m in (1, 2, 4, 5, 8):
        x = activations(rng, (m, k + 1), dtype)
        check(quantized_gemv(upload(x[:, :k]), q).to_numpy(), x[:, :k], w, dtype)
        check(quantized_gemv(upload(x)[:, 1:], q).to_numpy(), x[:, 1:], w, dtype)
        again = quantized_gemv(upload(x[:, :k]), q).to_numpy()
        assert np.array_equal(again, quantized_gemv(upload(x[:, :k]), q).to_numpy())  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize(("warps", "stages"), [(2, 3), (4, 3), (8, 3), (4, 2), (8, 2)])
def test_gpu_mma_gemv_every_split(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, name: str,
                                  warps: int, stages: int) -> None:  # fmt: skip
    """The tensor-core kernel (16-row tiles, warps splitting K): tiles with rows past N, fewer blocks
    per row than warps (idle warps), several blocks per warp (the cp.async stages wrap around), every
    row count in fp16 and bf16, aligned and unaligned x, bias, two or three stages; equal to the SIMT
    kernel within the bound and deterministic; one block walking every tile (the copies running ahead across tiles, the
    sums' two buffers alternating) gives the same bits as a block per tile."""
    from pygpukit.ops.quant import gemv as module

    monkeypatch.setattr(module, "_MMA_WARPS_FOR_TESTS", warps)
    monkeypatch.setattr(module, "MMA_STAGES", stages)
    monkeypatch.setattr(module, "MMA_MIN_ROWS", dict.fromkeys(module.MMA_MIN_ROWS, 1))
    monkeypatch.setattr(module, "MMA_MIN_N_AT_ONE_ROW", {})
    for n, blocks in ((21, 1), (16, 3), (45, 7), (130, 17)):
        k = blocks * 256 if name != "Q8_0" else blocks * 32 + 256 * (blocks > 3)  # Q8_0: partial last steps
        raw = weight_bytes(rng, name, n, k)
        q = QuantizedTensor.from_raw(raw, name, (n, k))
        w = decoded(name, raw, n, k)
        for dtype in (gp.float16, gp.bfloat16):
            for m in (1, 2, 5, 8):
                x = activations(rng, (m, k + 1), dtype)
                b = activations(rng, (n,), dtype)
                got = quantized_gemv(upload(x[:, :k]), q, bias=upload(b)).to_numpy()
                check(got, x[:, :k], w, dtype, b)
                check(quantized_gemv(upload(x)[:, 1:], q).to_numpy(), x[:, 1:], w, dtype)
                assert np.array_equal(got, quantized_gemv(upload(x[:, :k]), q, bias=upload(b)).to_numpy())
                for grid in (1, 2):
                    monkeypatch.setattr(module, "_MMA_GRID_FOR_TESTS", grid)
                    walked = quantized_gemv(upload(x[:, :k]), q, bias=upload(b)).to_numpy()
                    assert np.array_equal(got, walked), grid
                monkeypatch.setattr(module, "_MMA_GRID_FOR_TESTS", None)
                monkeypatch.setattr(module, "USE_MMA_GEMV", False)
                simt = quantized_gemv(upload(x[:, :k]), q, bias=upload(b)).to_numpy()
                monkeypatch.setattr(module, "USE_MMA_GEMV", True)
                check(simt, x[:, :k], w, dtype, b)


@pytest.mark.gpu
def test_gpu_mma_gemv_large_scales_and_graph(rng: np.random.Generator) -> None:
    """A Llama-shaped Q4_K weight with realistic scales through the tensor-core kernel, inside a
    captured graph: replays equal the eager result bit for bit."""
    n, k = 1024, 4096
    raw = weight_bytes(rng, "Q4_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q4_K", (n, k))
    xh = activations(rng, (1, k), gp.bfloat16)
    x = upload(xh)
    with gp.Stream() as stream:
        out = gp.empty((1, n), gp.bfloat16)
        eager = quantized_gemv(x, q, out).to_numpy().copy()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            quantized_gemv(x, q, out)
        out.copy_(gp.full((1, n), float("nan"), "bfloat16"))
        graph.replay(stream)
        stream.synchronize()
        assert out.to_numpy().tobytes() == eager.tobytes()
    check(eager, xh, decoded("Q4_K", raw, n, k), gp.bfloat16)


@pytest.mark.parametrize("rows", [1, 5, 12])
def test_linear_out_writes_in_place(rng: np.random.Generator, rows: int) -> None:
    """``linear(x, q, b, act, out=)`` writes the result into ``out`` (the decode GEMV straight into it up
    to 8 rows), equal to the call without ``out``; a wrong ``out`` raises naming it."""
    n, k = 37, 512
    raw = weight_bytes(rng, "Q4_K", n, k)
    q = QuantizedTensor.from_raw(raw, "Q4_K", (n, k))
    x = upload(activations(rng, (rows, k), gp.bfloat16))
    b = upload(activations(rng, (n,), gp.bfloat16))
    out = gp.empty((rows, n), gp.bfloat16)
    got = gp.ops.linear(x, q, b, "silu", out=out)
    assert got is out
    assert np.array_equal(out.to_numpy(), gp.ops.linear(x, q, b, "silu").to_numpy())
    with pytest.raises(ShapeError, match="out must have shape"):
        gp.ops.linear(x, q, out=gp.empty((rows, n + 1), gp.bfloat16))
    with pytest.raises(DTypeError, match="out must be a GPUArray"):
        gp.ops.linear(x, q, out=np.zeros((rows, n)))  # type: ignore[arg-type]
