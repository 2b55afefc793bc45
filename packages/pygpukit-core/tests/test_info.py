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


def run_info_with(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYGPUKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "pygpukit", "info", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        check=False,
    )


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("PYGPUKIT_BACKEND", "rocm", "must be 'auto', 'cuda' or 'cpu'"),
        ("PYGPUKIT_CUDA_VARIANT", "cu11", "must be 'cu12' or 'cu13'"),
        ("PYGPUKIT_KERNEL_CACHE", "maybe", "not an on/off value"),
        ("PYGPUKIT_ALLOW_TF32", "sure", "not an on/off value"),
        ("PYGPUKIT_DEBUG_LIBRARY_LOAD", "loud", "not an on/off value"),
        ("PYGPUKIT_NVRTC_PATH", "/nonexistent/libnvrtc.so.13", "/nonexistent/libnvrtc.so.13 does not exist"),
        ("PYGPUKIT_COPY_THREADS", "many", "must be a non-negative integer"),
        ("PYGPUKIT_BACKNED", "cpu", "did you mean PYGPUKIT_BACKEND?"),
    ],
)
def test_bad_variable_is_reported_not_raised(variable: str, value: str, problem: str) -> None:
    result = run_info_with({variable: value})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.strip().startswith(f"{variable}=")]
    assert line.strip().startswith(f"{variable}={value!r}  BAD: ")
    assert problem in line


def test_refused_backend_value_leaves_the_rest_of_the_report() -> None:
    result = run_info_with({"PYGPUKIT_BACKEND": "rocm"})
    assert result.returncode == 0, result.stderr
    assert "backend:   none  (PYGPUKIT_BACKEND must be 'auto', 'cuda' or 'cpu' (or unset), got 'rocm')" in result.stdout
    for needle in ("driver:", "NVRTC:", "cuBLASLt:", "distributions:"):
        assert needle in result.stdout
    report = json.loads(run_info_with({"PYGPUKIT_CUDA_VARIANT": "cu11"}, "--json").stdout)
    assert report["backend"]["name"] is None
    assert "PYGPUKIT_CUDA_VARIANT must be" in report["backend"]["reason"]
    assert report["devices"] == []
    (row,) = report["environment"]
    assert row["variable"] == "PYGPUKIT_CUDA_VARIANT"
    assert row["value"] == "cu11"
    assert row["problem"].startswith("must be 'cu12' or 'cu13'")
    (row,) = report["environment"]
    assert row["variable"] == "PYGPUKIT_CUDA_VARIANT"
    assert row["value"] == "cu11"
    assert row["problem"].startswith("must be 'cu12' or 'cu13'")


def test_good_variables_are_listed_as_ok() -> None:
    result = run_info_with({"PYGPUKIT_BACKEND": "CPU", "PYGPUKIT_KERNEL_CACHE": "off"})
    assert result.returncode == 0, result.stderr
    assert "PYGPUKIT_BACKEND='CPU'  ok" in result.stdout
    assert "PYGPUKIT_KERNEL_CACHE='off'  ok" in result.stdout
    assert "Warning" not in result.stderr
    assert "environment: no PYGPUKIT_* run-time variable is set" in run_info_with({}).stdout


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
