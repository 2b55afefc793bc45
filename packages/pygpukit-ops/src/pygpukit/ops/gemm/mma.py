"""The built-in tensor-core GEMM: mma.sync (native/kernels/gemm/gemm_mma.cu, SM 80+) and warpgroup MMA
(gemm_wgmma.cu, SM 90, compiled for sm_90a); their tiles, the tile choice and the prepared launch.

:func:`gemm_mma` is the public op: fp16 or bf16 operands, float accumulation, an fp16/bf16 or float32
result, operands transposed without copies, alpha/beta scaling and a fused bias + activation epilogue.
:func:`mma_launch` is the dispatcher's prepared launch (dispatch.py decides when these kernels run).
Every instantiation is a JIT kernel compiled by NVRTC on first use (one per kernel and tile);
:func:`name_expressions_for` lists them for the compile check and ``precompile()``.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pygpukit.core.array import GPUArray
from pygpukit.core.compiler import CompiledProgram, parse_arch
from pygpukit.core.dtypes import DType, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.stream import Stream

from .. import _kernels
from .._layout import check_devices
from . import gemv_kernels, host
from ._base import (
    HALF,
    INT32_MAX,
    PLANS,
    array_key,
    check_activation,
    check_bias,
    device_props,
    require_array,
    row_major_ld,
    rows_layout,
)

__all__ = [
    "GEMM_MMA_TILES",
    "GEMM_WGMMA_TILES",
    "GemmTile",
    "MmaLaunch",
    "gemm_mma",
    "gemm_tile_for",
    "mma_launch",
    "name_expressions_for",
]

_GEMM_MMA = "gemm/gemm_mma.cu"
_GEMM_WGMMA = "gemm/gemm_wgmma.cu"


@dataclass(frozen=True)
class GemmTile:
    """A block-tile configuration of the built-in GEMM.

    ``rate`` is the throughput (TFLOP/s, bf16, H100) of the tile on a large problem; only ratios
    between tiles matter, to weigh a larger tile's speed against the idle SMs of a small grid.
    """

    kernel: Literal["mma", "wgmma"]
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    rate: float
    blocks_per_sm: int  # resident blocks per SM when shared memory allows (register-limited)

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of one block (the wgmma kernel aligns its stages to 1 KiB)."""
        return self.stages * (self.bm + self.bn) * self.bk * 2 + (1024 if self.kernel == "wgmma" else 0)

    def expression(self, dtype: DType, out_dtype: DType, trans_a: bool, trans_b: bool) -> str:
        flags = f"{str(trans_a).lower()}, {str(trans_b).lower()}"
        if self.kernel == "wgmma":
            return (
                f"pygpukit::ops::gemm::gemm_wgmma<{dtype.ctype}, {out_dtype.ctype}, {flags}, {self.bn}, {self.stages}>"
            )
        return (f"pygpukit::ops::gemm::gemm_mma<{dtype.ctype}, {out_dtype.ctype}, {flags}, {self.bm}, {self.bn}, "
                f"{self.bk}, {self.warps_m}, {self.warps_n}, {self.stages}>")  # fmt: skip


# Measured on an H100 at 8192^3 (bf16): mma.sync 128x256x64 ~400 TFLOP/s, 128x128x32 ~370, 64x64x32
# ~250; wgmma 128x256 ~600, 128x128 ~520. The large mma tile needs 144 KiB of shared memory, which
# SM 86, 89 and 120 (about 100 KiB per block) do not have; they use the others.
GEMM_MMA_TILES = (
    GemmTile("mma", 128, 256, 64, 2, 4, 3, 400.0, 1),
    GemmTile("mma", 128, 128, 32, 2, 2, 4, 370.0, 2),
    GemmTile("mma", 64, 64, 32, 2, 2, 4, 250.0, 4),
)
GEMM_WGMMA_TILES = (
    GemmTile("wgmma", 128, 256, 64, 4, 2, 4, 600.0, 1),
    GemmTile("wgmma", 128, 128, 64, 4, 2, 6, 520.0, 1),
)

# Kernel parameters, in declaration order (gemm_mma.cu and gemm_wgmma.cu share one signature).
_PARAMS = [
    *(Param(name, "void*", "pointer", "Q") for name in ("a", "b", "out", "bias")),
    *(Param(name, "int", "scalar", "i") for name in ("m", "n", "k")),
    *(Param(name, "long long", "scalar", "q") for name in ("lda", "ldb", "ldc")),
    Param("alpha", "float", "scalar", "f"),
    Param("beta", "float", "scalar", "f"),
    *(Param(name, "int", "scalar", "i") for name in ("activation", "vector_a", "vector_b")),
]


