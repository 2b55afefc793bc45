"""pygpukit.ops: the NumPy-like op library (from the pygpukit-ops distribution).

Elementwise ops, reductions, shape ops (and later GEMM/GEMV, nn ops, attention) on GPUArrays, with
NumPy's broadcasting and type promotion (:mod:`pygpukit.ops.promotion`). Every name in ``__all__`` is
also reachable as ``pygpukit.<name>``. Kernels live in native/kernels/<family>/ and are compiled by NVRTC on
first use; on the CPU simulation backend the same ops run on NumPy with the same result dtypes.
"""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-ops needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-ops", required=("pygpukit-core",))

from . import (  # noqa: E402
    atan2_op,
    attention,
    elementwise,
    gemm,
    gemv_fusions,
    gguf,
    kv_cache,
    moe,
    nn,
    promotion,
    quant,
    recurrent,
    reduction,
    rope,
    rope_kv,
    sampling,
    shape,
    tts_ops,
)
from ._kernels import precompile  # noqa: E402
from .atan2_op import *  # noqa: E402,F403
from .attention import *  # noqa: E402,F403
from .elementwise import *  # noqa: E402,F403
from .gemm import *  # noqa: E402,F403
from .gemv_fusions import *  # noqa: E402,F403
from .gguf import *  # noqa: E402,F403
from .kv_cache import *  # noqa: E402,F403
from .moe import *  # noqa: E402,F403
from .nn import *  # noqa: E402,F403
from .promotion import *  # noqa: E402,F403
from .quant import *  # noqa: E402,F403
from .recurrent import *  # noqa: E402,F403
from .reduction import *  # noqa: E402,F403
from .rope import *  # noqa: E402,F403
from .rope_kv import *  # noqa: E402,F403
from .sampling import *  # noqa: E402,F403
from .shape import *  # noqa: E402,F403
from .tts_ops import *  # noqa: E402,F403

__version__ = distribution_version("pygpukit-ops") or "0+unknown"

__all__ = [
    "__version__",
    "precompile",
    *atan2_op.__all__,
    *attention.__all__,
    *elementwise.__all__,
    *gemv_fusions.__all__,
    *gemm.__all__,
    *gguf.__all__,
    *kv_cache.__all__,
    *nn.__all__,
    *moe.__all__,
    *promotion.__all__,
    *quant.__all__,
    *recurrent.__all__,
    *reduction.__all__,
    *sampling.__all__,
    *rope.__all__,
    *rope_kv.__all__,
    *shape.__all__,
    *tts_ops.__all__,
]
