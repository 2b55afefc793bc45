"""GGUF dequantization against the ``gguf`` package's reference decoder (gguf.quants.dequantize), bit
for bit: every format with random quants and finite random float16 scales (subnormals included), at
1, odd and multi-tile block counts; fully random bytes (NaN and inf scales) compared as bit patterns,
NaN payloads included on the CPU backend and for the plain formats; float16/bfloat16 results against
the float32 reference rounded once (NumPy, ml_dtypes). Typed errors leave ``out`` untouched. On the
GPU: larger tensors into poisoned outputs, unaligned views (the byte-load and scalar-store paths), and
CUDA-graph replays bitwise equal to eager runs."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ops_testing import Array, poison, upload

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

# name: (ggml type id, elements per block, bytes per block, byte offsets of the float16 scales)
FORMATS: dict[str, tuple[int, int, int, tuple[int, ...]]] = {
    "F32": (0, 1, 4, ()),
    "F16": (1, 1, 2, ()),
    "BF16": (30, 1, 2, ()),
    "Q8_0": (8, 32, 34, (0,)),
    "Q4_0": (2, 32, 18, (0,)),
    "Q4_1": (3, 32, 20, (0, 2)),
    "Q5_0": (6, 32, 22, (0,)),
    "Q5_1": (7, 32, 24, (0, 2)),
    "Q2_K": (10, 256, 84, (80, 82)),
    "Q3_K": (11, 256, 110, (108,)),
    "Q4_K": (12, 256, 144, (0, 2)),
    "Q5_K": (13, 256, 176, (0, 2)),
    "Q6_K": (14, 256, 210, (208,)),
}
NAMES = list(FORMATS)
PLAIN = ("F32", "F16", "BF16")
OUT_DTYPES = [gp.float32, gp.float16, gp.bfloat16]
BLOCK_COUNTS = [1, 3, 37]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _elements(name: str, blocks: int) -> int:
    return blocks * FORMATS[name][1]


def tensor_bytes(rng: np.random.Generator, name: str, blocks: int, *, raw: bool = False) -> Array:
    """The bytes of ``blocks`` blocks: random quants with finite random float16 scales (values of
    every magnitude, subnormals and signed zeros included), or with ``raw`` fully random bytes."""
    _, _, nbytes, scales = FORMATS[name]
    if raw:
        return rng.integers(0, 256, size=blocks * nbytes, dtype=np.uint8)
    if name in PLAIN:
        values = rng.standard_normal(blocks) * 10.0 ** rng.uniform(-6, 4, size=blocks)
        dtype = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[name]
        plain: Array = np.asarray(values.astype(dtype)).view(np.uint8).copy()
        return plain
    data = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    for offset in scales:
        magnitude = 10.0 ** rng.uniform(-8, 2, size=blocks)  # below ~6e-5 float16 is subnormal
        values = (rng.standard_normal(blocks) * magnitude).astype(np.float16)
        values[rng.random(blocks) < 0.05] = np.float16(-0.0)
        data[:, offset : offset + 2] = values.view(np.uint8).reshape(blocks, 2)
    return data.reshape(-1)


def reference(name: str, data: Array) -> Array:
    """float32 elements of ``data`` decoded by the gguf package."""
    gguf = pytest.importorskip("gguf")
    with np.errstate(all="ignore"):
        result = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[name])
    return np.asarray(result, dtype=np.float32).reshape(-1)


def rounded(values: Array, dtype: DType) -> Array:
    """float32 ``values`` rounded once to ``dtype``, as astype rounds (NumPy float16, ml_dtypes bfloat16)."""
    with np.errstate(all="ignore"):
        return values.astype(dtype.numpy)


def assert_same_bits(actual: Array, expected: Array, *, nan_payloads: bool = True) -> None:
    """Same bit patterns; with ``nan_payloads`` False, NaNs need only be NaN at the same places (the
    GPU's arithmetic makes its canonical NaN where x86 propagates an operand's payload)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    width = {4: np.uint32, 2: np.uint16}[actual.itemsize]
    a, e = actual.reshape(-1).view(width), expected.reshape(-1).view(width)
    if not nan_payloads:
        a_nan = np.isnan(actual.reshape(-1).astype(np.float32))
        e_nan = np.isnan(expected.reshape(-1).astype(np.float32))
        where = np.flatnonzero(a_nan != e_nan)
        assert where.size == 0, f"NaN at different places, first elements {where[:8]}"
        a, e = a[~e_nan], e[~e_nan]
    where = np.flatnonzero(a != e)
    assert where.size == 0, (
        f"{where.size} of {a.size} elements differ; first at {where[:8]}: got {[hex(int(x)) for x in a[where[:4]]]}, "
        f"expected {[hex(int(x)) for x in e[where[:4]]]}"
    )