class _Sm90aKernel(JITKernel):
    """A JIT kernel whose SM 90 build targets sm_90a, the architecture-specific ISA that wgmma needs."""

    def compile(self, arch: str | int | tuple[int, int], target: str = "cubin") -> CompiledProgram:
        arch_id = parse_arch(arch)
        return super().compile("90a" if arch_id == "90" else arch_id, target)


@functools.cache
def _kernel(file: str, expression: str) -> JITKernel:
    """Each instantiation is its own compilation: the first call of a shape compiles only its tile."""
    if file != _GEMM_WGMMA:
        return _kernels.group(file, (expression,)).kernel(expression, _PARAMS)
    path = _kernels.kernel_root() / file
    return _Sm90aKernel(path.read_text(), expression, name_expressions=[expression], include_dirs=[str(path.parent)],
                        cache_salt=_kernels.SOURCES.headers_digest(), params=_PARAMS)  # fmt: skip


_shared_set: set[tuple[str, int]] = set()
_shared_lock = threading.Lock()


def _launchable(file: str, expression: str, shared_bytes: int, device: int) -> JITKernel:
    kernel = _kernel(file, expression)
    if shared_bytes > 48 * 1024 and (expression, device) not in _shared_set:
        with _shared_lock:
            kernel.set_max_dynamic_shared_memory(shared_bytes)
            _shared_set.add((expression, device))
    return kernel


