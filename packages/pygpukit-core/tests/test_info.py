"""`python -m pygpukit info`: works with or without a GPU and reports everything it should."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pygpukit import _distributions


def run_info(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pygpukit", "info", *args], capture_output=True, text=True, check=False
    )


def test_text_report_names_every_section() -> None:
    result = run_info()
    assert result.returncode == 0, result.stderr
    for needle in ("backend:", "native:", "driver:", "NVRTC:", "cuBLASLt:", "distributions:"):
        assert needle in result.stdout
    for name in _distributions.DISTRIBUTIONS:
        assert name in result.stdout
    assert "Warning" not in result.stderr  # the report states the fallback itself


def test_json_report_is_complete() -> None:
    result = run_info("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["backend"]["name"] in ("cuda", "cpu")
    assert report["backend"]["reason"]
    assert set(report["distributions"]) == set(_distributions.DISTRIBUTIONS)
    assert all(report["distributions"].values())  # the workspace installs every one
    assert {"found"} <= set(report["nvrtc"])
    assert {"found"} <= set(report["cublaslt"])
    if report["backend"]["name"] == "cpu":
        assert report["devices"] == []


def test_forced_cpu_backend_in_report() -> None:
    import os

    env = {**os.environ, "PYGPUKIT_BACKEND": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "pygpukit", "info", "--json"], capture_output=True, text=True, env=env, check=False
    )
    report = json.loads(result.stdout)
    assert report["backend"] == {"name": "cpu", "reason": "forced by PYGPUKIT_BACKEND=cpu", "native_variant": None}


def test_bad_command_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, "-m", "pygpukit", "frobnicate"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.gpu
def test_gpu_report_lists_devices_and_driver() -> None:
    report = json.loads(run_info("--json").stdout)
    assert report["backend"]["name"] == "cuda"
    assert report["driver"]["found"]
    assert report["driver"]["init"] == "ok"
    assert report["devices"]
    assert all(d["arch"] >= "sm_80" for d in report["devices"])
