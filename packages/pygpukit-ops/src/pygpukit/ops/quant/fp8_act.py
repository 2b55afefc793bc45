"""Dynamic FP8 e4m3 quantization of activations on the device: the input side of W8A8 GEMMs (cuBLASLt
scaled matmul).

:func:`quantize_fp8` turns x (M, K) of float32, float16 or bfloat16 into ``q`` float8_e4m3fn (M, K)
(contiguous) and float32 scales with ``x ~= q * scale``, at one of three granularities:

- ``"block"``: one scale per row and group of 128 columns (the last group may be shorter), the
  activation scheme of DeepSeek-V3 / HF fp8 "dynamic" checkpoints. The scales come back as an (M,
  ceil(K / 128)) array that is the transpose view (strides (1, M) elements) of a contiguous (ceil(K /
  128), M) array: M-major, the layout cuBLASLt's block-scaled A operand reads;
- ``"row"``: one scale per row, shape (M,);
- ``"tensor"``: one scale, shape (1,).

Per group: amax = max |x| with NaN ignored; scale = amax / 448 in float32 (round to nearest), or exactly
1 where that quotient is 0 (an all-zero group, or amax below about 2^-141 where it underflows); q =
e4m3(x / scale) with the IEEE float32 quotient, rounded to nearest even and saturated to +-448; NaN
stays NaN (always the canonical code 0x7f, as CUDA converts). An infinite x makes its group's scale
infinite: the finite values of the group become 0 and the infinite ones NaN.

The kernels are native/kernels/quant/fp8_act.cu: one warp per (row, group) for ``"block"``, one block
per row for ``"row"``, and for ``"tensor"`` a grid-wide amax (atomicMax on the float bits into a slot
zeroed on the stream) followed by the quantize kernel. Everything runs on ``stream`` (the current stream
by default), without a synchronization or a host copy. The CPU simulation backend computes the same
formulas in NumPy (float32 quotient, ml_dtypes' cast after clipping to +-448), bitwise equal to the
kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, full, zeros
from pygpukit.core.dtypes import DType, float8_e4m3fn, float32, uint32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, code_param, grid_for, group, pointer, register_enumerator, size_param
from .._layout import check_devices, is_cuda
from ..gemm._base import row_major_ld
from . import _linear

__all__ = ["FP8_ACT_BLOCK", "FP8_ACT_GRANULARITIES", "quantize_fp8"]

Array = np.ndarray[Any, Any]
_FILE = "quant/fp8_act.cu"
FP8_ACT_BLOCK = 128
"""The columns of a group of the ``"block"`` granularity (the only block size with a kernel)."""
FP8_ACT_GRANULARITIES = ("block", "row", "tensor")
"""The granularities :func:`quantize_fp8` takes."""
_E4M3_MAX = np.float32(448.0)
_E4M3_NAN = 0x7F
_THREADS = 256  # threads per block of every fp8_act kernel (kThreads; _linear.launch_on's block)
_WARPS = _THREADS // 32
_MAX_BLOCKS = 1 << 20  # grid cap of the block and row kernels (both loop over what a grid leaves)
_BLOCK_PARAMS = [pointer("x"), pointer("q"), pointer("s"), c_param("rows", "int"), c_param("k", "int"),
                 size_param("ldx"), size_param("lds"), code_param("vector")]  # fmt: skip
_ROW_PARAMS = [pointer("x"), pointer("q"), pointer("s"), c_param("rows", "int"), c_param("k", "int"),
               size_param("ldx"), code_param("vector")]  # fmt: skip
_AMAX_PARAMS = [pointer("x"), pointer("amax"), c_param("rows", "int"), c_param("k", "int"), size_param("ldx"),
                code_param("vector")]  # fmt: skip
_TENSOR_PARAMS = [pointer("x"), pointer("q"), pointer("s"), pointer("amax"), c_param("rows", "int"),
                  c_param("k", "int"), size_param("ldx"), code_param("vector")]  # fmt: skip
_PARAMS = {"block": _BLOCK_PARAMS, "row": _ROW_PARAMS, "amax": _AMAX_PARAMS, "tensor": _TENSOR_PARAMS}
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.fp8_act")
_INT_MAX = 2**31 - 1


def _expression(kind: str, dtype: DType) -> str:
    return f"{NAMESPACE}fp8act::fp8_act_{kind}<{dtype.ctype}>"


def _expressions(dtype: DType) -> tuple[str, ...]:
    return tuple(_expression(kind, dtype) for kind in _PARAMS)


def _kernel(kind: str, dtype: DType) -> JITKernel:
    expression = _expression(kind, dtype)
    return _linear.cached_kernel(
        _KERNELS, (expression,), lambda: group(_FILE, _expressions(dtype)).kernel(expression, _PARAMS[kind])
    )


def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _linear.DTYPES]}


register_enumerator(_enumerate)


# -- the host computation (CPU simulation backend) ---------------------------------------------------
def _scales(amax: Array) -> Array:
    """float32 amax -> float32 scales: amax / 448 rounded once, 1 where that is 0."""
    scale = (amax / _E4M3_MAX).astype(np.float32)
    result: Array = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    return result


def _e4m3(values: Array) -> Array:
    """float32 values -> float8_e4m3fn: clipped to +-448, ml_dtypes' round to nearest even, NaN as the
    canonical 0x7f (CUDA's conversion; ml_dtypes keeps a negative NaN's sign)."""
    with np.errstate(invalid="ignore"):
        q = np.clip(values, -_E4M3_MAX, _E4M3_MAX).astype(float8_e4m3fn.numpy)
    bits = q.view(np.uint8)
    bits[np.isnan(values)] = _E4M3_NAN
    return q


def host_quantize(x: Array, granularity: str, block: int = FP8_ACT_BLOCK) -> tuple[Array, Array]:
    """The quantization of the 2-D array ``x`` (float32, float16 or bfloat16 on the host) as NumPy arrays
    (q float8_e4m3fn (M, K), scale float32: ``"tensor"`` (1,), ``"row"`` (M,), ``"block"`` (M, ceil(K /
    block)) row-major): the formulas of the kernels, bitwise."""
    xf = np.asarray(x).astype(np.float32)
    m, k = xf.shape
    mag = np.abs(xf)
    mag[np.isnan(mag)] = 0  # NaN ignored, as fmaxf does
    if granularity == "tensor":
        scale = _scales(np.array([mag.max() if mag.size else 0], np.float32))
        per_element = np.full((m, k), scale[0], np.float32)
    elif granularity == "row":
        scale = _scales(mag.max(axis=1) if k else np.zeros(m, np.float32))
        per_element = np.repeat(scale[:, None], k, axis=1)
    else:
        groups = -(-k // block)
        padded = np.zeros((m, groups * block), np.float32)
        padded[:, :k] = mag
        scale = _scales(padded.reshape(m, groups, block).max(axis=2) if groups else np.zeros((m, 0), np.float32))
        per_element = np.repeat(scale, block, axis=1)[:, :k]
    with np.errstate(invalid="ignore", divide="ignore"):
        quotient = (xf / per_element).astype(np.float32)
    return _e4m3(quotient), scale


# -- the op ------------------------------------------------------------------------------------------
def _check_block(block: Any) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise ArgumentError(f"quantize_fp8: block must be an int, got {type(block).__name__}")
    if int(block) != FP8_ACT_BLOCK:
        raise ArgumentError(f"quantize_fp8: block must be {FP8_ACT_BLOCK} (the only group size with a kernel), "
                            f"got {block}")  # fmt: skip
    return int(block)


def _launch(kind: str, x: GPUArray, args: tuple[Any, ...], grid: int, stream: Stream | None) -> None:
    _linear.launch_on(_kernel(kind, x.dtype), args, grid, stream)


def quantize_fp8(x: GPUArray, granularity: str = "block", *, block: int = FP8_ACT_BLOCK,
                 stream: Stream | None = None) -> tuple[GPUArray, GPUArray]:  # fmt: skip
    """Dynamic FP8 e4m3 quantization of the activations ``x``: returns ``(q, scale)`` with ``q``
    float8_e4m3fn of x's shape (contiguous) and ``scale`` float32, ``x ~= q * scale`` per group.

    ``x``: a float32, float16 or bfloat16 GPUArray, 2-D (M, K) or 1-D (K,) (one row: q keeps the 1-D
    shape, the scales are those of (1, K)). A 2-D x is read in place when its rows have unit stride
    (any leading dimension, e.g. a column slice of a wider array); any other layout is first copied to
    a contiguous array on the device.

    ``granularity``:

    - ``"block"`` (default): one scale per row and group of ``block`` = 128 columns (the last group
      may be shorter); ``scale`` has shape (M, ceil(K / 128)) and strides (1, M) elements: it is
      ``s.T`` of a contiguous (ceil(K / 128), M) array ``s`` (M-major scales);
    - ``"row"``: one scale per row, shape (M,);
    - ``"tensor"``: one scale for the whole tensor, shape (1,).

    Per group: amax = max |x| (NaN ignored), scale = amax / 448 in float32, or 1 where that is 0 (an
    all-zero group); ``q = e4m3(x / scale)`` with the IEEE float32 quotient, rounded to nearest even,
    saturated to +-448, NaN staying NaN (code 0x7f). Runs on ``stream`` (default: the current stream)
    without synchronizing. Raises :class:`DTypeError` for a non-GPUArray or another dtype,
    :class:`ShapeError` for another rank or a dimension past 2^31 - 1, :class:`ArgumentError` for an
    unknown granularity or a block other than 128."""
    op = "quantize_fp8"
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{op}: x must be a GPUArray, got {type(x).__name__}")
    if x.dtype not in _linear.DTYPES:
        raise DTypeError(f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise ShapeError(f"{op}: x must be 1-D (K,) or 2-D (M, K), got shape {x.shape}")
    if not isinstance(granularity, str) or granularity not in FP8_ACT_GRANULARITIES:
        raise ArgumentError(f"{op}: granularity must be one of {', '.join(map(repr, FP8_ACT_GRANULARITIES))}, "
                            f"got {granularity!r}")  # fmt: skip
    if granularity == "block":
        block = _check_block(block)
    check_devices(op, [x])
    x2 = x[None] if x.ndim == 1 else x
    m, k = int(x2.shape[0]), int(x2.shape[1])
    if m > _INT_MAX or k > _INT_MAX:
        raise ShapeError(f"{op}: x of shape {x.shape} has a dimension past 2^31 - 1")
    ldx = row_major_ld(x2)
    if ldx is None:
        x2 = x2.contiguous(stream=stream)
        ldx = max(k, 1)

    q = empty(x.shape, float8_e4m3fn, stream=stream)
    groups = -(-k // block) if granularity == "block" else 0
    shape = (groups, m) if granularity == "block" else (m,) if granularity == "row" else (1,)
    cuda = is_cuda()
    if cuda and (m == 0 or k == 0):  # nothing to read: every scale is 1 (a fill kernel)
        scale = full(shape, 1.0, float32, stream=stream)
    else:
        scale = empty(shape, float32, stream=stream)
    result = (q, scale.T if granularity == "block" else scale)
    if not cuda:
        values, host_scale = host_quantize(_cpu.host(x2), granularity, block)
        _cpu.store(q, values.reshape(x.shape))
        _cpu.store(scale, host_scale.T if granularity == "block" else host_scale)
        return result
    if m == 0 or k == 0:
        return result

    x_ptr = x2.device_ptr
    vector = int(x_ptr % (4 * x2.itemsize) == 0 and ldx % 4 == 0 and k % 4 == 0)
    if granularity == "block":
        grid = min(-(-(m * groups) // _WARPS), _MAX_BLOCKS)  # a warp per (row, group)
        # scale (G, M) contiguous: leading dimension M (the kernel takes any lds >= M)
        _launch("block", x2, (x_ptr, q.device_ptr, scale.device_ptr, m, k, ldx, m, vector), grid, stream)
    elif granularity == "row":
        _launch("row", x2, (x_ptr, q.device_ptr, scale.device_ptr, m, k, ldx, vector), min(m, _MAX_BLOCKS), stream)
    else:
        amax = zeros((1,), uint32, stream=stream)  # a memset on the stream, before the amax kernel
        grid = grid_for(m * -(-k // 4), _THREADS)  # a thread per 4 elements, grid-stride
        _launch("amax", x2, (x_ptr, amax.device_ptr, m, k, ldx, vector), grid, stream)
        _launch("tensor", x2, (x_ptr, q.device_ptr, scale.device_ptr, amax.device_ptr, m, k, ldx, vector), grid,
                stream)  # fmt: skip
    return result