def gemm_tile_for(
    m: int, n: int, *, sms: int, shared_per_block: int, shared_per_sm: int, wgmma: bool = False
) -> GemmTile:
    """The tile expected to finish an ``m x n`` output soonest on a device with ``sms`` SMs.

    Per tile: the waves of resident blocks the grid needs, times the work one SM does per wave, over
    the tile's rate. Larger tiles run faster but leave SMs idle on small outputs. Tiles needing more
    shared memory than a block may have are skipped; with ``wgmma`` the SM 90 tiles are candidates too.
    """
    candidates = (*GEMM_WGMMA_TILES, *GEMM_MMA_TILES) if wgmma else GEMM_MMA_TILES
    best: tuple[float, GemmTile] | None = None
    for tile in candidates:
        if tile.shared_bytes > shared_per_block:
            continue
        tiles = -(-m // tile.bm) * -(-n // tile.bn)
        resident = max(1, min(tile.blocks_per_sm, shared_per_sm // (tile.shared_bytes + 1024)))
        concurrent = min(resident, -(-tiles // sms))
        cost = -(-tiles // (sms * concurrent)) * concurrent * tile.bm * tile.bn / tile.rate
        if best is None or cost < best[0]:
            best = (cost, tile)
    if best is None:
        raise ShapeError(f"no built-in GEMM tile fits in {shared_per_block} bytes of shared memory per block")
    return best[1]


# -- the prepared launch --------------------------------------------------------------------------------
class MmaLaunch:
    """One GEMM call shape on the tensor-core kernels: kernel, grid and scalar arguments chosen once;
    ``run`` reads the addresses (and whether they keep the 16-byte alignment of vector loads) per
    call. ``count`` > 1 runs that many batch entries, the pointers advancing by the byte strides."""

    __slots__ = ("block", "count", "grid", "kernel", "ld_aligned", "scalars", "shared", "strides")

    def __init__(self, kernel: JITKernel, grid: int, block: int, shared: int, scalars: tuple[Any, ...],
                 ld_aligned: tuple[bool, bool], count: int = 1,
                 strides: tuple[int, int, int] = (0, 0, 0)) -> None:  # fmt: skip
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.shared = shared
        self.scalars = scalars  # m, n, k, lda, ldb, ldc, alpha, beta, activation
        self.ld_aligned = ld_aligned  # the leading dimensions of a and b are multiples of 16 bytes
        self.count = count
        self.strides = strides  # bytes between batch entries of a, b and out

    def run(self, a_ptr: int, b_ptr: int, out_ptr: int, bias_ptr: int, stream: Stream | None) -> None:
        kernel, scalars, (ld_a, ld_b) = self.kernel, self.scalars, self.ld_aligned
        sa, sb, sd = self.strides
        for index in range(self.count):
            pa, pb = a_ptr + index * sa, b_ptr + index * sb
            kernel(pa, pb, out_ptr + index * sd, bias_ptr, *scalars, int(ld_a and pa % 16 == 0),
                   int(ld_b and pb % 16 == 0), grid=self.grid, block=self.block, shared_mem=self.shared,
                   stream=stream)  # fmt: skip


def _build(dtype: DType, out_dtype: DType, m: int, n: int, k: int, a_layout: tuple[bool, int],
           b_layout: tuple[bool, int], ldc: int, trans: tuple[bool, bool], alpha: float, beta: float, code: int,
           device: int, tile: GemmTile | None = None, count: int = 1,
           strides: tuple[int, int, int] = (0, 0, 0)) -> MmaLaunch:  # fmt: skip
    (a_columns, lda), (b_columns, ldb) = a_layout, b_layout
    # A column-major operand is the row-major transpose of the other layout.
    stored_trans_a, stored_trans_b = trans[0] != a_columns, trans[1] != b_columns
    props = device_props(device)
    if tile is None:
        tile = gemm_tile_for(m, n, sms=props.sms, shared_per_block=props.shared_per_block,
                             shared_per_sm=props.shared_per_sm, wgmma=props.wgmma)  # fmt: skip
    elif tile.shared_bytes > props.shared_per_block or (tile.kernel == "wgmma" and not props.wgmma):
        raise ShapeError(f"gemm_mma: tile {tile} cannot run on this device")
    file = _GEMM_WGMMA if tile.kernel == "wgmma" else _GEMM_MMA
    kernel = _launchable(file, tile.expression(dtype, out_dtype, stored_trans_a, stored_trans_b), tile.shared_bytes,
                         device)  # fmt: skip
    grid = -(-m // tile.bm) * -(-n // tile.bn)
    size = dtype.itemsize
    return MmaLaunch(kernel, grid, tile.threads, tile.shared_bytes,
                     (m, n, k, lda, ldb, ldc, float(alpha), float(beta), code),
                     ((lda * size) % 16 == 0, (ldb * size) % 16 == 0), count, strides)  # fmt: skip


def mma_launch(dtype: DType, m: int, n: int, k: int, a_layout: tuple[bool, int], b_layout: tuple[bool, int],
               code: int, device: int, tile: GemmTile | None = None, count: int = 1,
               strides: tuple[int, int, int] = (0, 0, 0)) -> MmaLaunch:  # fmt: skip
    """The dispatcher's tensor-core launch: ``d (count, m, n)`` contiguous, of the inputs' dtype, =
    act(a @ b + bias) for operands given as (column-major?, leading dimension) and byte strides
    between batch entries (a, b, d)."""
    return _build(dtype, dtype, m, n, k, a_layout, b_layout, n, (False, False), 1.0, 0.0, code, device, tile, count,
                  strides)  # fmt: skip


def gemm_mma(
    a: GPUArray,
    b: GPUArray,
    out: GPUArray,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: GPUArray | None = None,
    activation: str | None = None,
    stream: Stream | None = None,
    tile: GemmTile | None = None,
) -> GPUArray:
    """``out = act(alpha * op(a) @ op(b) + beta * out + bias)`` on the tensor cores; returns ``out``.

    ``op(x)`` is ``x.T`` when ``trans_x`` else ``x``; ``op(a)`` is M x K, ``op(b)`` K x N and ``out``
    M x N. ``a`` and ``b`` are float16 or bfloat16 (the same); ``out`` has their dtype or float32.
    Each of ``a`` and ``b`` may be row-major or a transposed view (any leading stride of at least the
    row length): no copy is made. ``out`` must be row-major. ``bias`` (shape ``(N,)``, dtype of
    ``out`` or of the inputs) is added per column; ``activation`` is None, ``"relu"``,
    ``"gelu_tanh"``, ``"gelu"`` (erf) or ``"silu"``. The epilogue runs in float32 and rounds once.
    ``out`` is only read when ``beta != 0`` and must not overlap ``a`` or ``b``. Any M, N and K; rows
    that are not 16-byte aligned (for example K odd with row-major ``a``) take a slower element-wise
    load path. On SM 90 (H100, H200) the wgmma kernel runs where its tile is the better choice.

    ``tile`` forces one of :data:`GEMM_MMA_TILES` / :data:`GEMM_WGMMA_TILES` (tests, benchmarks);
    by default :func:`gemm_tile_for` chooses.

    Error bounds against float64 on the same (already rounded) inputs: products of fp16/bf16 are
    exact in float32 and the sums are float32, so a float32 ``out`` is within about 1e-6 (relative
    Frobenius norm, K up to 10^4); an fp16 ``out`` adds its rounding (at most 2**-11 relative per
    element), a bf16 one at most 2**-8.
    """
    key = None
    if (
        type(a) is GPUArray
        and type(b) is GPUArray
        and type(out) is GPUArray
        and (bias is None or type(bias) is GPUArray)
        and (activation is None or type(activation) is str)
        and (tile is None or type(tile) is GemmTile)
        and type(alpha) in (int, float)
        and type(beta) in (int, float)
    ):
        key = ("gemm_mma", array_key(a), array_key(b), array_key(out), None if bias is None else array_key(bias),
               bool(trans_a), bool(trans_b), alpha, beta, activation, tile)  # fmt: skip
        found = PLANS.get(key)
        if found is not None:
            launch, convert = found
            if launch is not None:
                _run(launch, a, b, out, bias, convert, stream)
            return out
    op = "gemm_mma"
    a = require_array(a, "a", op)
    b = require_array(b, "b", op)
    out = require_array(out, "out", op)
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ShapeError(f"{op}: a, b and out must be 2-D, got shapes {a.shape}, {b.shape} and {out.shape}")
    if a.dtype != b.dtype or a.dtype not in HALF:
        raise DTypeError(f"{op}: a and b must both be float16 or both bfloat16, got {a.dtype} and {b.dtype}")
    if out.dtype not in (a.dtype, float32):
        raise DTypeError(f"{op}: out must be {a.dtype} or float32 for {a.dtype} inputs, got {out.dtype}")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    k_b, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != k_b or out.shape != (m, n):
        raise ShapeError(
            f"{op}: op(a) is {m}x{k} (a {a.shape}, trans_a={trans_a}) and op(b) is {k_b}x{n} (b {b.shape}, "
            f"trans_b={trans_b}); they need equal inner sizes and out of shape ({m}, {n}), got {out.shape}"
        )
    if max(m, n, k) > INT32_MAX:
        raise ShapeError(f"{op}: dimensions up to 2**31 - 1 are supported, got M={m}, N={n}, K={k}")
    code = check_activation(activation, op)
    bias = check_bias(bias, n, a.dtype, op, out.dtype)
    layouts = []
    for name, array in (("a", a), ("b", b)):
        layout = rows_layout(array)
        if layout is None:
            raise ShapeError(f"{op}: {name} (shape {array.shape}, strides {array.strides}) needs unit stride along its "
                             "rows or its columns and a leading stride of at least the row length; pass "
                             ".contiguous()")  # fmt: skip
        layouts.append(layout)
    ldc = row_major_ld(out)
    if ldc is None:
        raise ShapeError(f"{op}: out (shape {out.shape}, strides {out.strides}) must be row-major: unit stride along "
                         "its rows and a row stride of at least the row length")  # fmt: skip
    device = check_devices(op, [x for x in (a, b, out, bias) if x is not None])
    if m == 0 or n == 0:
        return out
    if device < 0:
        return host.gemm(a, b, out, trans_a, trans_b, alpha, beta, bias, code)
    launch = _build(a.dtype, out.dtype, m, n, k, layouts[0], layouts[1], ldc, (trans_a, trans_b), alpha, beta, code,
                    device, tile)  # fmt: skip
    # A bias in the input dtype is widened to out's (exact: float16/bfloat16 -> float32) per call.
    convert = out.dtype if bias is not None and bias.dtype != out.dtype else None
    if key is not None:
        PLANS.put(key, (launch, convert))
    _run(launch, a, b, out, bias, convert, stream)
    return out


def _run(launch: MmaLaunch, a: GPUArray, b: GPUArray, out: GPUArray, bias: GPUArray | None, convert: DType | None,
         stream: Stream | None) -> None:  # fmt: skip
    if bias is not None and convert is not None:
        bias = bias.astype(convert, stream=stream)  # held until the launch is queued
    launch.run(a.device_ptr, b.device_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr, stream)


# -- compile checks -------------------------------------------------------------------------------------
def _gemm_expressions(file: str) -> list[str]:
    tiles = GEMM_WGMMA_TILES if file == _GEMM_WGMMA else GEMM_MMA_TILES
    return [tile.expression(dtype, out_dtype, trans_a, trans_b)
            for tile in tiles for dtype in HALF for out_dtype in (dtype, float32)
            for trans_a in (False, True) for trans_b in (False, True)]  # fmt: skip


def name_expressions_for(relative_path: str) -> list[str]:
    """Every template instantiation launched from ``relative_path`` (relative to native/kernels, e.g.
    ``gemm/gemm_mma.cu``); empty for other files. gemm_wgmma.cu's kernels have real bodies only when
    compiled for sm_90a (an empty body elsewhere)."""
    if relative_path in (_GEMM_MMA, _GEMM_WGMMA):
        return _gemm_expressions(relative_path)
    if relative_path == "gemv/gemv.cu":
        return gemv_kernels.name_expressions()
    return []


# Each instantiation is its own compilation (a group of one), as _kernel compiles it.
_kernels.register_enumerator(
    lambda: {path: [(e,) for e in _gemm_expressions(path)] for path in (_GEMM_MMA, _GEMM_WGMMA)}
)
