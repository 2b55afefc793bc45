"""The dispatch table of the GEMM family: which kernel runs a product, decided once per call shape.

The routes, in order (the first that takes the product wins):

1. the plan cache: a call shape seen before runs its plan (one lookup, then the launch);
2. GEMV (gemv_kernels.py): up to 8 rows of a, no batch, float32/fp16/bf16 with a contiguous weight either way;
3. cuBLASLt (cublaslt.py): when found and not turned off, for the dtypes it has; its heuristic is asked
   up front whether it has an algorithm (int8 has none for some sizes and layouts);
4. wgmma (mma.py, SM 90): fp16/bf16 where the tile model picks a warpgroup-MMA tile;
5. mma.sync (mma.py, SM 80+): fp16/bf16 whose matrices are row- or column-major;
6. SIMT (simt.py): every dtype and layout left.

A weight held in a GGUF block format (pygpukit.ops.quant.QuantizedTensor) never reaches this table
as such: ``linear`` hands it to pygpukit.ops.quant, whose GEMV reads the packed blocks (up to 8 rows)
and whose prefill dequantizes row tiles that come back through this table as ordinary operands.

The CPU simulation backend has its own functions (host.py) and no routes. Each route answers from
shapes, strides, dtypes, options and the device's capability, never by trying a launch: no exception
and no error message picks a kernel. The plan that comes out holds the route's prepared launch and
what the call needs around it: operand copies where a layout cannot be expressed (made on the device
on every call), the result allocation, and a device-side activation where cuBLASLt's epilogue has
none (exact GELU, SiLU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.codes import ACTIVATION_CODES
from pygpukit.core.dtypes import DType
from pygpukit.core.stream import Stream

from . import cublaslt, mma, simt
from ._base import HALF, INT32_MAX, batch_stride, device_props, matrix_layout, swap_last
from .gemv_kernels import GEMV_MAX_ROWS, gemv_route

__all__ = ["ROUTES", "DirectPlan", "Plan", "Problem", "plan_for"]


# -- operands -------------------------------------------------------------------------------------------
class Materialize:
    """The per-call device copy of an operand whose layout a route cannot take: the caller's array
    viewed with the planned (broadcast) shape and strides, made C-contiguous; with ``swap`` the copy
    holds the transpose of the last two axes (a column-major result)."""

    __slots__ = ("shape", "strides", "swap")

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], swap: bool = False) -> None:
        self.shape, self.strides, self.swap = shape, strides, swap

    def __call__(self, x: GPUArray, stream: Stream | None) -> GPUArray:
        view = x._view(self.shape, self.strides, x._offset)
        if self.swap:
            return swap_last(swap_last(view).clone(stream=stream))
        return view.clone(stream=stream)


@dataclass(frozen=True)
class Operand:
    """One operand (rows x cols per batch entry) as a kernel sees it, after ``copy`` if any: row- or
    column-major with leading dimension ``ld``, its element strides, one element stride per batch."""

    row_major: bool
    ld: int
    strides: tuple[int, int]
    batch_stride: int
    copy: Materialize | None


def describe(x: GPUArray, batch: tuple[int, ...], rows: int, cols: int, need: str = "layout") -> Operand:
    """How ``x`` (.., rows, cols), broadcast to ``batch``, reaches a kernel. ``need``: "layout" (row- or
    column-major), "strided" (any element strides), "row" / "col" (that layout with a leading
    dimension of exactly cols / rows: cuBLASLt's int8 "TN" form). It is copied on the device when
    its layout does not fit, or when no single stride walks its batch dims (a partial broadcast)."""
    strides = x._strides
    pad = len(batch) - (x.ndim - 2)
    lead = (1,) * pad + tuple(x._shape[:-2])
    lead_strides = (0,) * pad + tuple(strides[:-2])
    per_batch = tuple(0 if size == 1 else st for size, st in zip(lead, lead_strides, strict=True))
    s0, s1 = strides[-2], strides[-1]
    layout = matrix_layout(rows, cols, s0, s1)
    bstride = batch_stride(batch, per_batch)
    fits = {"layout": layout is not None, "strided": True, "row": layout == ("row", max(cols, 1)),
            "col": layout == ("col", max(rows, 1))}[need]  # fmt: skip
    if fits and bstride is not None:
        if layout is None:  # "strided": the kernel walks the strides
            return Operand(True, 0, (s0, s1), bstride, None)
        row_major, ld = layout[0] == "row", layout[1]
        return Operand(row_major, ld, (ld, 1) if row_major else (1, ld), bstride, None)
    full_shape, full_strides = (*batch, rows, cols), (*per_batch, s0, s1)
    count = rows * cols
    if need == "col":
        return Operand(False, max(rows, 1), (1, max(rows, 1)), count, Materialize(full_shape, full_strides, True))
    return Operand(True, max(cols, 1), (max(cols, 1), 1), count, Materialize(full_shape, full_strides))


# -- the problem and its plan ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """d (batch.., m, n), row-major and contiguous, = act(a2 @ b2 + bias) [* scales]."""

    a2: GPUArray
    b2: GPUArray
    d: GPUArray
    batch: tuple[int, ...]
    count: int
    m: int
    n: int
    k: int
    bias: GPUArray | None
    code: int
    tf32: bool
    scales: bool
    device: int
    cublaslt: bool


class _DeviceActivation:
    """The activation run on the result after cuBLASLt, where its epilogue has none (one fused
    elementwise kernel on the device, in place)."""

    __slots__ = ("function",)

    def __init__(self, code: int) -> None:
        from .. import elementwise

        self.function = elementwise.gelu if code == ACTIVATION_CODES["gelu"] else elementwise.silu

    def __call__(self, d: GPUArray, stream: Stream | None) -> None:
        if stream is None:
            self.function(d, out=d)
        else:
            with stream:
                self.function(d, out=d)


def aligned_bias(bias: GPUArray, stream: Stream | None) -> tuple[GPUArray, int]:
    """A copy of ``bias`` at a fresh (256-byte aligned) allocation and its pointer: cuBLASLt's epilogue
    refuses a bias pointer that is not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED at the launch), which
    a view such as ``bias[7:]`` of a bfloat16 vector is. The copy lives until the caller's launch is
    queued; the pool's stream-ordered reuse keeps it valid for the launch."""
    copy = bias.clone(stream)
    return copy, copy.device_ptr


