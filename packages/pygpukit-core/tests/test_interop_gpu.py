"""CUDA Array Interface round trips with torch and CuPy (GPU machine only; they are test references)."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gp


@pytest.mark.gpu
def test_torch_reads_a_gpuarray_without_copying() -> None:
    torch = pytest.importorskip("torch")
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    array = gp.from_numpy(host)
    tensor = torch.as_tensor(array.T, device="cuda")  # a strided view through __cuda_array_interface__
    assert tensor.data_ptr() == array.device_ptr
    np.testing.assert_array_equal(tensor.cpu().numpy(), host.T)
    tensor.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(array.to_numpy(), host * 2)


@pytest.mark.gpu
def test_cupy_reads_a_gpuarray_without_copying() -> None:
    cupy = pytest.importorskip("cupy")
    host = np.arange(10, dtype=np.int64)
    array = gp.from_numpy(host)[::2]
    view = cupy.asarray(array)
    assert view.data.ptr == array.device_ptr
    np.testing.assert_array_equal(cupy.asnumpy(view), host[::2])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "uint8", "bool"])
def test_dlpack_round_trip_with_torch(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    host = (np.arange(40) % 7).astype(gp.as_dtype(dtype).numpy).reshape(5, 8)
    array = gp.from_numpy(host)
    tensor = torch.from_dlpack(array[:, 1::2])  # strided view, no copy
    assert tensor.data_ptr() == array[:, 1::2].device_ptr
    assert tuple(tensor.shape) == (5, 4)
    back = gp.from_dlpack(tensor.T)
    assert back.device_ptr == tensor.data_ptr()
    np.testing.assert_array_equal(back.to_numpy().astype(np.float64), host[:, 1::2].T.astype(np.float64))
    imported = gp.asarray(torch.arange(10, device="cuda", dtype=torch.float32))
    np.testing.assert_array_equal(imported.to_numpy(), np.arange(10, dtype=np.float32))


@pytest.mark.gpu
def test_dlpack_round_trip_with_cupy() -> None:
    cupy = pytest.importorskip("cupy")
    source = cupy.arange(24, dtype=cupy.float64).reshape(4, 6)
    array = gp.from_dlpack(source)
    assert array.device_ptr == source.data.ptr
    np.testing.assert_array_equal(array.to_numpy(), np.arange(24.0).reshape(4, 6))
    again = cupy.from_dlpack(array.T)
    np.testing.assert_array_equal(cupy.asnumpy(again), np.arange(24.0).reshape(4, 6).T)
    via_cai = gp.asarray(cupy.ones(5, dtype=cupy.int32))
    np.testing.assert_array_equal(via_cai.to_numpy(), np.ones(5, np.int32))


@pytest.mark.gpu
def test_consumer_stream_waits_for_producer_work() -> None:
    torch = pytest.importorskip("torch")
    stream = gp.Stream()
    with stream:
        big = gp.arange(1 << 24, dtype=gp.float32)  # queued on our stream
        tensor = torch.from_dlpack(big)  # torch's current stream must wait for it
    assert float(tensor[-1]) == float((1 << 24) - 1)
