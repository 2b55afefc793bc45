"""Defects found in a newcomer trial, each pinned by a test: raw copies that crashed the interpreter on
bad pointers or sizes, freed memory that stayed usable, host allocation failures that escaped as NumPy
errors and left the statistics counting them, a negative or freed PinnedBuffer that still worked, and
bool ranges that differed between backends (now NumPy's rule on both)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, DTypeError, InvalidPointerError

# Run in a child interpreter: a regression here is a SIGSEGV, which must fail one test, not end the run.
# Each case prints one JSON line as it finishes, so a crash shows which case it was.
_COPY_CASES = r"""
import json, warnings
import numpy as np

warnings.simplefilter("ignore")
import pygpukit as gp

CPU = gp.current_backend() == "cpu"
N = 16
FUNCTIONS = {
    "htod": (gp.memcpy_host_to_device_async, "device", "host"),
    "dtoh": (gp.memcpy_device_to_host_async, "host", "device"),
    "dtod": (gp.memcpy_device_to_device_async, "device", "device"),
}
keep = []


def allocate(kind, n):
    if kind == "device":
        array = gp.empty(n, gp.uint8)
        keep.append(array)
        return array.device_ptr
    pinned = gp.PinnedBuffer(n)
    keep.append(pinned)
    return pinned.ptr


def freed(kind):
    if kind == "device":
        buffer = gp.empty(N, gp.uint8).buffer
        buffer.free()
    else:
        buffer = gp.PinnedBuffer(N)
        buffer.free()
    keep.append(buffer)  # a freed object that still lives: its address cannot have been reused
    return buffer.ptr


def case(name, call, cpu_only=False):
    if cpu_only and not CPU:
        return  # the CUDA backend cannot tell this pointer from memory of another library
    try:
        call()
        outcome = ["ok", ""]
    except gp.PyGPUkitError as error:
        outcome = [type(error).__name__, str(error)]
    print(json.dumps([name] + outcome), flush=True)


for name, (function, dst_kind, src_kind) in FUNCTIONS.items():
    for role, kind in (("dst", dst_kind), ("src", src_kind)):
        other = src_kind if role == "dst" else dst_kind

        def pair(ptr, other_size=N):
            other_ptr = allocate(other, other_size)
            return (ptr, other_ptr) if role == "dst" else (other_ptr, ptr)

        case(f"{name} {role} low address", lambda: function(*pair(0x10), N))
        case(f"{name} {role} freed", lambda: function(*pair(freed(kind)), N), cpu_only=True)
        if kind == "device":
            foreign = np.zeros(N, np.uint8)
            keep.append(foreign)
            case(f"{name} {role} unknown", lambda: function(*pair(foreign.ctypes.data), N), cpu_only=True)
        else:
            case(f"{name} {role} device as host", lambda: function(*pair(allocate("device", N)), N))
        case(f"{name} {role} past the end", lambda: function(*pair(allocate(kind, N), 2 * N), N + 1))
        case(f"{name} {role} inside past the end", lambda: function(*pair(allocate(kind, N) + 8, 2 * N), 9))
    case(f"{name} negative nbytes", lambda: function(allocate(dst_kind, N), allocate(src_kind, N), -1))
    case(f"{name} zero bytes one past the end", lambda: function(allocate(dst_kind, N) + N, allocate(src_kind, N), 0))

    def correct(function=function, dst_kind=dst_kind, src_kind=src_kind):
        data = np.arange(100, 100 + N, dtype=np.uint8)
        if src_kind == "device":
            source = gp.from_numpy(data)
            src = source.device_ptr
        else:
            source = np.ascontiguousarray(data)  # raw host memory the caller owns
            src = source.ctypes.data
        target = gp.zeros(N, gp.uint8) if dst_kind == "device" else gp.PinnedBuffer(N)
        keep.extend((source, target))
        function(target.device_ptr if dst_kind == "device" else target.ptr, src, N)
        gp.synchronize()
        got = target.to_numpy() if dst_kind == "device" else target.numpy()
        assert got.tolist() == data.tolist(), got

    case(f"{name} correct", correct)
