"""Devices as the driver reports them, and what they can run (:class:`DeviceCapabilities`)."""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass, field

from . import _variant
from ._sharing import DeviceSharing, detect_sharing
from .backend import MIN_COMPUTE_CAPABILITY, backend_state, native_module
from .errors import DeviceError
from .stream import set_thread_device, thread_device

__all__ = [
    "DeviceCapabilities",
    "DeviceInfo",
    "KernelType",
    "device_count",
    "get_device",
    "get_device_capabilities",
    "get_device_info",
    "get_device_sharing",
    "get_driver_version",
    "set_device",
]


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


def get_device_sharing(ordinal: int = 0) -> DeviceSharing:
    """Whether device ``ordinal`` is a MIG instance or shared through MPS, how that was detected and
    what it means for pygpukit.scheduler (``core/_sharing.py`` documents the detection and its limits).
    Raises :class:`DeviceError` when the device does not exist."""
    return detect_sharing(ordinal, get_device_info(ordinal).name)


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


# -- capabilities ----------------------------------------------------------------------------------------
class KernelType(enum.Enum):
    """The kinds of compute kernels, by the hardware they need (the order GEMM paths prefer them in,
    last best): :meth:`DeviceCapabilities.supports` says whether a device runs a kind, and
    :attr:`min_compute_capability` from which compute capability (WGMMA: exactly 9.0, Hopper; later
    architectures have other tensor-core instructions). pygpukit's own GEMM runs SIMT, the MMA kinds
    (native/kernels/gemm/gemm_mma.cu) and WGMMA (gemm_wgmma.cu, sm_90a) kernels."""

    SIMT = "simt"  # CUDA-core FMA, any element type
    TF32_MMA = "tf32_mma"  # tensor cores, float32 inputs rounded to TF32
    FP16_MMA = "fp16_mma"
    BF16_MMA = "bf16_mma"
    INT8_MMA = "int8_mma"
    FP8_MMA = "fp8_mma"  # float8_e4m3fn / float8_e5m2 (scaled_matmul)
    WGMMA = "wgmma"  # warpgroup MMA with TMA operands (Hopper)

    @property
    def min_compute_capability(self) -> tuple[int, int]:
        return _MIN_CC[self]

    def runs_on(self, compute_capability: tuple[int, int]) -> bool:
        """Whether a device of ``compute_capability`` runs kernels of this kind."""
        if self is KernelType.WGMMA:
            return tuple(compute_capability) == (9, 0)
        return tuple(compute_capability) >= _MIN_CC[self]


_MIN_CC = {
    KernelType.SIMT: (8, 0),  # pygpukit's minimum
    KernelType.TF32_MMA: (8, 0),
    KernelType.FP16_MMA: (8, 0),
    KernelType.BF16_MMA: (8, 0),
    KernelType.INT8_MMA: (8, 0),
    KernelType.FP8_MMA: (8, 9),
    KernelType.WGMMA: (9, 0),
}


