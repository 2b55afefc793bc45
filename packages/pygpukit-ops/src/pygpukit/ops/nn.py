"""Transformer and signal building blocks, one module per kernel family, re-exported here (docs and
users import ``pygpukit.ops.nn``):

- :mod:`pygpukit.ops.norms`: rmsnorm, layernorm, l2norm, add_rmsnorm, group_norm (nn/norm.cu)
- :mod:`pygpukit.ops.gated`: swiglu, geglu, relu2 (nn/gated.cu)
- :mod:`pygpukit.ops.embeddings`: embedding, gather_last, position_ids (nn/embedding.cu)
- :mod:`pygpukit.ops.convolution`: conv1d (nn/conv1d.cu)

float32, float16 and bfloat16 with float32 arithmetic (one rounding at the store); every op takes
``out=`` and is then one fixed launch sequence on the current stream (CUDA-graph capturable), with
deterministic results. Argument checks shared by the families: :mod:`pygpukit.ops._nn_common`.
"""

from __future__ import annotations

from .convolution import conv1d
from .embeddings import embedding, gather_last, position_ids
from .gated import geglu, relu2, swiglu
from .norms import add_rmsnorm, group_norm, l2norm, layernorm, rmsnorm

__all__ = [
    "add_rmsnorm",
    "conv1d",
    "embedding",
    "gather_last",
    "geglu",
    "group_norm",
    "l2norm",
    "layernorm",
    "position_ids",
    "relu2",
    "rmsnorm",
    "swiglu",
]
