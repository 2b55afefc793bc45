"""``atan2(y, x)``: the angle of the point (x, y) in radians, in [-pi, pi], elementwise over two float
arrays of one shape and dtype (NumPy's and C's atan2, signed zeros included). Kernel:
native/kernels/nn/atan2.cu (float32, float16 and bfloat16 computed in float32 with ``atan2f``); the CPU
backend computes it in float64 with NumPy. Kokoro's generator takes the phase of an STFT with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ShapeError

from . import _cpu
from ._kernels import NAMESPACE, Groups, grid_for, group, register_enumerator
from ._layout import check_devices, is_cuda
from ._nn_common import FLOATS, check_overlap, float_input, host64, output, same_dtype

__all__ = ["atan2"]

_FILE = "nn/atan2.cu"
ATAN2_ARGS = KernelStruct("pygpukit::ops::phase::Atan2Args", _FILE, [
    ("y", "const void*"), ("x", "const void*"), ("out", "void*"), ("total", "long long"),
])  # fmt: skip


def _expressions(dtype: Any) -> list[str]:
    return [f"{NAMESPACE}phase::atan2_kernel<{dtype.ctype}>"]


def atan2(y: GPUArray, x: GPUArray, /, *, out: GPUArray | None = None) -> GPUArray:
    """``atan2(y, x)`` elementwise: ``y`` and ``x`` float arrays of the same shape and dtype (contiguous
    on the GPU); ``out`` may be ``y`` or ``x`` itself."""
    name = "atan2"
    y = float_input(name, "y", y)
    x = float_input(name, "x", x)
    same_dtype(name, "x", x, y.dtype)
    if x.shape != y.shape:
        raise ShapeError(f"{name}: y and x must have the same shape, got {y.shape} and {x.shape}")
    result = output(name, "out", out, y.shape, y.dtype)
    check_devices(name, [y, x, result])
    check_overlap(name, [("out", result)], [("y", y), ("x", x)], in_place=True)
    if result.size == 0:
        return result
    if not is_cuda():
        _cpu.store(result, np.arctan2(host64(y), host64(x)))
        return result
    if not (y.is_contiguous and x.is_contiguous and result.is_contiguous):
        raise ShapeError(f"{name}: y, x and out must be contiguous, got strides {y.strides}, {x.strides} and "
                         f"{result.strides}")  # fmt: skip
    args = ATAN2_ARGS.pack_flat(y.device_ptr, x.device_ptr, result.device_ptr, y.size)
    expression = _expressions(y.dtype)[0]
    kernel = group(_FILE, _expressions(y.dtype)).kernel(expression, [ATAN2_ARGS.param("args")])
    kernel(args, grid=grid_for(y.size), block=256)
    return result


def _enumerate() -> Groups:
    return {_FILE: [tuple(_expressions(d)) for d in FLOATS]}


register_enumerator(_enumerate)
