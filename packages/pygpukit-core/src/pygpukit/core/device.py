"""Devices as the driver reports them."""

from __future__ import annotations

from dataclasses import dataclass

from . import _variant
from .backend import MIN_COMPUTE_CAPABILITY, backend_state, native_module
from .errors import DeviceError
from .stream import set_thread_device, thread_device

__all__ = ["DeviceInfo", "device_count", "get_device", "get_device_info", "get_driver_version", "set_device"]


@dataclass(frozen=True)
class DeviceInfo:
    """Static properties of one CUDA device."""

    ordinal: int
    name: str
    uuid: str
    total_memory: int
    compute_capability: tuple[int, int]
    multiprocessor_count: int
    max_threads_per_block: int
    max_threads_per_multiprocessor: int
    warp_size: int
    l2_cache_bytes: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    max_shared_memory_per_multiprocessor: int
    max_registers_per_block: int
    clock_rate_khz: int
    memory_clock_rate_khz: int
    memory_bus_width_bits: int
    pci_bus_id: int
    pci_device_id: int
    pci_domain_id: int
    async_engine_count: int
    unified_addressing: bool
    concurrent_managed_access: bool

    @property
    def arch(self) -> str:
        """``"sm_90"`` style architecture name."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


def device_count() -> int:
    """Number of CUDA devices; 0 on the CPU backend."""
    state = backend_state()
    if state.name != "cuda":
        return 0
    return int(native_module().device_count())


def get_device_info(ordinal: int = 0) -> DeviceInfo:
    """Properties of device ``ordinal``. Raises :class:`DeviceError` when it does not exist."""
    count = device_count()
    if not 0 <= ordinal < count:
        raise DeviceError(f"device {ordinal} does not exist ({count} CUDA device(s) available)")
    props = dict(native_module().device_properties(ordinal))
    props["compute_capability"] = tuple(props["compute_capability"])
    return DeviceInfo(**props)


def get_device() -> int:
    """The calling thread's current device ordinal (0 on the CPU backend)."""
    return thread_device() if backend_state().name == "cuda" else 0


def set_device(ordinal: int) -> None:
    """Make device ``ordinal`` current for the calling thread (allocations, launches, copies).

    Raises :class:`DeviceError` for a device that does not exist or whose compute capability is below
    8.0, leaving the current device unchanged.
    """
    info = get_device_info(ordinal) if backend_state().name == "cuda" else None
    if info is None:
        if ordinal != 0:
            raise DeviceError(f"device {ordinal} does not exist (CPU simulation backend: device 0 only)")
        return
    if info.compute_capability < MIN_COMPUTE_CAPABILITY:
        major, minor = info.compute_capability
        raise DeviceError(
            f"device {ordinal} ({info.name}) has compute capability {major}.{minor}; pygpukit needs 8.0 or newer"
        )
    native_module().set_device(ordinal)
    set_thread_device(ordinal)


def get_driver_version() -> int | None:
    """The CUDA version the installed driver supports (e.g. 13000 for 13.0), or None without a driver.

    Read from libcuda directly, so it also answers on the CPU backend (for example when the driver is
    too old for the installed native module).
    """
    state = backend_state()
    probe = state.driver_probe or _variant.probe_driver_version()
    return probe.version
