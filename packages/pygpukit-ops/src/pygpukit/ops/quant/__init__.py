"""Quantized weights that run natively on the device (issue 18), GGUF block formats first.

- ``tensor``: :class:`QuantizedTensor`, a 2-D weight kept as the raw blocks of a GGUF format.
- ``quantizers``: :func:`quantize` (float weights to a format, equal to the gguf package's reference
  quantizers) and :func:`dequantize`.
- ``gemv``: :func:`quantized_gemv` (decode, up to 8 rows, reads the packed blocks) and
  :func:`quantized_linear` (any rows: the GEMV, or dequantized tiles through the GEMM for prefill);
  ``pygpukit.ops.linear`` hands a QuantizedTensor weight to it.
- ``weight_only``: :class:`ChannelQuantizedTensor` (FP8 e4m3 or INT8 with per-channel scales),
  :func:`quantize_per_channel` and its GEMV (native/kernels/quant/wo_gemv.cu).

See docs/quantization.md.
"""

from __future__ import annotations

from . import gemv as gemv
from . import quantizers as quantizers
from . import tensor as tensor
from . import weight_only as weight_only
from .gemv import QUANT_GEMV_MAX_ROWS, quantized_gemv, quantized_linear
from .quantizers import QUANTIZE_FORMATS, dequantize, quantize
from .tensor import QUANT_FORMATS, QuantizedTensor
from .weight_only import ChannelQuantizedTensor, quantize_per_channel

__all__ = [
    "QUANTIZE_FORMATS",
    "QUANT_FORMATS",
    "QUANT_GEMV_MAX_ROWS",
    "ChannelQuantizedTensor",
    "QuantizedTensor",
    "dequantize",
    "quantize",
    "quantize_per_channel",
    "quantized_gemv",
    "quantized_linear",
]