def dequantize_host(data: Array, qtype: Any, shape: Any, dtype: DType = gp.float32, **kw: Any) -> Array:
    result: Array = gp.dequantize_gguf(upload(data), qtype, shape, dtype, **kw).to_numpy()
    return result


# -- the reference, on whichever backend is active -----------------------------------------------------
@pytest.mark.parametrize("blocks", BLOCK_COUNTS)
@pytest.mark.parametrize("name", NAMES)
def test_float32_is_the_reference_bit_for_bit(rng: np.random.Generator, name: str, blocks: int) -> None:
    data = tensor_bytes(rng, name, blocks)
    expected = reference(name, data)
    assert np.isfinite(expected).all()
    actual = dequantize_host(data, name, (_elements(name, blocks),))
    assert_same_bits(actual, expected)


@pytest.mark.parametrize("name", NAMES)
def test_random_bytes_nan_and_inf_bit_patterns(rng: np.random.Generator, name: str) -> None:
    blocks = 4099 if name in PLAIN else 301  # every float16 scale bit pattern turns up, NaNs included
    data = tensor_bytes(rng, name, blocks, raw=True)
    expected = reference(name, data)
    assert np.isnan(expected).any()
    assert not np.isnan(expected).all()
    actual = dequantize_host(data, name, (_elements(name, blocks),))
    assert_same_bits(actual, expected, nan_payloads=current_backend() != "cuda" or name in PLAIN)


@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_narrow_results_round_the_reference_once(rng: np.random.Generator, name: str, dtype: DType) -> None:
    blocks = 5
    data = tensor_bytes(rng, name, blocks)
    expected = rounded(reference(name, data), dtype)
    actual = dequantize_host(data, name, (_elements(name, blocks),), dtype)
    assert_same_bits(actual, expected)
    out = poison(_elements(name, blocks), dtype)
    assert gp.dequantize_gguf(upload(data), name.lower(), (_elements(name, blocks),), dtype.name, out=out) is out
    assert_same_bits(out.to_numpy(), expected)


def test_shapes_type_ids_and_tiles(rng: np.random.Generator) -> None:
    # Several 2048-element tiles, a partial last tile, a 2-D data array, type ids and lowercase names.
    data = tensor_bytes(rng, "Q4_K", 3 * 24)
    expected = reference("Q4_K", data).reshape(3, 24 * 256)
    result = gp.dequantize_gguf(upload(data.reshape(6, -1)), 12, (3, 24 * 256))
    assert result.shape == (3, 24 * 256)
    assert result.dtype == gp.float32
    assert_same_bits(result.to_numpy(), expected)
    assert_same_bits(dequantize_host(data, "q4_k", (3, 4, 6, 256)), expected.reshape(3, 4, 6, 256))
    plain = tensor_bytes(rng, "F16", 4099)  # not a whole number of 4-element groups
    assert_same_bits(dequantize_host(plain, "f16", (4099,), gp.bfloat16), rounded(reference("F16", plain), gp.bfloat16))
    assert_same_bits(dequantize_host(plain, 1, 4099), reference("F16", plain))


def test_gguf_type_enum_and_block_sizes() -> None:
    gguf = pytest.importorskip("gguf")
    assert tuple(NAMES) == gp.GGUF_DEQUANT_TYPES
    for name, (type_id, elements, nbytes, _) in FORMATS.items():
        enum = gguf.GGMLQuantizationType[name]
        assert int(enum) == type_id
        assert gguf.GGML_QUANT_SIZES[enum] == (elements, nbytes)
        for qtype in (name, name.lower(), type_id, enum, np.int64(type_id)):
            assert gp.gguf_block_size(qtype) == (elements, nbytes)
    data = tensor_bytes(np.random.default_rng(3), "Q6_K", 2)
    assert_same_bits(dequantize_host(data, gguf.GGMLQuantizationType.Q6_K, (512,)), reference("Q6_K", data))


