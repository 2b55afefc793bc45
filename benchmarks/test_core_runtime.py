"""Core runtime benchmarks on the GPU, each next to its CuPy / torch peer in the same run.

Groups (pytest-benchmark ``group``) pair pygpukit with its peers; ci/bench_report.py turns the JSON
into ratio tables for docs/performance.md. Peers are skipped, not faked, when not importable.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

pytestmark = pytest.mark.gpu

LAUNCHES = 200
SOURCE = 'extern "C" __global__ void add_one(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1.0f; }'
COPY_BYTES = 256 << 20


def _torch() -> Any:
    return pytest.importorskip("torch")


def _cupy() -> Any:
    return pytest.importorskip("cupy")


# -- small kernel launch ---------------------------------------------------------------------------
@pytest.mark.benchmark(group="launch: small JIT kernel, per 200 launches")
def test_launch_pygpukit(benchmark: Any) -> None:
    kernel = gp.jit(SOURCE, "add_one")
    x = gp.zeros(32)
    stream = gp.Stream()

    def run() -> None:
        for _ in range(LAUNCHES):
            kernel(x, 32, grid=1, block=32, stream=stream)
        stream.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)
    assert x.to_numpy(stream=stream)[0] == 33 * LAUNCHES


@pytest.mark.benchmark(group="launch: small JIT kernel, per 200 launches")
def test_launch_cupy(benchmark: Any) -> None:
    cupy = _cupy()
    kernel = cupy.RawKernel(SOURCE, "add_one")
    x = cupy.zeros(32, dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    n = np.int32(32)

    def run() -> None:
        for _ in range(LAUNCHES):
            kernel((1,), (32,), (x, n), stream=stream)
        stream.synchronize()

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


# -- pool allocate + free of a cached size ----------------------------------------------------------
@pytest.mark.benchmark(group="alloc+free: 1 MiB cached block, per 200 pairs")
def test_alloc_free_pygpukit(benchmark: Any) -> None:
    def run() -> None:
        for _ in range(LAUNCHES):
            a = gp.empty(1 << 18, gp.float32)
            del a

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


@pytest.mark.benchmark(group="alloc+free: 1 MiB cached block, per 200 pairs")
def test_alloc_free_torch(benchmark: Any) -> None:
    torch = _torch()

    def run() -> None:
        for _ in range(LAUNCHES):
            a = torch.empty(1 << 18, dtype=torch.float32, device="cuda")
            del a

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


@pytest.mark.benchmark(group="alloc+free: 1 MiB cached block, per 200 pairs")
def test_alloc_free_cupy(benchmark: Any) -> None:
    cupy = _cupy()

    def run() -> None:
        for _ in range(LAUNCHES):
            a = cupy.empty(1 << 18, dtype=cupy.float32)
            del a

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)


# -- host <-> device copies, 256 MiB ----------------------------------------------------------------
def _host_pair(pinned: bool) -> tuple[Any, Any]:
    if pinned:
        src, dst = gp.PinnedBuffer(COPY_BYTES), gp.PinnedBuffer(COPY_BYTES)
        src.numpy()[:] = 7
        return src, dst
    src, dst = np.full(COPY_BYTES, 7, np.uint8), np.empty(COPY_BYTES, np.uint8)
    return src, dst


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_copy_pygpukit(benchmark: Any, pinned: bool, direction: str) -> None:
    benchmark.group = f"copy {direction} 256 MiB {'pinned' if pinned else 'pageable'}"
    src, dst = _host_pair(pinned)
    device = gp.empty(COPY_BYTES, gp.uint8)
    stream = gp.Stream()
    host_src = src.ptr if pinned else src.ctypes.data
    host_dst = dst.ptr if pinned else dst.ctypes.data
    if direction == "h2d":

        def run() -> None:
            gp.memcpy_host_to_device_async(device.device_ptr, host_src, COPY_BYTES, stream)
            stream.synchronize()
    else:

        def run() -> None:
            gp.memcpy_device_to_host_async(host_dst, device.device_ptr, COPY_BYTES, stream)
            stream.synchronize()

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_copy_torch(benchmark: Any, pinned: bool, direction: str) -> None:
    torch = _torch()
    benchmark.group = f"copy {direction} 256 MiB {'pinned' if pinned else 'pageable'}"
    host = torch.full((COPY_BYTES,), 7, dtype=torch.uint8, pin_memory=pinned)
    device = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    if direction == "h2d":

        def run() -> None:
            with torch.cuda.stream(stream):
                device.copy_(host, non_blocking=pinned)
            stream.synchronize()
    else:

        def run() -> None:
            with torch.cuda.stream(stream):
                host.copy_(device, non_blocking=pinned)
            stream.synchronize()

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES


# -- kernel load from the disk cache, and a cold NVRTC compile ---------------------------------------
@pytest.mark.benchmark(group="kernel load: warm disk cache")
def test_warm_disk_cache_load(benchmark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jit_module = importlib.import_module("pygpukit.core.jit")
    from pygpukit.core.kernel_cache import KernelCache

    cache = KernelCache(tmp_path)
    monkeypatch.setattr(jit_module, "kernel_cache", cache)
    gp.jit(SOURCE, "add_one")  # fills the disk cache

    def load() -> None:
        cache.clear_memory()
        jit_module._modules.clear()  # force a new module load too
        gp.jit(SOURCE, "add_one")

    benchmark.pedantic(load, rounds=30, warmup_rounds=2)
    assert cache.stats.disk_hits >= 30


@pytest.mark.benchmark(group="kernel load: cold NVRTC compile")
def test_cold_compile(benchmark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jit_module = importlib.import_module("pygpukit.core.jit")
    from pygpukit.core.kernel_cache import KernelCache

    counter = iter(range(10**6))

    def compile_new() -> None:
        monkeypatch.setattr(jit_module, "kernel_cache", KernelCache(None))
        gp.jit(SOURCE + f"\n// variant {next(counter)}", "add_one")

    benchmark.pedantic(compile_new, rounds=10, warmup_rounds=1)


# -- NumPy transfers (pageable host memory), what users call ----------------------------------------
@pytest.mark.benchmark(group="numpy -> device 256 MiB (pageable)")
def test_from_numpy_pygpukit(benchmark: Any) -> None:
    host = np.full(COPY_BYTES, 7, np.uint8)
    result = benchmark.pedantic(lambda: gp.from_numpy(host), rounds=20, warmup_rounds=2)
    assert result.nbytes == COPY_BYTES
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.benchmark(group="numpy -> device 256 MiB (pageable)")
def test_from_numpy_torch(benchmark: Any) -> None:
    torch = _torch()
    host = np.full(COPY_BYTES, 7, np.uint8)

    def run() -> Any:
        tensor = torch.from_numpy(host).to("cuda")
        torch.cuda.synchronize()
        return tensor

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.benchmark(group="numpy -> device 256 MiB (pageable)")
def test_from_numpy_cupy(benchmark: Any) -> None:
    cupy = _cupy()
    host = np.full(COPY_BYTES, 7, np.uint8)
    benchmark.pedantic(lambda: cupy.asarray(host), rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.benchmark(group="device -> numpy 256 MiB (pageable)")
def test_to_numpy_pygpukit(benchmark: Any) -> None:
    device = gp.full(COPY_BYTES, 7, gp.uint8)
    result = benchmark.pedantic(device.to_numpy, rounds=20, warmup_rounds=2)
    assert result[-1] == 7
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.benchmark(group="device -> numpy 256 MiB (pageable)")
def test_to_numpy_torch(benchmark: Any) -> None:
    torch = _torch()
    device = torch.full((COPY_BYTES,), 7, dtype=torch.uint8, device="cuda")
    benchmark.pedantic(lambda: device.cpu().numpy(), rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES


@pytest.mark.benchmark(group="device -> numpy 256 MiB (pageable)")
def test_to_numpy_cupy(benchmark: Any) -> None:
    cupy = _cupy()
    device = cupy.full(COPY_BYTES, 7, dtype=cupy.uint8)
    benchmark.pedantic(lambda: cupy.asnumpy(device), rounds=20, warmup_rounds=2)
    benchmark.extra_info["bytes"] = COPY_BYTES
