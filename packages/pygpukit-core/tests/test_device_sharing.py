"""MIG / MPS detection (issue 23, item 4): the device name and CUDA_VISIBLE_DEVICES for MIG, the
driver's CU_DEVICE_ATTRIBUTE_MPS_ENABLED (and the MPS control pipe when the driver cannot say) for
MPS, and how ``pygpukit info`` shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pygpukit.core import _sharing
from pygpukit.core._sharing import detect_sharing
from pygpukit.info import format_info


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps"))


def test_a_mig_instance_is_recognised_by_its_name_or_visible_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sharing, "_mps_attribute", lambda ordinal: 0)
    mig = detect_sharing(0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert (mig.mig, mig.mig_profile, mig.mps) == (True, "1g.10gb", False)
    assert any("hardware slice" in n for n in mig.scheduler)
    whole = detect_sharing(0, "NVIDIA H100 80GB HBM3")
    assert (whole.mig, whole.mig_profile) == (False, None)
    assert any("time-slice" in n for n in whole.scheduler)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4b3c2a1d-0000-1111-2222-333344445555")
    by_uuid = detect_sharing(0, "NVIDIA A100-SXM4-40GB")
    assert by_uuid.mig is True
    assert any("MIG-4b3c2a1d" in e for e in by_uuid.evidence)


def test_mps_comes_from_the_driver_attribute_and_its_limits_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_sharing, "_mps_attribute", lambda ordinal: 1)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40")
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=8G")
    mps = detect_sharing(0, "NVIDIA H100 80GB HBM3")
    assert (mps.mps, mps.mps_active_thread_percentage, mps.mps_pinned_memory_limit) == (True, "40", "0=8G")
    assert any("40% of the SMs" in n for n in mps.scheduler)
    assert any("CU_DEVICE_ATTRIBUTE_MPS_ENABLED) = 1" in e for e in mps.evidence)


def test_without_the_attribute_mps_is_unknown_and_the_pipe_is_reported(tmp_path: Path) -> None:
    # On the CPU backend (no driver) the attribute cannot be read.
    unknown = detect_sharing(0, "NVIDIA L4")
    assert unknown.mps is None
    assert any("does not exist at" in e for e in unknown.evidence)
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").touch()
    assert any(f"exists at {pipe / 'control'}" in e for e in detect_sharing(0, "NVIDIA L4").evidence)


def test_info_shows_the_sharing_of_each_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sharing, "_mps_attribute", lambda ordinal: 0)
    s = detect_sharing(0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    device = {"ordinal": 0, "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "arch": "sm_90", "total_memory": 40 * 2**30,
              "multiprocessor_count": 60, "l2_cache_bytes": 25 * 2**20, "max_shared_memory_per_block_optin": 227 * 1024,
              "pci_bus_id": 0, "sharing": {"mig": s.mig, "mig_profile": s.mig_profile, "mps": s.mps,
                                           "mps_active_thread_percentage": None, "mps_pinned_memory_limit": None,
                                           "evidence": list(s.evidence), "scheduler": list(s.scheduler)}}  # fmt: skip
    backend = {"name": "cuda", "reason": "test", "native_variant": "cu13"}
    info = {"python": "3.11", "platform": "linux", "backend": backend,
            "native_variants_installed": ["cu13"], "driver": {"found": False, "attempts": []}, "devices": [device],
            "nvrtc": {"found": False, "error": "x"}, "cublaslt": {"found": False, "error": "x"},
            "distributions": {}, "environment": []}  # fmt: skip
    text = format_info(info)
    assert "MIG instance: yes (3g.40gb); MPS: no" in text
    assert "scheduler: MIG instance" in text


@pytest.mark.gpu
def test_gpu_device_sharing_is_read_from_the_driver() -> None:
    from pygpukit.core.device import get_device_info, get_device_sharing

    info = get_device_info(0)
    sharing = get_device_sharing(0)
    assert sharing.mig == ("MIG" in info.name.upper().split())
    assert sharing.mps is not None  # drivers of CUDA 12.x and newer report the attribute