def test_views_at_any_offset(rng: np.random.Generator) -> None:
    # data 1..15 bytes into its allocation, out one element in: the unaligned load and store paths.
    for name in ("Q5_0", "Q3_K", "F32"):
        blocks = 9 if name != "F32" else 2051
        data = tensor_bytes(rng, name, blocks)
        expected = reference(name, data)
        count = expected.size
        for shift in (1, 2, 5, 15):
            padded = np.zeros(data.size + 32, np.uint8)
            padded[shift : shift + data.size] = data
            view = upload(padded)[shift : shift + data.size]
            wide = poison(count + 3, gp.float32)
            out = wide[1 : count + 1]
            gp.dequantize_gguf(view, name, (count,), out=out)
            host = wide.to_numpy()
            assert_same_bits(host[1 : count + 1], expected)
            assert np.isnan(host[0])
            assert np.isnan(host[count + 1 :]).all()


@pytest.mark.parametrize("name", ["F16", "Q5_1", "Q2_K"])
def test_cpu_backend_chunks_like_one_pass(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                          name: str) -> None:  # fmt: skip
    # The CPU backend decodes large tensors in chunks of whole blocks; the bits, NaNs included, must not
    # depend on where the chunks end. (No effect on the GPU backend.)
    from pygpukit.ops import gguf as module

    monkeypatch.setattr(module, "_CHUNK", 600)
    blocks = 1001 if name in PLAIN else 13
    data = tensor_bytes(rng, name, blocks, raw=True)
    actual = dequantize_host(data, name, (_elements(name, blocks),))
    assert_same_bits(actual, reference(name, data), nan_payloads=current_backend() != "cuda" or name in PLAIN)


def test_empty_tensor() -> None:
    result = gp.dequantize_gguf(gp.empty(0, gp.uint8), "Q4_K", (0, 256), gp.bfloat16)
    assert result.shape == (0, 256)
    assert result.dtype == gp.bfloat16


# -- errors -----------------------------------------------------------------------------------------
def test_errors_name_the_problem_and_write_nothing() -> None:
    data = gp.from_numpy(np.zeros(144 * 2, np.uint8))
    out = poison(512, gp.float32)

    def untouched() -> None:
        assert np.isnan(out.to_numpy()).all()

    with pytest.raises(ArgumentError, match=r"'IQ2_XXS'.*supported: F32 \(0\), F16 \(1\).*Q6_K \(14\)"):
        gp.dequantize_gguf(data, "IQ2_XXS", (512,), out=out)
    with pytest.raises(ArgumentError, match="unsupported GGUF tensor type 16"):
        gp.dequantize_gguf(data, 16, (512,), out=out)
    with pytest.raises(ArgumentError, match="unsupported GGUF tensor type True"):
        gp.dequantize_gguf(data, True, (512,), out=out)
    with pytest.raises(ArgumentError, match="Q4_K_M"):
        gp.gguf_block_size("Q4_K_M")
    with pytest.raises(ShapeError, match=r"data has 288 bytes but shape \(768,\) in Q4_K takes 432"):
        gp.dequantize_gguf(data, "Q4_K", (768,))
    with pytest.raises(ShapeError, match=r"data has 288 bytes .* takes 360"):
        gp.dequantize_gguf(data, "Q4_0", (640,))
    with pytest.raises(ShapeError, match="300 elements, not a multiple of the 256-element blocks of Q4_K"):
        gp.dequantize_gguf(data, "Q4_K", (3, 100), out=out)
    with pytest.raises(ShapeError, match="shape must be"):
        gp.dequantize_gguf(data, "Q4_K", (2, -256), out=out)
    with pytest.raises(DTypeError, match="data must be uint8"):
        gp.dequantize_gguf(gp.zeros(72, gp.float32), "Q4_K", (512,), out=out)
    with pytest.raises(DTypeError, match="GPUArray"):
        gp.dequantize_gguf(np.zeros(288, np.uint8), "Q4_K", (512,), out=out)
    with pytest.raises(ShapeError, match="contiguous"):
        gp.dequantize_gguf(gp.zeros((288, 2), gp.uint8)[:, 0], "Q4_K", (512,), out=out)
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16, got float64"):
        gp.dequantize_gguf(data, "Q4_K", (512,), gp.float64)
    with pytest.raises(ShapeError, match=r"out has shape \(512,\) but the result has shape \(2, 256\)"):
        gp.dequantize_gguf(data, "Q4_K", (2, 256), out=out)
    with pytest.raises(DTypeError, match="out has dtype float32 but the result is bfloat16"):
        gp.dequantize_gguf(data, "Q4_K", (512,), gp.bfloat16, out=out)
    wide = poison((512, 2), gp.float32)
    with pytest.raises(ShapeError, match="out must be contiguous"):
        gp.dequantize_gguf(data, "Q4_K", (512,), out=wide[:, 0])
    with pytest.raises(DTypeError, match="out must be a GPUArray"):
        gp.dequantize_gguf(data, "Q4_K", (512,), out=np.zeros(512, np.float32))
    untouched()
    shared = gp.from_numpy(np.zeros(4 * 1024, np.uint8))
    aliased = gp.GPUArray(shared._buffer, (512,), gp.float32, offset=64)  # bytes 256..2303 of the allocation
    with pytest.raises(ArgumentError, match="out overlaps data"):
        gp.dequantize_gguf(shared[: 144 * 2], "Q4_K", (512,), out=aliased)
    gp.dequantize_gguf(shared[2304 : 2304 + 144 * 2], "Q4_K", (512,), out=aliased)  # adjacent, not overlapping


