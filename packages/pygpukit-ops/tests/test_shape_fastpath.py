"""The one-launch concatenate/stack (``concat`` of shape/copy.cu) and the repeated-call fast paths of
concatenate, stack, transpose and permute (issue 14, host cost). GPU tests compare every result with
NumPy bit for bit: random data of every dtype (so every element size), odd sizes, 2 to 16 inputs,
every axis, misaligned views, the fallbacks (strided inputs, mixed dtypes, more inputs than one launch
takes), the cached call on fresh data, poisoned outputs, and a freed input raising on the cached path.
The CPU tests check the launch plans' arithmetic and the argument handling."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import DTYPES, poison_pool, sample, upload

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, InvalidPointerError
from pygpukit.ops import shape as shape_ops

Array = np.ndarray[Any, Any]
ODD_SIZES = [1, 3, 1000, 4097]
COUNTS = [2, 3, 9, shape_ops.MAX_JOINED]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _same(got: gp.GPUArray, expected: Array, what: str) -> None:
    """``got`` equals ``expected`` exactly: shape, dtype and every byte (copies convert nothing)."""
    host = got.to_numpy()
    assert host.shape == expected.shape, (what, host.shape, expected.shape)
    assert host.dtype == expected.dtype, (what, host.dtype, expected.dtype)
    assert got.is_contiguous, what
    flat_got = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
    flat_expected = np.ascontiguousarray(expected).reshape(-1).view(np.uint8)
    mismatch = np.flatnonzero(flat_got != flat_expected)
    assert mismatch.size == 0, f"{what}: {mismatch.size} of {flat_got.size} bytes differ, first at {mismatch[:5]}"


def _join_cases(rng: np.random.Generator) -> list[tuple[list[tuple[int, ...]], int]]:
    """(input shapes, axis): odd sizes along every axis (negative ones too) of 1-, 2- and 3-D inputs,
    2 to MAX_JOINED inputs of different lengths along the axis (one of them empty now and then)."""
    cases: list[tuple[list[tuple[int, ...]], int]] = []
    for n, count in itertools.product(ODD_SIZES, COUNTS):
        lengths = [n + int(rng.integers(0, 3)) for _ in range(count)]
        cases.append(([(length,) for length in lengths], 0))
    for base, count in itertools.product([(3, 1000), (4097, 1), (2, 5, 3), (1, 3, 37)], COUNTS[:3]):
        for axis in range(-len(base), len(base)):
            shapes = []
            for i in range(count):
                shape = list(base)
                shape[axis] = base[axis] + int(rng.integers(0, 3)) - (base[axis] if i == 1 and count > 2 else 0)
                shapes.append(tuple(shape))
            cases.append((shapes, axis))
    return cases


def _cached(op: str, arrays: list[gp.GPUArray], axis: int) -> bool:
    key = shape_ops._join_key(op, arrays, axis)
    return key is not None and key in shape_ops._JOINS


# -- GPU: concatenate and stack ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_concatenate_one_launch_matches_numpy(dtype: DType, rng: np.random.Generator) -> None:
    for shapes, axis in _join_cases(rng):
        for call in range(2):  # the second call takes the cached plan, on fresh data
            hosts = [sample(rng, s, dtype, -100, 100) for s in shapes]
            arrays = [upload(h) for h in hosts]
            expected = np.concatenate(hosts, axis=axis)
            poison_pool(expected.shape, dtype)
            _same(gp.concatenate(arrays, axis=axis), expected, f"concatenate {shapes} axis {axis} call {call}")
            assert _cached("concatenate", arrays, axis), (shapes, axis)
            got = gp.concatenate(tuple(arrays), axis=axis)  # a tuple: the same plan
            _same(got, expected, f"concatenate tuple {shapes} axis {axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_stack_one_launch_matches_numpy(dtype: DType, rng: np.random.Generator) -> None:
    for shape, count in itertools.product([(1,), (3,), (1000,), (4097,), (3, 37), (2, 5, 3), ()], COUNTS):
        for axis in range(-len(shape) - 1, len(shape) + 1):
            for call in range(2):
                hosts = [np.asarray(sample(rng, shape, dtype, -100, 100)) for _ in range(count)]
                arrays = [upload(h) for h in hosts]
                expected = np.stack(hosts, axis=axis)
                poison_pool(expected.shape, dtype)
                _same(gp.stack(arrays, axis=axis), expected, f"stack {count} x {shape} axis {axis} call {call}")
                assert _cached("stack", arrays, axis), (shape, count, axis)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.uint8, gp.float16, gp.float32, gp.int64], ids=str)
def test_join_misaligned_views(dtype: DType, rng: np.random.Generator) -> None:
    """Contiguous views at odd offsets (x[1:], rows from the second on) take the kernel in narrower
    units; the cached plan serves aligned and misaligned inputs alike."""
    for n in ODD_SIZES:
        for start in (0, 1, 2, 3):
            hosts = [sample(rng, (n + 4,), dtype, -100, 100) for _ in range(3)]
            views = [upload(h)[start:] for h in hosts]
            views[1] = upload(hosts[1])[1:]
            expected = np.concatenate([hosts[0][start:], hosts[1][1:], hosts[2][start:]])
            poison_pool(expected.shape, dtype)
            _same(gp.concatenate(views), expected, f"concatenate views n={n} start={start}")
            stacked = np.stack([hosts[0][start : start + n], hosts[2][start : start + n]], axis=-1)
            got = gp.stack([upload(hosts[0])[start : start + n], upload(hosts[2])[start : start + n]], axis=-1)
            _same(got, stacked, f"stack views n={n} start={start}")
        matrix = sample(rng, (5, n), dtype, -100, 100)
        rows = upload(matrix)[1:]  # the second row on: misaligned whenever n * itemsize is
        _same(gp.concatenate([rows, rows], axis=1), np.concatenate([matrix[1:], matrix[1:]], axis=1), f"rows n={n}")


@pytest.mark.gpu
def test_join_fallbacks_match_numpy(rng: np.random.Generator) -> None:
    """Strided inputs, mixed dtypes and more than MAX_JOINED inputs keep the per-input copies."""
    for n in ODD_SIZES:
        for call in range(2):
            wide = sample(rng, (3, 2 * n), gp.float32, -100, 100)
            other = sample(rng, (3, n), gp.float32, -100, 100)
            strided = upload(wide)[:, ::2]
            arrays = [strided, upload(other)]
            expected = np.concatenate([wide[:, ::2], other], axis=1)
            poison_pool(expected.shape, gp.float32)
            _same(gp.concatenate(arrays, axis=1), expected, f"strided n={n} call {call}")
            assert not _cached("concatenate", arrays, 1)
            _same(gp.stack(arrays), np.stack([wide[:, ::2], other]), f"stack strided n={n}")
            ints = sample(rng, (3, n), gp.int16, -100, 100)
            mixed = [upload(other), upload(ints)]
            _same(gp.concatenate(mixed), np.concatenate([other, ints.astype(np.float32)]), f"mixed n={n}")
            assert not _cached("concatenate", mixed, 0)
            many = [sample(rng, (2, n), gp.uint8, 0, 255) for _ in range(shape_ops.MAX_JOINED + 1)]
            _same(gp.concatenate([upload(m) for m in many]), np.concatenate(many), f"{len(many)} inputs n={n}")
            _same(gp.stack([upload(m) for m in many], axis=2), np.stack(many, axis=2), f"stack many n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["concatenate", "stack"])
def test_join_freed_input_raises_on_the_cached_path(op: str, rng: np.random.Generator) -> None:
    join = getattr(gp, op)
    hosts = [sample(rng, (1000,), gp.float32, -1, 1) for _ in range(3)]
    arrays = [upload(h) for h in hosts]
    _same(join(arrays), getattr(np, op)(hosts), op)
    assert _cached(op, arrays, 0)
    fresh = [upload(h) for h in hosts]
    fresh[2].buffer.free()
    with pytest.raises(InvalidPointerError):
        join(fresh)
    with pytest.raises(InvalidPointerError):
        join([fresh[2][1:], arrays[0][1:]])  # not cached before: the general path refuses it too


@pytest.mark.gpu
def test_join_axis_types_stay_exact(rng: np.random.Generator) -> None:
    """True equals 0 and 1 as a cache key: it is still refused; a NumPy integer axis works uncached."""
    hosts = [sample(rng, (4, 5), gp.int32, -9, 9) for _ in range(2)]
    arrays = [upload(h) for h in hosts]
    for axis in (0, 1):
        _same(gp.concatenate(arrays, axis=axis), np.concatenate(hosts, axis=axis), f"axis {axis}")
        _same(gp.stack(arrays, axis=axis), np.stack(hosts, axis=axis), f"stack axis {axis}")
        with pytest.raises(ArgumentError):
            gp.concatenate(arrays, axis=bool(axis))
        with pytest.raises(ArgumentError):
            gp.stack(arrays, axis=bool(axis))
        _same(gp.concatenate(arrays, axis=np.int64(axis)), np.concatenate(hosts, axis=axis), "np.int64 axis")


@pytest.mark.gpu
def test_concatenate_past_32_bit_indexing(rng: np.random.Generator) -> None:
    """Two rows of 2**30 + 3 bytes per input (odd sizes: copied byte by byte), one input one byte past
    an aligned address: 2**31 + 6 units per input, past the kernel's 32-bit index space."""
    free, _ = gp.get_memory_info()
    if free < 12 << 30:
        pytest.skip(f"needs 12 GiB of free device memory, {free >> 30} GiB free")
    width = (1 << 30) + 3
    pattern = rng.integers(0, 256, size=4099, dtype=np.uint8)
    first = np.resize(pattern, (2, width))
    flat = np.resize(pattern[::-1], 2 * width + 1)
    shifted = upload(flat)[1:].reshape(2, width)  # contiguous, misaligned
    result = gp.concatenate([upload(first), shifted], axis=1)
    del shifted
    host = result.to_numpy()
    del result
    assert host.shape == (2, 2 * width)
    second = flat[1:].reshape(2, width)
    for row in range(2):
        assert np.array_equal(host[row, :width], first[row]), row
        assert np.array_equal(host[row, width:], second[row]), row