class DirectPlan:
    """A plan whose launch takes the caller's arrays as they are (the decode path's GEMV, most
    cuBLASLt products): allocate the result unless ``out`` is given, launch."""

    __slots__ = ("dtype", "full_shape", "launch", "result_shape", "route")

    def __init__(self, route: str, launch: Any, full_shape: tuple[int, ...], result_shape: tuple[int, ...],
                 dtype: DType) -> None:  # fmt: skip
        self.route = route
        self.launch = launch
        self.full_shape = full_shape
        self.result_shape = None if result_shape == full_shape else result_shape
        self.dtype = dtype

    def __call__(self, a: GPUArray, b: GPUArray, bias: GPUArray | None, out: GPUArray | None,
                 stream: Stream | None) -> GPUArray:  # fmt: skip
        bias_ptr = 0
        if bias is not None:
            bias_ptr = bias.device_ptr
            if bias_ptr & 15 and self.route == "cublaslt":
                bias, bias_ptr = aligned_bias(bias, stream)
        if out is None:
            d = empty(self.full_shape, self.dtype, stream=stream)
            self.launch.run(a.device_ptr, b.device_ptr, d.device_ptr, bias_ptr, stream)
            return d if self.result_shape is None else d.reshape(self.result_shape)
        self.launch.run(a.device_ptr, b.device_ptr, out.device_ptr, bias_ptr, stream)
        return out


