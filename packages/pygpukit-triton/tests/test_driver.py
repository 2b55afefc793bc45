"""Without a GPU: Triton's whole launch path on pygpukit's driver, down to the C launcher.

Triton's CUDA helpers (``CudaUtils``: module loading; ``CudaLauncher``: the C launch) need a driver, so
they are replaced by recorders, and the backend reports CUDA. Everything else is real: the driver
installed through ``DriverConfig.set_active``, Triton's binder reading GPUArrays' ``data_ptr()`` and
``dtype``, compilation for sm_90, and the device, stream and pointers the launch receives.
"""

from __future__ import annotations

import gc
import sys
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import pygpukit as gk
from pygpukit.core import device as device_module
from pygpukit.triton import _interop, kernels

triton = pytest.importorskip("triton")
from triton.backends.nvidia import driver as nvidia  # noqa: E402
from triton.runtime.driver import driver as config  # noqa: E402


class FakeNative:
    def __init__(self) -> None:
        self.devices: list[int] = []

    def set_device(self, ordinal: int) -> None:
        self.devices.append(ordinal)


class FakeUtils:
    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        assert kernel  # the CUBIN ptxas made
        return 1, 2, 32, 0, 1024

    def unload_module(self, module: int) -> None:
        pass


class FakeLauncher:
    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, src: Any, metadata: Any) -> None:
        self.name = metadata.name

    def __call__(self, grid_x: int, grid_y: int, grid_z: int, stream: int, function: int, *rest: Any) -> None:
        args = rest[4:]  # after the packed metadata, the launch metadata and the two hooks
        pointers = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
        FakeLauncher.calls.append({"name": self.name, "grid": (grid_x, grid_y, grid_z), "stream": stream,
                                   "args": pointers})  # fmt: skip


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNative]:
    native = FakeNative()
    monkeypatch.setattr(_interop, "backend_state", lambda: SimpleNamespace(name="cuda", native=native))
    monkeypatch.setattr(_interop, "_state", {})
    monkeypatch.setattr(nvidia, "CudaUtils", FakeUtils)
    monkeypatch.setattr(nvidia, "CudaLauncher", FakeLauncher)
    info = SimpleNamespace(name="Fake H100", compute_capability=(9, 0))
    monkeypatch.setattr(device_module, "get_device_info", lambda ordinal=0: info)
    monkeypatch.setattr(config, "_active", config._active)  # restored after the test
    jitted = (_triton_kernels().rmsnorm_kernel, _triton_kernels().matmul_kernel)
    for fn in jitted:
        monkeypatch.setattr(fn, "device_caches", defaultdict(fn.create_binder))  # no fake handles kept
    FakeLauncher.calls.clear()
    yield native
    # drop the kernels with fake handles while the fake driver can still unload them (Triton 3.9's
    # CompiledKernel.__del__ asks the active driver); monkeypatch then restores the real driver
    config._active = _interop._state.get("driver") or config._active
    for fn in jitted:
        fn.device_caches = defaultdict(fn.create_binder)
    gc.collect()


def _triton_kernels() -> Any:
    from pygpukit.triton import _triton_kernels as k

    return k


def test_kernels_launch_on_the_current_stream_with_the_arrays_pointers(fake_cuda: FakeNative) -> None:
    x = gk.from_numpy(np.ones((5, 300), np.float32))
    w = gk.from_numpy(np.ones(300, np.float32))
    out = gk.empty((5, 300), gk.float32)
    before = config._active
    with gk.Stream() as stream:
        assert kernels.rmsnorm(x, w, 1e-5, out=out) is out
    assert config._active is before  # the kernels install pygpukit's driver for their launch only
    (call,) = FakeLauncher.calls
    assert call["name"] == "rmsnorm_kernel"
    assert call["grid"] == (5, 1, 1)
    assert call["stream"] == stream.handle
    assert call["args"][:3] == [x.device_ptr, w.device_ptr, out.device_ptr]
    assert fake_cuda.devices  # pygpukit's context made current before the launch
    assert "torch" not in sys.modules


def test_matmul_passes_strides_of_a_transposed_view_without_copying(fake_cuda: FakeNative) -> None:
    a = gk.from_numpy(np.ones((40, 24), np.float16))
    b = gk.from_numpy(np.ones((32, 24), np.float16))
    result = kernels.matmul(a, b.T)
    (call,) = FakeLauncher.calls
    args = call["args"]
    assert args[:3] == [a.device_ptr, b.device_ptr, result.device_ptr]
    # m, n, k, then (batch, row, col) strides of a, b and the result, in elements
    assert [v for v in args[3:15] if isinstance(v, int)] == [40, 32, 24, 0, 24, 1, 0, 1, 24, 0, 32, 1]
    assert call["stream"] == 0  # the legacy default stream outside any `with stream:`


def test_a_graph_capture_launches_on_the_capture_stream(fake_cuda: FakeNative) -> None:
    x = gk.from_numpy(np.ones((3, 64), np.float32))
    kernels.rmsnorm(x, None)  # compiled before the capture, as on the GPU
    graph = gk.CudaGraph()
    with graph.capture() as stream:
        kernels.rmsnorm(x, None)
    assert [c["stream"] for c in FakeLauncher.calls] == [0, stream.handle]


def test_use_triton_backend_restores_the_previous_driver(fake_cuda: FakeNative) -> None:
    before = config._active
    with _interop.use_triton_backend() as activation:
        assert type(config.active).__name__ == "PygpukitCudaDriver"
        assert repr(activation) == "use_triton_backend()"
    assert config._active is before
    drv = _interop.pygpukit_driver()
    assert drv is _interop.pygpukit_driver()  # one driver per process
    assert drv.is_active()
    with gk.Stream() as stream:
        assert drv.get_current_stream(0) == stream.handle
    assert drv.get_device_capability(0) == (9, 0)
    with pytest.raises(gk.BackendUnavailableError, match="torch"):
        drv.get_active_torch_device()


def test_user_kernel_takes_gpuarrays_and_tritonarrays(fake_cuda: FakeNative) -> None:
    import triton.language as tl

    @triton.jit
    def copy(x, out, n, BLOCK: tl.constexpr):  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, mask=i < n), mask=i < n)

    _interop.use_triton_backend()
    for dtype in (gk.bfloat16, gk.float8_e4m3fn, gk.int8):
        x = gk.zeros((100,), dtype)
        out = _interop.from_gpuarray(gk.zeros((100,), dtype))
        compiled = copy[(1,)](x, out, 100, BLOCK=128)
        assert FakeLauncher.calls[-1]["args"][:2] == [x.device_ptr, out.array.device_ptr]
        assert f"*{ {'bfloat16': 'bf16', 'float8_e4m3fn': 'fp8e4nv', 'int8': 'i8'}[dtype.name] }" in str(
            compiled.src.signature
        )


def test_kernels_take_tritonarrays(fake_cuda: FakeNative) -> None:
    x = gk.from_numpy(np.ones((2, 64), np.float32))
    out = gk.empty((2, 64), gk.float32)
    tx, tout = _interop.from_gpuarray(x), _interop.from_gpuarray(out)
    assert tx.stride() == (64, 1)
    assert tx.stride(-2) == 64
    assert tx.numel() == 128
    assert tx.element_size() == 4
    assert tx.is_contiguous()
    assert kernels.rmsnorm(tx, None, 1e-6, out=tout) is out
    assert FakeLauncher.calls[-1]["args"][:3] == [x.device_ptr, None, out.device_ptr]
    with pytest.raises(gk.ShapeError, match="out of range"):
        tx.stride(2)
