"""Bad input raises typed errors from pygpukit.core.errors that name the shapes and dtypes involved,
before any memory is allocated or written: outputs keep their contents and the pool its usage."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError, DTypeError, ShapeError
from pygpukit.core.memory import ExternalBuffer


def _elsewhere(shape: tuple[int, ...], dtype: Any = gp.float32) -> gp.GPUArray:
    """An array that claims to live on another device (cuda:7): no kernel may touch it."""
    dt = gp.as_dtype(dtype)
    nbytes = int(np.prod(shape)) * dt.itemsize
    return gp.GPUArray(ExternalBuffer(0x1000, nbytes, 7, owner=None), shape, dt)


@pytest.fixture
def unchanged() -> Iterator[Callable[[gp.GPUArray], None]]:
    """Register arrays whose contents and the pool's in-use bytes must survive the failing call."""
    watched: list[tuple[gp.GPUArray, np.ndarray[Any, Any]]] = []
    baseline = [gp.memory_stats()["in_use_bytes"]]

    def watch(array: gp.GPUArray) -> None:
        watched.append((array, array.to_numpy()))
        baseline[0] = gp.memory_stats()["in_use_bytes"]

    yield watch
    for array, contents in watched:
        np.testing.assert_array_equal(array.to_numpy(), contents)
    assert gp.memory_stats()["in_use_bytes"] == baseline[0]


CASES: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "broadcast mismatch": (lambda: gp.add(gp.zeros((2, 3)), gp.zeros((4,))), ShapeError, r"\(2, 3\), \(4,\)"),
    "where broadcast": (lambda: gp.where(gp.zeros(3, gp.bool_), gp.zeros(3), gp.zeros(2)), ShapeError, r"\(2,\)"),
    "clamp bound shape": (lambda: gp.clamp(gp.zeros(3), gp.zeros(4), 1.0), ShapeError, r"\(3,\), \(4,\)"),
    "out shape": (lambda: gp.add(gp.zeros(3), 1.0, out=gp.zeros(4)), ShapeError, r"\(4,\).*\(3,\)"),
    "out kind": (lambda: gp.div(gp.zeros(3, gp.int32), 2, out=gp.zeros(3, gp.int32)), DTypeError, "float64.*int32"),
    "sub of bool": (lambda: gp.sub(gp.zeros(3, gp.bool_), gp.zeros(3, gp.bool_)), DTypeError, "bool"),
    "neg of bool": (lambda: gp.neg(gp.zeros(3, gp.bool_)), DTypeError, "bool"),
    "floor_divide of bool": (lambda: gp.floor_divide(gp.zeros(3, gp.bool_), True), DTypeError, "bool"),
    "softmax of int": (lambda: gp.softmax(gp.zeros((2, 3), gp.int8)), DTypeError, "int8"),
    "complex scalar": (lambda: gp.add(gp.zeros(3), 1j), DTypeError, "complex"),
    "scalar out of range": (lambda: gp.mul(gp.zeros(3, gp.uint8), 256), DTypeError, "256.*uint8"),
    "no array": (lambda: gp.add(1, 2), DTypeError, "GPUArray"),
    "host array": (lambda: gp.add(gp.zeros(3), np.ones(3)), DeviceError, r"NumPy array \(shape \(3,\)"),
    "mixed devices": (lambda: gp.add(gp.zeros(3), _elsewhere((3,))), DeviceError, "cuda:7"),
    "mixed devices out": (lambda: gp.exp(gp.zeros(3), out=_elsewhere((3,))), DeviceError, "different devices"),
    "reduction axis": (lambda: gp.sum(gp.zeros((2, 3)), axis=(1, 5)), ShapeError, "axis 5"),
    "empty max": (lambda: gp.max(gp.zeros((0, 2)), axis=0), ShapeError, r"\(0, 2\)"),
    "concatenate shapes": (lambda: gp.concatenate([gp.zeros((2, 3)), gp.zeros((3, 2))]), ShapeError, r"\(3, 2\)"),
    "concatenate devices": (lambda: gp.concatenate([gp.zeros((2, 3)), _elsewhere((2, 3))]), DeviceError, "cuda:7"),
    "stack shapes": (lambda: gp.stack([gp.zeros(3), gp.zeros(4)]), ShapeError, r"\(3,\), \(4,\)"),
    "permute axes": (lambda: gp.permute(gp.zeros((2, 3)), (0, 2)), ShapeError, "out of bounds"),
    "split sections": (lambda: gp.split(gp.zeros(5), 2), ShapeError, "length 5"),
    "gelu form": (lambda: gp.gelu(gp.zeros(3), approximate="fast"), ValueError, "approximate"),
    "cumsum axis": (lambda: gp.cumsum(gp.zeros((2, 3)), axis=2), ShapeError, "axis 2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_a_typed_error_and_changes_nothing(
    case: str, unchanged: Callable[[gp.GPUArray], None]
) -> None:
    call, error, pattern = CASES[case]
    with pytest.raises(error, match=pattern):
        call()


def test_failed_out_keeps_its_contents(unchanged: Callable[[gp.GPUArray], None]) -> None:
    out = gp.from_numpy(np.arange(3, dtype=np.int32))
    unchanged(out)
    with pytest.raises(DTypeError, match="same-kind"):
        gp.add(out, 0.5, out=out)
    with pytest.raises(ShapeError):
        gp.add(out, gp.zeros(2, gp.int32), out=out)


def test_errors_are_pygpukit_errors() -> None:
    for error in (ShapeError, DTypeError, DeviceError):
        assert issubclass(error, gp.PyGPUkitError)
    assert issubclass(ShapeError, ValueError)
    assert issubclass(DTypeError, TypeError)


def test_use_tf32_and_stream_priority_of_the_wrong_type_are_typed_errors() -> None:
    """Found in the session notes: `matmul(use_tf32="yes")` and `Stream(priority="a")` were accepted."""
    a = gp.from_numpy(np.ones((2, 3), np.float32))
    with pytest.raises(gp.DTypeError, match="use_tf32 must be True, False or None"):
        gp.matmul(a, a.T, use_tf32="yes")  # type: ignore[arg-type]
    with pytest.raises(gp.DTypeError, match="Stream priority must be an int"):
        gp.Stream(priority="a")  # type: ignore[arg-type]
    with pytest.raises(gp.DTypeError, match="Stream priority must be an int"):
        gp.Stream(priority=True)
    assert gp.Stream(priority=np.int32(0)) is not None
    np.testing.assert_array_equal(gp.matmul(a, a.T, use_tf32=np.bool_(False)).to_numpy(), np.full((2, 2), 3.0))