class Plan(DirectPlan):
    """A plan with work around the launch: operand copies before it, an activation after it."""

    __slots__ = ("copy_a", "copy_b", "post")

    def __init__(self, route: str, launch: Any, full_shape: tuple[int, ...], result_shape: tuple[int, ...],
                 dtype: DType, copy_a: Materialize | None, copy_b: Materialize | None,
                 post: _DeviceActivation | None) -> None:  # fmt: skip
        super().__init__(route, launch, full_shape, result_shape, dtype)
        self.copy_a, self.copy_b, self.post = copy_a, copy_b, post

    def __call__(self, a: GPUArray, b: GPUArray, bias: GPUArray | None, out: GPUArray | None,
                 stream: Stream | None) -> GPUArray:  # fmt: skip
        d = empty(self.full_shape, self.dtype, stream=stream) if out is None else out
        if self.copy_a is not None:
            a = self.copy_a(a, stream)  # held until the launch is queued
        if self.copy_b is not None:
            b = self.copy_b(b, stream)
        bias_ptr = 0
        if bias is not None:
            bias_ptr = bias.device_ptr
            if bias_ptr & 15 and self.route == "cublaslt":
                bias, bias_ptr = aligned_bias(bias, stream)
        self.launch.run(a.device_ptr, b.device_ptr, d.device_ptr, bias_ptr, stream)
        if self.post is not None:
            self.post(d, stream)
        if out is not None:
            return out
        return d if self.result_shape is None else d.reshape(self.result_shape)


# A route: the problem in, (launch, copy of a, copy of b, activation after) out, or None to pass.
Routed = tuple[Any, Materialize | None, Materialize | None, _DeviceActivation | None]


def _gemv(p: Problem) -> Routed | None:
    if p.batch or p.scales or p.m > GEMV_MAX_ROWS or p.a2.ndim != 2 or p.b2.ndim != 2:
        return None
    b = p.b2
    s0, s1 = b._strides
    if s1 == 1 and s0 == p.n:
        layout, weight = "kn", b  # b stored (K, N)
    elif s0 == 1 and s1 == p.k:
        layout, weight = "nk", swap_last(b)  # b is the transpose of a contiguous (N, K) weight
    else:
        return None
    d2 = p.d.reshape(p.m, p.n) if p.d.ndim != 2 else p.d
    launch = gemv_route(p.a2, weight, d2, layout, p.bias, p.code)
    return None if launch is None else (launch, None, None, None)


def _cublaslt(p: Problem) -> Routed | None:
    dtype = p.a2.dtype
    if not p.cublaslt or not cublaslt.supports(dtype):
        return None
    int8 = dtype.name == "int8"  # integer tensor-core GEMMs exist only for the "TN" layout
    oa = describe(p.a2, p.batch, p.m, p.k, "row" if int8 else "layout")
    ob = describe(p.b2, p.batch, p.k, p.n, "col" if int8 else "layout")
    native_act = p.code in cublaslt.EPILOGUE_ACTIVATIONS
    # Copies are fresh allocations (aligned): pointer 0 stands for them in the alignment query.
    pointers = (0 if oa.copy else p.a2.device_ptr, 0 if ob.copy else p.b2.device_ptr, p.d.device_ptr)
    if int8 and any(ptr % 16 for ptr in pointers):
        return None  # int8 is planned for 16-byte aligned operands (see _Aligned16)
    prepared = cublaslt.cublaslt_launch(
        (dtype, p.b2.dtype, p.d.dtype), p.m, p.n, p.k, p.count, (oa.row_major, oa.ld, oa.batch_stride),
        (ob.row_major, ob.ld, ob.batch_stride), pointers, bias=None if p.bias is None else p.bias.dtype,
        activation=p.code if native_act else ACTIVATION_CODES["none"], tf32=p.tf32, scales=p.scales,
    )  # fmt: skip
    if prepared is None:
        return None
    launch: cublaslt.CublasLtLaunch | _Aligned16 = prepared
    if int8:
        fallback = simt.simt_launch(dtype, p.d.dtype, p.count, p.m, p.n, p.k, oa.strides, ob.strides,
                                    (oa.batch_stride, ob.batch_stride), p.bias is not None, p.code)  # fmt: skip
        launch = _Aligned16(prepared, fallback)
    return launch, oa.copy, ob.copy, None if native_act else _DeviceActivation(p.code)