@dataclass(frozen=True)
class DeviceCapabilities:
    """What one device can do: its compute capability and size, the tensor-core kinds it has, its
    shared memory and whether it has thread-block clusters (:func:`get_device_capabilities`).

    Derived from the compute capability: ``tensor_cores`` with ``tf32``, ``fp16``, ``bf16`` and
    ``int8`` from 8.0 (every device pygpukit runs on), ``fp8`` from 8.9, ``wgmma`` (and
    ``KernelType.WGMMA``) on 9.0 exactly, ``async_copy`` (cp.async) from 8.0, ``tma`` and ``clusters``
    from 9.0 (``max_cluster_size``: 8, the portable cluster size, else 0). On the CPU simulation
    backend ``simulated`` is True and the values describe the simulation: compute capability (0, 0), no
    tensor-core kind, no clusters, no shared memory, ``kernel_types`` just SIMT, the host's CPU count as
    ``multiprocessor_count`` and its RAM as ``total_memory``; every op still runs there, in NumPy,
    whatever these say, and custom kernels do not."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    multiprocessor_count: int
    total_memory: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_multiprocessor: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    max_shared_memory_per_multiprocessor: int
    l2_cache_bytes: int
    tensor_cores: bool
    tf32: bool
    fp16: bool
    bf16: bool
    int8: bool
    fp8: bool
    wgmma: bool
    async_copy: bool
    tma: bool
    clusters: bool
    max_cluster_size: int
    simulated: bool = False
    kernel_types: frozenset[KernelType] = field(default=frozenset())

    @property
    def arch(self) -> str:
        """``"sm_90"`` style architecture name (``"cpu"`` on the CPU backend)."""
        if self.simulated:
            return "cpu"
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def supports(self, kind: KernelType) -> bool:
        """Whether this device runs kernels of ``kind``."""
        if not isinstance(kind, KernelType):
            raise TypeError(f"supports() takes a KernelType, got {type(kind).__name__}")
        return kind in self.kernel_types


def _from_compute_capability(info: DeviceInfo) -> DeviceCapabilities:
    cc = (int(info.compute_capability[0]), int(info.compute_capability[1]))
    kinds = frozenset(kind for kind in KernelType if kind.runs_on(cc))
    hopper_or_later = cc >= (9, 0)
    return DeviceCapabilities(
        ordinal=info.ordinal,
        name=info.name,
        compute_capability=cc,
        multiprocessor_count=info.multiprocessor_count,
        total_memory=info.total_memory,
        warp_size=info.warp_size,
        max_threads_per_block=info.max_threads_per_block,
        max_threads_per_multiprocessor=info.max_threads_per_multiprocessor,
        max_shared_memory_per_block=info.max_shared_memory_per_block,
        max_shared_memory_per_block_optin=info.max_shared_memory_per_block_optin,
        max_shared_memory_per_multiprocessor=info.max_shared_memory_per_multiprocessor,
        l2_cache_bytes=info.l2_cache_bytes,
        tensor_cores=KernelType.TF32_MMA in kinds,
        tf32=KernelType.TF32_MMA in kinds,
        fp16=KernelType.FP16_MMA in kinds,
        bf16=KernelType.BF16_MMA in kinds,
        int8=KernelType.INT8_MMA in kinds,
        fp8=KernelType.FP8_MMA in kinds,
        wgmma=KernelType.WGMMA in kinds,
        async_copy=cc >= (8, 0),
        tma=hopper_or_later,
        clusters=hopper_or_later,
        max_cluster_size=8 if hopper_or_later else 0,
        simulated=False,
        kernel_types=kinds,
    )


def _host_memory() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf (not a POSIX host)
        return 0


def simulated_capabilities() -> DeviceCapabilities:
    """The CPU simulation backend's capabilities (see :class:`DeviceCapabilities`)."""
    return DeviceCapabilities(
        ordinal=0,
        name="CPU simulation",
        compute_capability=(0, 0),
        multiprocessor_count=os.cpu_count() or 1,
        total_memory=_host_memory(),
        warp_size=32,
        max_threads_per_block=1024,
        max_threads_per_multiprocessor=2048,
        max_shared_memory_per_block=0,
        max_shared_memory_per_block_optin=0,
        max_shared_memory_per_multiprocessor=0,
        l2_cache_bytes=0,
        tensor_cores=False,
        tf32=False,
        fp16=False,
        bf16=False,
        int8=False,
        fp8=False,
        wgmma=False,
        async_copy=False,
        tma=False,
        clusters=False,
        max_cluster_size=0,
        simulated=True,
        kernel_types=frozenset({KernelType.SIMT}),
    )


@functools.cache
def _capabilities(ordinal: int) -> DeviceCapabilities:
    return _from_compute_capability(get_device_info(ordinal))


def get_device_capabilities(device: int | None = None) -> DeviceCapabilities:
    """What device ``device`` (the calling thread's current device when None) can do. Raises
    :class:`DeviceError` for a device that does not exist. On the CPU backend: the simulation's
    documented values (:class:`DeviceCapabilities`) for device None or 0."""
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise TypeError(f"device must be an int ordinal or None, got {type(device).__name__}")
    if backend_state().name != "cuda":
        if device not in (None, 0):
            raise DeviceError(f"device {device} does not exist (CPU simulation backend: device 0 only)")
        return simulated_capabilities()
    ordinal = get_device() if device is None else device
    count = device_count()
    if not 0 <= ordinal < count:
        raise DeviceError(f"device {ordinal} does not exist ({count} CUDA device(s) available)")
    return _capabilities(ordinal)
