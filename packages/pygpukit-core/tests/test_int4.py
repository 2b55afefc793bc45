"""The packed int4 dtype: packing layout, uploads and downloads, fills, copies, reshapes and astype to
and from int8 and the float types against an independently written reference of the conversion rule
(and ml_dtypes where it is defined); typed errors for everything else. On the GPU the same tests run
the int4.cu kernels; their compilation is checked anywhere NVRTC is."""

from __future__ import annotations

import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.dtypes import INT4_PARTNERS, int4_values, pack_int4, unpack_int4
from pygpukit.core.errors import DTypeError
from pygpukit.testing import assert_bitwise_equal

INT4 = np.dtype(ml_dtypes.int4)
SIZES = [1, 2, 7, 1000, 4097]
SHAPES = [(1,), (5,), (2, 3), (3, 5, 7), (1023,)]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def reference_nibble(value: float) -> int:
    """The int4 conversion rule written out for one value: truncate toward zero (floats), keep the low
    four bits as a signed number; NaN, infinities and truncations beyond int32 give 0."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return 0
        value = math.trunc(value)
        if abs(value) >= 2**31:
            return 0
    low = int(value) & 15
    return low - 16 if low >= 8 else low


def random_int4(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-8, 8, size=shape).astype(np.int8).astype(INT4)


def test_dtype_properties() -> None:
    assert gp.int4.bits == 4
    assert gp.int4.itemsize == 1  # as ml_dtypes.int4 on the host
    assert gp.int4.packed
    assert not gp.float32.packed
    assert gp.float32.bits == 32
    assert gp.as_dtype("int4") is gp.int4
    assert gp.as_dtype(ml_dtypes.int4) is gp.int4
    assert gp.int4 not in gp.dtypes.all_dtypes()  # not a compute type of the kernels
    assert gp.dtypes.packed_dtypes() == (gp.int4,)


def test_packing_layout() -> None:
    """Element 2i in the low nibble of byte i, 2i + 1 in the high nibble, zero padding."""
    packed = pack_int4(np.array([1, -1, 7, -8, 3], dtype=INT4))
    assert packed.tolist() == [0xF1, 0x87, 0x03]
    assert unpack_int4(packed, 5).tolist() == [1, -1, 7, -8, 3]
    with pytest.raises(DTypeError, match="hold 6 int4 values, not 7"):
        unpack_int4(packed, 7)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_and_nbytes(rng: np.random.Generator, shape: tuple[int, ...]) -> None:
    host = random_int4(rng, shape)
    x = gp.from_numpy(host)
    assert x.dtype == gp.int4
    assert x.shape == shape
    assert x.nbytes == (host.size + 1) // 2
    assert x.buffer.nbytes >= x.nbytes
    back = x.to_numpy()
    assert back.dtype == INT4
    assert_bitwise_equal(back, host)


def test_non_contiguous_numpy_source(rng: np.random.Generator) -> None:
    host = random_int4(rng, (6, 8))[:, ::3]
    assert not host.flags.c_contiguous
    assert gp.from_numpy(host).to_numpy().tolist() == host.tolist()


def test_conversion_rule_matches_the_reference_and_ml_dtypes() -> None:
    values = [0.0, -0.0, 0.4, -0.6, 1.9, -1.9, 7.5, -8.5, 8.0, -9.0, 15.99, 16.0, 100.0, -100.0, 2.0**31 - 1,
              -(2.0**31) + 1, 2.0**31, -(2.0**31), 1e10, -1e10, float("nan"), float("inf"), float("-inf")]  # fmt: skip
    got = int4_values(np.array(values, np.float64)).tolist()
    assert got == [reference_nibble(v) for v in values]
    # ml_dtypes' own conversion agrees wherever it is defined (inside int32; it is platform-defined beyond).
    inside = np.array([v for v in values if math.isfinite(v) and abs(math.trunc(v)) < 2**31], np.float64)
    assert int4_values(inside).tolist() == inside.astype(INT4).astype(np.int8).tolist()
    ints = np.arange(-128, 128, dtype=np.int8)
    assert int4_values(ints).tolist() == [reference_nibble(int(v)) for v in ints]
    assert int4_values(ints).tolist() == ints.astype(INT4).astype(np.int8).tolist()


@pytest.mark.parametrize("target", INT4_PARTNERS, ids=str)
@pytest.mark.parametrize("size", SIZES)
def test_astype_from_int4_is_exact(rng: np.random.Generator, target: gp.DType, size: int) -> None:
    host = random_int4(rng, (size,))
    got = gp.from_numpy(host).astype(target).to_numpy()
    assert got.dtype == target.numpy
    np.testing.assert_array_equal(got.astype(np.float64), host.astype(np.int8).astype(np.float64))


@pytest.mark.parametrize("source", INT4_PARTNERS, ids=str)
@pytest.mark.parametrize("size", SIZES)
def test_astype_to_int4_follows_the_rule(rng: np.random.Generator, source: gp.DType, size: int) -> None:
    if source == gp.int8:
        host = rng.integers(-128, 128, size=size).astype(np.int8)
    else:
        host = (rng.standard_normal(size) * 12.0).astype(np.float32).astype(source.numpy)
        host[: min(size, 3)] = np.array([np.nan, np.inf, -np.inf], np.float32)[: min(size, 3)].astype(source.numpy)
    x = gp.from_numpy(host)
    got = x.astype(gp.int4)
    assert got.dtype == gp.int4
    expected = [reference_nibble(float(v) if source.is_floating else int(v)) for v in host.astype(np.float64)]
    assert got.to_numpy().astype(np.int8).tolist() == expected


def test_astype_of_a_strided_view_to_int4(rng: np.random.Generator) -> None:
    host = (rng.standard_normal((6, 9)) * 6).astype(np.float32)
    view = gp.from_numpy(host)[1:, ::2].T  # non-contiguous: compacted on the device first
    got = view.astype(gp.int4).to_numpy().astype(np.int8)
    assert got.tolist() == [[reference_nibble(float(v)) for v in row] for row in host[1:, ::2].T.astype(np.float64)]


@pytest.mark.parametrize("value", [0, 1, -8, 7, -1, 2.7, -3.9])
def test_fills(value: float) -> None:
    x = gp.full((3, 5), value, gp.int4)
    assert x.to_numpy().astype(np.int8).tolist() == [[reference_nibble(value)] * 5] * 3
    assert gp.zeros(7, gp.int4).to_numpy().astype(np.int8).tolist() == [0] * 7
    assert gp.ones(4, gp.int4).to_numpy().astype(np.int8).tolist() == [1] * 4
    with pytest.raises(DTypeError, match="cannot be represented as int4"):
        gp.full(3, 8, gp.int4)


def test_copies_reshape_and_asarray(rng: np.random.Generator) -> None:
    host = random_int4(rng, (4, 6))
    x = gp.from_numpy(host)
    y = x.clone()
    assert y.buffer is not x.buffer
    assert_bitwise_equal(y.to_numpy(), host)
    r = x.reshape(3, 8)
    assert r.buffer is x.buffer
    assert r.to_numpy().tolist() == host.reshape(3, 8).tolist()
    assert x.reshape(-1)[None].to_numpy().tolist() == host.reshape(1, -1).tolist()  # a contiguous view
    z = gp.empty((4, 6), gp.int4)
    z.copy_(x)
    assert_bitwise_equal(z.to_numpy(), host)
    z.copy_(np.full((4, 6), -2.6))  # NumPy sources convert by the rule
    assert z.to_numpy().astype(np.int8).tolist() == [[-2] * 6] * 4
    a = gp.asarray([[9, -9], [1.5, 40.0]], dtype="int4")
    assert a.to_numpy().astype(np.int8).tolist() == [[-7, 7], [1, -8]]
    assert x.astype(gp.int4).to_numpy().tolist() == host.tolist()  # a copy
    assert gp.empty(0, gp.int4).to_numpy().shape == (0,)


def test_views_that_split_bytes_raise(rng: np.random.Generator) -> None:
    x = gp.from_numpy(random_int4(rng, (4, 6)))
    with pytest.raises(DTypeError, match="only contiguous views that start at element 0"):
        _ = x.T
    with pytest.raises(DTypeError, match="only contiguous views that start at element 0"):
        x[1:]
    with pytest.raises(DTypeError, match="only contiguous views that start at element 0"):
        x[:, ::2]
    assert x[0:2].to_numpy().shape == (2, 6)  # starts at element 0 and is contiguous


def test_other_uses_raise_typed_errors(rng: np.random.Generator) -> None:
    x = gp.from_numpy(random_int4(rng, (4,)))
    with pytest.raises(DTypeError, match="device_ptr"):
        _ = x.device_ptr
    with pytest.raises(DTypeError, match="int4"):
        x.astype(gp.int16)
    with pytest.raises(DTypeError, match="int4"):
        gp.from_numpy(np.ones(4, np.uint8)).astype(gp.int4)
    with pytest.raises(DTypeError, match="arange"):
        gp.arange(4, dtype=gp.int4)
    with pytest.raises(DTypeError):
        x.__dlpack__()
    square = x.reshape(2, 2)
    ops = (lambda: x + x, lambda: x + 1.0, lambda: x == x, lambda: gp.sum(x), lambda: -x, lambda: gp.maximum(x, x),
           lambda: gp.where(x, x, x), lambda: gp.softmax(x), lambda: gp.matmul(square, square))  # fmt: skip
    for op in ops:
        with pytest.raises(DTypeError, match="int4"):
            op()


@pytest.mark.nvrtc
def test_int4_kernels_compile() -> None:
    from pygpukit.core.int4 import int4_kernel

    for partner in INT4_PARTNERS:
        for direction in ("pack", "unpack"):
            program = int4_kernel(direction, partner).compile("sm_80")
            assert program.binary[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_gpu_large_conversions_match_the_host_rule(rng: np.random.Generator) -> None:
    """A size that spreads over many blocks; bitwise against the host computation of the rule."""
    n = 3 * 2**20 + 5
    host = (rng.standard_normal(n) * 9).astype(np.float32)
    packed = gp.from_numpy(host).astype(gp.int4)
    assert_bitwise_equal(packed.to_numpy(), int4_values(host).astype(INT4))
    assert_bitwise_equal(packed.astype(gp.bfloat16).to_numpy(), int4_values(host).astype(ml_dtypes.bfloat16))
    copy = gp.empty(n, gp.int4)
    copy.copy_(packed)
    assert_bitwise_equal(copy.to_numpy(), packed.to_numpy())
