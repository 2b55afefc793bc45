"""GPUArray operators forward to pygpukit.ops, with NumPy's scalar and reflection rules."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError, DTypeError


def test_arithmetic_operators_and_reflection() -> None:
    host = np.array([1.0, -2.0, 3.5], np.float32)
    x = gp.from_numpy(host)
    cases = {
        "x + 2": (x + 2, host + 2), "2 + x": (2 + x, 2 + host), "x - 1": (x - 1, host - 1),
        "1 - x": (1 - x, 1 - host), "x * x": (x * x, host * host), "3 * x": (3 * x, 3 * host),
        "x / 2": (x / 2, host / 2), "2 / x": (2 / x, 2 / host), "x // 2": (x // 2, host // 2),
        "7 // x": (7 // x, 7 // host), "x % 2": (x % 2, host % 2), "7 % x": (7 % x, 7 % host),
        "x ** 2": (x**2, host**2), "2 ** x": (2**x, 2**host), "-x": (-x, -host), "abs(x)": (abs(x), abs(host)),
        "+x": (+x, host),
    }  # fmt: skip
    for label, (got, expected) in cases.items():
        assert got.dtype == gp.float32, label
        np.testing.assert_allclose(got.to_numpy(), expected.astype(np.float32), rtol=1e-6, err_msg=label)


def test_comparisons_give_bool_arrays() -> None:
    x = gp.from_numpy(np.array([1, 2, 3], np.int16))
    assert (x == 2).to_numpy().tolist() == [False, True, False]
    assert (x != 2).to_numpy().tolist() == [True, False, True]
    assert (x < 2).to_numpy().tolist() == [True, False, False]
    assert (x <= 2).to_numpy().tolist() == [True, True, False]
    assert (x > 2).to_numpy().tolist() == [False, False, True]  # reflected to x > 2
    assert (x >= x).dtype == gp.bool_
    assert (x == None) is False  # noqa: E711 - not an operand: identity comparison


def test_in_place_operators_keep_the_array() -> None:
    x = gp.from_numpy(np.arange(4, dtype=np.int32))
    before = x
    x += 1
    x *= 3
    x -= 2
    x //= 2
    x %= 5
    x **= 2
    assert x is before
    expected = ((((np.arange(4) + 1) * 3 - 2) // 2) % 5) ** 2
    assert x.to_numpy().tolist() == expected.tolist()
    with pytest.raises(DTypeError, match="same-kind"):
        x /= 2  # float64 result into int32, as NumPy refuses


def test_numpy_scalars_are_strong_and_numpy_arrays_are_refused() -> None:
    x = gp.from_numpy(np.ones(3, np.float16))
    assert (x + 1.5).dtype == gp.float16  # Python float: weak
    assert (x + np.float32(1.5)).dtype == gp.float32  # NumPy scalar: strong
    assert (np.float32(1.5) + x).dtype == gp.float32
    with pytest.raises(DeviceError, match=r"gp\.asarray"):
        x + np.ones(3)
    with pytest.raises(DeviceError, match=r"gp\.asarray"):
        np.ones(3) + x


def test_truth_value_follows_numpy() -> None:
    assert bool(gp.ones(1)) is True
    assert bool(gp.zeros((1, 1))) is False
    with pytest.raises(ValueError, match="ambiguous"):
        bool(gp.ones(3))
    with pytest.raises(TypeError, match="unhashable"):
        hash(gp.ones(3))


def test_matmul_operator_reaches_the_op_library() -> None:
    a = gp.from_numpy(np.eye(2, dtype=np.float32))
    b = gp.from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    np.testing.assert_array_equal((a @ b).to_numpy(), b.to_numpy())


def test_top_level_names_come_from_the_op_library() -> None:
    import pygpukit.ops as ops

    for name in ("add", "sum", "softmax", "transpose", "where", "clamp", "sum_axis", "result_type", "concatenate"):
        assert getattr(gp, name) is getattr(ops, name), name
