"""Quantized weights that run natively on the device (issue 18), GGUF block formats first.

- ``tensor``: :class:`QuantizedTensor`, a 2-D weight kept as the raw blocks of a GGUF format.
- ``quantizers``: :func:`quantize` (float weights to a format, equal to the gguf package's reference
  quantizers) and :func:`dequantize`.
- ``gemv``: :func:`quantized_gemv` (decode, up to 8 rows, reads the packed blocks) and
  :func:`quantized_linear` (any rows: the GEMV, or dequantized tiles through the GEMM for prefill);
  ``pygpukit.ops.linear`` hands a QuantizedTensor weight to it.
- ``weight_only``: :class:`ChannelQuantizedTensor` (FP8 e4m3 or INT8 with per-channel scales),
  :func:`quantize_per_channel` and its GEMV (native/kernels/quant/wo_gemv.cu).
- ``int4``: :class:`Int4Tensor` (group-quantized INT4 in the AWQ / GPTQ packings of HF checkpoints),
  :func:`quantize_int4` and its GEMV (native/kernels/quant/int4_gemv.cu); packing in ``int4_pack``.
- ``kquants``: the k-quant quantizers (llama.cpp's reference algorithm) behind ``quantize(w, "q4_k")``.
- ``fp8_block``: :class:`BlockFP8Tensor` (FP8 e4m3 with 128x128 block scales, HF "fp8" checkpoints) and
  its GEMV (native/kernels/quant/fp8_block_gemv.cu); ``nvf4``: :class:`NVF4Tensor` (e2m1 values, e4m3
  scales per 16, a float32 tensor scale) and its dequantizing GEMV (native/kernels/quant/nvf4_gemv.cu).
- ``fp8_act``: :func:`quantize_fp8`, dynamic e4m3 quantization of activations (W8A8 with scaled_matmul).
- ``experts``: :class:`QuantizedExperts` (MoE experts in a GGUF block format), the grouped GEMV and
  grouped GEMM that ``pygpukit.ops.moe_mlp`` runs their projections through, and
  :func:`quantized_moe_mlp` (the same call as ``moe_mlp``).

See docs/quantization.md.
"""

from __future__ import annotations

from . import experts as experts
from . import fp8_act as fp8_act
from . import fp8_block as fp8_block
from . import gemv as gemv
from . import int4 as int4
from . import int4_pack as int4_pack
from . import kquants as kquants
from . import nvf4 as nvf4
from . import quantizers as quantizers
from . import tensor as tensor
from . import weight_only as weight_only
from .experts import QuantizedExperts, quantize_experts, quantized_moe_mlp
from .fp8_act import quantize_fp8
from .fp8_block import BlockFP8Tensor, quantize_block_fp8
from .gemv import QUANT_GEMV_MAX_ROWS, quantized_gemv, quantized_linear
from .int4 import INT4_PACKINGS, ActOrderError, Int4Tensor, quantize_int4
from .nvf4 import NVF4Tensor, quantize_nvf4
from .quantizers import QUANTIZE_FORMATS, dequantize, quantize
from .tensor import QUANT_FORMATS, QuantizedTensor
from .weight_only import ChannelQuantizedTensor, quantize_per_channel

__all__ = [
    "INT4_PACKINGS",
    "QUANTIZE_FORMATS",
    "QUANT_FORMATS",
    "QUANT_GEMV_MAX_ROWS",
    "ActOrderError",
    "BlockFP8Tensor",
    "ChannelQuantizedTensor",
    "Int4Tensor",
    "NVF4Tensor",
    "QuantizedExperts",
    "QuantizedTensor",
    "dequantize",
    "quantize",
    "quantize_block_fp8",
    "quantize_experts",
    "quantize_fp8",
    "quantize_int4",
    "quantize_nvf4",
    "quantize_per_channel",
    "quantized_gemv",
    "quantized_linear",
    "quantized_moe_mlp",
]
