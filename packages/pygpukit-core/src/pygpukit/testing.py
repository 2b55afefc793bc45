"""Helpers for testing code built on pygpukit: random data per dtype, bitwise comparison, and running
workers on threads with their failures and deadlocks reported."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .core.dtypes import DType, as_dtype

__all__ = ["assert_bitwise_equal", "random_array", "run_threads"]


def random_array(
    rng: np.random.Generator, shape: Any, dtype: Any, *, nonnegative: bool = False
) -> np.ndarray[Any, Any]:
    """Fresh random data (never all zeros) exactly representable in ``dtype``.

    Integers lie in [-100, 100] (or [0, 100]), floats in [-50, 50) rounded to the type, so every value
    converts between all supported types without overflow.
    """
    dt: DType = as_dtype(dtype)
    values: np.ndarray[Any, Any]
    if dt.kind == "b":
        values = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dt.kind in "iu":
        info = np.iinfo(dt.numpy)
        low = 0 if nonnegative else max(int(info.min), -100)
        values = rng.integers(low, min(int(info.max), 100) + 1, size=shape).astype(dt.numpy)
    else:
        low_f = 0.0 if nonnegative else -50.0
        values = rng.uniform(low_f, 50.0, size=shape).astype(np.float32).astype(dt.numpy)
    return values


def assert_bitwise_equal(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    """Same dtype, same shape, same bytes (NaNs and signed zeros included)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a = np.ascontiguousarray(actual).view(np.uint8)
    e = np.ascontiguousarray(expected).view(np.uint8)
    if not np.array_equal(a, e):
        mismatch = int(np.count_nonzero(np.ascontiguousarray(actual) != np.ascontiguousarray(expected)))
        raise AssertionError(f"{mismatch} of {actual.size} elements differ")


def run_threads(workers: list[Callable[[], None]], timeout: float = 120.0) -> None:
    """Run each worker in its own daemon thread; fail (AssertionError) with every worker's traceback if
    any raised, and name the threads still running after ``timeout`` seconds (a deadlock)."""
    errors: list[str] = []

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException:
                errors.append(traceback.format_exc())

        return run

    threads = [threading.Thread(target=guarded(w), daemon=True, name=f"worker-{i}") for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout} s (deadlock?): {stuck}"
    assert not errors, "\n".join(errors)
