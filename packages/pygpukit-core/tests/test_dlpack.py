"""DLPack on the active backend: NumPy consumes GPUArrays (CPU backend) and capsules are released."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core import dlpack


def test_device_tuple() -> None:
    array = gp.zeros(3)
    assert array.__dlpack_device__() == ((2, 0) if array.on_gpu else (1, 0))


def test_unconsumed_capsule_releases_its_array() -> None:
    array = gp.arange(5, dtype=gp.int32)
    before = len(dlpack._exported)
    capsule = array.__dlpack__()
    assert len(dlpack._exported) == before + 1
    del capsule
    gc.collect()
    assert len(dlpack._exported) == before


def test_numpy_consumes_and_produces_on_the_cpu_backend() -> None:
    if gp.is_cuda_available():
        pytest.skip("NumPy consumes host tensors only; covered by the GPU interop tests here")
    array = gp.arange(12, dtype=gp.float32).reshape(3, 4)[:, ::2]
    view = np.from_dlpack(array)
    np.testing.assert_array_equal(view, np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
    before = len(dlpack._exported)
    del view
    gc.collect()
    assert len(dlpack._exported) == before - 1
    imported = gp.from_dlpack(np.arange(4.0))
    np.testing.assert_array_equal(imported.to_numpy(), np.arange(4.0))


def test_objects_without_dlpack_are_rejected() -> None:
    with pytest.raises(TypeError, match="does not support DLPack"):
        gp.from_dlpack([1, 2, 3])
