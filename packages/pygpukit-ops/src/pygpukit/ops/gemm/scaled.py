"""The scales of :func:`pygpukit.ops.scaled_matmul` (fp8 x fp8 through cuBLASLt) beyond one scalar
each, and its fp8 output.

For ``d = (a * scale_a) @ (b * scale_b)`` with a (M, K) row-major and b (K, N) column-major (``w.T``
of a contiguous (N, K) weight), the scales come in three kinds, recognised by their shapes:

- ``"tensor"``: one float32 each (shape () or (1,));
- ``"channel"``: scale_a (M,) one per row of a (per token) and scale_b (N,) one per column of b (per
  output channel of w): cuBLASLt's OUTER_VEC_32F;
- ``"block"``: DeepSeek-V3 / HF "fp8" checkpoints' scales: scale_a (M, ceil(K / 128)) one per row and
  128 elements of K (VEC128_32F), stored M-major: the transpose view ``.T`` of a contiguous
  (ceil(K / 128), M) array, as :func:`pygpukit.ops.quant.quantize_fp8` makes it; scale_b
  (ceil(K / 128), ceil(N / 128)) one per 128x128 block of b (BLK128x128_32F), stored as the transpose
  view of a contiguous (ceil(N / 128), R) array whose first ceil(K / 128) columns are used, R =
  ceil(K / 128) rounded up to a multiple of 4 (for a weight w (N, K) with scale (ceil(N / 128),
  ceil(K / 128)): that array's ``.T`` when ceil(K / 128) is a multiple of 4, else a padded copy:
  :func:`block_weight_scale`).

Both operands take the same kind. An fp8 result (``out_dtype`` float8_e4m3fn) is
``saturate(scale_out * product)`` with ``scale_out`` a float32 scalar; it takes "tensor" scales and no
bias. Block scales need a Hopper GPU (compute capability 9.x) and cuBLASLt 12.9 or newer; where
cuBLASLt has no algorithm the call raises :class:`PyGPUkitError` saying so.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ml_dtypes
import numpy as np

from pygpukit.core.array import GPUArray, full
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from .. import _kernels
from .._layout import is_cuda

__all__ = [
    "BLOCK",
    "MODES",
    "block_weight_scale",
    "device_fallback",
    "host_scaled_matmul",
    "native_unsupported",
    "scale_kind",
]

BLOCK = 128
# cublasLtMatmulMatrixScale_t of each kind for (a, b).
MODES = {"tensor": (0, 0), "channel": (3, 3), "block": (4, 5)}


def _padded_kb(k: int) -> int:
    kb = -(-k // BLOCK)
    return -(-kb // 4) * 4


def _is_scalar(s: GPUArray) -> bool:
    return s.size == 1 and s.ndim <= 1


def _elements(s: GPUArray) -> tuple[int, ...]:
    """Strides in elements."""
    return tuple(st // s.itemsize for st in s.strides)


def scale_kind(a: GPUArray, b: GPUArray, scale_a: Any, scale_b: Any) -> str:
    """ "tensor", "channel" or "block" for these scales of a (M, K) @ b (K, N), or ShapeError/DTypeError
    naming what does not fit."""
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, GPUArray) or s.dtype.name != "float32":
            raise DTypeError(f"scaled_matmul: {name} must be a float32 GPUArray, got "
                             f"{getattr(s, 'dtype', type(s).__name__)}")  # fmt: skip
    (m, k), n = a.shape, b.shape[1]
    kb = -(-k // BLOCK)
    if _is_scalar(scale_a) and _is_scalar(scale_b):
        return "tensor"
    if scale_a.shape == (m,) and scale_b.shape == (n,):
        for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if not s.is_contiguous:
                raise ShapeError(f"scaled_matmul: the per-channel {name} must be contiguous")
        return "channel"
    if scale_a.shape == (m, kb) and scale_b.shape == (kb, -(-n // BLOCK)):
        st_a, st_b = _elements(scale_a), _elements(scale_b)
        if (m > 1 and st_a[0] != 1) or (kb > 1 and st_a[1] != m):
            raise ShapeError(
                f"scaled_matmul: block scale_a (M, ceil(K/128)) = {scale_a.shape} must be stored M-major (strides "
                f"(1, {m}), the .T of a contiguous ({kb}, {m}) array), got strides {st_a}"
            )
        rk = _padded_kb(k)
        if (kb > 1 and st_b[0] != 1) or (scale_b.shape[1] > 1 and st_b[1] != rk):
            raise ShapeError(
                f"scaled_matmul: block scale_b (ceil(K/128), ceil(N/128)) = {scale_b.shape} must be the .T of a "
                f"contiguous (ceil(N/128), {rk}) array (strides (1, {rk}); block_weight_scale makes it), got strides "
                f"{st_b}"
            )
        return "block"
    raise ShapeError(
        f"scaled_matmul: scales {tuple(scale_a.shape)} and {tuple(scale_b.shape)} fit none of the kinds for "
        f"({m}, {k}) @ ({k}, {n}): one scalar each, ({m},) and ({n},) per channel, or ({m}, {kb}) and "
        f"({kb}, {-(-n // BLOCK)}) per 128-block"
    )


def block_weight_scale(scale: GPUArray) -> GPUArray:
    """The scale_b of :func:`scaled_matmul` for ``w.T``, from a weight's block scale (ceil(N / 128),
    ceil(K / 128)) contiguous float32 (a BlockFP8Tensor's ``scale``, HF's ``weight_scale_inv``):
    its transpose view when ceil(K / 128) is a multiple of 4, else a copy padded to that."""
    if scale.dtype.name != "float32" or scale.ndim != 2 or not scale.is_contiguous:
        raise ShapeError(f"block_weight_scale: scale must be a contiguous 2-D float32 array, got {scale.dtype} "
                         f"{scale.shape}")  # fmt: skip
    nb, kb = scale.shape
    rk = -(-kb // 4) * 4
    if rk == kb:
        return scale.T
    from .. import shape as _shape

    padded = _shape.concatenate([scale, full((nb, rk - kb), 1.0, scale.dtype)], axis=1)
    return padded[:, :kb].T


def _expand(s: np.ndarray[Any, Any], rows: int, cols: int) -> np.ndarray[Any, Any]:
    return np.repeat(np.repeat(s, BLOCK, axis=0)[:rows], BLOCK, axis=1)[:, :cols]


def host_scaled_matmul(a: GPUArray, b: GPUArray, scale_a: GPUArray, scale_b: GPUArray, kind: str,
                       bias: GPUArray | None, d: GPUArray, scale_out: GPUArray | None) -> None:  # fmt: skip
    """The CPU simulation: the product in float64 from the stored values and expanded scales."""
    ha = a.to_numpy().astype(np.float64)
    hb = b.to_numpy().astype(np.float64)
    sa = scale_a.to_numpy().astype(np.float64)
    sb = scale_b.to_numpy().astype(np.float64)
    k, n = ha.shape[1], hb.shape[1]
    if kind == "tensor":
        ha, hb = ha * float(sa.reshape(-1)[0]), hb * float(sb.reshape(-1)[0])
    elif kind == "channel":
        ha, hb = ha * sa[:, None], hb * sb[None, :]
    else:
        ha = ha * np.repeat(sa, BLOCK, axis=1)[:, :k]
        hb = hb * _expand(sb, k, n)
    result = ha @ hb + (bias.to_numpy().astype(np.float64) if bias is not None else 0.0)
    if scale_out is not None:
        limit = float(ml_dtypes.finfo(d.dtype.numpy).max)  # type: ignore[no-untyped-call]
        result = np.clip(result * float(scale_out.to_numpy().reshape(-1)[0]), -limit, limit)
    d.copy_(np.ascontiguousarray(result.astype(d.dtype.numpy)))


# (kind, device) pairs whose scale mode this process's cuBLASLt refused (no algorithm, or the launch
# failed): scaled_matmul then takes device_fallback at once.
_REFUSED: set[tuple[str, int]] = set()


def native_unsupported(kind: str, device: int) -> bool:
    """Whether cuBLASLt refused ``kind`` scales on ``device`` in this process (cuBLASLt before 12.9
    has neither outer-vector nor 128-block scaling)."""
    return (kind, device) in _REFUSED


def refuse(kind: str, device: int) -> None:
    _REFUSED.add((kind, device))


def _expanded(scale: GPUArray, index: GPUArray) -> GPUArray:
    """Rows of the contiguous (R, C) ``scale`` gathered by ``index`` (L,): (L, C), on the device."""
    from ..embeddings import embedding

    return embedding(scale if scale.is_contiguous else scale.contiguous(), index)


_EPILOGUE_FILE = "gemm/scale_epilogue.cu"
_EPILOGUE_DTYPES = (float32, float16, bfloat16)
_EPILOGUE_PARAMS = [_kernels.pointer("acc"), _kernels.pointer("sa"), _kernels.pointer("sb"), _kernels.pointer("bias"),
                    _kernels.pointer("d"), _kernels.c_param("m", "int"), _kernels.c_param("n", "int")]  # fmt: skip
_EPILOGUES: PlanCache[JITKernel] = PlanCache("ops.scaled_epilogue")
_UNIT: PlanCache[GPUArray] = PlanCache("ops.scaled_unit_scale")  # a float32 1 per device (dies with a reset)


def _epilogue_expression(dtype: DType) -> str:
    return f"{_kernels.NAMESPACE}scaled::channel_epilogue<{dtype.ctype}>"


def _epilogue_kernel(dtype: DType) -> JITKernel:
    key = (dtype, thread_device())
    kernel = _EPILOGUES.get(key)
    if kernel is None:
        group = _kernels.group(_EPILOGUE_FILE, tuple(_epilogue_expression(t) for t in _EPILOGUE_DTYPES))
        kernel = _EPILOGUES.put(key, group.kernel(_epilogue_expression(dtype), _EPILOGUE_PARAMS))
    return kernel


_kernels.register_enumerator(lambda: {_EPILOGUE_FILE: [tuple(_epilogue_expression(t) for t in _EPILOGUE_DTYPES)]})


def _unit_scale() -> GPUArray:
    key = (thread_device(),)
    one = _UNIT.get(key)
    if one is None:
        one = _UNIT.put(key, full((), 1.0, float32))
    return one


def device_fallback(a: GPUArray, b: GPUArray, scale_a: GPUArray, scale_b: GPUArray, kind: str, bias: GPUArray | None,
                    d: GPUArray, stream: Any, scale_out: GPUArray | None = None) -> None:  # fmt: skip
    """scaled_matmul's result where cuBLASLt lacks the scale mode or the fp8 output, on the device and on
    ``stream`` (the current stream when None): per tensor with an fp8 result the float32 product, times
    ``scale_out``, saturated and cast; per channel the fp8 product with unit scales in float32 (cuBLASLt's
    per-tensor path, exact fp8 products), then one kernel applying both scale vectors and the bias and
    rounding into ``d`` (native/kernels/gemm/scale_epilogue.cu); per 128-block both operands expanded to
    float32 with their block scales (gathered on the device) and the float32 GEMM. Slower than the fused
    scaling, the same value up to float32 rounding order."""
    from pygpukit.core.array import from_numpy

    from ..elementwise import clamp
    from .api import matmul, scaled_matmul

    m, k = a.shape
    n = b.shape[1]
    with stream if stream is not None else contextlib.nullcontext():
        if kind == "tensor":
            assert scale_out is not None
            limit = float(ml_dtypes.finfo(d.dtype.numpy).max)  # type: ignore[no-untyped-call]
            product = scaled_matmul(a, b, scale_a, scale_b, out_dtype="float32")
            d.copy_(clamp(product * scale_out.reshape(1, 1), -limit, limit).astype(d.dtype))
            return
        if kind == "channel":
            one = _unit_scale()
            product = scaled_matmul(a, b, one, one, out_dtype="float32")
            if not is_cuda():  # the CPU simulation: the same float32 steps as the kernel, as array ops
                result = product * scale_a.reshape(m, 1) * scale_b.reshape(1, n)
                d.copy_((result if bias is None else result + bias.astype(float32)).astype(d.dtype))
                return
            args = (product.device_ptr, scale_a.device_ptr, scale_b.device_ptr,
                    0 if bias is None else bias.device_ptr, d.device_ptr, m, n)  # fmt: skip
            quads = m * -(-n // 4)
            _kernels.launch(_epilogue_kernel(d.dtype), args, _kernels.grid_for(quads, 256), 256)
            return
        blocks = from_numpy(np.arange(k, dtype=np.int32) // BLOCK)  # column c of K is in block c // 128
        sa = _expanded(scale_a.T, blocks).T  # (M, K): scale_a is the .T of a contiguous (kb, M)
        sb_rows = _expanded(scale_b.T, from_numpy(np.arange(n, dtype=np.int32) // BLOCK))  # (N, kb)
        sb = _expanded(sb_rows.T, blocks)  # (K, N)
        result = matmul(a.astype(float32) * sa, b.astype(float32) * sb)
        if bias is not None:
            result = result + bias.astype(float32)
        d.copy_(result.astype(d.dtype))


def check_fp8_output(out_dt: DType, kind: str, scale_out: Any, bias: GPUArray | None) -> None:
    """An fp8 result takes one scalar scale_out, "tensor" input scales and no bias."""
    if not out_dt.name.startswith("float8"):
        if scale_out is not None:
            raise DTypeError(f"scaled_matmul: scale_out applies to an fp8 out_dtype, not {out_dt.name}")
        return
    if out_dt.name != "float8_e4m3fn":
        raise DTypeError(f"scaled_matmul: the fp8 out_dtype must be float8_e4m3fn, got {out_dt.name}")
    if not isinstance(scale_out, GPUArray) or scale_out.dtype.name != "float32" or not _is_scalar(scale_out):
        raise DTypeError("scaled_matmul: an fp8 out_dtype needs scale_out, a float32 GPUArray with one element")
    if kind != "tensor":
        raise ShapeError(f"scaled_matmul: an fp8 result takes per-tensor scales, got {kind} scales")
    if bias is not None:
        raise ShapeError("scaled_matmul: an fp8 result takes no bias")
