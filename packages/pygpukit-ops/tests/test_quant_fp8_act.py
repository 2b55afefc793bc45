"""Dynamic FP8 e4m3 quantization of activations (pygpukit.ops.quant.fp8_act.quantize_fp8): every
granularity against a float64 / ml_dtypes reference written here (bitwise: scales and codes), on fresh
random data with odd shapes, zero rows and groups, huge, tiny and special values, every input dtype,
strided and transposed inputs, the layout of the block scales, the reconstruction bound, typed errors;
the kernels' enumeration and NVRTC compile; GPU twins on large shapes with poisoned pools, streams and
graph replay."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import quant_testing as qt
from ops_testing import poison_pool, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops.quant import quantize_fp8

Array = np.ndarray[Any, Any]
_FILE = "quant/fp8_act.cu"
GRANULARITIES = ["block", "row", "tensor"]
E4M3 = ml_dtypes.float8_e4m3fn
# (largest, smallest normal, smallest subnormal) of each input dtype
RANGE = {"float32": (3.4028234663852886e38, 2.0**-126, 2.0**-149), "float16": (65504.0, 2.0**-14, 2.0**-24),
         "bfloat16": (3.3895313892515355e38, 2.0**-126, 2.0**-133)}  # fmt: skip


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def reference(x: Array, granularity: str) -> tuple[Array, Array]:
    """(q as uint8 codes (M, K), scale float32 ((1,), (M,) or (M, G))) computed independently of the
    module: amax in float64 with NaN ignored, scale = float32(amax) / 448 rounded to float32 (the float64
    quotient rounds to the float32 one: 53 >= 2 * 24 + 2), 1 where that is 0; q = the float64 quotient
    rounded to float32, then clipped to +-448 and cast by ml_dtypes; NaN as the canonical code 0x7f."""
    x64 = np.asarray(x).astype(np.float64)
    m, k = x64.shape
    mag = np.where(np.isnan(x64), 0.0, np.abs(x64))
    if granularity == "tensor":
        amax = np.array([mag.max() if mag.size else 0.0])
    elif granularity == "row":
        amax = mag.max(axis=1) if k else np.zeros(m)
    else:
        amax = np.zeros((m, -(-k // 128)))
        for j in range(amax.shape[1]):
            amax[:, j] = mag[:, j * 128 : (j + 1) * 128].max(axis=1)
    scale = (amax / 448.0).astype(np.float32)  # amax is a float32 value: exact in float64
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    full = np.empty((m, k), np.float64)
    if granularity == "block":
        for j in range(scale.shape[1]):
            full[:, j * 128 : (j + 1) * 128] = scale[:, j : j + 1]
    else:
        full[...] = scale[0] if granularity == "tensor" else scale.astype(np.float64)[:, None]
    with np.errstate(all="ignore"):
        quotient = (x64 / full).astype(np.float32)
        codes = np.clip(quotient, -448, 448).astype(E4M3).view(np.uint8).copy()
    codes[np.isnan(quotient)] = 0x7F
    return codes, scale


def check(x: gp.GPUArray, host: Array, granularity: str, **kwargs: Any) -> tuple[gp.GPUArray, gp.GPUArray]:
    """quantize_fp8(x) bitwise equal to :func:`reference` of ``host`` (x's values, 1-D or 2-D)."""
    q, s = quantize_fp8(x, granularity, **kwargs)
    host2 = host.reshape(1, -1) if host.ndim == 1 else host
    m, k = host2.shape
    codes, scale = reference(host2, granularity)
    assert q.dtype == gp.float8_e4m3fn
    assert q.shape == host.shape
    assert q.is_contiguous
    assert s.dtype == gp.float32
    if granularity == "block":
        g = -(-k // 128)
        assert s.shape == (m, g)
        assert s.strides == (4, 4 * m)  # the transpose of a contiguous (G, M) array
        assert s.T.is_contiguous
        assert s.T.shape == (g, m)
    else:
        assert s.shape == ((m,) if granularity == "row" else (1,))
        assert s.is_contiguous
    got_q = q.to_numpy().view(np.uint8).reshape(m, k)
    mismatch = np.argwhere(got_q != codes)
    assert mismatch.size == 0, (granularity, mismatch[:5], got_q[tuple(mismatch[0])], codes[tuple(mismatch[0])])
    np.testing.assert_array_equal(s.to_numpy().view(np.uint32), scale.view(np.uint32))
    return q, s


def per_element_scale(s: Array, granularity: str, m: int, k: int) -> Array:
    if granularity == "tensor":
        return np.full((m, k), np.float64(s[0]))
    if granularity == "row":
        return np.repeat(s.astype(np.float64)[:, None], k, axis=1)
    return np.repeat(s.astype(np.float64), 128, axis=1)[:, :k]


def assert_reconstructs(q: gp.GPUArray, s: gp.GPUArray, host: Array, granularity: str) -> None:
    """q * scale within e4m3's relative error 2^-4 per element (normal codes), and half the subnormal
    spacing 2^-9 of the scale below them."""
    x = host.astype(np.float64).reshape(q.shape[0] if q.ndim == 2 else 1, -1)
    m, k = x.shape
    full = per_element_scale(s.to_numpy(), granularity, m, k)
    back = q.to_numpy().astype(np.float64).reshape(m, k) * full
    assert np.all(np.abs(back - x) <= 2.0**-4 * np.abs(x) + 2.0**-10 * full)


def random_rows(rng: np.random.Generator, m: int, k: int, dtype: DType) -> Array:
    """Normal values with a magnitude of 10^-3 .. 10^3 per row, one all-zero row where m > 2, one
    all-zero 128-column group where possible; exactly representable in ``dtype``."""
    x = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-3, 3, size=(m, 1))
    if m > 2:
        x[1] = 0.0
    if k > 128:
        x[0, 128:256] = 0.0
    return x.astype(np.float32).astype(qt.NP[dtype.name])


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", qt.DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("m", [1, 3, 37])
def test_matches_the_reference(rng: np.random.Generator, granularity: str, dtype: DType, m: int) -> None:
    for k in (1, 5, 127, 128, 300, 516):
        x = random_rows(rng, m, k, dtype)
        q, s = check(upload(x), x, granularity)
        assert_reconstructs(q, s, x, granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_all_zero_input_has_unit_scales(granularity: str) -> None:
    x = np.zeros((3, 200), np.float32)
    x[1, 7] = -0.0
    q, s = check(upload(x), x, granularity)
    assert np.all(s.to_numpy() == 1.0)
    assert np.all(q.to_numpy().astype(np.float32) == 0.0)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", qt.DTYPES, ids=lambda d: d.name)
def test_huge_and_tiny_magnitudes(rng: np.random.Generator, granularity: str, dtype: DType) -> None:
    big, smallest_normal, tiny = RANGE[dtype.name]
    k = 260
    x = rng.standard_normal((6, k))
    x[0] *= big / 8  # near the top of the dtype's range
    x[1] *= smallest_normal * 4  # near its smallest normal
    x[2] = rng.choice([0.0, tiny, -tiny, 2 * tiny, 3 * tiny], size=k)  # subnormals only: amax / 448 underflows
    x[3, :3] = [big, -big, 1.0]  # a group dominated by one value: the others round to e4m3 subnormals or 0
    x[4] = rng.standard_normal(k) * 1e-30
    x[5] = rng.standard_normal(k) * 1e30
    x = np.clip(x, -big, big).astype(qt.NP[dtype.name])
    q, s = check(upload(x), x, granularity)
    assert_reconstructs(q, s, x, granularity)
    if granularity == "row" and dtype == gp.float32:  # amax = 3 * 2^-149: amax / 448 underflows, scale 1
        assert s.to_numpy()[2] == 1.0
        assert np.all(q.to_numpy()[2].astype(np.float32) == 0.0)


def test_scales_and_codes_at_the_rounding_edges() -> None:
    """Quotients at e4m3's ties (round to even), in its subnormal range, below its smallest subnormal
    and at -0 land on the codes ml_dtypes gives; with amax = 448 the scale is exactly 1."""
    ties = [1.0625, 1.1875, 0.5 + 1 / 32, 2.0**-7 + 2.0**-10, 2.0**-10, 3 * 2.0**-10, 2.0**-11, 248.0, 440.0]
    row = np.array([448.0, *ties, *(-t for t in ties), -0.0, 447.99997, 2.0**-149], np.float32)
    x = np.stack([row, row[::-1]])
    for granularity in GRANULARITIES:
        _, s = check(upload(x), x, granularity)
        assert np.all(s.to_numpy() == 1.0)


def test_nan_and_inf() -> None:
    """NaN is ignored by the amax and stays NaN (0x7f, also for a negative NaN); an infinity makes its
    group's scale infinite: the finite values become +-0, the infinities NaN."""
    x = np.ones((3, 300), np.float32)
    x[0, 5] = np.nan
    x[0, 6] = -np.nan
    x[0, 7] = 896.0
    x[1, 200] = np.inf
    x[1, 201] = -3.0
    x[2, :] = np.nan
    for granularity in GRANULARITIES:
        q, s = check(upload(x), x, granularity)
        codes = q.to_numpy().view(np.uint8)
        assert codes[0, 5] == codes[0, 6] == codes[2, 0] == 0x7F
    q, s = quantize_fp8(upload(x), "row")
    row_scales = s.to_numpy()
    assert row_scales[0] == np.float32(2.0)
    assert np.isinf(row_scales[1])
    assert row_scales[2] == 1.0
    q, s = quantize_fp8(upload(x), "block")
    block_scales = s.to_numpy()
    assert np.isinf(block_scales[1, 1])
    assert block_scales[1, 0] == np.float32(1 / 448)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_strided_transposed_and_1d_inputs(rng: np.random.Generator, granularity: str) -> None:
    wide = random_rows(rng, 37, 700, gp.bfloat16)
    device = upload(wide)
    for start, k in ((3, 300), (4, 512), (0, 129)):  # unaligned rows; aligned, ldx > K; K odd
        check(device[:, start : start + k], wide[:, start : start + k], granularity)
    check(device[::2, 8:264], wide[::2, 8:264], granularity)  # every other row: ldx = 1400
    check(device[:5, :40].T, wide[:5, :40].T, granularity)  # column-major: a contiguous copy first
    check(device[7], wide[7], granularity)  # 1-D: one row, q keeps the shape
    check(device[7, ::3], wide[7, ::3], granularity)  # 1-D strided
    narrow = wide.astype(np.float32).reshape(37 * 7, 100)
    check(upload(narrow)[:, 1:], narrow[:, 1:], granularity)  # K = 99, many rows


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_empty_inputs(granularity: str) -> None:
    for shape in ((0, 300), (3, 0), (0,), (0, 0)):
        x = np.zeros(shape, np.float32)
        q, s = quantize_fp8(upload(x), granularity)
        m, k = (1, shape[0]) if len(shape) == 1 else shape
        assert q.shape == shape
        assert q.dtype == gp.float8_e4m3fn
        expected = {"tensor": (1,), "row": (m,), "block": (m, -(-k // 128))}[granularity]
        assert s.shape == expected
        assert np.all(s.to_numpy() == 1.0)


def test_runs_on_a_stream(rng: np.random.Generator) -> None:
    x = random_rows(rng, 9, 1000, gp.float16)
    device = upload(x)
    stream = gp.Stream()
    results = {g: quantize_fp8(device, g, stream=stream) for g in GRANULARITIES}
    stream.synchronize()
    for granularity, (q, s) in results.items():
        codes, scale = reference(x, granularity)
        np.testing.assert_array_equal(q.to_numpy().view(np.uint8), codes)
        np.testing.assert_array_equal(s.to_numpy(), scale)


def test_errors(rng: np.random.Generator) -> None:
    x = upload(rng.standard_normal((4, 256)).astype(np.float32))
    with pytest.raises(DTypeError, match="GPUArray"):
        quantize_fp8(np.ones((4, 256), np.float32))  # type: ignore[arg-type]
    for dtype in (gp.float64, gp.int32, gp.float8_e4m3fn):
        with pytest.raises(DTypeError, match=dtype.name):
            quantize_fp8(x.astype(dtype))
    with pytest.raises(ShapeError, match=r"\(2, 2, 256\)"):
        quantize_fp8(x.reshape(2, 2, 256))
    with pytest.raises(ShapeError, match=r"\(\)"):
        quantize_fp8(x[0, 0])
    with pytest.raises(ArgumentError, match="'channel'"):
        quantize_fp8(x, "channel")
    with pytest.raises(ArgumentError, match="granularity"):
        quantize_fp8(x, None)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"block must be 128 .*got 64"):
        quantize_fp8(x, "block", block=64)
    for bad in (True, 128.0, "128"):
        with pytest.raises(ArgumentError, match="block must be an int"):
            quantize_fp8(x, block=bad)  # type: ignore[arg-type]
    quantize_fp8(x, "row", block=64)  # the block only matters to the block granularity


def test_every_kernel_is_enumerated_for_the_compile_check() -> None:
    qt.enumerated(_FILE, 4 * 3, "pygpukit::ops::fp8act::fp8_act_block<__nv_bfloat16>",
                  "pygpukit::ops::fp8act::fp8_act_row<float>", "pygpukit::ops::fp8act::fp8_act_amax<__half>",
                  "pygpukit::ops::fp8act::fp8_act_tensor<__half>")  # fmt: skip


@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    qt.assert_compiles(_FILE, 4 * 3)


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", qt.DTYPES, ids=lambda d: d.name)
def test_gpu_large_shapes_bitwise(rng: np.random.Generator, granularity: str, dtype: DType) -> None:
    """Prefill and decode shapes, aligned (16-byte chunks) and not, with garbage left in the pool for
    the results; the tensor amax over more blocks than the grid (grid-stride loops); repeated calls
    equal (deterministic)."""
    for m, k in ((1, 7168), (8, 4096), (333, 7168), (2048, 1000), (4097, 516), (61, 18432 + 3)):
        x = random_rows(rng, m, k, dtype)
        q_bytes, s_bytes = m * k, 4 * m * -(-k // 128)
        poison_pool((q_bytes,), gp.uint8)
        poison_pool((max(s_bytes // 4, 1),), gp.float32)
        device = upload(x)
        q, s = check(device, x, granularity)
        assert_reconstructs(q, s, x, granularity)
        again_q, again_s = quantize_fp8(device, granularity)
        assert again_q.to_numpy().tobytes() == q.to_numpy().tobytes()
        assert again_s.to_numpy().tobytes() == s.to_numpy().tobytes()
    wide = random_rows(rng, 300, 4096 + 8, dtype)
    device = upload(wide)
    check(device[:, 4 : 4 + 4096], wide[:, 4 : 4 + 4096], granularity)  # ldx > K, vector path
    check(device[:, 1 : 1 + 4096], wide[:, 1 : 1 + 4096], granularity)  # unaligned: element by element


@pytest.mark.gpu
def test_gpu_special_values_every_dtype(rng: np.random.Generator) -> None:
    for dtype in qt.DTYPES:
        x = random_rows(rng, 50, 1024 + 4, dtype).astype(np.float32)
        x[3, 10], x[4, 500], x[5, :] = np.nan, np.inf, -0.0
        x[6, ::7] = np.float32(2.0**-140)
        x = x.astype(qt.NP[dtype.name])
        for granularity in GRANULARITIES:
            check(upload(x), x, granularity)


@pytest.mark.gpu
def test_gpu_graph_replay_on_a_stream(rng: np.random.Generator) -> None:
    """The tensor path (memset, amax and quantize kernels) and the block path captured once and replayed
    on new values of x: equal to eager runs."""
    x = random_rows(rng, 16, 2048, gp.bfloat16)
    device = upload(x)
    stream = gp.Stream()
    graph = gp.CudaGraph()
    with stream:
        warm = [quantize_fp8(device, g) for g in ("tensor", "block")]  # the pool blocks the capture takes,
        del warm  # all alive at once, as in the capture
        with graph.capture(stream):
            outputs = [quantize_fp8(device, g) for g in ("tensor", "block")]
        fresh = random_rows(rng, 16, 2048, gp.bfloat16) * 3
        device.copy_(fresh)
        graph.replay(stream)
    stream.synchronize()
    for granularity, (q, s) in zip(("tensor", "block"), outputs, strict=True):
        codes, scale = reference(fresh, granularity)
        np.testing.assert_array_equal(q.to_numpy().view(np.uint8), codes)
        np.testing.assert_array_equal(s.to_numpy(), scale)
