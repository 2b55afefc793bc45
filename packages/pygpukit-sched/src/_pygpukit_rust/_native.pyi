"""Type stubs of the native module _pygpukit_rust (crates/pygpukit-sched-py)."""

__version__: str

def build_info() -> dict[str, str]:
    """Version, build profile and target of the native module."""
