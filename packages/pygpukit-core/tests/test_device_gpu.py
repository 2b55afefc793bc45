"""Devices as the driver reports them (GPU only), and the CPU-backend behaviour of the same calls."""

from __future__ import annotations

import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError


@pytest.mark.gpu
def test_device_properties_are_plausible() -> None:
    assert gp.device_count() >= 1
    for ordinal in range(gp.device_count()):
        info = gp.get_device_info(ordinal)
        assert info.ordinal == ordinal
        assert info.name
        assert info.uuid.startswith("GPU-")
        assert info.compute_capability >= (8, 0)
        assert info.total_memory > 2**30
        assert info.multiprocessor_count > 0
        assert info.warp_size == 32
        assert info.max_threads_per_block >= 1024
        assert info.max_shared_memory_per_block_optin >= info.max_shared_memory_per_block
        assert info.l2_cache_bytes > 0
        assert info.arch == f"sm_{info.compute_capability[0]}{info.compute_capability[1]}"


@pytest.mark.gpu
def test_missing_device_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match=r"device 999 does not exist"):
        gp.get_device_info(999)


@pytest.mark.gpu
def test_driver_loads_once_and_reports_cuda_version() -> None:
    from pygpukit.core import backend

    native = backend.native_module()
    status = native.driver_status()
    assert status["loaded"]
    assert status["init_result"] == 0
    assert status["version"] >= native.CUDA_MAJOR * 1000
    assert native.load_driver(["/nonexistent/libcuda.so.1"])["path"] == status["path"]  # idempotent


@pytest.mark.gpu
def test_cublaslt_is_found_on_the_gpu_machine() -> None:
    from pygpukit.core.cublaslt import cublaslt_status

    status = cublaslt_status()
    assert status["version"] >= 120000
    assert "libcublasLt" in status["path"]


def test_cpu_backend_has_no_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.core import backend

    monkeypatch.setattr(backend, "_state", None)
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    assert gp.device_count() == 0
    with pytest.raises(DeviceError, match=r"device 0 does not exist \(0 CUDA device\(s\) available\)"):
        gp.get_device_info(0)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["cu12", "cu13"])
def test_each_native_variant_runs_kernels(variant: str) -> None:
    """Both variants work on this driver (a CUDA 13 driver serves the CUDA 12 ABI too)."""
    import os
    import subprocess
    import sys

    from pygpukit.core import _variant

    if variant not in _variant.installed_variants():
        pytest.skip(f"pygpukit-core-{variant} is not installed")
    code = (
        "import numpy as np, pygpukit as gp\n"
        "from pygpukit.core.backend import backend_state\n"
        "k = gp.jit('extern \"C\" __global__ void inc(int* x) { x[threadIdx.x] += threadIdx.x; }', 'inc')\n"
        "x = gp.zeros(64, gp.int32)\n"
        "k(x, grid=1, block=64)\n"
        "assert (x.to_numpy() == np.arange(64)).all()\n"
        "assert (gp.arange(5, dtype=gp.bfloat16).astype(gp.float32).to_numpy() == np.arange(5)).all()\n"
        "print(backend_state().variant, backend_state().native.CUDA_MAJOR)\n"
    )
    env = {**os.environ, "PYGPUKIT_CUDA_VARIANT": variant, "PYGPUKIT_BACKEND": "cuda"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [variant, variant[2:]]


def test_driver_version_is_reported_or_none() -> None:
    version = gp.get_driver_version()
    if gp.is_cuda_available():
        assert version is not None
        assert version >= 12000
    else:
        assert version is None or version > 0


def test_devices_below_compute_capability_8_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from pygpukit.core import backend, device

    fake = device.DeviceInfo(
        **{f.name: 0 for f in dataclasses.fields(device.DeviceInfo)}
        | {
            "name": "Tesla T4",
            "uuid": "",
            "compute_capability": (7, 5),
            "unified_addressing": True,
            "concurrent_managed_access": True,
        }
    )
    monkeypatch.setattr(backend, "_state", backend.BackendState("cuda", "test", native=None))
    monkeypatch.setattr(device, "get_device_info", lambda ordinal: fake)
    with pytest.raises(DeviceError, match=r"device 1 \(Tesla T4\) has compute capability 7\.5; pygpukit needs 8\.0"):
        device.set_device(1)


@pytest.mark.gpu
def test_one_gib_round_trip_is_bitwise() -> None:
    import numpy as np

    host = np.random.default_rng(1).integers(0, 256, size=(1 << 30) + 3, dtype=np.uint8)
    array = gp.from_numpy(host)
    back = array.to_numpy()
    assert np.array_equal(back, host)
    del array
    gp.empty_cache()


@pytest.mark.gpu
def test_device_synchronize_waits_for_all_streams() -> None:
    # cuCtxSynchronize changed its signature in CUDA 13; the cu13 module must call the original one.
    x = gp.zeros(1 << 20)
    with gp.Stream():
        y = x.astype(gp.float64)
    gp.synchronize()
    assert float(y.to_numpy()[0]) == 0.0
    gp.synchronize()
