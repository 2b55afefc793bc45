"""``pygpukit info``: what pygpukit found on this machine, as a dict or as text."""

from __future__ import annotations

import platform
import sys
import warnings
from typing import Any

from ._distributions import installed_versions
from .core import _env, _install, _libraries, _variant
from .core._sharing import detect_sharing
from .core.backend import BackendState, backend_state
from .core.compiler import nvrtc_status
from .core.cublaslt import cublaslt_status
from .core.device import device_count, get_device_info
from .core.errors import PyGPUkitError

__all__ = ["collect_info", "format_info"]


def _library(loader: Any, name: str, driver_version: int | None) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", _install.DriverMismatchWarning)  # reported as "mismatch"
            status = dict(loader())
    except PyGPUkitError as exc:
        return {"found": False, "error": str(exc)}
    status.pop("loaded", None)
    return {"found": True, **status, "mismatch": _install.driver_mismatch(name, str(status["path"]), driver_version)}


def _environment() -> list[dict[str, Any]]:
    """Every PYGPUKIT_* run-time variable that is set, with what is wrong with it (None when nothing)."""
    settings = _env.environment_report()
    paths = {spec.env_var: spec for spec in (_libraries.CUDA_DRIVER, _libraries.NVRTC, _libraries.CUBLASLT)}
    rows = []
    for setting in settings:
        problem = setting.problem
        if setting.variable in paths:
            problem = _libraries.explicit_problem(paths[setting.variable])
        rows.append({"variable": setting.variable, "value": setting.value, "problem": problem})
    return rows


def collect_info() -> dict[str, Any]:
    """Backend, driver, devices, NVRTC, cuBLASLt, distribution versions and the PYGPUKIT_* variables
    that are set, as plain data. A variable with a value pygpukit refuses (``PYGPUKIT_BACKEND=rocm``)
    is reported, not raised: ``backend.name`` is then None and ``backend.reason`` the error."""
    with warnings.catch_warnings():
        # The report names every bad variable itself (the "environment" entry).
        warnings.simplefilter("ignore", _env.EnvironmentVariableWarning)
        return _collect()


def _collect() -> dict[str, Any]:
    state: BackendState | None
    try:
        state = backend_state()
    except PyGPUkitError as exc:
        state = None
        backend: dict[str, Any] = {"name": None, "reason": str(exc), "native_variant": None}
    else:
        backend = {"name": state.name, "reason": state.reason, "native_variant": state.variant}
    probe = (state.driver_probe if state is not None else None) or _variant.probe_driver_version()
    driver: dict[str, Any] = {"found": probe.version is not None}
    if probe.version is not None:
        driver.update(path=probe.path, version=probe.version, cuda=_variant.format_cuda_version(probe.version))
    else:
        driver["attempts"] = probe.attempts
    if state is not None and state.driver is not None:
        driver["path"] = state.driver["path"]
        driver["init"] = "ok" if state.driver["init_result"] == 0 else state.driver["init_error"]
    devices = []
    for i in range(device_count() if state is not None else 0):
        d = get_device_info(i)
        devices.append(
            {
                "ordinal": d.ordinal,
                "name": d.name,
                "arch": d.arch,
                "total_memory": d.total_memory,
                "multiprocessor_count": d.multiprocessor_count,
                "l2_cache_bytes": d.l2_cache_bytes,
                "max_shared_memory_per_block_optin": d.max_shared_memory_per_block_optin,
                "pci_bus_id": d.pci_bus_id,
                "sharing": _sharing(d.ordinal, d.name),
            }
        )
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "backend": backend,
        "native_variants_installed": _variant.installed_variants(),
        "driver": driver,
        "devices": devices,
        "nvrtc": _library(nvrtc_status, "NVRTC", probe.version),
        "cublaslt": _library(cublaslt_status, "cuBLASLt", probe.version),
        "distributions": installed_versions(),
        "environment": _environment(),
    }


def _sharing(ordinal: int, name: str) -> dict[str, Any]:
    """MIG / MPS facts of a device (pygpukit.core._sharing), as plain data."""
    s = detect_sharing(ordinal, name)
    return {"mig": s.mig, "mig_profile": s.mig_profile, "mps": s.mps,
            "mps_active_thread_percentage": s.mps_active_thread_percentage,
            "mps_pinned_memory_limit": s.mps_pinned_memory_limit,
            "evidence": list(s.evidence), "scheduler": list(s.scheduler)}  # fmt: skip


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def format_info(info: dict[str, Any]) -> str:
    """Human-readable rendering of :func:`collect_info`."""
    lines = [f"pygpukit on Python {info['python']} ({info['platform']})", ""]
    backend = info["backend"]
    lines.append(f"backend:   {backend['name'] or 'none'}  ({backend['reason']})")
    installed = ", ".join(info["native_variants_installed"]) or "none"
    lines.append(f"native:    in use: {backend['native_variant'] or '-'}; installed: {installed}")
    drv = info["driver"]
    if drv["found"]:
        init = f", cuInit: {drv['init']}" if "init" in drv else ""
        lines.append(f"driver:    CUDA {drv['cuda']} ({drv['version']}) from {drv['path']}{init}")
    else:
        lines.append("driver:    not found")
        lines.extend(f"           tried {a}" for a in drv["attempts"])
    if info["devices"]:
        for d in info["devices"]:
            lines.append(
                f"device {d['ordinal']}:  {d['name']} ({d['arch']}), {_gib(d['total_memory'])}, "
                f"{d['multiprocessor_count']} SMs, L2 {d['l2_cache_bytes'] // 2**20} MiB, "
                f"smem/block {d['max_shared_memory_per_block_optin'] // 1024} KiB"
            )
            sharing = d.get("sharing")
            if sharing:
                profile = f" ({sharing['mig_profile']})" if sharing["mig_profile"] else ""
                lines.append(f"           MIG instance: {_yes_no(sharing['mig'])}{profile}; "
                             f"MPS: {_yes_no(sharing['mps'])}")  # fmt: skip
                lines.extend(f"             {e}" for e in sharing["evidence"])
                lines.extend(f"           scheduler: {n}" for n in sharing["scheduler"])
    else:
        lines.append("devices:   none")
    for key, label in (("nvrtc", "NVRTC"), ("cublaslt", "cuBLASLt")):
        lib = info[key]
        if lib["found"]:
            version = lib["version"]
            shown = ".".join(map(str, version)) if isinstance(version, (list, tuple)) else str(version)
            lines.append(f"{label + ':':<10} {shown} from {lib['path']}")
            if lib.get("mismatch"):
                lines.append(f"           MISMATCH: {lib['mismatch']}")
        else:
            first, *rest = lib["error"].splitlines()
            lines.append(f"{label + ':':<10} not found: {first}")
            lines.extend(f"           {r.strip()}" for r in rest)
    lines.append("")
    lines.append("distributions:")
    for name, version in info["distributions"].items():
        lines.append(f"  {name:<20} {version or 'not installed'}")
    environment = info.get("environment", [])
    lines.append("")
    lines.append("environment:" + ("" if environment else " no PYGPUKIT_* run-time variable is set"))
    for row in environment:
        verdict = "ok" if row["problem"] is None else f"BAD: {row['problem']}"
        lines.append(f"  {row['variable']}={row['value']!r}  {verdict}")
    return "\n".join(lines)
