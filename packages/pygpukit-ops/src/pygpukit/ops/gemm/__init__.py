"""The GEMM family of pygpukit.ops: matmul, linear, scaled_matmul, gemv and gemm_mma.

One module per kernel family, one dispatch table, one plan cache:

- ``api``: the public matrix products (``matmul``, ``linear``, ``linear_bias_gelu``, ``scaled_matmul``,
  ``bias_add_inplace``) and the TF32 switch; each call shape is checked and planned once.
- ``dispatch``: the ordered route table (GEMV, cuBLASLt, wgmma, mma.sync, SIMT) and the plans.
- ``gemv_kernels``: the decode-path GEMV kernels (native/kernels/gemv/gemv.cu) and the public ``gemv``.
- ``cublaslt``: the cuBLASLt route (a prepared native ``GemmArgs`` per call shape).
- ``mma``: the tensor-core kernels (mma.sync and wgmma: native/kernels/gemm/gemm_mma.cu, gemm_wgmma.cu),
  their tiles and the public ``gemm_mma``.
- ``simt``: the CUDA-core kernel (native/kernels/gemm/gemm_simt.cu) for every other dtype and layout.
- ``host``: the CPU simulation backend.
- ``_base``: the plan cache (``PLANS``), layouts, argument checks and device properties they share.
"""

from __future__ import annotations

from . import api as api
from . import cublaslt as cublaslt
from . import dispatch as dispatch
from . import gemv_kernels as gemv_kernels
from . import host as host
from . import mma as mma
from . import simt as simt
from .api import bias_add_inplace, get_tf32, linear, linear_bias_gelu, matmul, scaled_matmul, set_tf32
from .gemv_kernels import GEMV_MAX_ROWS as GEMV_MAX_ROWS
from .gemv_kernels import gemv
from .gemv_kernels import gemv_launch as gemv_launch
from .mma import GEMM_MMA_TILES as GEMM_MMA_TILES
from .mma import GEMM_WGMMA_TILES as GEMM_WGMMA_TILES
from .mma import GemmTile as GemmTile
from .mma import gemm_mma
from .mma import gemm_tile_for as gemm_tile_for
from .mma import name_expressions_for as name_expressions_for

# pygpukit.ops re-exports these; the names above are importable from here (tests, benchmarks).
__all__ = [
    "bias_add_inplace",
    "gemm_mma",
    "gemv",
    "get_tf32",
    "linear",
    "linear_bias_gelu",
    "matmul",
    "scaled_matmul",
    "set_tf32",
]
