"""_pygpukit_rust: the Rust side of pygpukit's scheduler (PyO3 module from crates/pygpukit-sched-py).

Everything is defined in the native submodule ``_pygpukit_rust._native`` and re-exported here, so
``import _pygpukit_rust as rust; rust.build_info()`` works as the seeds show.
"""

from ._native import __version__, build_info

__all__ = ["__version__", "build_info"]
