"""Whether a device is a MIG instance or shared through MPS, and what that means for pygpukit's
scheduler (``pygpukit info`` and :func:`pygpukit.core.device.get_device_sharing`).

How each is detected (NVML is not used; everything comes from the driver API and the environment):

- MIG: a MIG compute instance is a CUDA device of its own whose name (``cuDeviceGetName``) ends in
  ``"MIG <profile>"`` (e.g. ``"NVIDIA H100 80GB HBM3 MIG 1g.10gb"``); ``CUDA_VISIBLE_DEVICES``
  entries starting ``"MIG-"`` are MIG instance UUIDs. Either is reported as evidence.
- MPS: ``cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED)`` (attribute 133, drivers of CUDA 12.x
  and newer) says whether contexts on the device are shared through MPS; it is called through
  ``ctypes`` on the libcuda the backend loaded. When the driver does not know the attribute, the
  answer is None ("unknown") and the evidence says whether an MPS control daemon's pipe exists
  (``$CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``, holding ``control``).
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` are reported when
  set (the client's SM and memory limits).

What cannot be detected this way: other processes using the device (time-sliced sharing without MPS
or MIG), limits an MPS control daemon sets per client (``set_active_thread_percentage``) unless the
environment variable carries them, and the other MIG instances of the same GPU.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .backend import backend_state

__all__ = ["DeviceSharing", "detect_sharing"]

CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 133
_MIG_NAME = re.compile(r"\bMIG\s+(?P<profile>\d+g\.\d+gb)\b", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceSharing:
    """``mig``/``mps``: True, False or None (unknown); ``evidence`` says how each was decided;
    ``scheduler`` what it means for pygpukit.scheduler."""

    ordinal: int
    mig: bool | None
    mig_profile: str | None
    mps: bool | None
    mps_active_thread_percentage: str | None
    mps_pinned_memory_limit: str | None
    evidence: tuple[str, ...] = field(default_factory=tuple)
    scheduler: tuple[str, ...] = field(default_factory=tuple)


def _mps_attribute(ordinal: int) -> int | None:
    """CU_DEVICE_ATTRIBUTE_MPS_ENABLED of ``ordinal`` through the loaded libcuda; None when unknown."""
    state = backend_state()
    path = state.driver.get("path") if state.driver else None
    if state.name != "cuda" or not path:
        return None
    try:
        cuda = ctypes.CDLL(str(path))
        device, value = ctypes.c_int(0), ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ctypes.c_int(ordinal)) != 0:
            return None
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(CU_DEVICE_ATTRIBUTE_MPS_ENABLED), device) != 0:
            return None  # a driver that does not know the attribute (CUDA_ERROR_INVALID_VALUE)
    except (OSError, AttributeError):
        return None
    return int(value.value)


def _mps_pipe() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps") / "control"


def detect_sharing(ordinal: int, name: str) -> DeviceSharing:
    """MIG and MPS facts of device ``ordinal`` named ``name`` (see the module documentation)."""
    evidence: list[str] = []
    notes: list[str] = []
    match = _MIG_NAME.search(name)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    mig_uuids = [v.strip() for v in visible.split(",") if v.strip().upper().startswith("MIG-")]
    mig = bool(match or mig_uuids)
    if match:
        evidence.append(f"MIG: the device name {name!r} names MIG profile {match.group('profile')}")
    if mig_uuids:
        evidence.append(f"MIG: CUDA_VISIBLE_DEVICES selects MIG instance(s) {', '.join(mig_uuids)}")
    if not mig:
        evidence.append("MIG: no (the device name has no MIG profile; CUDA_VISIBLE_DEVICES names no MIG- UUID)")

    attribute = _mps_attribute(ordinal)
    pipe = _mps_pipe()
    daemon = pipe.exists()
    mps: bool | None
    if attribute is not None:
        mps = bool(attribute)
        evidence.append(f"MPS: cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED) = {attribute}")
    else:
        mps = None
        evidence.append(
            "MPS: unknown (the driver does not report CU_DEVICE_ATTRIBUTE_MPS_ENABLED); an MPS control pipe "
            + (f"exists at {pipe}" if daemon else f"does not exist at {pipe}")
        )
    if mps is not False and daemon and attribute is not None:
        evidence.append(f"MPS: control pipe at {pipe}")
    threads = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") or None
    pinned = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") or None

    if mig:
        notes.append(
            "MIG instance: its memory and SMs are a hardware slice; the scheduler's capacity, partitions "
            "and compute shares divide this slice only, and other instances neither see nor slow it"
        )
    if mps:
        notes.append(
            "MPS: other processes share this device at the same time; budgets and pacing see only this "
            "process's work, so admit against what this process may use (initialize(capacity=...))"
        )
        if threads:
            notes.append(f"MPS: this client may use {threads}% of the SMs; compute shares divide that part")
        if pinned:
            notes.append(f"MPS: this client's device memory is limited ({pinned}); set capacity to match")
    if not mig and not mps:
        notes.append(
            "whole device: other processes may still time-slice it (not detectable without NVML); "
            "stream priorities and pacing order this process's work only"
        )
    return DeviceSharing(ordinal, mig, match.group("profile") if match else None, mps, threads, pinned,
                         tuple(evidence), tuple(notes))  # fmt: skip
