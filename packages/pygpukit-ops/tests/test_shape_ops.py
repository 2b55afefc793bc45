"""Shape ops on the device: permute/transpose copies (tiled and gathered), concatenate and stack with
promotion, split and broadcast_to views. CPU backend in CI; the ``gpu`` tests use the large sizes."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from ops_testing import DTYPES, SIZES, SMALL_SIZES, assert_matches, poison_pool, sample, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ShapeError


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def check_permute(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    for n in sizes:
        matrix = sample(rng, (3, n), dtype, -50, 50)
        poison_pool((n, 3), dtype)
        result = gp.transpose(upload(matrix))
        assert result.is_contiguous
        assert_matches(result.to_numpy(), matrix.T, dtype, 0, f"transpose {dtype} n={n}")
        strided = upload(sample(rng, (4, 2 * n), dtype, -50, 50))
        view = strided[::2, ::2]
        assert_matches(gp.transpose(view).to_numpy(), view.to_numpy().T, dtype, 0, f"transpose view {dtype} n={n}")
        cube = sample(rng, (2, min(n, 513), 5), dtype, -50, 50)
        for axes in itertools.permutations(range(3)):
            got = gp.permute(upload(cube), axes)
            assert_matches(got.to_numpy(), np.transpose(cube, axes), dtype, 0, f"permute {axes} {dtype} n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permute(dtype: DType, rng: np.random.Generator) -> None:
    check_permute(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permute_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_permute(dtype, SIZES, rng)


def check_concatenate(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    for n in sizes:
        a, b = sample(rng, (2, n), dtype, -50, 50), sample(rng, (3, n), dtype, -50, 50)
        got = gp.concatenate([upload(a), upload(b)], axis=0)
        assert_matches(got.to_numpy(), np.concatenate([a, b]), dtype, 0, f"concatenate axis 0 {dtype} n={n}")
        c = sample(rng, (2, 2 * n), dtype, -50, 50)
        view = upload(c)[:, ::2]
        got = gp.concatenate([upload(a), view, upload(a[:, :0])], axis=1)
        assert_matches(got.to_numpy(), np.concatenate([a, c[:, ::2]], axis=1), dtype, 0, f"concatenate axis 1 {dtype}")
        other = gp.float32 if dtype != gp.float32 else gp.int16
        mixed = sample(rng, (2, n), other, -50, 50)
        common = gp.promote_types(dtype, other)
        got = gp.concatenate([upload(a), upload(mixed)], axis=-1)
        expected = np.concatenate([a.astype(common.numpy), mixed.astype(common.numpy)], axis=-1)
        assert_matches(got.to_numpy(), expected, common, 0, f"concatenate {dtype} with {other}")
        got = gp.stack([upload(a[0]), upload(b[0]), view[1]], axis=1)
        assert_matches(got.to_numpy(), np.stack([a[0], b[0], c[1, ::2]], axis=1), dtype, 0, f"stack {dtype} n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_concatenate_and_stack(dtype: DType, rng: np.random.Generator) -> None:
    check_concatenate(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_concatenate_and_stack_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_concatenate(dtype, SIZES, rng)


def test_split_returns_views(rng: np.random.Generator) -> None:
    host = sample(rng, (4, 9), gp.float32, -50, 50)
    x = upload(host)
    parts = gp.split(x, 3, axis=1)
    assert [p.shape for p in parts] == [(4, 3)] * 3
    assert all(p.buffer is x.buffer for p in parts)
    for got, expected in zip(parts, np.split(host, 3, axis=1), strict=True):
        np.testing.assert_array_equal(got.to_numpy(), expected)
    for got, expected in zip(gp.split(x, [1, 3, 20]), np.split(host, [1, 3, 20]), strict=True):
        np.testing.assert_array_equal(got.to_numpy(), expected)
    with pytest.raises(ShapeError, match="equal parts"):
        gp.split(x, 2, axis=1)


def test_broadcast_to_is_a_view() -> None:
    row = upload(np.arange(3, dtype=np.float32))
    view = gp.broadcast_to(row, (4, 3))
    assert view.shape == (4, 3)
    assert view.buffer is row.buffer
    np.testing.assert_array_equal(view.to_numpy(), np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3)))
    np.testing.assert_array_equal(gp.add(view, 1).to_numpy(), np.arange(3) + np.ones((4, 3)))
    with pytest.raises(ShapeError, match="cannot be broadcast"):
        gp.broadcast_to(row, (4, 2))
    assert gp.broadcast_shapes((3, 1), (4,)) == (3, 4)


def test_shape_op_errors() -> None:
    a, b = gp.zeros((2, 3)), gp.zeros((2, 4))
    with pytest.raises(ShapeError, match=r"\(2, 3\), \(2, 4\)"):
        gp.concatenate([a, b], axis=0)
    with pytest.raises(ShapeError, match="one shape"):
        gp.stack([a, b])
    with pytest.raises(ShapeError, match="permutation"):
        gp.permute(a, (0, 0))
    with pytest.raises(ShapeError, match="out of bounds"):
        gp.concatenate([a, a], axis=2)
    with pytest.raises(ShapeError, match="at least one"):
        gp.concatenate([])
    with pytest.raises(TypeError, match="sequence"):
        gp.concatenate(a)  # type: ignore[arg-type]
