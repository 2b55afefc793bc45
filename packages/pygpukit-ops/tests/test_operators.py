"""GPUArray operators forward to pygpukit.ops, with NumPy's scalar and reflection rules."""

from __future__ import annotations

from typing import Any

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


def test_operators_are_bound_to_the_elementwise_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """pygpukit.ops binds GPUArray's operators to the engine (issue 14: ``x + y`` was one Python call
    more than ``ops.add``). With a CUDA backend state simulated and the launch recorded, an array-array
    operator whose plan exists launches the contiguous kernel itself, with the operands in order
    (reflected ones swapped); an unknown operator name is refused."""
    from types import SimpleNamespace

    from pygpukit.core import array as array_module
    from pygpukit.core.errors import ArgumentError
    from pygpukit.ops import _elementwise_engine as engine
    from pygpukit.ops import elementwise

    assert gp.GPUArray.__add__.__name__ == "add_operator"
    assert gp.GPUArray.__rsub__.__name__ == "sub_reflected_operator"
    assert gp.GPUArray.__eq__.__name__ == "eq_operator"
    assert gp.GPUArray.__neg__.__name__ == "neg_operator"
    with pytest.raises(ArgumentError, match="__matmul__"):
        array_module.bind_operator("__matmul__", lambda a, b: a)
    x = gp.from_numpy(np.array([1.0, 2.0], np.float32))
    y = gp.from_numpy(np.array([3.0, 5.0], np.float32))
    launches: list[tuple[Any, tuple[Any, ...]]] = []
    kernels = {}
    for op in (elementwise._SUB, elementwise._LT, elementwise._NEG):
        plan = op.plan(gp.float32)
        kernels[op.name] = object()
        monkeypatch.setattr(plan, "_contig", kernels[op.name])
    monkeypatch.setattr(engine, "_backend", SimpleNamespace(_state=SimpleNamespace(name="cuda")))
    monkeypatch.setattr(engine, "launch", lambda kernel, args, grid, block=None: launches.append((kernel, args)))
    for result, name, first, second in [(x - y, "sub", x, y), (x.__rsub__(y), "sub", y, x), (x < y, "lt", x, y)]:
        kernel, args = launches.pop(0)
        assert kernel is kernels[name], name
        assert args[0] is first, name
        assert args[1] is second, name
        assert args[3] is result, name
        assert args[4] == 2
        assert result.dtype == (gp.bool_ if name == "lt" else gp.float32)
    negated = -x
    kernel, args = launches.pop(0)
    assert kernel is kernels["neg"]
    assert args[0] is x
    assert args[1] is negated
    assert x.__add__("text") is NotImplemented
    assert x.__radd__(None) is NotImplemented
    assert (x == "text") is False
    assert not launches


def test_operators_replay_in_a_graph_capture() -> None:
    """Every bound operator replays as itself (on the CPU backend a capture records calls and finds a
    function by its code object: the operators, built by one factory, each have their own)."""
    x = gp.from_numpy(np.array([1.0, -2.0, 3.5], np.float32))
    y = gp.from_numpy(np.array([0.5, 4.0, -1.0], np.float32))

    def body() -> list[gp.GPUArray]:
        return [x + y, x - y, y - x, x * y, x * 2.0, 3.0 - x, x / y, x < y, x >= y, x == y, -x, abs(y)]

    stream = gp.Stream()
    with stream:
        body()  # plans and kernels exist before the capture
        stream.synchronize()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            outs = body()
        x.copy_(np.array([2.0, 5.0, -1.0], np.float32))
        y.copy_(np.array([2.0, 1.0, 0.25], np.float32))
        graph.replay()
        stream.synchronize()
    a, b = x.to_numpy(), y.to_numpy()
    expected = [a + b, a - b, b - a, a * b, a * 2, 3 - a, a / b, a < b, a >= b, a == b, -a, abs(b)]
    for got, want in zip(outs, expected, strict=True):
        np.testing.assert_array_equal(got.to_numpy(), want)
