"""Type promotion: NumPy 2's table for NumPy's types, the documented rules for bfloat16 and float8,
weak Python scalars (NEP 50) and same-kind casting; the ops' result dtypes follow it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError

DTYPES = list(gp.dtypes.all_dtypes())
NATIVE = [d for d in DTYPES if d not in (gp.bfloat16, gp.float8_e4m3fn, gp.float8_e5m2)]


@pytest.mark.parametrize(("a", "b"), list(itertools.product(NATIVE, NATIVE)), ids=str)
def test_numpy_types_promote_as_numpy(a: DType, b: DType) -> None:
    assert gp.promote_types(a, b).numpy == np.promote_types(a.numpy, b.numpy)
    x, y = gp.zeros(2, a), gp.zeros(2, b)
    assert (
        gp.add(x, y).dtype.numpy == (np.zeros(2, a.numpy) + np.zeros(2, b.numpy)).dtype
        if a.kind != "b" or b.kind != "b"
        else True
    )


EXTENDED = {
    (gp.bfloat16, gp.float16): gp.float32,
    (gp.bfloat16, gp.float32): gp.float32,
    (gp.bfloat16, gp.float64): gp.float64,
    (gp.bfloat16, gp.int8): gp.bfloat16,
    (gp.bfloat16, gp.uint8): gp.bfloat16,
    (gp.bfloat16, gp.int16): gp.float32,
    (gp.bfloat16, gp.int32): gp.float64,
    (gp.bfloat16, gp.bool_): gp.bfloat16,
    (gp.float8_e4m3fn, gp.float8_e5m2): gp.float16,
    (gp.float8_e4m3fn, gp.float16): gp.float16,
    (gp.float8_e5m2, gp.bfloat16): gp.bfloat16,
    (gp.float8_e4m3fn, gp.float32): gp.float32,
    (gp.float8_e4m3fn, gp.int8): gp.float16,
    (gp.float8_e5m2, gp.uint16): gp.float32,
    (gp.float8_e5m2, gp.int64): gp.float64,
    (gp.float8_e4m3fn, gp.bool_): gp.float8_e4m3fn,
}


@pytest.mark.parametrize(("pair", "expected"), list(EXTENDED.items()), ids=str)
def test_extended_float_rules(pair: tuple[DType, DType], expected: DType) -> None:
    a, b = pair
    assert gp.promote_types(a, b) == expected == gp.promote_types(b, a)
    assert gp.add(gp.zeros(2, a), gp.zeros(2, b)).dtype == expected


def test_promotion_is_symmetric_and_total() -> None:
    for a, b in itertools.product(DTYPES, DTYPES):
        assert gp.promote_types(a, b) == gp.promote_types(b, a)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_python_scalars_are_weak(dtype: DType) -> None:
    x = gp.zeros(2, dtype)
    assert gp.result_type(x, True) == dtype
    assert gp.result_type(x, 3) == (gp.int64 if dtype.kind == "b" else dtype)
    assert gp.result_type(x, 1.5) == (dtype if dtype.is_floating else gp.float64)
    assert gp.add(x, 1.5).dtype == gp.result_type(x, 1.5)
    assert gp.lt(x, 1).dtype == gp.bool_
    assert gp.result_type(x, np.float64(1.0)) == gp.promote_types(dtype, gp.float64)


def test_weak_integers_must_fit_except_in_comparisons() -> None:
    x = gp.from_numpy(np.array([1, 100], np.int8))
    with pytest.raises(DTypeError, match="300 is out of bounds for int8"):
        gp.add(x, 300)
    assert gp.lt(x, 300).to_numpy().tolist() == [True, True]
    assert gp.gt(x, -1000).to_numpy().tolist() == [True, True]
    u = gp.from_numpy(np.array([1, 2], np.uint8))
    assert gp.gt(u, -1).to_numpy().tolist() == [True, True]


def test_math_and_division_of_integers_give_floats() -> None:
    assert gp.exp(gp.zeros(2, gp.int8)).dtype == gp.float16
    assert gp.exp(gp.zeros(2, gp.uint16)).dtype == gp.float32
    assert gp.sqrt(gp.zeros(2, gp.int32)).dtype == gp.float64
    assert gp.sigmoid(gp.zeros(2, gp.bool_)).dtype == gp.float16
    assert gp.div(gp.zeros(2, gp.int8), 2).dtype == gp.float64
    assert gp.div(gp.zeros(2, gp.bfloat16), 2).dtype == gp.bfloat16


def test_can_cast_is_same_kind() -> None:
    assert gp.can_cast(gp.int64, gp.int8)
    assert gp.can_cast(gp.int32, gp.float16)
    assert gp.can_cast(gp.bool_, gp.float8_e5m2)
    assert not gp.can_cast(gp.float16, gp.int64)
    assert gp.can_cast(gp.float64, gp.bfloat16)
