"""DeviceCapabilities and KernelType: the rules from compute capability for the architectures pygpukit
supports (checked without a GPU on recorded properties), the CPU backend's documented simulated value,
errors, and on a GPU the real device against its DeviceInfo."""

from __future__ import annotations

import dataclasses

import pytest

import pygpukit as gp
from pygpukit.core import device as device_module
from pygpukit.core.device import DeviceCapabilities, DeviceInfo, KernelType
from pygpukit.core.errors import DeviceError


def info(name: str, cc: tuple[int, int], sms: int, shared_optin: int) -> DeviceInfo:
    return DeviceInfo(
        ordinal=0, name=name, uuid="GPU-0", total_memory=80 << 30, compute_capability=cc, multiprocessor_count=sms,
        max_threads_per_block=1024, max_threads_per_multiprocessor=2048, warp_size=32, l2_cache_bytes=50 << 20,
        max_shared_memory_per_block=48 << 10, max_shared_memory_per_block_optin=shared_optin,
        max_shared_memory_per_multiprocessor=shared_optin + (1 << 10), max_registers_per_block=65536,
        clock_rate_khz=1_700_000, memory_clock_rate_khz=2_600_000, memory_bus_width_bits=5120, pci_bus_id=1,
        pci_device_id=0, pci_domain_id=0, async_engine_count=3, unified_addressing=True, concurrent_managed_access=True,
    )  # fmt: skip


ALL_BUT_FP8_AND_WGMMA = {KernelType.SIMT, KernelType.TF32_MMA, KernelType.FP16_MMA, KernelType.BF16_MMA,
                         KernelType.INT8_MMA}  # fmt: skip
DEVICES = [
    # (name, compute capability, SMs, opt-in shared memory, kernel types, clusters)
    ("A100", (8, 0), 108, 163 << 10, ALL_BUT_FP8_AND_WGMMA, False),
    ("RTX 3090", (8, 6), 82, 99 << 10, ALL_BUT_FP8_AND_WGMMA, False),
    ("L4", (8, 9), 58, 99 << 10, ALL_BUT_FP8_AND_WGMMA | {KernelType.FP8_MMA}, False),
    ("H100", (9, 0), 132, 227 << 10, set(KernelType), True),
    ("B200", (10, 0), 148, 227 << 10, ALL_BUT_FP8_AND_WGMMA | {KernelType.FP8_MMA}, True),
    ("RTX 5090", (12, 0), 170, 99 << 10, ALL_BUT_FP8_AND_WGMMA | {KernelType.FP8_MMA}, True),
]


@pytest.mark.parametrize(("name", "cc", "sms", "shared", "kinds", "clusters"), DEVICES, ids=[d[0] for d in DEVICES])
def test_capabilities_follow_the_compute_capability(
    name: str, cc: tuple[int, int], sms: int, shared: int, kinds: set[KernelType], clusters: bool
) -> None:
    caps = device_module._from_compute_capability(info(name, cc, sms, shared))
    assert caps.name == name
    assert caps.compute_capability == cc
    assert caps.arch == f"sm_{cc[0]}{cc[1]}"
    assert caps.multiprocessor_count == sms
    assert caps.max_shared_memory_per_block_optin == shared
    assert caps.kernel_types == frozenset(kinds)
    assert all((caps.tensor_cores, caps.tf32, caps.fp16, caps.bf16, caps.int8, caps.async_copy))
    assert caps.fp8 == (cc >= (8, 9))
    assert caps.wgmma == (cc == (9, 0))
    assert caps.tma == caps.clusters == clusters
    assert caps.max_cluster_size == (8 if clusters else 0)
    assert not caps.simulated
    for kind in KernelType:
        assert caps.supports(kind) == (kind in kinds)
        assert kind.runs_on(cc) == (kind in kinds)


def test_kernel_types() -> None:
    assert [k.value for k in KernelType] == ["simt", "tf32_mma", "fp16_mma", "bf16_mma", "int8_mma", "fp8_mma", "wgmma"]
    assert KernelType.FP8_MMA.min_compute_capability == (8, 9)
    assert KernelType.WGMMA.min_compute_capability == (9, 0)
    assert not KernelType.WGMMA.runs_on((10, 0))  # Blackwell has other tensor-core instructions
    assert KernelType.SIMT.runs_on((8, 0))
    assert not KernelType.SIMT.runs_on((7, 5))  # below pygpukit's minimum
    assert gp.KernelType is KernelType


def test_capabilities_are_frozen() -> None:
    caps = device_module.simulated_capabilities()
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.fp8 = True  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes a KernelType"):
        caps.supports("wgmma")  # type: ignore[arg-type]


def test_the_cpu_backend_reports_the_documented_simulated_value() -> None:
    if gp.is_cuda_available():
        pytest.skip("the CUDA backend is in use")
    caps = gp.get_device_capabilities()
    assert isinstance(caps, DeviceCapabilities)
    assert caps == gp.get_device_capabilities(0)
    assert caps.simulated
    assert caps.name == "CPU simulation"
    assert caps.arch == "cpu"
    assert caps.compute_capability == (0, 0)
    assert caps.kernel_types == frozenset({KernelType.SIMT})
    flags = (caps.tensor_cores, caps.tf32, caps.fp16, caps.bf16, caps.int8, caps.fp8, caps.wgmma, caps.tma,
             caps.clusters, caps.async_copy)  # fmt: skip
    assert not any(flags)
    assert caps.max_cluster_size == 0
    assert caps.max_shared_memory_per_block == 0
    assert caps.multiprocessor_count >= 1
    assert caps.total_memory == gp.get_memory_info()[1]
    with pytest.raises(DeviceError, match="device 1 does not exist"):
        gp.get_device_capabilities(1)
    with pytest.raises(TypeError, match="device must be an int"):
        gp.get_device_capabilities("0")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_gpu_capabilities_match_the_device_properties() -> None:
    caps = gp.get_device_capabilities()
    props = gp.get_device_info(gp.get_device())
    assert caps == gp.get_device_capabilities(gp.get_device())
    assert not caps.simulated
    assert caps.ordinal == props.ordinal
    assert caps.name == props.name
    assert caps.compute_capability == props.compute_capability
    assert caps.multiprocessor_count == props.multiprocessor_count
    assert caps.total_memory == props.total_memory
    assert caps.max_shared_memory_per_block_optin == props.max_shared_memory_per_block_optin
    assert caps.supports(KernelType.SIMT)
    assert caps.fp8 == (props.compute_capability >= (8, 9))
    with pytest.raises(DeviceError, match="does not exist"):
        gp.get_device_capabilities(gp.device_count())