class _Aligned16:
    """cuBLASLt's int8 algorithms, chosen for 16-byte aligned operands, where a call's addresses keep
    that alignment; the CUDA-core kernel (planned for the same layouts) where one does not (a view a
    row into its buffer, say). Decided by the addresses, before anything launches."""

    __slots__ = ("aligned", "unaligned")

    def __init__(self, aligned: cublaslt.CublasLtLaunch, unaligned: simt.SimtLaunch) -> None:
        self.aligned, self.unaligned = aligned, unaligned

    def run(self, a_ptr: int, b_ptr: int, d_ptr: int, bias_ptr: int, stream: Stream | None) -> None:
        launch = self.unaligned if (a_ptr | b_ptr | d_ptr) % 16 else self.aligned
        launch.run(a_ptr, b_ptr, d_ptr, bias_ptr, stream)


def _tensor_cores(p: Problem, wgmma: bool) -> Routed | None:
    dtype = p.a2.dtype
    if p.scales or dtype not in HALF or p.d.dtype != dtype or max(p.m, p.n, p.k) > INT32_MAX:
        return None
    props = device_props(p.device)
    if wgmma != props.wgmma:
        return None
    tile = mma.gemm_tile_for(p.m, p.n, sms=props.sms, shared_per_block=props.shared_per_block,
                             shared_per_sm=props.shared_per_sm, wgmma=props.wgmma)  # fmt: skip
    if (tile.kernel == "wgmma") != wgmma:
        return None
    oa = describe(p.a2, p.batch, p.m, p.k)
    ob = describe(p.b2, p.batch, p.k, p.n)
    size = dtype.itemsize
    launch = mma.mma_launch(dtype, p.m, p.n, p.k, (not oa.row_major, oa.ld), (not ob.row_major, ob.ld), p.code,
                            p.device, tile, p.count,
                            (oa.batch_stride * size, ob.batch_stride * size, p.m * p.n * size))  # fmt: skip
    return launch, oa.copy, ob.copy, None


def _wgmma(p: Problem) -> Routed | None:
    return _tensor_cores(p, True)


def _mma(p: Problem) -> Routed | None:
    return _tensor_cores(p, False)


def _simt(p: Problem) -> Routed | None:
    if p.scales or not simt.supports(p.a2.dtype, p.d.dtype):
        return None
    oa = describe(p.a2, p.batch, p.m, p.k, "strided")
    ob = describe(p.b2, p.batch, p.k, p.n, "strided")
    launch = simt.simt_launch(p.a2.dtype, p.d.dtype, p.count, p.m, p.n, p.k, oa.strides, ob.strides,
                              (oa.batch_stride, ob.batch_stride), p.bias is not None, p.code)  # fmt: skip
    return launch, oa.copy, ob.copy, None


ROUTES: tuple[tuple[str, Callable[[Problem], Routed | None]], ...] = (
    ("gemv", _gemv),
    ("cublaslt", _cublaslt),
    ("wgmma", _wgmma),
    ("mma", _mma),
    ("simt", _simt),
)


def plan_for(p: Problem, result_shape: tuple[int, ...]) -> DirectPlan | None:
    """The plan of the first route that takes ``p``; None when none does (fp8 without cuBLASLt)."""
    for name, route in ROUTES:
        routed = route(p)
        if routed is None:
            continue
        launch, copy_a, copy_b, post = routed
        full_shape = p.d.shape
        if copy_a is None and copy_b is None and post is None:
            return DirectPlan(name, launch, full_shape, result_shape, p.d.dtype)
        return Plan(name, launch, full_shape, result_shape, p.d.dtype, copy_a, copy_b, post)
    return None
