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