# -- GPU: transpose and permute ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permute_repeat_matches_numpy(dtype: DType, rng: np.random.Generator) -> None:
    for n in ODD_SIZES:
        for call in range(2):
            matrix = sample(rng, (3, n), dtype, -100, 100)
            poison_pool((n, 3), dtype)
            _same(gp.transpose(upload(matrix)), matrix.T, f"transpose (3, {n}) call {call}")
            _same(gp.transpose(upload(matrix), (1, 0)), matrix.T, f"transpose axes (3, {n})")
            _same(gp.permute(upload(matrix), [1, 0]), matrix.T, f"permute list (3, {n})")
            wide = sample(rng, (4, 2 * n), dtype, -100, 100)
            _same(gp.transpose(upload(wide)[::2, ::2]), wide[::2, ::2].T, f"transpose strided n={n}")
            _same(gp.transpose(upload(matrix)[1:]), matrix[1:].T, f"transpose misaligned n={n}")
            row = sample(rng, (1, n), dtype, -100, 100)  # the permuted view is contiguous: a plain copy
            _same(gp.transpose(upload(row)), row.T, f"transpose (1, {n})")
            cube = sample(rng, (2, min(n, 513), 5), dtype, -100, 100)
            for axes in itertools.permutations(range(3)):
                poison_pool(np.transpose(cube, axes).shape, dtype)
                _same(gp.permute(upload(cube), axes), np.transpose(cube, axes), f"permute {axes} n={n}")
    empty = np.zeros((0, 3), dtype=dtype.numpy)
    for _ in range(2):
        _same(gp.transpose(upload(empty)), empty.T, "transpose of an empty array")


