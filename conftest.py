"""Repository-wide pytest configuration: GPU and NVRTC tests skip, with the reason, where they cannot run."""

from __future__ import annotations

import warnings

import pytest


def _cuda_reason() -> str | None:
    from pygpukit.core.backend import BackendFallbackWarning, backend_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)
        state = backend_state()
    return None if state.name == "cuda" else f"needs the CUDA backend: {state.reason}"


def _nvrtc_reason() -> str | None:
    from pygpukit.core.compiler import nvrtc_status
    from pygpukit.core.errors import PyGPUkitError

    try:
        nvrtc_status()
    except PyGPUkitError as exc:
        return f"needs NVRTC: {str(exc).splitlines()[0]}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}
    for item in items:
        for marker, probe in (("gpu", _cuda_reason), ("nvrtc", _nvrtc_reason)):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in reasons:
                reasons[marker] = probe()
            reason = reasons[marker]
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