"""

_EXPECTED = {
    "low address": "InvalidPointerError",
    "freed": "InvalidPointerError",
    "unknown": "InvalidPointerError",
    "device as host": "InvalidPointerError",
    "past the end": "ArgumentError",
    "negative nbytes": "ArgumentError",
    "zero bytes one past the end": "ok",
    "correct": "ok",
}


def test_raw_copies_refuse_bad_pointers_and_sizes_with_typed_errors() -> None:
    result = subprocess.run([sys.executable, "-c", _COPY_CASES], capture_output=True, text=True, check=False)
    report = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, report
    outcomes = {name: (kind, message) for name, kind, message in map(json.loads, result.stdout.splitlines())}
    cpu = gp.current_backend() == "cpu"
    # 13 cases a function on the CPU backend; on CUDA, freed and unknown device pointers are not run.
    assert len(outcomes) == (39 if cpu else 29), report
    functions = {"htod": "host_to_device", "dtoh": "device_to_host", "dtod": "device_to_device"}
    for name, (kind, message) in outcomes.items():
        expected = _EXPECTED[max((suffix for suffix in _EXPECTED if name.endswith(suffix)), key=len)]
        assert kind == expected, f"{name}: {kind} {message}"
        if kind != "ok":
            assert message.startswith(f"memcpy_{functions[name.split()[0]]}_async: "), message
            assert "nbytes" in message, message
        if kind == "ArgumentError" and "past the end" in name:
            assert "16 bytes at 0x" in message, message  # the allocation's size
            assert f"{'src' if ' src ' in name else 'dst'} 0x" in message, message  # the pointer


def test_negative_nbytes_is_an_argument_error_in_process() -> None:
    device = gp.empty(8, gp.uint8)
    with pytest.raises(ArgumentError, match=r"memcpy_device_to_device_async: nbytes must be >= 0, got -1"):
        gp.memcpy_device_to_device_async(device.device_ptr, device.device_ptr, -1)


def _freed_pair() -> tuple[gp.GPUArray, gp.GPUArray]:
    x = gp.from_numpy(np.arange(4, dtype=np.float32))
    freed = gp.ones(4)
    freed.buffer.free()
    return x, freed


@pytest.mark.parametrize(
    "use",
    [
        lambda x, freed: gp.add(freed, 1),
        lambda x, freed: gp.add(x, 1, out=freed),
        lambda x, freed: gp.rmsnorm(freed, gp.ones(4)),
        lambda x, freed: freed.copy_(x),
        lambda x, freed: x.copy_(freed),
        lambda x, freed: freed.copy_(np.zeros(4, np.float32)),
        lambda x, freed: freed.to_numpy(),
        lambda x, freed: freed.astype(gp.float64),
        lambda x, freed: freed[1:].clone(),
    ],
    ids=["add", "out", "rmsnorm", "copy_into", "copy_from", "copy_from_numpy", "to_numpy", "astype", "view"],
)
def test_any_use_of_a_freed_array_raises_invalid_pointer(use: Callable[[gp.GPUArray, gp.GPUArray], Any]) -> None:
    x, freed = _freed_pair()
    with pytest.raises(InvalidPointerError, match="freed") as caught:
        use(x, freed)
    if not freed.on_gpu:  # native launches name the kernel parameter instead
        assert re.search(r"shape \((4|3),\), dtype float32", str(caught.value)), caught.value  # 3: the view
    assert x.to_numpy().tolist() == [0, 1, 2, 3]  # the live operand is untouched and still usable


@pytest.mark.parametrize("nbytes", [1 << 62, 1 << 63, 1 << 80], ids=["4EiB", "past-intp", "past-int64"])
def test_a_failed_huge_allocation_is_out_of_memory_and_not_counted(nbytes: int) -> None:
    before = gp.memory_stats()
    with pytest.raises(gp.OutOfMemoryError) as caught:
        gp.empty(nbytes, gp.uint8)
    error = caught.value
    assert error.requested == nbytes
    assert f"{nbytes} bytes" in str(error)
    if gp.current_backend() == "cpu":  # the native pool reports its own numbers
        assert error.in_use == before["in_use_bytes"]
        assert error.limit is None
        assert f"in use {before['in_use_bytes']} bytes, cached 0 bytes, limit none" in str(error)
    after = gp.memory_stats()
    for key in ("in_use_bytes", "in_use_blocks", "peak_in_use_bytes", "device_allocations"):
        assert after[key] == before[key], key
    assert gp.ones(3).to_numpy().tolist() == [1, 1, 1]  # the runtime stays usable


def test_a_failed_huge_allocation_refunds_the_allocation_scope() -> None:
    from pygpukit.core.memory import allocation_scope

    class Scope:
        used = 0

        def charge(self, nbytes: int) -> None:
            self.used += nbytes

        def refund(self, nbytes: int) -> None:
            self.used -= nbytes

    scope = Scope()
    with allocation_scope(scope), pytest.raises(gp.OutOfMemoryError):
        gp.empty(1 << 62, gp.uint8)
    assert scope.used == 0


@pytest.mark.parametrize("nbytes", [-1, -(1 << 40)])
def test_pinned_buffer_refuses_a_negative_size(nbytes: int) -> None:
    with pytest.raises(ArgumentError, match=f"nbytes must be >= 0, got {nbytes}"):
        gp.PinnedBuffer(nbytes)
    with pytest.raises(ArgumentError, match="nbytes must be >= 0"):
        gp.pinned_malloc(nbytes)


def test_a_freed_pinned_buffer_no_longer_gives_its_bytes() -> None:
    pinned = gp.PinnedBuffer(16)
    pinned.numpy()[:] = 7
    assert not pinned.freed
    pinned.free()
    assert pinned.freed
    with pytest.raises(InvalidPointerError, match=r"pinned buffer at 0x[0-9a-f]+ \(16 bytes\) was freed"):
        pinned.numpy()
    with pytest.raises(InvalidPointerError, match="already freed"):
        pinned.free()
    assert gp.PinnedBuffer(4).numpy().size == 4  # new ones still work


def test_pinned_views_share_the_bytes() -> None:
    pinned = gp.PinnedBuffer(4 * 8)
    pinned.numpy()[:] = 0
    pinned.numpy(np.float32, 5)[:] = np.arange(5)
    assert pinned.numpy(np.float32).tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert pinned.numpy(np.int64, 1).shape == (1,)


def test_a_huge_limit_set_still_reports_the_host_failure() -> None:
    gp.set_memory_limit(1 << 63)
    try:
        with pytest.raises(gp.OutOfMemoryError) as caught:
            gp.empty(1 << 62, gp.uint8)
        if gp.current_backend() == "cpu":
            assert caught.value.limit == 1 << 63
            assert "host allocation failed" in str(caught.value)
    finally:
        gp.set_memory_limit(None)


@pytest.mark.parametrize(
    "args", [(0,), (1,), (2,), (0, 2), (1, 3), (-1, 1), (2, 0, -1), (0, 0.5, 0.3), (0.5, 1.5)], ids=str
)
def test_arange_of_bool_follows_numpy_on_every_backend(args: tuple[float, ...]) -> None:
    """NumPy's rule, computed on the host on both backends: at most 2 values, bool(start + i * step)."""
    for dtype in (bool, gp.bool_, "bool"):
        got = gp.arange(*args, dtype=dtype)
        assert got.dtype == gp.bool_
        assert got.to_numpy().tolist() == np.arange(*args, dtype=bool).tolist()


@pytest.mark.parametrize("args", [(3,), (5, 0, -1), (0, 1, 0.25)], ids=str)
def test_arange_of_bool_longer_than_two_is_refused_as_numpy_does(args: tuple[float, ...]) -> None:
    with pytest.raises(TypeError):
        np.arange(*args, dtype=bool)
    with pytest.raises(DTypeError, match=r"arange of bool gives at most 2 values, as in NumPy.* give [345]"):
        gp.arange(*args, dtype=gp.bool_)
    assert gp.arange(3).to_numpy().tolist() == [0, 1, 2]
