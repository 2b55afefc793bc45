"""Issue 21, item 0, what test_memory_defects.py left open: raw copies through a host pointer into
unmapped memory crashed the interpreter on both backends (the pointer is neither pinned nor device
memory, so it was taken as caller-owned host memory and copied from); ``arange`` bounds that are not
finite real numbers, float or str dimensions, ragged ``asarray`` input, ``copy_`` from a list,
``set_memory_limit(-1)`` and a str ``nbytes`` failed with Python internals or were truncated."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core._host_memory import is_mapped
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapping check is Linux's mincore")

# In a child interpreter: a regression is a SIGSEGV. Two fresh pages are mapped and the second one
# unmapped again, so the addresses below are surely unmapped (or surely mapped) in the child.
_UNMAPPED_CASES = r"""
import ctypes, json, mmap, warnings
import numpy as np

warnings.simplefilter("ignore")
import pygpukit as gp

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
PAGE = mmap.PAGESIZE
base = libc.mmap(None, 2 * PAGE, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
assert base not in (None, ctypes.c_void_p(-1).value)
assert libc.munmap(base + PAGE, PAGE) == 0
mapped, hole = base, base + PAGE
ctypes.memset(mapped, 7, PAGE)
device = gp.empty(64, gp.uint8)
device.copy_(np.arange(64, dtype=np.uint8))
gp.synchronize()


def case(name, call):
    try:
        call()
        gp.synchronize()
        outcome = ["ok", ""]
    except gp.PyGPUkitError as error:
        outcome = [type(error).__name__, str(error)]
    print(json.dumps([name] + outcome), flush=True)


htod, dtoh = gp.memcpy_host_to_device_async, gp.memcpy_device_to_host_async
case("htod src in a hole", lambda: htod(device.device_ptr, hole, 16))
case("htod src running into a hole", lambda: htod(device.device_ptr, hole - 8, 16))
case("htod src past the address space", lambda: htod(device.device_ptr, (1 << 64) - 4096, 16))
case("dtoh dst in a hole", lambda: dtoh(hole + 100, device.device_ptr, 16))
case("dtoh dst running into a hole", lambda: dtoh(hole - 1, device.device_ptr, 2))
case("dtoh dst zero bytes in a hole", lambda: dtoh(hole, device.device_ptr, 0))
case("htod src inside the mapped page", lambda: htod(device.device_ptr, hole - 16, 16))
case("dtoh dst inside the mapped page", lambda: dtoh(mapped, device.device_ptr, 64))
print(json.dumps(["device", device.to_numpy().tolist()]), flush=True)
print(json.dumps(["host", list(ctypes.string_at(mapped, 64))]), flush=True)
"""


@linux_only
def test_raw_copies_refuse_unmapped_host_memory_instead_of_crashing() -> None:
    result = subprocess.run([sys.executable, "-c", _UNMAPPED_CASES], capture_output=True, text=True, check=False)
    report = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, report
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    outcomes = {line[0]: line[1:] for line in lines}
    assert len(outcomes) == 10, report
    for name, (kind, message) in ((n, o) for n, o in outcomes.items() if n not in ("device", "host")):
        if ("hole" in name and "zero bytes" not in name) or "address space" in name:
            assert kind == "InvalidPointerError", f"{name}: {kind} {message}"
            role = name.split()[1]
            assert message.startswith(f"memcpy_{'host_to_device' if role == 'src' else 'device_to_host'}_async: "), (
                message
            )
            assert f"{role} 0x" in message, message
            assert "nbytes" in message, message
            assert "not mapped" in message, message
        else:
            assert kind == "ok", f"{name}: {kind} {message}"
    # The refused copies changed nothing; the good ones copied: 16 bytes of 7 into the device array's
    # start, then the device array's 64 bytes into the mapped page.
    expected = [7] * 16 + list(range(16, 64))
    assert outcomes["device"][0] == expected, report
    assert outcomes["host"][0] == expected, report


@linux_only
def test_is_mapped_tells_live_host_memory_from_addresses_nobody_mapped() -> None:
    data = np.zeros(1 << 20, np.uint8)
    assert is_mapped(data.ctypes.data, data.nbytes)
    assert is_mapped(data.ctypes.data + 5, 7)
    assert is_mapped(0x1234, 0)  # nothing touched
    assert not is_mapped((1 << 64) - 4096, 16)  # past the user address space
    assert not is_mapped(1 << 62, 1)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ((math.nan,), "stop must be finite, got nan"),
        ((0, math.inf), "stop must be finite, got inf"),
        ((0, 4, math.nan), "step must be finite, got nan"),
        (("4",), "stop must be a real number, got '4' of type str"),
        ((None,), "stop must be a real number, got None"),
        ((1j,), "stop must be a real number, got 1j of type complex"),
        ((0, 4, 0), "step must not be zero"),
    ],
    ids=str,
)
def test_arange_refuses_bad_bounds_with_an_argument_error(args: tuple[object, ...], pattern: str) -> None:
    with pytest.raises(ArgumentError, match=rf"arange: {pattern}"):
        gp.arange(*args)  # type: ignore[arg-type]
    got = gp.arange(0, 2.5, 0.5).to_numpy()
    np.testing.assert_array_equal(got, np.arange(0, 2.5, 0.5))


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: gp.empty(1.5), ShapeError, "must be an int or a sequence of ints, got 1.5"),
        (lambda: gp.zeros((2, 1.5)), ShapeError, r"shape \(2, 1.5\) has a dimension 1.5 of type float"),
        (lambda: gp.full(("3",), 1.0), ShapeError, "dimension '3' of type str"),
        (lambda: gp.empty((True, 2)), ShapeError, "bool dimension"),
        (lambda: gp.empty(None), ShapeError, "got None"),
        (lambda: gp.ones((2, 3)).reshape(3, 2.0), ShapeError, "dimension 2.0"),
        (lambda: gp.ones((2, 3)).reshape("6"), ShapeError, "dimension '6'"),
        (lambda: gp.asarray([[1, 2], [3]]), ShapeError, "asarray: .*inhomogeneous"),
        (lambda: gp.asarray(["x"], gp.float32), DTypeError, "asarray: could not convert"),
        (lambda: gp.ones(3).copy_([1, 2, 3]), DTypeError, "copy_ needs a GPUArray or a NumPy array, got list"),
        (lambda: gp.set_memory_limit(-1), ArgumentError, "set_memory_limit: limit must be a positive int"),
        (lambda: gp.set_memory_limit(1.5), ArgumentError, "got 1.5"),
        (lambda: gp.memcpy_device_to_device_async(0x10000, 0x10000, "8"), DTypeError, "nbytes must be an int"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_core_arguments_of_the_wrong_type_raise_typed_errors(
    call: Callable[[], object], error: type[Exception], pattern: str
) -> None:
    before = gp.memory_stats()["in_use_bytes"]
    with pytest.raises(error, match=pattern):
        call()
    assert gp.memory_stats()["in_use_bytes"] == before
    assert gp.memory_stats()["limit"] is None  # a refused limit changed nothing


def test_integer_shapes_of_every_spelling_still_work() -> None:
    for shape, expected in (
        (np.int64(3), (3,)),
        ([2, np.int32(3)], (2, 3)),
        (np.array([2, 3]), (2, 3)),
        (range(1, 3), (1, 2)),
        ((), ()),
    ):
        got = gp.zeros(shape)
        assert got.shape == expected
        np.testing.assert_array_equal(got.to_numpy(), np.zeros(expected, np.float32))
    x = gp.from_numpy(np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(x.reshape(np.int64(2), -1).to_numpy(), np.arange(6).reshape(2, 3))
