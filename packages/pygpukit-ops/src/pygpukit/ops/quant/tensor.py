"""The quantized weight type: :class:`QuantizedTensor`, a 2-D weight kept on the device in a GGUF block
format (its raw blocks, rows of K elements, exactly as a GGUF file stores them).

The formats (:data:`QUANT_FORMATS`) are GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks) and
the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element blocks). A weight of shape (N, K) holds
N * K / QK blocks; K must be a multiple of the block size so that every row is whole blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import bfloat16, uint8
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.stream import Stream

from .. import gguf as _gguf

__all__ = ["QUANT_FORMATS", "QuantizedTensor", "TransposedWeight", "quant_format"]

QUANT_FORMATS: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""The GGUF block formats a :class:`QuantizedTensor` holds and the quantized GEMV/GEMM run natively."""

_IDS = {  # the ggml type ids
    "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
}  # fmt: skip
_BY_ID = {v: k for k, v in _IDS.items()}


def quant_format(name: str, fmt: Any) -> str:
    """The canonical name (``"Q4_K"``) of a format given by name (any case) or ggml type id; raises
    :class:`ArgumentError` naming the value for anything outside :data:`QUANT_FORMATS`."""
    found: str | None = None
    if isinstance(fmt, str):
        upper = fmt.upper()
        found = upper if upper in _IDS else None
    elif isinstance(fmt, (int, np.integer)) and not isinstance(fmt, bool):
        found = _BY_ID.get(int(fmt))  # also a gguf.GGMLQuantizationType (an IntEnum)
    if found is None:
        raise ArgumentError(f"{name}: unsupported quantized format {fmt!r}; supported: {', '.join(QUANT_FORMATS)}")
    return found


def _shape2(name: str, shape: Any) -> tuple[int, int]:
    if not isinstance(shape, Sequence) or isinstance(shape, str) or len(shape) != 2:
        raise ShapeError(f"{name}: a quantized weight is 2-D (N, K), got shape {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0:
            raise ShapeError(f"{name}: shape must be two positive ints (N, K), got {shape!r}")
        dims.append(int(d))
    return dims[0], dims[1]


class QuantizedTensor:
    """A weight ``W`` of shape (N, K) (a linear layer's (out_features, in_features)) stored as the raw
    blocks of a GGUF format on the device: ``data`` is a contiguous uint8 GPUArray of
    ``N * K / block_elems * block_bytes`` bytes, row n's blocks at ``n * row_bytes``.

    ``pygpukit.ops.linear(x, q)`` and ``matmul(x, q.T)``-style products run on it directly:
    :func:`pygpukit.ops.quantized_linear` (a GEMV reading the packed blocks for up to 8 rows of x, the
    existing GEMM on tiles dequantized to x's dtype beyond). :meth:`dequantize` expands it."""

    __slots__ = ("_host", "block_bytes", "block_elems", "data", "format", "shape")
    _quantized = True  # what linear() looks for (one attribute read)

    def __init__(self, data: GPUArray, fmt: str | int, shape: Sequence[int]) -> None:
        name = "QuantizedTensor"
        self.format = quant_format(name, fmt)
        n, k = _shape2(name, shape)
        elems, nbytes = _gguf.gguf_block_size(self.format)
        if k % elems:
            raise ShapeError(f"{name}: K = {k} (shape {(n, k)}) is not a multiple of the {elems}-element blocks of "
                             f"{self.format}")  # fmt: skip
        if not isinstance(data, GPUArray):
            raise DTypeError(f"{name}: data must be a uint8 GPUArray, got {type(data).__name__}")
        if data.dtype != uint8:
            raise DTypeError(f"{name}: data must be uint8 (the raw blocks), got {data.dtype}")
        if not data.is_contiguous:
            raise ShapeError(f"{name}: data must be contiguous, got strides {data.strides}")
        expected = n * (k // elems) * nbytes
        if data.size != expected:
            raise ShapeError(f"{name}: data has {data.size} bytes but {self.format} {(n, k)} takes {expected}")
        self.data = data.reshape(expected)
        self.shape = (n, k)
        self.block_elems, self.block_bytes = elems, nbytes
        self._host: Any = None  # the CPU backend's decoded float32 weight (host_weights)

    @classmethod
    def from_raw(
        cls, raw: Any, fmt: str | int, shape: Sequence[int], *, stream: Stream | None = None
    ) -> QuantizedTensor:
        """From the tensor's bytes on the host (a NumPy uint8 array, as ``gguf.quants.quantize`` or a
        GGUF reader returns them), copied to the device."""
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
            raise DTypeError(f"QuantizedTensor.from_raw: raw must be a NumPy uint8 array, got {type(raw).__name__} "
                             f"{getattr(raw, 'dtype', '')}")  # fmt: skip
        return cls(from_numpy(np.ascontiguousarray(raw).reshape(-1), stream=stream), fmt, shape)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def T(self) -> TransposedWeight:  # noqa: N802 (NumPy's name)
        """The (K, N) transpose, for ``pygpukit.ops.matmul(x, w.T)`` (the same product as ``linear(x, w)``)."""
        return TransposedWeight(self)

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    @property
    def row_bytes(self) -> int:
        return self.shape[1] // self.block_elems * self.block_bytes

    @property
    def device(self) -> int:
        return int(self.data.buffer.device)

    def dequantize(self, dtype: Any = bfloat16, *, out: GPUArray | None = None) -> GPUArray:
        """The (N, K) weight decoded to float32, float16 or bfloat16 on the device
        (:func:`pygpukit.ops.dequantize_gguf`: float32 equals ``gguf.quants.dequantize`` bit for bit)."""
        return _gguf.dequantize_gguf(self.data, self.format, self.shape, dtype, out=out)

    def host_weights(self) -> Any:
        """The CPU simulation backend's float32 (N, K) NumPy copy of the decoded weight, decoded once
        and kept (a weight's bytes are not expected to change; :meth:`forget_host_weights` drops it)."""
        if self._host is None:
            from pygpukit.core.dtypes import float32

            from .. import _cpu

            self._host = _cpu.host(self.dequantize(float32)).copy()
        return self._host

    def forget_host_weights(self) -> None:
        self._host = None

    def rows(self, first: int, last: int) -> QuantizedTensor:
        """Rows [first, last) as a QuantizedTensor viewing the same device bytes (no copy)."""
        n = self.shape[0]
        if not (0 <= first < last <= n):
            raise ShapeError(f"QuantizedTensor.rows: [{first}, {last}) is not a non-empty row range of {n} rows")
        rb = self.row_bytes
        return QuantizedTensor(self.data[first * rb : last * rb], self.format, (last - first, self.shape[1]))

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.format}, shape={self.shape}, {self.nbytes} bytes, device={self.device})"


class TransposedWeight:
    """``w.T`` of a quantized weight ``w`` (N, K): shape (K, N). ``pygpukit.ops.matmul(x, w.T)`` runs
    ``linear(x, w)``; ``.T`` gives ``w`` back. Holds no data of its own."""

    __slots__ = ("weight",)
    _quantized_t = True  # what matmul() looks for (one attribute read)

    def __init__(self, weight: Any) -> None:
        self.weight = weight

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.weight.shape
        return (k, n)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def T(self) -> Any:  # noqa: N802 (NumPy's name)
        return self.weight

    def __repr__(self) -> str:
        return f"{self.weight!r}.T"
