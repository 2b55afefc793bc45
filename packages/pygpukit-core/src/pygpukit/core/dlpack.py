"""DLPack exchange (``__dlpack__``, ``__dlpack_device__``, :func:`from_dlpack`) and import through the
CUDA Array Interface. Zero-copy on the CUDA backend in both directions; the producer's memory is
kept alive until the consumer lets go of it.

Implemented with ctypes over the DLPack C structures (the unversioned ``dltensor`` capsule, which every
current consumer accepts).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from .backend import backend_state
from .dtypes import DType, as_dtype
from .errors import DeviceError, DTypeError, PyGPUkitError
from .memory import ExternalBuffer
from .stream import Event, current_stream

__all__ = ["from_cuda_array_interface", "from_dlpack", "to_dlpack"]

KDL_CPU, KDL_CUDA = 1, 2
# DLPack dtype codes: int, uint, float, bfloat, bool, and the float8 codes of DLPack 1.1.
_CODES = {"i": 0, "u": 1, "f": 2}
_SPECIAL = {"bfloat16": (4, 16), "bool": (6, 8), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8)}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _ManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedTensor))
_ManagedTensor._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_api = ctypes.pythonapi
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The same two calls on a raw PyObject*: a capsule destructor runs while its capsule is being freed,
# so it must not make a Python reference to it.
_capsule_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# Exported tensors alive in some consumer: address of the managed tensor -> what it needs.
_exported: dict[int, tuple[Any, ...]] = {}
_lock = threading.Lock()


def _forget_exported(managed: Any) -> None:
    with _lock:
        _exported.pop(ctypes.addressof(managed.contents), None)


def _release_unconsumed(capsule: int) -> None:
    # Called for capsules no consumer took (still named "dltensor"): run the deleter ourselves.
    if _capsule_is_valid_raw(capsule, b"dltensor"):
        pointer = _capsule_pointer_raw(capsule, b"dltensor")
        _forget_exported(ctypes.cast(pointer, ctypes.POINTER(_ManagedTensor)))


# C callables (kept referenced for the life of the process).
_delete_exported: Any = _Deleter(_forget_exported)
_destroy_capsule: Any = _CapsuleDestructor(_release_unconsumed)


def _dl_dtype(dtype: DType) -> tuple[int, int]:
    if dtype.name in _SPECIAL:
        return _SPECIAL[dtype.name]
    return _CODES[dtype.kind], dtype.itemsize * 8


def _from_dl_dtype(code: int, bits: int, lanes: int) -> DType:
    if lanes != 1:
        raise DTypeError(f"DLPack tensors with {lanes} lanes are not supported")
    for name, spec in _SPECIAL.items():
        if spec == (code, bits):
            return as_dtype(name)
    kinds = {0: "int", 1: "uint", 2: "float"}
    if code in kinds:
        return as_dtype(f"{kinds[code]}{bits}")
    raise DTypeError(f"DLPack dtype code {code} with {bits} bits is not supported")


def _stream_value(stream: int) -> int:
    """Consumer stream per the DLPack convention: 1 legacy default, 2 per-thread, else a handle."""
    return {1: 0x1, 2: 0x2}.get(stream, stream)


def to_dlpack(array: Any, stream: int | None = None) -> Any:
    """The DLPack capsule of a GPUArray (what ``array.__dlpack__(stream=...)`` returns)."""
    state = backend_state()
    if state.name == "cuda" and stream is not None and stream != -1:
        # Make the consumer's stream wait for the work queued on ours.
        ours = current_stream().handle
        target = _stream_value(stream)
        if target != ours and not (target == 0x1 and ours == 0):
            event = Event(timing=False).record()
            state.native.stream_wait_event(target, event.handle)  # type: ignore[union-attr]
    ndim = array.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // array.itemsize for s in array.strides))
    managed = _ManagedTensor()
    code, bits = _dl_dtype(array.dtype)
    device = (KDL_CUDA, array.buffer.device) if array.on_gpu else (KDL_CPU, 0)
    managed.dl_tensor = _Tensor(
        array.device_ptr if array.size else 0, _Device(*device), ndim, _DataType(code, bits, 1), shape, strides, 0
    )
    managed.deleter = _delete_exported
    address = ctypes.addressof(managed)
    with _lock:
        _exported[address] = (managed, shape, strides, array)
    return _api.PyCapsule_New(address, b"dltensor", _destroy_capsule)


def dlpack_device(array: Any) -> tuple[int, int]:
    return (KDL_CUDA, array.buffer.device) if array.on_gpu else (KDL_CPU, 0)


def from_dlpack(obj: Any) -> Any:
    """A GPUArray viewing the memory of any DLPack producer on the current device (no copy). On the CPU
    backend host tensors are copied in."""
    from .array import GPUArray, _contiguous_strides, from_numpy

    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{type(obj).__name__} does not support DLPack (__dlpack__)")
    device_type, device_id = obj.__dlpack_device__()
    state = backend_state()
    if state.name != "cuda":
        if device_type != KDL_CPU:
            raise DeviceError("the CPU simulation backend can only import host (kDLCPU) tensors")
        return from_numpy(np.from_dlpack(obj))
    if device_type != KDL_CUDA:
        raise DeviceError(f"from_dlpack needs a CUDA tensor (device type {KDL_CUDA}), got device type {device_type}")
    if device_id != int(state.native.get_device()):  # type: ignore[union-attr]
        raise DeviceError(f"the tensor lives on cuda:{device_id}; make that device current first")
    handle = current_stream().handle
    capsule = obj.__dlpack__(stream=handle if handle else 1)
    pointer = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = ctypes.cast(pointer, ctypes.POINTER(_ManagedTensor))
    tensor = managed.contents.dl_tensor
    dtype = _from_dl_dtype(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    explicit = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
    strides = explicit or _contiguous_strides(shape)
    if any(s < 0 for s in strides):
        raise PyGPUkitError("DLPack tensors with negative strides are not supported")
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) if all(shape) else 0
    base = (tensor.data or 0) + tensor.byte_offset
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    deleter = managed.contents.deleter

    def release(m: Any = managed, d: Any = deleter) -> None:
        if d:
            d(m)

    buffer = ExternalBuffer(base, span * dtype.itemsize, device_id, owner=obj, release=release)
    return GPUArray(buffer, shape, dtype, strides, 0)  # type: ignore[arg-type]


def from_cuda_array_interface(obj: Any) -> Any:
    """A GPUArray viewing memory described by ``__cuda_array_interface__`` (no copy)."""
    from .array import GPUArray, _contiguous_strides

    state = backend_state()
    if state.name != "cuda":
        raise DeviceError("importing device memory needs the CUDA backend")
    cai = obj.__cuda_array_interface__
    dtype = as_dtype(np.dtype(cai["typestr"]))
    shape = tuple(int(s) for s in cai["shape"])
    if cai.get("strides") is None:
        strides = _contiguous_strides(shape)
    else:
        if any(s % dtype.itemsize for s in cai["strides"]):
            raise PyGPUkitError(f"strides {cai['strides']} are not multiples of the item size {dtype.itemsize}")
        strides = tuple(int(s) // dtype.itemsize for s in cai["strides"])
    if any(s < 0 for s in strides):
        raise PyGPUkitError("negative strides are not supported")
    producer_stream = cai.get("stream")
    if producer_stream not in (None, 0):
        event = Event(timing=False)
        state.native.event_record(event.handle, _stream_value(producer_stream))  # type: ignore[union-attr]
        current_stream().wait_event(event)
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) if all(shape) else 0
    device = int(state.native.get_device())  # type: ignore[union-attr]
    buffer = ExternalBuffer(int(cai["data"][0]), span * dtype.itemsize, device, owner=obj)
    return GPUArray(buffer, shape, dtype, strides, 0)  # type: ignore[arg-type]
