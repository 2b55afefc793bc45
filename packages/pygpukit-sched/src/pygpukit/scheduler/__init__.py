"""pygpukit.scheduler: sharing one GPU between several models (from the pygpukit-sched distribution).

The decisions (admission, QoS, partitions, pacing) are made by the Rust module ``_pygpukit_rust``,
which ships in the same distribution.
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

__all__ = ["__version__", "build_info"]
