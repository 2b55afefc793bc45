"""pygpukit.scheduler: sharing one GPU between several models (from the pygpukit-sched distribution).

    from pygpukit.scheduler import GB, context_session, create_context, initialize

    initialize(device_id=0)
    llm = create_context("llm", max_vram=4 * GB, qos="guaranteed")
    with context_session(llm):          # or `async with`
        ...                             # allocations here count against llm's budget

Execution contexts (QoS classes, their own streams, asyncio waiting) are orchestrated in
``_contexts`` (their budgets, admission and accounting are the Rust ``ContextRegistry``'s),
partition sessions in ``_partitions``, paced streams in ``_pacing``; the scheduling
engine (task state machine, admission, QoS, partitions, pacing,
transfer engine, dispatcher) is the Rust module ``_pygpukit_rust`` of the same distribution.
"""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-sched needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-sched", required=("pygpukit-core",))

import _pygpukit_rust  # noqa: E402

__version__ = distribution_version("pygpukit-sched") or _pygpukit_rust.__version__

if _pygpukit_rust.__version__ != __version__:
    from pygpukit.core.errors import VersionMismatchError

    raise VersionMismatchError(
        f"pygpukit-sched {__version__} found _pygpukit_rust {_pygpukit_rust.__version__}; reinstall pygpukit-sched"
    )

build_info = _pygpukit_rust.build_info

from . import _contexts  # noqa: E402
from ._contexts import *  # noqa: E402,F403
from ._pacing import PacedStream  # noqa: E402
from ._partitions import partition_session, partition_stream  # noqa: E402

__all__ = ["PacedStream", "__version__", "build_info", "partition_session", "partition_stream", *_contexts.__all__]
