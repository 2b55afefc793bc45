"""The native C API capsule, used from ctypes as a second extension would use it from C."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import c_api_capsule

u64, i32 = ctypes.c_uint64, ctypes.c_int32
P = ctypes.POINTER


class CApi(ctypes.Structure):
    """Mirror of PygpukitCApi in native/runtime/c_api.h (version 1)."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p)),
        ("set_device", ctypes.CFUNCTYPE(i32, i32)),
        ("get_device", ctypes.CFUNCTYPE(i32, P(i32))),
        ("allocate", ctypes.CFUNCTYPE(i32, u64, u64, P(u64))),
        ("free", ctypes.CFUNCTYPE(i32, u64)),
        ("memory_in_use", ctypes.CFUNCTYPE(i32, P(u64), P(u64))),
        ("memcpy_async", ctypes.CFUNCTYPE(i32, i32, u64, u64, u64, u64)),
        ("stream_create", ctypes.CFUNCTYPE(i32, i32, P(u64))),
        ("stream_destroy", ctypes.CFUNCTYPE(i32, u64)),
        ("stream_synchronize", ctypes.CFUNCTYPE(i32, u64)),
        ("stream_query", ctypes.CFUNCTYPE(i32, u64, P(i32))),
        ("stream_wait_event", ctypes.CFUNCTYPE(i32, u64, u64)),
        ("event_create", ctypes.CFUNCTYPE(i32, i32, P(u64))),
        ("event_destroy", ctypes.CFUNCTYPE(i32, u64)),
        ("event_record", ctypes.CFUNCTYPE(i32, u64, u64)),
        ("event_synchronize", ctypes.CFUNCTYPE(i32, u64)),
        ("event_query", ctypes.CFUNCTYPE(i32, u64, P(i32))),
        ("event_elapsed_ms", ctypes.CFUNCTYPE(i32, u64, u64, P(ctypes.c_float))),
        (
            "launch",
            ctypes.CFUNCTYPE(
                i32, u64, P(ctypes.c_uint32), P(ctypes.c_uint32), ctypes.c_uint32, u64, P(ctypes.c_void_p)
            ),
        ),
        ("graph_launch", ctypes.CFUNCTYPE(i32, u64, u64)),
    ]


def table() -> CApi:
    capsule = c_api_capsule()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    name = get_name(capsule)
    assert name.endswith(b"._C_API")
    api = ctypes.cast(get(capsule, name), P(CApi)).contents
    assert api.version == 1
    assert api.size == ctypes.sizeof(CApi)
    return api


def test_capsule_layout_and_errors_without_a_driver() -> None:
    api = table()
    if gp.is_cuda_available():
        return
    ptr = u64()
    assert api.allocate(16, 0, ctypes.byref(ptr)) == 4  # PYGPUKIT_E_NOT_INITIALIZED
    assert b"driver has not been loaded" in api.last_error()
    assert api.allocate(16, 0, None) == 3  # PYGPUKIT_E_INVALID
    assert b"null output pointer" in api.last_error()
    assert api.memcpy_async(9, 0, 0, 0, 0) == 3


@pytest.mark.gpu
def test_a_second_consumer_shares_pool_streams_and_kernels() -> None:
    api = table()
    stream, event_a, event_b, ptr = u64(), u64(), u64(), u64()
    assert api.stream_create(0, ctypes.byref(stream)) == 0
    in_use_before, cached = u64(), u64()
    api.memory_in_use(ctypes.byref(in_use_before), ctypes.byref(cached))
    assert api.allocate(4096 * 4, stream.value, ctypes.byref(ptr)) == 0
    in_use = u64()
    api.memory_in_use(ctypes.byref(in_use), ctypes.byref(cached))
    assert in_use.value >= in_use_before.value + 4096 * 4  # the same pool as GPUArray
    host = np.arange(4096, dtype=np.float32)
    assert api.memcpy_async(0, ptr.value, host.ctypes.data, host.nbytes, stream.value) == 0
    kernel = gp.jit('extern "C" __global__ void twice(float* x, int n) { int i = blockIdx.x * blockDim.x + '
                    "threadIdx.x; if (i < n) x[i] *= 2.0f; }", "twice")  # fmt: skip
    function = kernel.load()[1]
    x, n = ctypes.c_uint64(ptr.value), ctypes.c_int32(4096)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(x), ctypes.addressof(n))
    grid, block = (ctypes.c_uint32 * 3)(16, 1, 1), (ctypes.c_uint32 * 3)(256, 1, 1)
    assert api.event_create(1, ctypes.byref(event_a)) == 0
    assert api.event_create(1, ctypes.byref(event_b)) == 0
    assert api.event_record(event_a.value, stream.value) == 0
    assert api.launch(function, grid, block, 0, stream.value, params) == 0
    assert api.event_record(event_b.value, stream.value) == 0
    out = np.empty_like(host)
    assert api.memcpy_async(1, out.ctypes.data, ptr.value, host.nbytes, stream.value) == 0
    assert api.stream_synchronize(stream.value) == 0
    np.testing.assert_array_equal(out, host * 2)
    ms = ctypes.c_float()
    assert api.event_elapsed_ms(event_a.value, event_b.value, ctypes.byref(ms)) == 0
    assert ms.value >= 0
    assert api.free(ptr.value) == 0
    assert api.free(ptr.value) == 3  # double free is refused
    assert b"double free" in api.last_error()
    for event in (event_a, event_b):
        assert api.event_destroy(event.value) == 0
    assert api.stream_destroy(stream.value) == 0
