"""Routing between built-in and Triton kernels: modes from a call, a block, set_route and the
environment; auto's measure-once-and-remember, in memory and on disk; the CPU backend's fallback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gk
from pygpukit import ops
from pygpukit.core.errors import ArgumentError
from pygpukit.triton import routing

rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(routing.ENV_VAR, raising=False)
    routing._settings.clear()
    routing.clear_auto_cache(disk=False)
    yield
    routing._settings.clear()
    routing.clear_auto_cache(disk=False)


def test_default_is_builtin_and_precedence_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(routing.get_route(op) == "builtin" for op in routing.OPS)
    monkeypatch.setenv(routing.ENV_VAR, "auto, matmul=triton")
    assert routing.get_route("rmsnorm") == "auto"
    assert routing.get_route("matmul") == "triton"
    routing.set_route("builtin")
    assert routing.get_route("matmul") == "builtin"
    routing.set_route("softmax", "triton")
    assert routing.get_route("softmax") == "triton"
    assert routing.get_route("swiglu") == "builtin"
    with routing.route("auto", "swiglu"):
        assert routing.get_route("swiglu") == "auto"
        assert routing.get_route("softmax") == "triton"
        with routing.route("builtin"):
            assert routing.get_route("softmax") == "builtin"
        assert routing.get_route("softmax") == "triton"
    assert routing.get_route("swiglu") == "builtin"
    routing.set_route("softmax", None)
    routing.set_route("*", None)
    assert routing.get_route("softmax") == "auto"  # back to the environment


@pytest.mark.parametrize("value", ["fast", "rmsnorm=gpu", "attention=triton"])
def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(routing.ENV_VAR, value)
    with pytest.raises(ArgumentError, match=routing.ENV_VAR):
        routing.get_route("rmsnorm")


def test_bad_modes_and_ops_raise_typed_errors() -> None:
    with pytest.raises(ArgumentError, match="mode"):
        routing.set_route("rmsnorm", "cuda")
    with pytest.raises(ArgumentError, match="op"):
        routing.set_route("attention", "triton")
    with pytest.raises(ArgumentError, match="mode"), routing.route("fastest"):
        pass
    x = gk.from_numpy(np.ones((2, 3), np.float32))
    with pytest.raises(ArgumentError, match="mode"):
        routing.rmsnorm(x, None, backend="gpu")


def test_cpu_or_unsupported_dtype_runs_the_builtin_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton cannot run, every mode gives exactly the built-in op's result."""
    if routing.triton_available():
        pytest.skip("Triton runs here; the GPU tests cover it")
    x = gk.from_numpy(rng.standard_normal((5, 33)).astype(np.float32))
    w = gk.from_numpy(rng.standard_normal(33).astype(np.float32))
    for mode in routing.MODES:
        got = routing.rmsnorm(x, w, 1e-5, backend=mode).to_numpy()
        np.testing.assert_array_equal(got, ops.rmsnorm(x, w, 1e-5).to_numpy())
    with routing.route("triton"):
        out = gk.empty((5, 33), gk.float32)
        assert routing.softmax(x, out=out) is out
        np.testing.assert_array_equal(out.to_numpy(), ops.softmax(x).to_numpy())
        np.testing.assert_array_equal(routing.swiglu(x[:, :32]).to_numpy(), ops.swiglu(x[:, :32]).to_numpy())
        a = gk.from_numpy(rng.standard_normal((7, 5)).astype(np.float32))
        np.testing.assert_array_equal(routing.matmul(a, x).to_numpy(), ops.matmul(a, x).to_numpy())


def _fake_pair(monkeypatch: pytest.MonkeyPatch, triton_ms: float, builtin_ms: float) -> dict[str, int]:
    """Replace the rmsnorm pair and the timer: counts the calls each side gets."""
    calls = {"builtin": 0, "triton": 0}

    def impl(side: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> str:
            calls[side] += 1
            return side

        return run

    monkeypatch.setitem(routing._IMPLS, "rmsnorm", (impl("builtin"), impl("triton")))
    monkeypatch.setattr(routing, "triton_available", lambda: True)
    monkeypatch.setattr(routing, "_device_tag", lambda: ("Fake GPU", (9, 0), "3.6.0"))
    monkeypatch.setattr(routing, "_time", lambda fn: {"builtin": builtin_ms, "triton": triton_ms}[fn()])
    return calls


def test_auto_measures_once_and_remembers_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    x = gk.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
    calls = _fake_pair(monkeypatch, triton_ms=0.5, builtin_ms=1.0)
    measured: list[str] = []
    real_measure = routing._measure
    monkeypatch.setattr(routing, "_measure", lambda *a: measured.append(a[0]) or real_measure(*a))
    with routing.route("auto"):
        assert routing.rmsnorm(x, None) == "triton"
        assert routing.rmsnorm(x, None) == "triton"
    assert measured == ["rmsnorm"]
    data = json.loads(routing.auto_cache_path().read_text())
    ((key, entry),) = data["winners"].items()
    assert entry == {"winner": "triton", "ms": {"builtin": 1.0, "triton": 0.5}}
    op, device, args, _ = json.loads(key)
    assert (op, device) == ("rmsnorm", ["Fake GPU", [9, 0], "3.6.0"])
    assert args[0][:2] == [[4, 8], "float32"]
    # a new process (memory forgotten) reads the winner from disk without measuring
    routing.clear_auto_cache(disk=False)
    assert routing.rmsnorm(x, None, backend="auto") == "triton"
    assert measured == ["rmsnorm"]
    # another shape is measured on its own
    y = gk.from_numpy(rng.standard_normal((3, 8)).astype(np.float32))
    assert routing.rmsnorm(y, None, backend="auto") == "triton"
    assert measured == ["rmsnorm", "rmsnorm"]
    assert calls == {"builtin": 2, "triton": 6}  # each side timed once per shape; the winner ran all 4 calls


def test_auto_keeps_the_builtin_op_when_it_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    x = gk.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
    _fake_pair(monkeypatch, triton_ms=2.0, builtin_ms=1.0)
    assert routing.rmsnorm(x, None, backend="auto") == "builtin"
    routing.clear_auto_cache()
    assert not routing.auto_cache_path().exists()


def test_a_corrupt_cache_file_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    path = routing.auto_cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    x = gk.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
    _fake_pair(monkeypatch, triton_ms=0.1, builtin_ms=1.0)
    assert routing.rmsnorm(x, None, backend="auto") == "triton"
    assert json.loads(path.read_text())["version"] == 1
