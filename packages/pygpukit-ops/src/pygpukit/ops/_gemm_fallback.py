"""The GEMM used when cuBLASLt is absent or ``PYGPUKIT_NO_CUBLASLT=1``: a tiled CUDA-core kernel
(native/kernels/gemm/gemm_simt.cu) that takes any strides, batches, bias and activation."""

from __future__ import annotations

import struct
from typing import Any

from pygpukit.core.array import GPUArray
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.stream import Stream

from . import _kernels

__all__ = ["gemm_fallback", "name_expressions"]

_CTYPE = {"float64": "double", "float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
          "int8": "signed char", "int32": "int"}  # fmt: skip
_ACC = {"float64": "double", "int8": "int"}  # everything else accumulates in float
_ACTIVATION = {None: 0, "relu": 1, "gelu": 2}
_TILE = 64


def _expression(in_dtype: str, out_dtype: str) -> str:
    return f"pygpukit::gemm_simt<{_CTYPE[in_dtype]}, {_CTYPE[out_dtype]}, {_ACC.get(in_dtype, 'float')}>"


def name_expressions() -> list[str]:
    """Every instantiation gemm_simt.cu is used with (for the compile checks of `nox -s kernels`)."""
    pairs = [("float64", "float64"), ("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"),
             ("int8", "int32")]  # fmt: skip
    return [_expression(i, o) for i, o in pairs]


_FILE = "gemm/gemm_simt.cu"
_POINTER = Param("p", "void*", "pointer", "Q")
_PARAMS = [_POINTER, _POINTER, _POINTER, _POINTER, Param("shape", "GemmShape", "opaque", "")]


def _kernel(in_dtype: str, out_dtype: str) -> JITKernel:
    return _kernels.group(_FILE, name_expressions()).kernel(_expression(in_dtype, out_dtype), _PARAMS)


_kernels.register_enumerator(lambda: {_FILE: name_expressions()})


def _strides(x: GPUArray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def _batch_stride(x: GPUArray, batch: tuple[int, ...]) -> int | None:
    """One stride walking x's (broadcast) batch dims in row-major order, or None."""
    lead, strides = x.shape[:-2], _strides(x)[:-2]
    pad = len(batch) - len(lead)
    eff = [0] * pad + [0 if n == 1 else s for n, s in zip(lead, strides, strict=True)]
    stride = expected = None
    for size, s in zip(reversed(batch), reversed(eff), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride, expected = s, s * size
        elif s != expected:
            return None
        else:
            expected = s * size
    return stride or 0


def gemm_fallback(
    a: GPUArray,
    b: GPUArray,
    d: GPUArray,
    batch: tuple[int, ...],
    m: int,
    n: int,
    k: int,
    *,
    bias: GPUArray | None,
    activation: str | None,
    scales: Any,
    alpha: float,
    stream: Stream | None,
) -> None:
    if scales is not None:
        raise PyGPUkitError("fp8 GEMM needs cuBLASLt; there is no built-in fp8 kernel")
    count = 1
    for size in batch:
        count *= size
    sa, sb = _batch_stride(a, batch), _batch_stride(b, batch)
    if sa is None:
        a, sa = a.contiguous(stream=stream), None
    if sb is None:
        b, sb = b.contiguous(stream=stream), None
    if sa is None or sb is None:  # contiguous copies of a partial broadcast: walk batches one by one
        for index in range(count):
            pos = _unravel(index, batch)
            gemm_fallback(_at(a, pos), _at(b, pos), d.reshape(count, m, n)[index], (), m, n, k, bias=bias,
                          activation=activation, scales=None, alpha=alpha, stream=stream)  # fmt: skip
        return
    if a.dtype.name in ("float16", "bfloat16") and _tensor_cores(a, b, d, count, m, n, k, bias, activation, alpha,
                                                                 stream):  # fmt: skip
        return
    a_strides, b_strides = _strides(a), _strides(b)
    shape = struct.pack("@10q2id", m, n, k, a_strides[-2], a_strides[-1], sa, b_strides[-2], b_strides[-1], sb,
                        m * n, _ACTIVATION[activation], int(bias is not None), alpha)  # fmt: skip
    kernel = _kernel(a.dtype.name, d.dtype.name)
    grid = ((n + _TILE - 1) // _TILE, (m + _TILE - 1) // _TILE, max(count, 1))
    # Raw addresses: the kernel reads A and B through their strides, so views need no copy.
    kernel(a.device_ptr, b.device_ptr, d.device_ptr, bias.device_ptr if bias is not None else 0, shape, grid=grid,
           block=256, stream=stream)  # fmt: skip


def _tensor_cores(
    a: GPUArray,
    b: GPUArray,
    d: GPUArray,
    count: int,
    m: int,
    n: int,
    k: int,
    bias: GPUArray | None,
    activation: str | None,
    alpha: float,
    stream: Stream | None,
) -> bool:
    """float16/bfloat16 on the built-in tensor-core kernel (``_builtin_gemm.gemm_mma``), batch by batch;
    False when an operand's layout is one it does not take (then the CUDA-core kernel runs)."""
    from pygpukit.core.errors import ShapeError

    from . import _builtin_gemm

    act = {None: None, "relu": "relu", "gelu": "gelu_tanh"}[activation]
    batch = tuple(d.shape[:-2])
    out = d.reshape(max(count, 1), m, n)
    try:
        for index in range(max(count, 1)):
            pos = _unravel(index, batch) if batch else ()
            a2, b2 = _at(a, pos), _at(b, pos)
            _builtin_gemm.gemm_mma(a2.reshape(m, k) if a2.ndim != 2 else a2, b2.reshape(k, n) if b2.ndim != 2 else b2,
                                   out[index], alpha=alpha, bias=bias, activation=act, stream=stream)  # fmt: skip
    except ShapeError:
        if count > 1:
            raise  # some batches were written already; layouts do not change between batches
        return False
    return True


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return tuple(reversed(out))


def _at(x: GPUArray, pos: tuple[int, ...]) -> GPUArray:
    lead = x.ndim - 2
    pad = len(pos) - lead
    key = tuple(0 if x.shape[i] == 1 else pos[pad + i] for i in range(lead))
    return x[key] if key else x