@pytest.mark.gpu
def test_permute_cached_path_checks(rng: np.random.Generator) -> None:
    """A freed input raises on the cached path (contiguous and strided inputs); bool axes stay refused
    after (1, 0) was cached."""
    matrix = sample(rng, (37, 5), gp.float32, -1, 1)
    x = upload(matrix)
    _same(gp.permute(x, (1, 0)), matrix.T, "permute")
    _same(gp.transpose(x), matrix.T, "transpose")
    _same(gp.transpose(x[::2]), matrix[::2].T, "transpose strided")
    with pytest.raises(ArgumentError):
        gp.permute(x, (True, False))
    with pytest.raises(ArgumentError):
        gp.transpose(x, (True, False))
    y = upload(matrix)
    y.buffer.free()
    with pytest.raises(InvalidPointerError):
        gp.permute(y, (1, 0))
    with pytest.raises(InvalidPointerError):
        gp.transpose(y)
    with pytest.raises(InvalidPointerError):
        gp.transpose(y[::2])


# -- CPU: plans and arguments ---------------------------------------------------------------------------
def _unpacked(plan: Any) -> tuple[list[int], int, int, int]:
    values = shape_ops._CONCAT_ARGS.struct.unpack(plan.args)
    count = shape_ops.MAX_JOINED + 1
    return list(values[:count]), values[count], values[count + 1], values[count + 2]


