"""What the GEMM family's modules share: the one plan cache, operand layouts, argument checks, the
activation codes, the device properties the routes are chosen by, and the epilogue in NumPy.

Layouts are described in elements. A 2-D operand is *row-major* with leading dimension ``ld`` when it
has unit stride along its rows and a row stride of at least the row length, *column-major* (the
transpose of a row-major array) in the mirror case; the kernels and cuBLASLt take both without a copy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.codes import activation_code
from pygpukit.core.compiler import nvrtc_status
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, bfloat16, float16
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.plans import PlanCache

__all__ = [
    "HALF",
    "INT32_MAX",
    "PLANS",
    "DeviceProps",
    "apply_activation",
    "array_key",
    "batch_stride",
    "check_activation",
    "check_bias",
    "device_props",
    "element_strides",
    "matrix_layout",
    "require_array",
    "row_major_ld",
    "rows_layout",
    "swap_last",
]

# The one launch-plan cache of the GEMM family: matmul, linear, scaled_matmul, gemv and gemm_mma
# keep their validated route and prepared launch here per call shape (operands' shapes, strides,
# dtypes and devices, and the options). cuBLASLt's own descriptors and algorithms stay in the native
# plan store (native/runtime/gemm.cpp); the prepared launch of a cuBLASLt route holds one of them.
PLANS: PlanCache[Any] = PlanCache("ops.gemm")

HALF = (float16, bfloat16)
INT32_MAX = 2**31 - 1


def array_key(x: GPUArray) -> tuple[Any, ...]:
    """What a plan depends on of an array: shape, strides, dtype, device (never its address)."""
    return (x._shape, x._strides, x._dtype, x._buffer.device)


def element_strides(x: GPUArray) -> tuple[int, ...]:
    return x._strides


def swap_last(x: GPUArray) -> GPUArray:
    """A view with the last two axes exchanged."""
    order = list(range(x.ndim))
    order[-1], order[-2] = order[-2], order[-1]
    return x.transpose(order)


def matrix_layout(rows: int, cols: int, s0: int, s1: int) -> tuple[str, int] | None:
    """('row', ld) when a rows x cols matrix with element strides (s0, s1) is row-major with leading
    dimension ld, ('col', ld) when column-major, None when neither (then it needs a copy)."""
    if s1 == 1 or cols == 1:
        ld = s0 if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return "row", ld
    if s0 == 1 or rows == 1:
        ld = s1 if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return "col", ld
    return None


def batch_stride(batch: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """One element stride that walks the (row-major) batch index over ``batch`` with these per-dim
    strides (0 for broadcast dims), or None when no single stride does (a partial broadcast)."""
    stride: int | None = None
    expected: int | None = None
    for size, s in zip(reversed(batch), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride, expected = s, s * size
            continue
        if s != expected:
            return None
        expected = s * size
    return 0 if stride is None else stride


def require_array(value: Any, name: str, op: str) -> GPUArray:
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{op}: {name} must be a GPUArray, got {type(value).__name__}")
    return value


def rows_layout(array: GPUArray) -> tuple[bool, int] | None:
    """How a 2-D operand is stored for the built-in kernels: (column-major?, leading dimension), or
    None when neither dimension has unit stride with a leading stride of at least the row length."""
    rows, cols = array._shape
    s0, s1 = array._strides
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return False, s0 if rows > 1 else max(cols, 1)
    if (rows <= 1 or s0 == 1) and (cols <= 1 or s1 >= max(rows, 1)):
        return True, s1 if cols > 1 else max(rows, 1)
    return None


def row_major_ld(array: GPUArray) -> int | None:
    """The leading dimension of a row-major 2-D operand, None for any other layout."""
    rows, cols = array._shape
    s0, s1 = array._strides
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return s0 if rows > 1 else max(cols, 1)
    return None


def check_bias(bias: Any, n: int, dtype: DType, op: str, out_dtype: DType) -> GPUArray | None:
    """A bias of shape (n,), of ``out_dtype`` or ``dtype``, contiguous; the typed error otherwise."""
    if bias is None:
        return None
    array = require_array(bias, "bias", op)
    if array.shape != (n,):
        raise ShapeError(f"{op}: bias has shape {array.shape}; expected ({n},) (one value per output column)")
    if array.dtype not in (out_dtype, dtype):
        raise DTypeError(f"{op}: bias has dtype {array.dtype}; expected {out_dtype}" +
                         (f" or {dtype}" if dtype != out_dtype else ""))  # fmt: skip
    if not array.is_contiguous:
        raise ShapeError(f"{op}: bias (strides {array.strides}) must be contiguous")
    return array


def check_activation(activation: Any, op: str) -> int:
    """The code (pygpukit.core.codes.ACTIVATION_CODES) of None, "relu", "gelu" (erf), "gelu_tanh" or
    "silu"; any case. ValueError naming the op and the choices otherwise."""
    return activation_code(activation.lower() if isinstance(activation, str) else activation, op)


_SQRT_HALF = 1.0 / math.sqrt(2.0)


def apply_activation(values: np.ndarray[Any, Any], code: int) -> np.ndarray[Any, Any]:
    """The epilogue activation ``code`` in float64 NumPy (the CPU simulation backend)."""
    from pygpukit.core.codes import ACTIVATION_CODES as CODES

    if code == CODES["relu"]:
        result = np.maximum(values, 0.0)
    elif code == CODES["gelu_tanh"]:
        result = 0.5 * values * (1.0 + np.tanh(0.7978845608028654 * (values + 0.044715 * values**3)))
    elif code == CODES["silu"]:
        with np.errstate(over="ignore"):
            result = values / (1.0 + np.exp(-values))
    elif code == CODES["gelu"]:
        from .._cpu import erf

        result = 0.5 * values * (1.0 + erf(values * _SQRT_HALF))
    else:
        result = values
    return np.asarray(result, dtype=np.float64)


@dataclass(frozen=True)
class DeviceProps:
    """What the routes and tiles are chosen by, per device."""

    capability: tuple[int, int]
    sms: int
    shared_per_block: int
    shared_per_sm: int
    wgmma: bool  # SM 90 and an NVRTC that targets sm_90a
    clusters: bool  # thread-block clusters (SM 90 and newer)


@functools.cache
def device_props(ordinal: int) -> DeviceProps:
    """Cached: reading the device properties costs a fraction of a millisecond."""
    info = get_device_info(ordinal)
    capability = (int(info.compute_capability[0]), int(info.compute_capability[1]))
    wgmma = capability == (9, 0) and 90 in nvrtc_status()["supported_archs"]
    return DeviceProps(capability, int(info.multiprocessor_count), int(info.max_shared_memory_per_block_optin),
                       int(info.max_shared_memory_per_multiprocessor), wgmma, capability >= (9, 0))  # fmt: skip
