"""The built-in GEMM and GEMV kernels: checking operands, choosing a kernel and its tile, launching.

:func:`gemm_mma` is the tensor-core GEMM that ``matmul`` and ``linear`` use when cuBLASLt is absent or
``PYGPUKIT_NO_CUBLASLT=1``: fp16 or bf16 operands, float accumulation, an fp16/bf16 or float32 result,
operands transposed without copies, alpha/beta scaling and a fused bias + activation epilogue. On
SM 90 (H100, H200) it runs native/kernels/gemm/gemm_wgmma.cu (warpgroup MMA, compiled for sm_90a);
elsewhere, and where NVRTC cannot target sm_90a, native/kernels/gemm/gemm_mma.cu (mma.sync, SM 80+).

:func:`gemv` is the decode path: ``x @ W`` for up to 8 rows of x with W stored K x N ("kn") or N x K
("nk", a linear layer's weight), float32, fp16 or bf16, optional bias and activation
(native/kernels/gemv/gemv.cu). It reads W once at close to the memory bandwidth.

Every instantiation is a JIT kernel compiled by NVRTC on first use (one per kernel and tile, so the
first call of a shape compiles only what it launches); :func:`name_expressions_for` lists them per
kernel file for the compile check of ``nox -s kernels``, and the op library's ``precompile()`` finds
them through the enumerator registered below.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.compiler import CompiledProgram, nvrtc_status, parse_arch
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.stream import Stream, current_stream

from . import _kernels
from ._layout import check_devices

__all__ = [
    "ACTIVATIONS",
    "GEMM_MMA_TILES",
    "GEMM_WGMMA_TILES",
    "GemmTile",
    "gemm_mma",
    "gemm_tile_for",
    "gemv",
    "gemv_launch",
    "name_expressions_for",
]

# Epilogue activations by name, with the codes of native/kernels/gemm/matmul_common.cuh.
ACTIVATIONS: dict[str | None, int] = {None: 0, "none": 0, "relu": 1, "gelu_tanh": 2, "silu": 3, "gelu": 4}

_GEMM_MMA = "gemm/gemm_mma.cu"
_GEMM_WGMMA = "gemm/gemm_wgmma.cu"
_GEMV = "gemv/gemv.cu"
_HALF = (float16, bfloat16)
_INT32_MAX = 2**31 - 1


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
_POINTER = "void*"
_GEMM_PARAMS = [
    *(Param(name, _POINTER, "pointer", "Q") for name in ("a", "b", "out", "bias")),
    *(Param(name, "int", "scalar", "i") for name in ("m", "n", "k")),
    *(Param(name, "long long", "scalar", "q") for name in ("lda", "ldb", "ldc")),
    Param("alpha", "float", "scalar", "f"),
    Param("beta", "float", "scalar", "f"),
    *(Param(name, "int", "scalar", "i") for name in ("activation", "vector_a", "vector_b")),
]
_GEMV_PARAMS = [
    *(Param(name, _POINTER, "pointer", "Q") for name in ("x", "w", "y", "bias")),
    *(Param(name, "int", "scalar", "i") for name in ("m", "n", "k")),
    *(Param(name, "long long", "scalar", "q") for name in ("ldx", "ldw", "ldy")),
    Param("activation", "int", "scalar", "i"),
    Param("splits", "int", "scalar", "i"),
    Param("partial", _POINTER, "pointer", "Q"),
    Param("counters", _POINTER, "pointer", "Q"),
    Param("vector", "int", "scalar", "i"),
]


# -- kernels ------------------------------------------------------------------------------------------
class _Sm90aKernel(JITKernel):
    """A JIT kernel whose SM 90 build targets sm_90a, the architecture-specific ISA that wgmma needs."""

    def compile(self, arch: str | int | tuple[int, int], target: str = "cubin") -> CompiledProgram:
        arch_id = parse_arch(arch)
        return super().compile("90a" if arch_id == "90" else arch_id, target)


@functools.cache
def _kernel(file: str, expression: str) -> JITKernel:
    params = _GEMV_PARAMS if file == _GEMV else _GEMM_PARAMS
    if file != _GEMM_WGMMA:
        return _kernels.group(file, (expression,)).kernel(expression, params)
    path = _kernels.kernel_root() / file
    return _Sm90aKernel(path.read_text(), expression, name_expressions=[expression], include_dirs=[str(path.parent)],
                        cache_salt=_kernels._headers_digest(), params=params)  # fmt: skip


_shared_set: set[tuple[str, int]] = set()
_shared_lock = threading.Lock()


def _launchable(file: str, expression: str, shared_bytes: int, device: int) -> JITKernel:
    kernel = _kernel(file, expression)
    if shared_bytes > 48 * 1024 and (expression, device) not in _shared_set:
        with _shared_lock:
            kernel.set_max_dynamic_shared_memory(shared_bytes)
            _shared_set.add((expression, device))
    return kernel


@dataclass(frozen=True)
class _Device:
    sms: int
    shared_per_block: int
    shared_per_sm: int
    wgmma: bool
    clusters: bool  # thread-block clusters (SM 90 and newer)


@functools.cache
def _device(ordinal: int) -> _Device:
    info = get_device_info(ordinal)
    wgmma = False
    if tuple(info.compute_capability) == (9, 0):
        wgmma = 90 in nvrtc_status()["supported_archs"]
    return _Device(int(info.multiprocessor_count), int(info.max_shared_memory_per_block_optin),
                   int(info.max_shared_memory_per_multiprocessor), wgmma,
                   tuple(info.compute_capability) >= (9, 0))  # fmt: skip


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


# -- operand checks -----------------------------------------------------------------------------------
def _require_array(value: Any, name: str, op: str) -> GPUArray:
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{op}: {name} must be a GPUArray, got {type(value).__name__}")
    return value


def _strides(array: GPUArray) -> tuple[int, int]:
    s0, s1 = array.strides
    return s0 // array.itemsize, s1 // array.itemsize


def _rows(array: GPUArray, name: str, op: str) -> tuple[bool, int]:
    """How a 2-D operand is stored: (column-major?, leading dimension in elements). Row-major means unit
    stride along the rows and a row stride of at least the row length (a transposed view of such an
    array is column-major); anything else is refused."""
    rows, cols = array.shape
    s0, s1 = _strides(array)
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return False, s0 if rows > 1 else max(cols, 1)
    if (rows <= 1 or s0 == 1) and (cols <= 1 or s1 >= max(rows, 1)):
        return True, s1 if cols > 1 else max(rows, 1)
    raise ShapeError(
        f"{op}: {name} (shape {array.shape}, strides {array.strides}) needs unit stride along its rows or its "
        "columns and a leading stride of at least the row length; pass .contiguous()"
    )


def _row_major(array: GPUArray, name: str, op: str) -> int:
    """The leading dimension of a row-major 2-D operand; :class:`ShapeError` for any other layout."""
    rows, cols = array.shape
    s0, s1 = _strides(array)
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return s0 if rows > 1 else max(cols, 1)
    raise ShapeError(f"{op}: {name} (shape {array.shape}, strides {array.strides}) must be row-major: unit stride "
                     "along its rows and a row stride of at least the row length")  # fmt: skip


def _vector(array: GPUArray, ld: int) -> int:
    """1 when every row of the operand starts on a 16-byte boundary (the kernels' vector loads)."""
    return int(array.device_ptr % 16 == 0 and (ld * array.itemsize) % 16 == 0)


def _bias(bias: GPUArray | None, n: int, dtype: DType, op: str, out_dtype: DType) -> GPUArray | None:
    if bias is None:
        return None
    bias = _require_array(bias, "bias", op)
    if bias.shape != (n,):
        raise ShapeError(f"{op}: bias has shape {bias.shape}; expected ({n},) (one value per output column)")
    if bias.dtype not in (out_dtype, dtype):
        raise DTypeError(f"{op}: bias has dtype {bias.dtype}; expected {out_dtype}" +
                         (f" or {dtype}" if dtype != out_dtype else ""))  # fmt: skip
    if not bias.is_contiguous:
        raise ShapeError(f"{op}: bias (strides {bias.strides}) must be contiguous")
    return bias


def _activation(activation: str | None, op: str) -> int:
    code = ACTIVATIONS.get(activation.lower() if isinstance(activation, str) else activation)
    if code is None:
        names = ", ".join(repr(k) for k in ACTIVATIONS if k is not None)
        raise ValueError(f"{op}: unknown activation {activation!r}; expected None or one of {names}")
    return code


def _apply_activation(values: np.ndarray[Any, Any], code: int) -> np.ndarray[Any, Any]:
    """The epilogue activation in NumPy (the CPU simulation backend)."""
    if code == 1:
        result = np.maximum(values, 0.0)
    elif code == 2:
        result = 0.5 * values * (1.0 + np.tanh(0.7978845608028654 * (values + 0.044715 * values**3)))
    elif code == 3:
        result = values / (1.0 + np.exp(-values))
    elif code == 4:
        erf = np.vectorize(math.erf, otypes=[np.float64])
        result = 0.5 * values * (1.0 + erf(values / math.sqrt(2.0)))
    else:
        result = values
    return np.asarray(result, dtype=np.float64)


# -- GEMM ---------------------------------------------------------------------------------------------
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
    load path.

    ``tile`` forces one of :data:`GEMM_MMA_TILES` / :data:`GEMM_WGMMA_TILES` (tests, benchmarks);
    by default :func:`gemm_tile_for` chooses.

    Error bounds against float64 on the same (already rounded) inputs: products of fp16/bf16 are
    exact in float32 and the sums are float32, so a float32 ``out`` is within about 1e-6 (relative
    Frobenius norm, K up to 10^4); an fp16 ``out`` adds its rounding (at most 2**-11 relative per
    element), a bf16 one at most 2**-8.
    """
    op = "gemm_mma"
    a = _require_array(a, "a", op)
    b = _require_array(b, "b", op)
    out = _require_array(out, "out", op)
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ShapeError(f"{op}: a, b and out must be 2-D, got shapes {a.shape}, {b.shape} and {out.shape}")
    if a.dtype != b.dtype or a.dtype not in _HALF:
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
    if max(m, n, k) > _INT32_MAX:
        raise ShapeError(f"{op}: dimensions up to 2**31 - 1 are supported, got M={m}, N={n}, K={k}")
    code = _activation(activation, op)
    bias = _bias(bias, n, a.dtype, op, out.dtype)
    a_columns, lda = _rows(a, "a", op)
    b_columns, ldb = _rows(b, "b", op)
    ldc = _row_major(out, "out", op)
    device = check_devices(op, [x for x in (a, b, out, bias) if x is not None])
    if m == 0 or n == 0:
        return out
    if device < 0:
        return _gemm_numpy(a, b, out, trans_a, trans_b, alpha, beta, bias, code)
    if bias is not None and bias.dtype != out.dtype:
        bias = bias.astype(out.dtype, stream=stream)  # exact: float16/bfloat16 -> float32
    # A column-major operand is the row-major transpose of the other layout.
    stored_trans_a = trans_a != a_columns
    stored_trans_b = trans_b != b_columns
    props = _device(device)
    if tile is None:
        tile = gemm_tile_for(m, n, sms=props.sms, shared_per_block=props.shared_per_block,
                             shared_per_sm=props.shared_per_sm, wgmma=props.wgmma)  # fmt: skip
    elif tile.shared_bytes > props.shared_per_block or (tile.kernel == "wgmma" and not props.wgmma):
        raise ShapeError(f"{op}: tile {tile} cannot run on this device")
    file = _GEMM_WGMMA if tile.kernel == "wgmma" else _GEMM_MMA
    expression = tile.expression(a.dtype, out.dtype, stored_trans_a, stored_trans_b)
    kernel = _launchable(file, expression, tile.shared_bytes, device)
    grid = -(-m // tile.bm) * -(-n // tile.bn)
    kernel(a.device_ptr, b.device_ptr, out.device_ptr, bias.device_ptr if bias is not None else 0, m, n, k, lda,
           ldb, ldc, float(alpha), float(beta), code, _vector(a, lda), _vector(b, ldb), grid=grid,
           block=tile.threads, shared_mem=tile.shared_bytes, stream=stream)  # fmt: skip
    return out


def _gemm_numpy(
    a: GPUArray,
    b: GPUArray,
    out: GPUArray,
    trans_a: bool,
    trans_b: bool,
    alpha: float,
    beta: float,
    bias: GPUArray | None,
    code: int,
) -> GPUArray:
    """The CPU simulation backend: the same function in float64 NumPy, rounded once to out's dtype."""
    lhs = a.to_numpy().astype(np.float64)
    rhs = b.to_numpy().astype(np.float64)
    result = alpha * ((lhs.T if trans_a else lhs) @ (rhs.T if trans_b else rhs))
    if beta != 0.0:
        result = result + beta * out.to_numpy().astype(np.float64)
    if bias is not None:
        result = result + bias.to_numpy().astype(np.float64)
    out.copy_(_apply_activation(result, code).astype(out.dtype.numpy))
    return out


# -- GEMV ---------------------------------------------------------------------------------------------
GEMV_MAX_ROWS = 8


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
    if dtype in _HALF and rows > 1:  # tensor cores: x as the 8 columns of an m16n8k16 B fragment
        if layout == "nk":
            return _GemvPlan(f"{ns}gemv_nk_mma<{t}, 1>", 16, 2, 64 * 16)
        return _GemvPlan(f"{ns}gemv_kn_mma<{t}, 1>", 64, 2, 16 * 16)
    mt = 1 << max(0, rows - 1).bit_length()
    if layout == "nk":
        r, u = (1, 4) if mt == 1 else (2, 2)
        return _GemvPlan(f"{ns}gemv_nk<{t}, {mt}, {r}, {u}>", 8 * r, 2, 16 // dtype.itemsize * 32 * u)
    if sm90 and dtype in _HALF:
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
    if layout != "kn" or rows != 1 or dtype not in _HALF:
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


def _gemv_expressions() -> list[str]:
    expressions: dict[str, None] = {}
    for dtype in (float32, float16, bfloat16):
        for rows in range(1, GEMV_MAX_ROWS + 1):
            for layout in ("nk", "kn"):
                for sm90 in (False, True):
                    expressions[_gemv_plan(dtype, rows, layout, sm90).expression] = None
        if dtype in _HALF:
            for cluster in _GEMV_CLUSTER_SIZES:
                for u in _GEMV_CLUSTER_LOADS:
                    expressions[_gemv_cluster_expression_plan(dtype, cluster, u=u).expression] = None
    return list(expressions)


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


_workspaces: dict[tuple[int, int], _SplitWorkspace] = {}
_workspaces_lock = threading.Lock()


def _workspace(device: int, stream: Stream | None) -> _SplitWorkspace:
    key = (device, (stream if stream is not None else current_stream()).handle)
    found = _workspaces.get(key)
    if found is None:
        with _workspaces_lock:
            found = _workspaces.get(key)
            if found is None:
                found = _workspaces[key] = _SplitWorkspace(stream)
    return found


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
    ``activation`` as in :func:`gemm_mma`. When N alone cannot fill the GPU, K is split across blocks
    and the partial sums are added in a fixed order (results are deterministic); the scratch for that
    belongs to the stream and is allocated on first use, so call once before capturing a CUDA graph.
    On SM 90 and newer, one row of 16-bit x against W stored K x N splits K within thread-block
    clusters instead, which needs no scratch.
    """
    launch = gemv_launch(x, w, out, w_layout=w_layout, bias=bias, activation=activation)
    if launch is not None:
        launch.run(x, w, out, bias, stream)
    elif out.size and out.buffer.device < 0:  # the CPU backend
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        rhs = w.to_numpy().astype(np.float64)
        result = x2.to_numpy().astype(np.float64) @ (rhs.T if w_layout == "nk" else rhs)
        if bias is not None:
            result = result + bias.to_numpy().astype(np.float64)
        result = _apply_activation(result, _activation(activation, "gemv")).astype(out.dtype.numpy)
        out.copy_(result.reshape(out.shape))
    return out


def gemv_launch(
    x: GPUArray,
    w: GPUArray,
    out: GPUArray,
    *,
    w_layout: Literal["kn", "nk"] = "kn",
    bias: GPUArray | None = None,
    activation: str | None = None,
) -> _GemvLaunch | None:
    """The launch :func:`gemv` makes for these operands, validated (the same errors) and kept per call
    shape; its ``run(x, w, out, bias, stream)`` launches it for operands of that call shape. None when
    there is nothing to launch: no output elements, or the CPU backend."""
    key = _gemv_key(x, w, out, w_layout, activation, bias)
    launch = _gemv_launches.get(key) if key is not None else None
    if launch is not None:
        return launch
    op = "gemv"
    x = _require_array(x, "x", op)
    w = _require_array(w, "w", op)
    out = _require_array(out, "out", op)
    if w_layout not in ("kn", "nk"):
        raise ValueError(f"{op}: w_layout must be 'kn' (w is K x N) or 'nk' (w is N x K), got {w_layout!r}")
    if w.ndim != 2 or x.ndim not in (1, 2) or out.ndim != x.ndim:
        raise ShapeError(f"{op}: x must be 1-D or 2-D, w 2-D and out of x's rank; got shapes {x.shape}, {w.shape} "
                         f"and {out.shape}")  # fmt: skip
    if not (x.dtype == w.dtype == out.dtype) or x.dtype not in (float32, float16, bfloat16):
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
    if max(m, n, k) > _INT32_MAX:
        raise ShapeError(f"{op}: dimensions up to 2**31 - 1 are supported, got M={m}, N={n}, K={k}")
    code = _activation(activation, op)
    bias = _bias(bias, n, x.dtype, op, x.dtype)
    ldx = _row_major(x2, "x", op)
    ldw = _row_major(w, "w", op)
    ldy = _row_major(out2, "out", op)
    device = check_devices(op, [v for v in (x, w, out, bias) if v is not None])
    if m == 0 or n == 0 or device < 0:
        return None
    props = _device(device)
    plan = _gemv_plan(x.dtype, m, w_layout, props.clusters)
    blocks = -(-n // plan.per_block)
    splits = 1
    if blocks < plan.target * props.sms and blocks <= _kernels.COUNTERS:
        splits = max(1, min(-(-plan.target * props.sms // blocks), k // plan.split_unit, 65535))
        per_split = _ceil_div(_ceil_div(k, splits), plan.k_step) * plan.k_step  # as the kernel rounds it
        splits = _ceil_div(k, per_split)
    if splits > 1 and props.clusters:
        clustered = _gemv_cluster_plan(x.dtype, m, w_layout, blocks, props.sms)
        if clustered is not None:
            plan, blocks, splits = clustered, -(-n // clustered.per_block), clustered.cluster
    aligned = (ldx * x.itemsize) % 16 == 0 and (ldw * w.itemsize) % 16 == 0
    scalars = (m, n, k, ldx, ldw, ldy, code, splits)
    launch = _GemvLaunch(_kernel(_GEMV, plan.expression), device, (blocks, splits), scalars, aligned,
                         splits > 1 and plan.cluster == 0)  # fmt: skip
    if key is not None:
        if len(_gemv_launches) >= _GEMV_LAUNCHES_MAX:
            _gemv_launches.clear()
        _gemv_launches[key] = launch
    return launch


def _gemv_key(x: Any, w: Any, out: Any, w_layout: str, activation: Any, bias: Any) -> tuple[Any, ...] | None:
    """What a gemv call's validation and launch shape depend on (None: not cacheable)."""
    if not (type(x) is GPUArray and type(w) is GPUArray and type(out) is GPUArray):
        return None
    if type(w_layout) is not str or not (activation is None or type(activation) is str):
        return None
    if not (bias is None or type(bias) is GPUArray):
        return None
    bias_key = None if bias is None else (bias._shape, bias._strides, bias._dtype, bias._buffer.device)
    return (x._shape, x._strides, x._dtype, x._buffer.device, w._shape, w._strides, w._dtype, w._buffer.device,
            out._shape, out._strides, out._dtype, out._buffer.device, w_layout, activation, bias_key)  # fmt: skip


class _GemvLaunch:
    """A validated gemv call shape (what gemv computes from the operands' shapes, strides, dtypes and
    devices), kept so that a repeated call (every decode step) only reads the addresses and launches."""

    __slots__ = ("aligned", "device", "grid", "kernel", "scalars", "workspace")

    def __init__(self, kernel: JITKernel, device: int, grid: tuple[int, int], scalars: tuple[int, ...],
                 aligned: bool, workspace: bool) -> None:  # fmt: skip
        self.kernel = kernel
        self.device = device
        self.grid = grid
        self.scalars = scalars  # m, n, k, ldx, ldw, ldy, activation code, splits
        self.aligned = aligned  # the leading dimensions keep 16-byte row starts
        self.workspace = workspace  # split K through global partial sums and completion counters

    def run(self, x: GPUArray, w: GPUArray, out: GPUArray, bias: GPUArray | None, stream: Stream | None) -> None:
        x_ptr, w_ptr = x.device_ptr, w.device_ptr
        partial_ptr = counters_ptr = 0
        if self.workspace:
            m, n = self.scalars[0], self.scalars[1]
            partial_ptr = _workspace(self.device, stream).partials(self.grid[1] * m * n, stream).device_ptr
            counters = _kernels.completion_counters(self.device, stream)
            assert counters is not None  # made even inside a capture (see gemv's docstring)
            counters_ptr = counters.device_ptr
        vector = int(self.aligned and (x_ptr | w_ptr) % 16 == 0)
        self.kernel(x_ptr, w_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr, *self.scalars, partial_ptr,
                    counters_ptr, vector, grid=self.grid, block=256, stream=stream)  # fmt: skip


_GEMV_LAUNCHES_MAX = 4096
_gemv_launches: dict[tuple[Any, ...], _GemvLaunch] = {}


# -- compile checks -----------------------------------------------------------------------------------
def _gemm_expressions(file: str) -> list[str]:
    tiles = GEMM_WGMMA_TILES if file == _GEMM_WGMMA else GEMM_MMA_TILES
    return [tile.expression(dtype, out_dtype, trans_a, trans_b)
            for tile in tiles for dtype in _HALF for out_dtype in (dtype, float32)
            for trans_a in (False, True) for trans_b in (False, True)]  # fmt: skip


def name_expressions_for(relative_path: str) -> list[str]:
    """Every template instantiation launched from ``relative_path`` (relative to native/kernels, e.g.
    ``gemm/gemm_mma.cu``); empty for other files. gemm_wgmma.cu's kernels have real bodies only when
    compiled for sm_90a (an empty body elsewhere)."""
    if relative_path in (_GEMM_MMA, _GEMM_WGMMA):
        return _gemm_expressions(relative_path)
    if relative_path == _GEMV:
        return _gemv_expressions()
    return []


# Each instantiation is its own compilation (a group of one), as _kernel compiles it.
_kernels.register_enumerator(
    lambda: {path: [(e,) for e in name_expressions_for(path)] for path in (_GEMM_MMA, _GEMM_WGMMA, _GEMV)}
)