def test_join_plans() -> None:
    """Prefix offsets in bytes, the copy unit the sizes allow, the grid (blocks per input x inputs)."""
    plan = shape_ops._plan_join((2048,), gp.float32, 1, [1024, 1024])  # 16-byte units: 256 per input
    starts, rows, row_bytes, bits = _unpacked(plan)
    assert starts == [0, 4096] + [8192] * (shape_ops.MAX_JOINED - 1)
    assert (rows, row_bytes, bits & -bits, plan.grid, len(plan.pad)) == (1, 8192, 4096, (1, 2), 14)
    plan = shape_ops._plan_join((3, 8), gp.float32, 3, [3, 5])  # 12-byte ranges: 4-byte units
    starts, rows, row_bytes, bits = _unpacked(plan)
    assert (starts[:3], rows, row_bytes, bits & -bits, plan.grid) == ([0, 12, 32], 3, 32, 4, (1, 2))
    plan = shape_ops._plan_join((5, 4097 * 3), gp.uint8, 5, [4097] * 3)
    starts, _, row_bytes, bits = _unpacked(plan)
    assert (starts[:4], row_bytes, bits & -bits, plan.grid) == ([0, 4097, 8194, 12291], 12291, 1, (81, 3))
    assert shape_ops._plan_join((0, 4), gp.int8, 0, [2, 2]).kernel is None
    assert shape_ops._plan_join((4, 0), gp.int8, 4, [0, 0]).kernel is None


def test_permute_plans() -> None:
    """Tiles when the fastest axis moves, the gather otherwise, a plain copy when the permuted view is
    contiguous, nothing for an empty result; int4 only as a contiguous view."""
    tiles = shape_ops._plan_permute(gp.zeros((32, 256)), (1, 0))
    assert (tiles.shape, tiles.grid, tiles.block, tiles.order) == ((256, 32), (8, 1, 1), (32, 8), None)
    gather = shape_ops._plan_permute(gp.zeros((2, 3, 4)), (1, 0, 2))
    assert (gather.shape, gather.args[0], gather.block, gather.kernel is not None) == ((3, 2, 4), 24, 256, True)
    copy = shape_ops._plan_permute(gp.zeros((1, 5)), (1, 0))
    assert (copy.shape, copy.kernel, copy.order) == ((5, 1), None, (1, 0))
    empty = shape_ops._plan_permute(gp.zeros((0, 5)), (1, 0))
    assert (empty.shape, empty.kernel, empty.order) == ((5, 0), None, None)
    packed = gp.zeros((4, 6), gp.int4)
    assert shape_ops._plan_permute(packed, (0, 1)).order == (0, 1)
    with pytest.raises(DTypeError, match="int4"):
        shape_ops._plan_permute(packed, (1, 0))


def test_cpu_backend_fills_no_plan(rng: np.random.Generator) -> None:
    if current_backend() == "cuda":
        pytest.skip("the CPU backend's behaviour")
    joins, permutes = len(shape_ops._JOINS), len(shape_ops._PERMUTES)
    hosts = [sample(rng, (3, 4), gp.float32, -1, 1) for _ in range(2)]
    arrays = [upload(h) for h in hosts]
    _same(gp.concatenate(arrays), np.concatenate(hosts), "concatenate")
    _same(gp.stack(arrays, axis=1), np.stack(hosts, axis=1), "stack")
    _same(gp.transpose(arrays[0]), hosts[0].T, "transpose")
    assert (len(shape_ops._JOINS), len(shape_ops._PERMUTES)) == (joins, permutes)


def test_permute_axes_arguments(rng: np.random.Generator) -> None:
    cube = sample(rng, (2, 3, 4), gp.float32, -1, 1)
    x = upload(cube)
    _same(gp.permute(x, range(2, -1, -1)), np.transpose(cube, (2, 1, 0)), "range axes")
    _same(gp.permute(x, np.array([1, 2, 0])), np.transpose(cube, (1, 2, 0)), "NumPy axes")
    _same(gp.transpose(x, [0, 2, 1]), np.transpose(cube, (0, 2, 1)), "list axes")
    _same(gp.transpose(x), cube.T, "reversed")
    for bad in (None, 5, 1.5):
        with pytest.raises(ArgumentError, match="permute: axes must be"):
            gp.permute(x, bad)
    with pytest.raises(ArgumentError, match="transpose: axes must be integers"):
        gp.transpose(x, (0, 1, True))
    assert shape_ops._exact_axes((1, 0)) == (1, 0)
    assert shape_ops._exact_axes([1, 0]) == (1, 0)
    assert shape_ops._exact_axes((True, 0)) is None
    assert shape_ops._exact_axes((np.int64(1), 0)) is None
    assert shape_ops._exact_axes(None) is None
