"""Products with GGUF block-quantized weights (:class:`~pygpukit.ops.quant.tensor.QuantizedTensor`).

- :func:`quantized_gemv`: the decode path, ``y (M, N) = x (M, K) @ W.T`` for M = 1 .. 8, reading W's
  packed blocks straight from device memory. Q4_K, Q5_K (the weight's start 16-byte aligned, as every
  upload is), Q6_K and Q8_0 weights with fp16 / bf16 x go to the tensor-core kernels
  (native/kernels/quant/gguf_gemv_mma.cu): the quants as exact small integers in mma.sync tiles of 16
  rows, each scale group's products scaled in float32 afterwards, 2 to 8 warps per tile splitting K, a
  block per tile or (``PERSISTENT_MMA``) the resident blocks walking tiles (:func:`_mma_layout`). Every
  other case goes to native/kernels/quant/gguf_gemv.cu: a warp per row of W (2 to 8 warps per row where
  N is too small to fill the device: :func:`_split`), 16-byte loads of the blocks, x staged once per
  block in shared memory as float32 (with its group sums), float32 accumulation, instantiated per
  format, activation dtype (float32, float16, bfloat16) and rows of x rounded up to 1, 2, 4 or 8.
- :func:`quantized_linear`: ``act(x @ W.T + b)`` for x of any leading shape: the GEMV up to 8 rows;
  beyond (prefill), W is dequantized to x's dtype in row tiles and each tile goes through the
  existing GEMM (:func:`pygpukit.ops.linear`), so at most :data:`PREFILL_TILE_BYTES` of decoded
  weight exist at a time. ``pygpukit.ops.linear(x, q)`` with a QuantizedTensor lands here.

Precision: the kernels sum in float32 in their own order (the tensor cores per 16 elements, or per
lane over 8-element groups, then a warp tree), so results differ from a float64 reference by float32
rounding of a K-term dot product: the tests bound
``|y - ref| <= 2e-5 * sum_k |x_k| |w_k| + 1 ulp of the output dtype``. The CPU simulation
backend computes the same product in NumPy (weights decoded to float32 as the gguf package decodes
them, the product in float64 like the backend's ``linear``, one rounding).
Prefill (more than 8 rows) multiplies W *rounded once to x's dtype* (the dequantized tile), so with
float16/bfloat16 x every weight carries up to half an ulp of that dtype more: the bound grows by
``u * sum_k |x_k| |w_k|`` (u = 2**-11 for float16, 2**-8 for bfloat16; nothing for float32). Both
backends run that same path (the CPU one through its NumPy dequantize and ``linear``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream, thread_device

from .. import _cpu
from .._kernels import (
    NAMESPACE,
    Groups,
    c_param,
    code_param,
    group,
    launch,
    pointer,
    register_enumerator,
    size_param,
    sm_count,
)
from .._layout import check_devices, is_cuda
from ..gemm._base import check_activation, check_bias, row_major_ld
from .fp8_block import BlockFP8Tensor, block_fp8_linear
from .int4 import Int4Tensor, int4_linear
from .nvf4 import NVF4Tensor, nvf4_linear
from .tensor import _IDS, QUANT_FORMATS, QuantizedTensor
from .weight_only import ChannelQuantizedTensor, weight_only_linear

__all__ = ["GEMV_BUCKETS", "PREFILL_TILE_BYTES", "QUANT_GEMV_MAX_ROWS", "quantized_gemv", "quantized_linear"]

_FILE = "quant/gguf_gemv.cu"
QUANT_GEMV_MAX_ROWS = 8
GEMV_BUCKETS = (1, 2, 4, 8)  # the kernel's M template values; rows of x round up to one
PREFILL_TILE_BYTES = 256 << 20  # decoded weight bytes per prefill tile
_ROWS_PER_BLOCK = 8  # kWarps of the kernel: a warp per row of W
_DTYPES = (float32, float16, bfloat16)
_PARAMS = [pointer("x"), pointer("w"), pointer("y"), pointer("bias"), c_param("rows", "int"), c_param("n", "int"),
           c_param("k", "int"), size_param("ldx"), size_param("ldy"), code_param("vector"),
           code_param("split")]  # fmt: skip
_SEGMENT = 1024  # kSegElems of the kernel: elements of a row per warp step
_MAX_X_SEGMENTS = 8  # kMaxXSegments of the kernel: rows of x (bucket) times split at most
_X_STAGE_BYTES = _SEGMENT * 4 + _SEGMENT // 16 * 4  # dynamic shared memory per row of x per split
_SPLIT_FOR_TESTS: int | None = None  # forces the warps-per-row split (tests)
_INT32_MAX = 2**31 - 1
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.quant_gemv")
_MMA_KERNELS: PlanCache[tuple[JITKernel, _Device]] = PlanCache("ops.quant_gemv_mma")
_MMA_FILE = "quant/gguf_gemv_mma.cu"
_MMA_FORMATS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0")  # the tensor-core kernels' formats (fp16 / bf16 x)
_MMA_DTYPES = (float16, bfloat16)
_MMA_TILE = 16  # rows of W per block of the tensor-core kernel
_MMA_PARAMS = _PARAMS[:-1]  # no split
_MMA_WARPS_FOR_TESTS: int | None = None  # forces the tensor-core kernel's warps per block (tests)
_MMA_GRID_FOR_TESTS: int | None = None  # forces its blocks (tests: one block walking every tile)
_MMA_MAX_WARPS = 8  # kMmaMaxThreads / 32
USE_MMA_GEMV = True  # False: every format through gguf_gemv.cu (benchmarks compare the two)
# True: the tensor-core kernels run at most as many blocks as fit on the device at once, each walking
# several tiles (no tail of a last partial wave, the next tile's loads in flight during a tile's
# epilogue); False: one block per tile, the hardware handing tiles to SMs as they free up. On the H100
# (2026-12-07, Llama-3-8B shapes) the two were within the run-to-run spread; benchmarks compare them.
PERSISTENT_MMA = False


def _mma_expression(fmt: str, dtype: DType, stages: int) -> str:
    if fmt == "Q6_K":
        return f"{NAMESPACE}qgemv::gguf_gemv_mma_q6k<{dtype.ctype}, {stages}>"
    if fmt == "Q8_0":
        return f"{NAMESPACE}qgemv::gguf_gemv_mma_q8_0<{dtype.ctype}, {stages}>"
    return f"{NAMESPACE}qgemv::gguf_gemv_mma<{_IDS[fmt]}, {dtype.ctype}, {stages}>"


# Blocks a warp of the tensor-core kernels stages at once (their Stages argument: 2 or 3): three keep two
# blocks per warp in flight, two fit three blocks of 8 warps on an SM instead of two.
MMA_STAGES = 3
_MMA_X_STRIDE = 576  # kMmaXStride
# Rows of x from which a format takes the tensor-core kernel: on the H100 (2026-12-07) Q8_0 at M = 1
# ran 2x faster through gguf_gemv.cu (its staged reads cost more than the SIMT decode), at M = 8 2-3x
# slower.
MMA_MIN_ROWS = {"Q4_K": 1, "Q5_K": 1, "Q6_K": 1, "Q8_0": 2}
# At one row of x, formats listed here take the tensor-core kernel only from this N: Q6_K's, with x
# staged in shared memory, was 1.10-1.18x the SIMT kernel at N >= 4096 on the H100 (2026-12-07,
# Llama-3-8B shapes) and 0.7x at 1024 x 4096.
MMA_MIN_N_AT_ONE_ROW = {"Q6_K": 4096}
_MMA_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176}


def _mma_shared(fmt: str, warps: int, x_rows: int = 0, stages: int | None = None) -> int:
    """The kernel's dynamic shared memory: per warp ``stages`` (default MMA_STAGES) copies of 16 rows of one
    block (Q8_0: a step of 8 blocks) and of ``x_rows`` rows of x (kMmaXStride bytes each: 16-byte
    aligned x is staged with the weights), and two buffers of 16 x 8 float partial sums. Q4_K / Q5_K
    (MmaStage): the row stride in words padded to 8 or 24 modulo 32; Q6_K: 14 aligned 16-byte chunks per
    row (kQ6Stride); Q8_0: 18 per step of 8 blocks."""
    if fmt in ("Q6_K", "Q8_0"):
        words = 56 if fmt == "Q6_K" else 72  # kQ6Stride, kQ8Stride
    else:
        words = -(-_MMA_BLOCK_BYTES[fmt] // 16) * 4
        while words % 32 not in (8, 24):
            words += 4
    stages = MMA_STAGES if stages is None else stages
    return warps * (stages * (_MMA_TILE * 4 * words + x_rows * _MMA_X_STRIDE) + 2 * _MMA_TILE * 8 * 4)


def _mma_kernel(fmt: str, dtype: DType, stages: int) -> tuple[JITKernel, _Device]:
    """The tensor-core kernel of ``fmt`` and ``dtype`` on the calling thread's device, with the device
    facts its launch layout needs (both made once per device: reading them costs about a millisecond)."""
    key = ("mma", fmt, dtype, stages, thread_device())
    made = _MMA_KERNELS.get(key)
    if made is None:
        expression = _mma_expression(fmt, dtype, stages)
        kernel = group(_MMA_FILE, (expression,)).kernel(expression, _MMA_PARAMS)
        kernel.set_max_dynamic_shared_memory(get_device_info(thread_device()).max_shared_memory_per_block_optin)
        made = _MMA_KERNELS.put(key, (kernel, _Device.of(kernel)))
    return made


class _Device:
    """What the tensor-core GEMV's launch layout depends on: SMs, shared memory per SM and per block
    (opt-in), and the kernel's registers per thread."""

    __slots__ = ("optin", "regs", "smem", "sms")

    def __init__(self, sms: int, smem: int, optin: int, regs: int) -> None:
        self.sms, self.smem, self.optin, self.regs = sms, smem, optin, regs

    @classmethod
    def of(cls, kernel: JITKernel) -> _Device:
        info = get_device_info(thread_device())
        regs = int(kernel.attributes.get("num_regs", 128))
        return cls(sm_count(), info.max_shared_memory_per_multiprocessor, info.max_shared_memory_per_block_optin,
                   regs)  # fmt: skip

    def blocks_per_sm(self, warps: int, shared: int) -> int:
        """Blocks of ``warps`` warps and ``shared`` bytes of dynamic shared memory one SM holds at once
        (threads; registers in 256-register warp allocations; shared memory, 1 KiB reserved per block)."""
        if shared > self.optin:
            return 0
        regs = -(-max(self.regs, 1) * 32 // 256) * 256
        return max(0, min(2048 // (32 * warps), 65536 // (regs * warps), self.smem // (shared + 1024), 32))


def _mma_layout(device: _Device, fmt: str, m: int, n: int, k: int) -> tuple[int, int]:
    """(warps per block, blocks) of a tensor-core GEMV launch. Each warp takes every warps-th k-quant
    block (Q8_0: step of 8 blocks) of a 16-row tile: 8 warps, 4 for Q4_K / Q5_K beyond 4 rows of x (the
    H100 run of 2026-12-07: at M = 1 eight were fastest or tied, at M = 8 four 7-25 % ahead for those
    formats), never more than a row has blocks, halved until a block fits (forced warps too: tests, the
    benchmark's --mma-warps, 2 .. 8). With PERSISTENT_MMA the grid is at most the blocks that fit on
    the device at once, each walking tiles blockIdx.x, + gridDim.x, ...; else a block per tile. (On the
    H100, 2026-12-07, the two were within the run-to-run spread of each other at the Llama-3-8B shapes,
    and 16 warps per tile, tried then, no faster than 8.)"""
    units = -(-k // 256)
    warps = min(_MMA_WARPS_FOR_TESTS or (4 if fmt in ("Q4_K", "Q5_K") and m > 4 else 8), _MMA_MAX_WARPS)
    while warps > 2 and ((warps > units and _MMA_WARPS_FOR_TESTS is None)
                         or device.blocks_per_sm(warps, _mma_shared(fmt, warps, m)) == 0):  # fmt: skip
        warps //= 2
    tiles = -(-n // _MMA_TILE)
    per_sm = max(device.blocks_per_sm(warps, _mma_shared(fmt, warps, m)), 1)
    grid = min(tiles, device.sms * per_sm) if PERSISTENT_MMA else tiles
    if _MMA_GRID_FOR_TESTS is not None:
        grid = min(grid, _MMA_GRID_FOR_TESTS)
    return warps, grid


def _expression(fmt: str, dtype: DType, bucket: int) -> str:
    return f"{NAMESPACE}qgemv::gguf_gemv<{_IDS[fmt]}, {dtype.ctype}, {bucket}>"


def _expressions(fmt: str, dtype: DType) -> tuple[str, ...]:
    """One compilation per format and dtype holds every row bucket (a model uses them all)."""
    return tuple(_expression(fmt, dtype, b) for b in GEMV_BUCKETS)


def _bucket(rows: int) -> int:
    return next(b for b in GEMV_BUCKETS if b >= rows)


def _kernel(fmt: str, dtype: DType, bucket: int) -> JITKernel:
    key = (fmt, dtype, bucket, thread_device())
    kernel = _KERNELS.get(key)
    if kernel is None:
        expression = _expression(fmt, dtype, bucket)
        kernel = _KERNELS.put(key, group(_FILE, _expressions(fmt, dtype)).kernel(expression, _PARAMS))
    return kernel


def _check_weight(q: Any, op: str) -> QuantizedTensor:
    if not isinstance(q, QuantizedTensor):
        raise DTypeError(f"{op}: w must be a QuantizedTensor, got {type(q).__name__}")
    return q


def _check_x(x: Any, k: int, op: str) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{op}: x must be a GPUArray, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise DTypeError(f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(f"{op}: x of shape {x.shape} does not have the weight's K = {k} features")
    return x


def _host_product(x2: GPUArray, q: QuantizedTensor, bias: GPUArray | None, code: int, out: GPUArray) -> None:
    """The CPU simulation backend: W decoded to float32 (bit for bit the gguf package's), the product,
    bias and activation in float64 as the backend's ``linear`` computes them, one rounding to out's
    dtype (so a float32 model gives the same bits as with the weight dequantized to float32)."""
    from ..gemm._base import apply_activation

    w = q.host_weights().astype(np.float64)
    y = _cpu.host(x2).astype(np.float64) @ w.T
    if bias is not None:
        y = y + _cpu.host(bias).astype(np.float64)
    if code:
        y = apply_activation(y, code)
    _cpu.store(out, y)


def quantized_gemv(
    x: GPUArray,
    w: QuantizedTensor,
    out: GPUArray | None = None,
    *,
    bias: GPUArray | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``out = x @ W.T (+ bias)`` for ``x`` of shape (K,) or (M, K) with M <= 8 (float32, float16 or
    bfloat16, rows of unit stride) and a :class:`QuantizedTensor` ``w`` of shape (N, K); ``out`` (N,)
    or (M, N) of x's dtype (allocated when None), ``bias`` (N,) of x's dtype. Reads W's blocks once;
    with ``out`` given nothing is allocated (graph-capturable). Typed errors (:class:`DTypeError`,
    :class:`ShapeError`) name the bad value; nothing is launched then."""
    op = "quantized_gemv"
    q = _check_weight(w, op)
    n, k = q.shape
    x = _check_x(x, k, op)
    if x.ndim > 2:
        raise ShapeError(f"{op}: x must be (K,) or (M, K), got shape {x.shape}")
    x2 = x.reshape(1, k) if x.ndim == 1 else x
    m = x2.shape[0]
    if m > QUANT_GEMV_MAX_ROWS:
        raise ShapeError(f"{op}: x has {m} rows; the GEMV takes at most {QUANT_GEMV_MAX_ROWS} (use quantized_linear)")
    want = (n,) if x.ndim == 1 else (m, n)
    if out is None:
        out = empty(want, x.dtype, stream=stream)
    elif not isinstance(out, GPUArray):
        raise DTypeError(f"{op}: out must be a GPUArray, got {type(out).__name__}")
    elif out.shape != want or out.dtype != x.dtype:
        raise ShapeError(f"{op}: out must have shape {want} and dtype {x.dtype}, got {out.shape} {out.dtype}")
    out2 = out.reshape(1, n) if out.ndim == 1 else out
    bias = check_bias(bias, n, x.dtype, op, x.dtype)
    ldx, ldy = row_major_ld(x2), row_major_ld(out2)
    if ldx is None or ldy is None:
        raise ShapeError(f"{op}: x (strides {x.strides}) and out (strides {out.strides}) must be row-major")
    if max(n, k) > _INT32_MAX:
        raise ShapeError(f"{op}: N = {n} and K = {k} must be below 2**31")
    check_devices(op, [v for v in (x, q.data, out, bias) if v is not None])
    if m == 0:
        return out
    if not is_cuda():
        _host_product(x2, q, bias, 0, out2)
        return out
    _Launch(q.format, x.dtype, m, n, k, ldx, ldy, x.itemsize, 0).run(x2, q, bias, out2, stream)
    return out


def _split(n: int, k: int, bucket: int = 1) -> int:
    """Warps per row of W (1, 2, 4 or 8): more while the grid would be under two blocks per SM and
    every warp still gets a segment of K (short, wide products such as a 7B model's K/V projections),
    at most 8 / bucket (the block stages bucket * split segments of x in shared memory)."""
    segments = -(-k // _SEGMENT)
    target = 2 * sm_count()
    limit = _MAX_X_SEGMENTS // bucket
    split = 1
    while split < limit and 2 * split <= segments and -(-n * split // _ROWS_PER_BLOCK) < target:
        split *= 2
    return split


class _Launch:
    """A checked GEMV call shape: the kernel, its grid and scalars; ``run`` launches it for one call's
    addresses (x's 16-byte alignment read then). With ``code`` an activation follows on the device."""

    __slots__ = ("aligned", "code", "fmt", "grid", "kernel", "mma", "scalars", "shared", "split")

    def __init__(self, fmt: str, dtype: DType, m: int, n: int, k: int, ldx: int, ldy: int, itemsize: int,
                 code: int) -> None:  # fmt: skip
        self.fmt = fmt
        self.scalars = (m, n, k, ldx, ldy)
        self.aligned = (ldx * itemsize) % 16 == 0
        self.code = code
        self.kernel: JITKernel | None = None  # gguf_gemv.cu's, made when a call first needs it
        self.grid = self.shared = self.split = 0
        # the tensor-core kernel (taken when the weight's start is 16-byte aligned): kernel, grid, block,
        # shared memory
        # (kernel, grid, block, shared memory with x staged, without)
        self.mma: tuple[JITKernel, int, int, int, int] | None = None
        if (USE_MMA_GEMV and fmt in _MMA_FORMATS and dtype in _MMA_DTYPES and m >= MMA_MIN_ROWS[fmt]
                and (m > 1 or n >= MMA_MIN_N_AT_ONE_ROW.get(fmt, 0))):  # fmt: skip
            kernel, device = _mma_kernel(fmt, dtype, MMA_STAGES)
            warps, grid = _mma_layout(device, fmt, m, n, k)
            self.mma = (kernel, grid, 32 * warps, _mma_shared(fmt, warps, m), _mma_shared(fmt, warps))
        else:
            self._fallback(dtype)

    def _fallback(self, dtype: DType) -> JITKernel:
        m, n, k = self.scalars[:3]
        bucket = _bucket(m)
        split = _split(n, k, bucket) if _SPLIT_FOR_TESTS is None else min(_SPLIT_FOR_TESTS, _MAX_X_SEGMENTS // bucket)
        self.grid = -(-n // (_ROWS_PER_BLOCK // split))
        self.shared = bucket * split * _X_STAGE_BYTES
        self.split = split
        self.kernel = kernel = _kernel(self.fmt, dtype, bucket)
        return kernel

    def run(self, x2: GPUArray, q: QuantizedTensor, bias: GPUArray | None, out2: GPUArray,
            stream: Stream | None) -> None:  # fmt: skip
        x_ptr = x2.device_ptr
        w_ptr = q.data.device_ptr
        vector = int(self.aligned and x_ptr % 16 == 0)
        common = (x_ptr, w_ptr, out2.device_ptr, 0 if bias is None else bias.device_ptr, *self.scalars, vector)
        # Q4_K / Q5_K read their blocks as aligned 16-byte chunks; Q6_K's staging assumes even starts
        if self.mma is not None and w_ptr % (2 if self.fmt in ("Q6_K", "Q8_0") else 16) == 0:
            kernel, grid, block, staged, unstaged = self.mma
            shared = staged if vector else unstaged
            args: tuple[int, ...] = common
        else:
            kernel = self.kernel if self.kernel is not None else self._fallback(x2.dtype)
            grid, block, shared = self.grid, 256, self.shared
            args = (*common, self.split)
        if stream is None:
            launch(kernel, args, grid, block, shared)
        else:
            kernel(*args, grid=grid, block=block, shared_mem=shared, stream=stream)
        if self.code:
            _activate(out2, self.code, stream)


class _DecodePlan:
    """quantized_linear's repeated decode call (contiguous x of at most 8 rows on the device): allocate
    the result, launch; no checks (they ran when the call shape was first seen)."""

    __slots__ = ("dtype", "launch", "result_shape", "rows_shape")

    def __init__(self, launch: _Launch, rows_shape: tuple[int, int], result_shape: tuple[int, ...],
                 dtype: DType) -> None:  # fmt: skip
        self.launch, self.rows_shape, self.dtype = launch, rows_shape, dtype
        self.result_shape = None if result_shape == rows_shape else result_shape

    def __call__(self, x: GPUArray, q: QuantizedTensor, bias: GPUArray | None, stream: Stream | None) -> GPUArray:
        out = empty(self.rows_shape, self.dtype, stream=stream)
        self.launch.run(x, q, bias, out, stream)
        return out if self.result_shape is None else out.reshape(self.result_shape)


_DECODE: PlanCache[_DecodePlan] = PlanCache("ops.quant_linear")


def _activate(y: GPUArray, code: int, stream: Stream | None) -> None:
    from pygpukit.core.codes import ACTIVATION_CODES

    from .. import elementwise

    names = {v: name for name, v in ACTIVATION_CODES.items()}
    function = {"relu": elementwise.relu, "gelu": elementwise.gelu, "gelu_tanh": elementwise.gelu_tanh,
                "silu": elementwise.silu}[names[code]]  # fmt: skip
    if stream is None:
        function(y, out=y)
    else:
        with stream:
            function(y, out=y)


def quantized_linear(
    x: GPUArray,
    w: QuantizedTensor | ChannelQuantizedTensor | Int4Tensor | BlockFP8Tensor | NVF4Tensor,
    b: GPUArray | None = None,
    activation: str | None = None,
    *,
    stream: Stream | None = None,
    out: GPUArray | None = None,
) -> GPUArray:
    """``activation(x @ W.T + b)`` like :func:`pygpukit.ops.linear`, for a :class:`QuantizedTensor`
    ``w`` of shape (out_features, in_features) and x (..., in_features) of float32, float16 or
    bfloat16. Up to 8 rows: :func:`quantized_gemv` on the packed blocks (the activation, if any,
    after it); more (prefill): W dequantized to x's dtype in row tiles of at most
    :data:`PREFILL_TILE_BYTES`, each through the GEMM dispatch (cuBLASLt / tensor cores). A
    :class:`~pygpukit.ops.quant.weight_only.ChannelQuantizedTensor` (FP8/INT8 with per-channel
    scales) goes to :func:`~pygpukit.ops.quant.weight_only.weight_only_linear`, and the INT4,
    block-FP8 and NVF4 types to theirs. ``out`` (contiguous, the result's shape, x's dtype): the weight
    types other than QuantizedTensor write their decode GEMV straight into it (nothing allocated);
    otherwise the result is copied in."""
    if out is not None and not isinstance(w, QuantizedTensor):
        if isinstance(w, ChannelQuantizedTensor):
            return weight_only_linear(x, w, b, activation, stream=stream, out=out)
        if isinstance(w, BlockFP8Tensor):
            return block_fp8_linear(x, w, b, activation, stream=stream, out=out)
        if isinstance(w, NVF4Tensor):
            return nvf4_linear(x, w, b, activation, stream=stream, out=out)
        if isinstance(w, Int4Tensor):
            return int4_linear(x, w, b, activation, stream=stream, out=out)
    if out is not None:
        want = (*x.shape[:-1], w.shape[0]) if isinstance(x, GPUArray) else None
        if not isinstance(out, GPUArray):
            raise DTypeError(f"linear: out must be a GPUArray, got {type(out).__name__}")
        if want is not None and (out.shape != want or out.dtype != x.dtype):
            raise ShapeError(f"linear: out must have shape {want} and dtype {x.dtype}, got {out.shape} {out.dtype}")
        rows = int(np.prod(want[:-1])) if want is not None and len(want) > 1 else 1
        if (isinstance(w, QuantizedTensor) and want is not None and rows <= QUANT_GEMV_MAX_ROWS
                and out.is_contiguous and x.is_contiguous):  # fmt: skip
            # the decode GEMV straight into out: nothing allocated (graph-capturable)
            code = check_activation(activation, "linear")
            x2, out2 = x.reshape(rows, x.shape[-1]), out.reshape(rows, w.shape[0])
            if not is_cuda():  # as without out: the activation before the one rounding
                _check_x(x, w.shape[1], "linear")
                bias = check_bias(b, w.shape[0], x.dtype, "linear", x.dtype)
                check_devices("linear", [v for v in (x, w.data, bias, out) if v is not None])
                _host_product(x2, w, bias, code, out2)
                return out
            quantized_gemv(x2, w, out2, bias=b, stream=stream)
            if code:
                _activate(out, code, stream)
            return out
        result = quantized_linear(x, w, b, activation, stream=stream)
        out.copy_(result.reshape(out.shape))
        return out
    key = None
    if type(x) is GPUArray and type(w) is QuantizedTensor and (b is None or type(b) is GPUArray):
        # The buffers' devices are >= 0 only on the CUDA backend: a key never matches across backends.
        key = ("quantized_linear", x._shape, x._strides, x._dtype, x._buffer.device, w.format, w.shape,
               w.data._buffer.device, None if b is None else (b._shape, b._strides, b._dtype, b._buffer.device),
               activation)  # fmt: skip
        plan = _DECODE.get(key)
        if plan is not None:
            return plan(x, w, b, stream)
    op = "linear"
    if isinstance(w, ChannelQuantizedTensor):
        return weight_only_linear(x, w, b, activation, stream=stream)
    if isinstance(w, BlockFP8Tensor):  # FP8 with 128x128 block scales (fp8_block.py)
        return block_fp8_linear(x, w, b, activation, stream=stream)
    if isinstance(w, NVF4Tensor):  # e2m1 values, e4m3 scales per 16 (nvf4.py)
        return nvf4_linear(x, w, b, activation, stream=stream)
    if isinstance(w, Int4Tensor):  # group-quantized INT4, AWQ / GPTQ packing (int4.py)
        return int4_linear(x, w, b, activation, stream=stream)
    q = _check_weight(w, op)
    n, k = q.shape
    x = _check_x(x, k, op)
    code = check_activation(activation, op)
    bias = check_bias(b, n, x.dtype, op, x.dtype)
    lead = x.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    x2 = x.reshape(rows, k) if x.is_contiguous else x.contiguous(stream=stream).reshape(rows, k)
    out = empty((rows, n), x.dtype, stream=stream)
    if rows == 0:
        return out.reshape((*lead, n))
    if rows <= QUANT_GEMV_MAX_ROWS and not is_cuda():
        check_devices(op, [v for v in (x, q.data, bias) if v is not None])
        _host_product(x2, q, bias, code, out)
        return out.reshape((*lead, n))
    if rows <= QUANT_GEMV_MAX_ROWS:
        quantized_gemv(x2, q, out, bias=bias, stream=stream)  # every check, then the launch
        if code:
            _activate(out, code, stream)
        if key is not None and x.is_contiguous:
            launch_ = _Launch(q.format, x.dtype, rows, n, k, k, n, x.itemsize, code)
            _DECODE.put(key, _DecodePlan(launch_, (rows, n), (*lead, n), x.dtype))
        return out.reshape((*lead, n))
    # Prefill, on both backends alike: W rounded once to x's dtype (the tile the GEMM reads), then
    # the GEMM; the CPU backend runs this same code so that it shows the same weight rounding.
    from ..gemm.api import linear

    tile = max(1, PREFILL_TILE_BYTES // (k * x.itemsize))
    if tile >= n:
        wd = q.dequantize(x.dtype)
        return linear(x2, wd, bias, activation, stream=stream).reshape((*lead, n))
    from .. import shape as _shape

    parts = []
    for first in range(0, n, tile):
        last = min(n, first + tile)
        wd = q.rows(first, last).dequantize(x.dtype)
        part_bias = None if bias is None else bias[first:last]
        parts.append(linear(x2, wd, part_bias, activation, stream=stream))
    return _shape.concatenate(parts, axis=1).reshape((*lead, n))


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    return {_FILE: [_expressions(f, d) for f in QUANT_FORMATS for d in _DTYPES],
            _MMA_FILE: [(_mma_expression(f, d, st),) for f in _MMA_FORMATS for d in _MMA_DTYPES
                        for st in (2, 3)]}  # fmt: skip


register_enumerator(_enumerate)
