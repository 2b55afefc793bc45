"""The GEMV kernels (native/kernels/gemv/gemv.cu), the decode path: ``x @ W`` for up to 8 rows of x.

W is stored K x N ("kn") or N x K ("nk", a linear layer's weight); float32, fp16 or bf16 with float
accumulation, optional bias and activation. The kernels read W once at close to the memory bandwidth.
:func:`gemv` is the public op; :func:`gemv_route` is the dispatcher's question "does the GEMV take
this product?", answered from the layouts without raising. A validated call shape keeps its
:class:`GemvLaunch` in the family's plan cache, so a repeated call (every decode step) only reads the
addresses and launches.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream, current_stream, on_stream_destroyed

from .. import _kernels
from .._layout import check_devices
from . import host
from ._base import HALF, INT32_MAX, PLANS, check_activation, check_bias, device_props, require_array, row_major_ld

__all__ = ["GEMV_MAX_ROWS", "GemvLaunch", "gemv", "gemv_launch", "gemv_route", "name_expressions"]

GEMV_MAX_ROWS = 8
_FILE = "gemv/gemv.cu"
_GEMV_DTYPES = (float32, *HALF)
_POINTER = "void*"
_PARAMS = [
    *(Param(name, _POINTER, "pointer", "Q") for name in ("x", "w", "y", "bias")),
    *(Param(name, "int", "scalar", "i") for name in ("m", "n", "k")),
    *(Param(name, "long long", "scalar", "q") for name in ("ldx", "ldw", "ldy")),
    Param("activation", "int", "scalar", "i"),
    Param("splits", "int", "scalar", "i"),
    Param("partial", _POINTER, "pointer", "Q"),
    Param("counters", _POINTER, "pointer", "Q"),
    Param("vector", "int", "scalar", "i"),
]


def _kernel(expression: str) -> JITKernel:
    """Each instantiation is its own compilation (a group of one): the first call of a shape compiles
    only what it launches."""
    return _kernels.group(_FILE, (expression,)).kernel(expression, _PARAMS, programmatic=True)


@dataclass(frozen=True)
class _GemvPlan:
    expression: str
    per_block: int  # outputs (rows of W for "nk", columns for "kn") per block
    target: int  # blocks per SM to aim for; fewer blocks than that splits K
    split_unit: int  # K elements below which a split is not worth it
    k_step: int = 1  # each split covers a multiple of this many K elements (gemv_kn: U * 8 warps)
    cluster: int = 0  # > 0: K is split in exactly this many parts, one thread-block cluster per output group


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _gemv_plan(dtype: DType, rows: int, layout: str, sm90: bool = False) -> _GemvPlan:
    """Kernel and launch shape for ``rows`` rows of x (measured on an H100 and an H200 at the issue's
    shapes: bf16 M = 1 reads W at 2.4 to 3.1 TB/s on the H100, 3.0 to 4.4 on the H200). ``sm90``: the
    device is SM 90 or newer (thread-block clusters; see _gemv_cluster_plan)."""
    t = dtype.ctype
    ns = "pygpukit::ops::gemv::"
    if dtype in HALF and rows > 1:  # tensor cores: x as the 8 columns of an m16n8k16 B fragment
        if layout == "nk":
            return _GemvPlan(f"{ns}gemv_nk_mma<{t}, 1>", 16, 2, 64 * 16)
        return _GemvPlan(f"{ns}gemv_kn_mma<{t}, 1>", 64, 2, 16 * 16)
    mt = 1 << max(0, rows - 1).bit_length()
    if layout == "nk":
        r, u = (1, 4) if mt == 1 else (2, 2)
        return _GemvPlan(f"{ns}gemv_nk<{t}, {mt}, {r}, {u}>", 8 * r, 2, 16 // dtype.itemsize * 32 * u)
    if sm90 and dtype in HALF:
        # 16 lanes per row segment (128 columns per block) and no split once there is a block per SM:
        # 1 to 4 % faster on the H100 at (3584, 18944), (18944, 3584) and (8192, 29568) than the
        # 32-lane blocks at two per SM (benchmarks/tools/gemv_variants.py). A split goes through a
        # cluster where one fits (_gemv_cluster_plan).
        return _GemvPlan(f"{ns}gemv_kn<{t}, 1, 8, 16>", 16 * 16 // dtype.itemsize, 1, 64, 8 * 16)
    u = 8 if mt == 1 else 4
    return _GemvPlan(f"{ns}gemv_kn<{t}, {mt}, {u}>", 32 * 16 // dtype.itemsize, 2, 64, u * 8)


# Cluster sizes gemv_kn_cluster is built with (8 is the largest portable one), and loads in flight.
_GEMV_CLUSTER_SIZES = (8, 4, 2)
_GEMV_CLUSTER_LOADS = (4, 8)


def _gemv_cluster_plan(dtype: DType, rows: int, layout: str, groups: int, sms: int) -> _GemvPlan | None:
    """On SM 90 and newer, where the plan splits K over ``groups`` column groups of 128: the split
    whose parts meet in distributed shared memory, one thread-block cluster per column group
    (gemv_kn_cluster), with the largest cluster that keeps the grid within two blocks per SM. None
    where that grid would leave more than a tenth of the SMs idle: then the split through global
    memory (completion counters), which may use more blocks, is taken. On the H100 at (4096, 4096)
    this saves about 0.5 us of 14.3 (the finish's atomic and round trip through L2)."""
    if layout != "kn" or rows != 1 or dtype not in HALF:
        return None
    cluster = next((c for c in _GEMV_CLUSTER_SIZES if groups * c <= 2 * sms), _GEMV_CLUSTER_SIZES[-1])
    if 10 * groups * cluster < 9 * sms:
        return None
    # Loads in flight per thread: 8 with one block per SM (N = 2048: 8.3 us against 9.2 with 4), 4
    # with two (4096^2: 13.6 against 13.6 to 13.9 us with 8).
    return _gemv_cluster_expression_plan(dtype, cluster, u=8 if groups * cluster <= sms else 4)


def _gemv_cluster_expression_plan(dtype: DType, cluster: int, lanes: int = 16, u: int = 4) -> _GemvPlan:
    expression = f"pygpukit::ops::gemv::gemv_kn_cluster<{dtype.ctype}, 1, {u}, {lanes}, {cluster}>"
    return _GemvPlan(expression, lanes * 16 // dtype.itemsize, 0, 0, u * 8 * (32 // lanes), cluster)


def name_expressions() -> list[str]:
    """Every instantiation of gemv.cu the plans can launch (for the compile checks and precompile)."""
    expressions: dict[str, None] = {}
    for dtype in _GEMV_DTYPES:
        for rows in range(1, GEMV_MAX_ROWS + 1):
            for layout in ("nk", "kn"):
                for sm90 in (False, True):
                    expressions[_gemv_plan(dtype, rows, layout, sm90).expression] = None
        if dtype in HALF:
            for cluster in _GEMV_CLUSTER_SIZES:
                for u in _GEMV_CLUSTER_LOADS:
                    expressions[_gemv_cluster_expression_plan(dtype, cluster, u=u).expression] = None
    return list(expressions)


_kernels.register_enumerator(lambda: {_FILE: [(e,) for e in name_expressions()]})


# -- split-K scratch ------------------------------------------------------------------------------------
class _SplitWorkspace:
    """Split-K scratch of one stream: float partial sums (its completion counters are the stream's,
    _kernels.completion_counters). Buffers only grow, and a replaced one is kept alive, because a
    CUDA graph captured earlier may still use its address."""

    def __init__(self, stream: Stream | None) -> None:
        self.partial = empty(0, float32, stream=stream)
        self.retired: list[GPUArray] = []

    def partials(self, size: int, stream: Stream | None) -> GPUArray:
        if self.partial.size < size:
            self.retired.append(self.partial)
            self.partial = empty(max(size, 2 * self.partial.size), float32, stream=stream)
        return self.partial


# A PlanCache so that clear_plan_caches(), which pygpukit.reset_device() runs, drops the arrays: they
# die with a device reset (core/recovery.py).
_workspaces: PlanCache[_SplitWorkspace] = PlanCache("ops.gemv_workspaces")
_workspaces_lock = threading.Lock()


def _drop_workspace(device: int, handle: int) -> None:
    """A destroyed stream's workspace goes back to the pool (a plain dict pop: this may run inside a
    garbage collection); a cached GemvLaunch of that stream may still hold it until the plan cache
    drops it."""
    _workspaces._plans.pop((device, handle), None)


on_stream_destroyed(_drop_workspace)


def _workspace(device: int, stream: Stream | None) -> _SplitWorkspace:
    key = (device, (stream if stream is not None else current_stream())._id)  # no token taken (paced streams)
    found = _workspaces.get(key)
    if found is None:
        with _workspaces_lock:
            found = _workspaces.get(key)
            if found is None:
                found = _workspaces.put(key, _SplitWorkspace(stream))
    return found


# -- the prepared launch --------------------------------------------------------------------------------
class GemvLaunch:
    """A validated GEMV call shape (kernel, grid and scalar arguments, computed from the operands'
    shapes, strides, dtypes and devices); ``run`` launches it for the addresses of one call."""

    __slots__ = ("aligned", "device", "grid", "kernel", "scalars", "workspace")

    def __init__(self, kernel: JITKernel, device: int, grid: tuple[int, int], scalars: tuple[int, ...],
                 aligned: bool, workspace: bool) -> None:  # fmt: skip
        self.kernel = kernel
        self.device = device
        self.grid = grid
        self.scalars = scalars  # m, n, k, ldx, ldw, ldy, activation code, splits
        self.aligned = aligned  # the leading dimensions keep 16-byte row starts
        self.workspace = workspace  # split K through global partial sums and completion counters

    def run(self, x_ptr: int, w_ptr: int, y_ptr: int, bias_ptr: int, stream: Stream | None) -> None:
        partial_ptr = counters_ptr = 0
        if self.workspace:
            m, n = self.scalars[0], self.scalars[1]
            partial_ptr = _workspace(self.device, stream).partials(self.grid[1] * m * n, stream).device_ptr
            counters = _kernels.completion_counters(self.device, stream)
            assert counters is not None  # made even inside a capture (see gemv's docstring)
            counters_ptr = counters.device_ptr
        vector = int(self.aligned and (x_ptr | w_ptr) % 16 == 0)
        self.kernel(x_ptr, w_ptr, y_ptr, bias_ptr, *self.scalars, partial_ptr, counters_ptr, vector, grid=self.grid,
                    block=256, stream=stream)  # fmt: skip


def _build(x2: GPUArray, w: GPUArray, layout: str, code: int, m: int, n: int, k: int, lds: tuple[int, int, int],
           device: int) -> GemvLaunch:  # fmt: skip
    ldx, ldw, ldy = lds
    props = device_props(device)
    plan = _gemv_plan(x2.dtype, m, layout, props.clusters)
    blocks = -(-n // plan.per_block)
    splits = 1
    if blocks < plan.target * props.sms and blocks <= _kernels.COUNTERS:
        splits = max(1, min(-(-plan.target * props.sms // blocks), k // plan.split_unit, 65535))
        per_split = _ceil_div(_ceil_div(k, splits), plan.k_step) * plan.k_step  # as the kernel rounds it
        splits = _ceil_div(k, per_split)
    if splits > 1 and props.clusters:
        clustered = _gemv_cluster_plan(x2.dtype, m, layout, blocks, props.sms)
        if clustered is not None:
            plan, blocks, splits = clustered, -(-n // clustered.per_block), clustered.cluster
    aligned = (ldx * x2.itemsize) % 16 == 0 and (ldw * w.itemsize) % 16 == 0
    return GemvLaunch(_kernel(plan.expression), device, (blocks, splits), (m, n, k, ldx, ldw, ldy, code, splits),
                      aligned, splits > 1 and plan.cluster == 0)  # fmt: skip


def gemv_route(x2: GPUArray, w: GPUArray, d: GPUArray, layout: str, bias: GPUArray | None,
               code: int) -> GemvLaunch | None:  # fmt: skip
    """The GEMV launch for ``d (m, n) = act(x2 (m, k) @ op(w) + bias)`` when the kernels take these
    operands as they are (float32/fp16/bf16 of one dtype, m <= 8, row-major x2, w and d, a bias of
    that dtype), else None. Decided from shapes, strides and dtypes; nothing is raised or launched.
    The caller has checked shapes, devices and that m, n, k > 0."""
    dtype = x2.dtype
    if dtype not in _GEMV_DTYPES or w.dtype != dtype or d.dtype != dtype or (bias is not None and bias.dtype != dtype):
        return None
    m, k = x2.shape
    n = d.shape[1]
    if m > GEMV_MAX_ROWS or max(n, k) > INT32_MAX:
        return None
    ldx, ldw, ldy = row_major_ld(x2), row_major_ld(w), row_major_ld(d)
    if ldx is None or ldw is None or ldy is None:
        return None
    return _build(x2, w, layout, code, m, n, k, (ldx, ldw, ldy), d.buffer.device)


def _key(x: Any, w: Any, out: Any, w_layout: Any, activation: Any, bias: Any) -> tuple[Any, ...] | None:
    """What a gemv call's validation and launch shape depend on (None: not cacheable)."""
    if not (type(x) is GPUArray and type(w) is GPUArray and type(out) is GPUArray):
        return None
    if type(w_layout) is not str or not (activation is None or type(activation) is str):
        return None
    if not (bias is None or type(bias) is GPUArray):
        return None
    bias_key = None if bias is None else (bias._shape, bias._strides, bias._dtype, bias._buffer.device)
    return ("gemv", x._shape, x._strides, x._dtype, x._buffer.device, w._shape, w._strides, w._dtype,
            w._buffer.device, out._shape, out._strides, out._dtype, out._buffer.device, w_layout, activation,
            bias_key)  # fmt: skip


def gemv_launch(
    x: GPUArray,
    w: GPUArray,
    out: GPUArray,
    *,
    w_layout: Literal["kn", "nk"] = "kn",
    bias: GPUArray | None = None,
    activation: str | None = None,
) -> GemvLaunch | None:
    """The launch :func:`gemv` makes for these operands, validated (the same errors) and kept per call
    shape in the plan cache. None when there is nothing to launch: no output elements, or the CPU
    backend."""
    key = _key(x, w, out, w_layout, activation, bias)
    if key is not None:
        found = PLANS.get(key)
        if found is not None:
            launch: GemvLaunch | None = found[0]
            return launch
    op = "gemv"
    x = require_array(x, "x", op)
    w = require_array(w, "w", op)
    out = require_array(out, "out", op)
    if w_layout not in ("kn", "nk"):
        raise ArgumentError(f"{op}: w_layout must be 'kn' (w is K x N) or 'nk' (w is N x K), got {w_layout!r}")
    if w.ndim != 2 or x.ndim not in (1, 2) or out.ndim != x.ndim:
        raise ShapeError(f"{op}: x must be 1-D or 2-D, w 2-D and out of x's rank; got shapes {x.shape}, {w.shape} "
                         f"and {out.shape}")  # fmt: skip
    if not (x.dtype == w.dtype == out.dtype) or x.dtype not in _GEMV_DTYPES:
        raise DTypeError(f"{op}: x, w and out must share one dtype of float32, float16 or bfloat16; got {x.dtype}, "
                         f"{w.dtype} and {out.dtype}")  # fmt: skip
    for name, array in (("x", x), ("out", out)):
        if array.ndim == 1 and array.shape[0] > 1 and array.strides[0] != array.itemsize:
            raise ShapeError(f"{op}: {name} (shape {array.shape}, strides {array.strides}) must be contiguous")
    x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
    out2 = out.reshape(1, out.shape[0]) if out.ndim == 1 else out
    m, k = x2.shape
    n, k_w = (w.shape[0], w.shape[1]) if w_layout == "nk" else (w.shape[1], w.shape[0])
    if k != k_w or out2.shape != (m, n):
        raise ShapeError(f"{op}: x {x.shape} @ w {w.shape} (w_layout={w_layout!r}) needs x's last size to equal K = "
                         f"{k_w} and out of shape {(m, n) if x.ndim == 2 else (n,)}, got out {out.shape}")  # fmt: skip
    if m > GEMV_MAX_ROWS:
        raise ShapeError(f"{op}: x has {m} rows; gemv takes at most {GEMV_MAX_ROWS} (use gemm_mma)")
    if max(m, n, k) > INT32_MAX:
        raise ShapeError(f"{op}: dimensions up to 2**31 - 1 are supported, got M={m}, N={n}, K={k}")
    code = check_activation(activation, op)
    bias = check_bias(bias, n, x.dtype, op, x.dtype)
    lds = []
    for name, array in (("x", x2), ("w", w), ("out", out2)):
        ld = row_major_ld(array)
        if ld is None:
            raise ShapeError(f"{op}: {name} (shape {array.shape}, strides {array.strides}) must be row-major: unit "
                             "stride along its rows and a row stride of at least the row length")  # fmt: skip
        lds.append(ld)
    device = check_devices(op, [v for v in (x, w, out, bias) if v is not None])
    launch = None
    if m and n and device >= 0:
        launch = _build(x2, w, w_layout, code, m, n, k, (lds[0], lds[1], lds[2]), device)
    if key is not None:
        PLANS.put(key, (launch, code))
    return launch


def gemv(
    x: GPUArray,
    w: GPUArray,
    out: GPUArray,
    *,
    w_layout: Literal["kn", "nk"] = "kn",
    bias: GPUArray | None = None,
    activation: str | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``out = act(x @ W + bias)`` for ``x`` of up to 8 rows; returns ``out``.

    ``x`` is ``(K,)`` or ``(M, K)`` with M <= 8, ``out`` ``(N,)`` or ``(M, N)`` accordingly. ``w`` is
    stored ``(K, N)`` when ``w_layout="kn"`` (``y = x @ w``) or ``(N, K)`` when ``w_layout="nk"``, the
    weight of a linear layer (``y = x @ w.T``). x, w, out and bias share one dtype: float32, float16
    or bfloat16; accumulation is float32 (float32 weights use exact float32 FMAs). Rows must have unit
    stride (any leading stride of at least the row length). ``bias`` has shape ``(N,)``;
    ``activation`` is None, ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"`` or ``"silu"``. When N alone
    cannot fill the GPU, K is split across blocks and the partial sums are added in a fixed order
    (results are deterministic); the scratch for that belongs to the stream and is allocated on first
    use, so call once before capturing a CUDA graph. On SM 90 and newer, one row of 16-bit x against
    W stored K x N splits K within thread-block clusters instead, which needs no scratch.
    """
    launch = gemv_launch(x, w, out, w_layout=w_layout, bias=bias, activation=activation)
    if launch is not None:
        launch.run(x.device_ptr, w.device_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr, stream)
    elif out.size and out.buffer.device < 0:  # the CPU backend
        host.gemv(x, w, out, w_layout, bias, check_activation(activation, "gemv"))
    return out