# -- NVRTC ------------------------------------------------------------------------------------------
@pytest.mark.nvrtc
def test_kernels_compile_without_warnings() -> None:
    from pygpukit.core.compiler import compile_source
    from pygpukit.ops._kernels import name_expressions

    expressions = name_expressions("quant/gguf_dequant.cu")
    assert len(expressions) == 3 * len(NAMES)
    source = Path(__file__).resolve().parents[3] / "native" / "kernels" / "quant" / "gguf_dequant.cu"
    floats = [e for e in expressions if e.endswith(", float>")]
    for arch in ("80", "90"):
        program = compile_source(source.read_text(), arch=arch, name=source.name, include_dirs=[source.parent],
                                 name_expressions=floats)  # fmt: skip
        assert program.log.strip() == "", program.log


# -- the GPU ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_gpu_large_tensors_into_poisoned_outputs(rng: np.random.Generator, name: str, dtype: DType) -> None:
    rows, cols = (96, 4096) if name not in PLAIN else (33, 4099)  # plain: odd rows, a partial last tile
    blocks = rows * cols // FORMATS[name][1]
    data = tensor_bytes(rng, name, blocks)
    expected = rounded(reference(name, data), dtype).reshape(rows, cols)
    out = poison((rows, cols), dtype)
    gp.dequantize_gguf(upload(data), name, (rows, cols), dtype, out=out)
    assert_same_bits(out.to_numpy(), expected)
    raw = tensor_bytes(rng, name, blocks, raw=True)
    out = poison((rows, cols), dtype)
    gp.dequantize_gguf(upload(raw), name, (rows, cols), dtype, out=out)
    exact = name in PLAIN and dtype == gp.float32
    assert_same_bits(out.to_numpy(), rounded(reference(name, raw), dtype).reshape(rows, cols), nan_payloads=exact)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_gpu_graph_replay_is_bitwise_eager(rng: np.random.Generator, dtype: DType) -> None:
    cases = []
    for name in NAMES:
        count = 8 * 2048 + (256 if name not in PLAIN else 5)
        blocks = count // FORMATS[name][1]
        data = upload(tensor_bytes(rng, name, blocks, raw=True))  # NaNs too: their bits must repeat
        cases.append((name, data, count, gp.empty((count,), dtype)))
    for name, data, count, out in cases:
        gp.dequantize_gguf(data, name, (count,), dtype, out=out)  # compiles, and gives the eager result
    eager = [out.to_numpy() for *_, out in cases]
    for *_, out in cases:
        out.copy_(np.full(out.shape, np.nan).astype(dtype.numpy))
    graph = gp.CudaGraph()
    with graph.capture():
        for name, data, count, out in cases:
            gp.dequantize_gguf(data, name, (count,), dtype, out=out)
    for _ in range(2):
        graph.replay()
        graph.synchronize()
        for (name, *_, out), expected in zip(cases, eager, strict=True):
            try:
                assert_same_bits(out.to_numpy(), expected)
            except AssertionError as exc:
                raise AssertionError(f"{name}: graph replay differs from eager: {exc}") from None
