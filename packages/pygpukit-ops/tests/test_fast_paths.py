"""The repeated-call fast paths (issue 14, host cost): the second and later calls of an op with the same
layouts skip validation and planning. Each test calls an op several times on fresh data of one shape and
checks every result against NumPy, and checks that what the first call refused is still refused, that
values the cache could confuse (0.0 and -0.0, 1 and 1.0 and True, NaN) stay distinct, and that a freed
input raises on the cached path too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ops_testing import tolerance

import pygpukit as gp
import pygpukit.ops as ops
from pygpukit.core.errors import ArgumentError, DTypeError, InvalidPointerError

pytestmark = pytest.mark.gpu

CALLS = 3


def _check(result: gp.GPUArray, expected: Any, dtype: Any = None) -> None:
    got = result.to_numpy()
    expected = np.asarray(expected)
    assert got.shape == expected.shape
    rtol, atol = tolerance(gp.dtypes.as_dtype(dtype or result.dtype), 8.0)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)


def _repeat(rng: np.random.Generator, shape: Any, run: Callable[[np.ndarray[Any, Any]], None]) -> None:
    for _ in range(CALLS):
        run(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "argmax", "std", "var"])
@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (-1, False), (0, True), (1, False)])
def test_reductions_repeat(name: str, axis: Any, keepdims: bool) -> None:
    rng = np.random.default_rng(1)
    op, ref = getattr(ops, name), getattr(np, name)

    def run(values: np.ndarray[Any, Any]) -> None:
        values = values * 0.5 + 1.0  # prod stays in range
        result = op(gp.from_numpy(values), axis=axis, keepdims=keepdims)
        _check(result, ref(values.astype(np.float64), axis=axis, keepdims=keepdims), gp.float32)

    _repeat(rng, (7, 33), run)
    with pytest.raises(ArgumentError):  # True equals 1 as a cache key; the op still refuses it
        op(gp.from_numpy(rng.standard_normal((7, 33)).astype(np.float32)), axis=True)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_repeat(log: bool) -> None:
    rng = np.random.default_rng(2)

    def run(values: np.ndarray[Any, Any]) -> None:
        wide = values.astype(np.float64)
        shifted = wide - wide.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        result = (ops.log_softmax if log else ops.softmax)(gp.from_numpy(values))
        _check(result, shifted - lse if log else np.exp(shifted - lse))

    _repeat(rng, (5, 300), run)


def test_scalar_calls_keep_values_apart() -> None:
    rng = np.random.default_rng(3)
    for _ in range(CALLS):
        values = rng.standard_normal(1000).astype(np.float32)
        values[:3] = [-0.0, 0.0, np.nan]
        x = gp.from_numpy(values)
        _check(ops.add(x, 2.5), values + np.float32(2.5))
        _check(ops.sub(1.5, x), np.float32(1.5) - values)
        _check(x * 3, values * 3)
        for zero in (0.0, -0.0):  # equal keys, distinct values
            got = ops.mul(x, zero).to_numpy()
            np.testing.assert_array_equal(np.signbit(got), np.signbit(values * np.float32(zero)))
            got = ops.add(x, zero).to_numpy()
            np.testing.assert_array_equal(np.signbit(got), np.signbit(values + np.float32(zero)))
        assert np.isnan(ops.add(x, float("nan")).to_numpy()).all()
        half = gp.from_numpy(values.astype(np.float16))
        _check(ops.add(half, 1e-4), values.astype(np.float16) + np.float16(1e-4), gp.float16)
        ints = gp.from_numpy(rng.integers(-50, 50, 100).astype(np.int8))
        np.testing.assert_array_equal(ops.add(ints, 7).to_numpy(), ints.to_numpy() + np.int8(7))
        np.testing.assert_array_equal((ints < 1).to_numpy(), ints.to_numpy() < 1)
        np.testing.assert_array_equal((ints < True).to_numpy(), ints.to_numpy() < True)
        with pytest.raises(DTypeError):
            ops.add(ints, 300)  # out of int8's range, every time


def test_where_and_clamp_repeat() -> None:
    rng = np.random.default_rng(4)
    for _ in range(CALLS):
        values = rng.standard_normal(999).astype(np.float32)
        other = rng.standard_normal(999).astype(np.float32)
        cond = values > 0
        x, y, c = gp.from_numpy(values), gp.from_numpy(other), gp.from_numpy(cond)
        np.testing.assert_array_equal(ops.where(c, x, y).to_numpy(), np.where(cond, values, other))
        np.testing.assert_array_equal(ops.clamp(x, 0.0, 1.0).to_numpy(), np.clip(values, 0.0, 1.0))
        np.testing.assert_array_equal(ops.clamp(x, None, 0.5).to_numpy(), np.minimum(values, np.float32(0.5)))
        np.testing.assert_array_equal(ops.clamp(x, -0.25).to_numpy(), np.maximum(values, np.float32(-0.25)))
        got = ops.clamp(x, -0.0, None).to_numpy()
        np.testing.assert_array_equal(got, np.maximum(values, np.float32(-0.0)))
        ints = rng.integers(-100, 100, 77).astype(np.int32)
        np.testing.assert_array_equal(ops.clamp(gp.from_numpy(ints), -5, 5).to_numpy(), np.clip(ints, -5, 5))


def _silu(v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return v / (1.0 + np.exp(-v))


def test_gated_embedding_conv_repeat() -> None:
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 24)).astype(np.float32)
    weight = rng.standard_normal((6, 4, 3)).astype(np.float32)
    for _ in range(CALLS):
        both = rng.standard_normal((9, 64)).astype(np.float32)
        wide = both.astype(np.float64)
        _check(ops.swiglu(gp.from_numpy(both)), _silu(wide[:, :32]) * wide[:, 32:])
        gate, up = both[:, :32].copy(), both[:, 32:].copy()
        _check(ops.swiglu(gp.from_numpy(gate), gp.from_numpy(up)), _silu(wide[:, :32]) * wide[:, 32:])
        _check(ops.relu2(gp.from_numpy(gate)), np.maximum(wide[:, :32], 0) ** 2)
        ids = rng.integers(0, 50, (3, 5)).astype(np.int32)
        np.testing.assert_array_equal(ops.embedding(gp.from_numpy(table), gp.from_numpy(ids)).to_numpy(), table[ids])
        x = rng.standard_normal((2, 4, 20)).astype(np.float32)
        padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1)))
        expected = np.stack([np.einsum("bck,ock->bo", padded[:, :, i : i + 3], weight) for i in range(20)], axis=-1)
        _check(ops.conv1d(gp.from_numpy(x), gp.from_numpy(weight), padding=1), expected)
        _check(ops.conv1d(gp.from_numpy(x), gp.from_numpy(weight), padding="same"), expected)


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b: ops.sum(a),
        lambda a, b: ops.softmax(a),
        lambda a, b: ops.add(a, 2.0),
        lambda a, b: ops.exp(a),
        lambda a, b: a + b,
        lambda a, b: ops.clamp(a, 0.0, 1.0),
        lambda a, b: ops.where(a > 0, a, b),
        lambda a, b: ops.swiglu(a),
        lambda a, b: ops.relu2(a),
    ],
)
def test_freed_input_raises_on_the_cached_path(call: Callable[[gp.GPUArray, gp.GPUArray], Any]) -> None:
    rng = np.random.default_rng(6)
    b = gp.from_numpy(rng.standard_normal((4, 16)).astype(np.float32))
    for _ in range(2):
        call(gp.from_numpy(rng.standard_normal((4, 16)).astype(np.float32)), b)
    a = gp.from_numpy(rng.standard_normal((4, 16)).astype(np.float32))
    a.buffer.free()
    with pytest.raises(InvalidPointerError):
        call(a, b)


def test_bound_operators_repeat() -> None:
    """GPUArray's operators run the engine's fast path themselves from the second call of a dtype on
    (issue 14): every bound operator, array-array and with Python scalars on either side, equals NumPy
    on fresh data each call, for float32 and bfloat16 (results rounded once to the dtype)."""
    import operator

    rng = np.random.default_rng(7)
    # (floor division and mod are left out: a quotient within rounding of an integer may floor either way)
    binary_ops = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.eq, operator.ne,
                  operator.lt, operator.le, operator.gt, operator.ge]  # fmt: skip
    for dtype in (gp.float32, gp.bfloat16):
        for _ in range(CALLS):
            a = (np.abs(rng.standard_normal((4, 33))) + 0.5).astype(np.float32)
            b = (np.abs(rng.standard_normal((4, 33))) + 0.5).astype(np.float32)
            x, y = gp.from_numpy(a).astype(dtype), gp.from_numpy(b).astype(dtype)
            ha = x.astype(gp.float32).to_numpy().astype(np.float64)  # the values as rounded to dtype
            hb = y.astype(gp.float32).to_numpy().astype(np.float64)
            for fn in binary_ops:
                for got, want in ((fn(x, y), fn(ha, hb)), (fn(x, 1.5), fn(ha, 1.5)), (fn(2.5, x), fn(2.5, ha))):
                    if got.dtype == gp.bool_:
                        np.testing.assert_array_equal(got.to_numpy(), want, err_msg=fn.__name__)
                    else:
                        _check(got.astype(gp.float32), want, dtype)
            _check((-x).astype(gp.float32), -ha, dtype)
            _check(abs(-x).astype(gp.float32), ha, dtype)
