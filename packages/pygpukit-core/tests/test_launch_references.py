"""Issue 21: a kernel launch keeps no reference to its arguments or to its callers' frames, whichever path
takes it: the C fast path's every way of declining (native/bindings/launcher.cpp; checkable without a GPU),
and on a GPU the first launch, the fast path and the general path (JITKernel._launch). Under
compute-sanitizer the arrays of an eager run stayed alive, held by frames of returned calls that no Python
object referred to (ci/sanitize_probe.py); these tests pin the launch paths as clean."""

from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core import _variant
from pygpukit.core.array import GPUArray
from pygpukit.core.jit import JITKernel
from pygpukit.core.stream import current_streams

REPEATS = 200


def _frames_of(code: types.CodeType) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is types.FrameType and o.f_code is code)


class _ThreadState:
    """The Launcher reads ``device`` from the thread state it is given: -1 matches the CPU arrays."""

    device = -1


def _cases(x: GPUArray) -> dict[str, tuple[Any, ...]]:
    """(args, grid, block, shared_mem, stream) declined at each step of Launcher.launch, the later ones
    after packing some or all of the arguments (the paths that hold new references when they return)."""
    ints = gp.from_numpy(np.arange(8, dtype=np.int32))
    view = gp.from_numpy(np.ones((4, 6), np.float32))[:, ::2]
    freed = gp.from_numpy(np.ones(8, np.float32))
    freed._buffer.free()
    return {
        "argument count": ((x, 1.5), 1, 32, 0, None),
        "grid": ((x, 1.5, 8), (1, 1, 1, 1), 32, 0, None),
        "block threads": ((x, 1.5, 8), 1, 2048, 0, None),
        "shared memory": ((x, 1.5, 8), 1, 32, 10**6, None),
        "pointer of another type": ((np.zeros(8, np.float32), 1.5, 8), 1, 32, 0, None),
        "pointer dtype": ((ints, 1.5, 8), 1, 32, 0, None),
        "non-contiguous view": ((view, 1.5, 8), 1, 32, 0, None),
        "freed array": ((freed, 1.5, 8), 1, 32, 0, None),
        "float after a packed pointer": ((x, "1.5", 8), 1, 32, 0, None),
        "int out of range after packing": ((x, np.float32(1.5), 2**40), 1, 32, 0, None),
        "stream after packing everything": ((x, 1.5, 8), (1, 1), (32, 1), 0, object()),
    }


def test_the_fast_path_keeps_no_reference_when_it_declines() -> None:
    """Every NotImplemented return of Launcher.launch, repeated: the arguments' reference counts, the
    caller's frame and the number of tracked objects are unchanged (a Py_INCREF without its DECREF on
    one of those returns would keep every array a declined launch saw alive)."""
    native = _variant.any_native()
    if native is None:
        pytest.skip("no pygpukit native module installed")
    x = gp.from_numpy(np.ones(8, np.float32))
    launcher = native.Launcher(1, -1, 1024, 48 * 1024, "pfi", ("float", None, None), GPUArray, _ThreadState(),
                               current_streams)  # fmt: skip
    other_device = native.Launcher(1, 0, 1024, 48 * 1024, "pfi", ("float", None, None), GPUArray, _ThreadState(),
                                   current_streams)  # fmt: skip
    cases = _cases(x)

    def call(target: Any, case: tuple[Any, ...]) -> object:
        return target.launch(*case)

    def check(name: str, target: Any, case: tuple[Any, ...]) -> None:
        # Objects of this test only (not None or cached small ints, whose counts move with anything).
        watched = [o for o in (*case[0], case[0], case[1], case[2], case[4])
                   if not isinstance(o, (int, float, str)) and o is not None]  # fmt: skip
        before = [sys.getrefcount(o) for o in watched]
        gc.collect()
        objects = len(gc.get_objects())
        for _ in range(REPEATS):
            result = call(target, case)
            assert result is NotImplemented, f"{name}: {result!r}"
        del result
        gc.collect()
        assert [sys.getrefcount(o) for o in watched] == before, name
        assert len(gc.get_objects()) - objects < REPEATS // 4, name
        assert _frames_of(call.__code__) == 0, name

    for name, case in cases.items():
        check(name, launcher, case)
    check("device", other_device, ((x, 1.5, 8), 1, 32, 0, None))
    stream = gp.Stream()
    with stream:  # the current-stream stack read from the ContextVar, then a decline
        check("current stream", launcher, ((x, "1.5", 8), 1, 32, 0, None))
    if gp.current_backend() == "cpu":  # everything packed, then the launch itself fails (no context here)

        def raising(target: Any, case: tuple[Any, ...]) -> object:
            try:
                return target.launch(*case)
            except gp.PyGPUkitError as error:
                return error

        case = ((x, 1.5, 8), 1, 32, 0, None)
        before = [sys.getrefcount(o) for o in (x, case[0])]
        for _ in range(REPEATS):
            assert isinstance(raising(launcher, case), gp.PyGPUkitError)
        gc.collect()
        assert [sys.getrefcount(o) for o in (x, case[0])] == before
        assert _frames_of(raising.__code__) == 0


SCALE = r"""
extern "C" __global__ void scale_refs(float* x, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}
"""


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["first", "fast", "general"])
def test_a_launch_keeps_no_array_or_frame_alive(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches from a helper holding a fresh array: after it returns, the arrays and the helper's frames
    are gone (the memory back in the pool), on the first launch of a kernel, through the fast path (no
    launch taking the general path) and through the general path."""
    rng = np.random.default_rng(21)
    general: list[str] = []
    original = JITKernel._launch

    def counting(self: JITKernel, *args: Any) -> None:
        general.append(self.name)
        original(self, *args)

    monkeypatch.setattr(JITKernel, "_launch", counting)
    kernels = [gp.jit(SCALE, "scale_refs") for _ in range(5 if path == "first" else 1)]
    for kernel in kernels if path != "first" else ():
        kernel(gp.zeros(4, gp.float32), 1.0, 4, grid=1, block=256)  # loads and prepares it
    if path == "general":
        kernels[0]._fast = None
    general.clear()
    refs: list[weakref.ref[GPUArray]] = []

    def helper(kernel: JITKernel, n: int) -> None:
        host = rng.standard_normal(n).astype(np.float32)
        x = gp.from_numpy(host)
        kernel(x, 2.5, n, grid=(n + 255) // 256, block=256)
        np.testing.assert_allclose(x.to_numpy(), 2.5 * host.astype(np.float64), rtol=1e-6)
        refs.append(weakref.ref(x))

    gc.collect()
    in_use = gp.memory_stats()["in_use_bytes"]
    for i in range(5):
        helper(kernels[i % len(kernels)], 1000 + 37 * i)
    gc.collect()
    gp.synchronize()
    assert [r() for r in refs] == [None] * 5
    assert _frames_of(helper.__code__) == 0
    assert gp.memory_stats()["in_use_bytes"] == in_use
    expected = {"first": 5, "fast": 0, "general": 5}[path]
    assert len(general) == expected, f"{len(general)} launches took the general path, expected {expected}"
