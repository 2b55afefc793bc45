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


# -- the built-in ops follow the routes (pygpukit.ops._route) ----------------------------------------


def test_builtin_ops_follow_set_route_blocks_and_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.ops import _route

    monkeypatch.setattr(_route, "hook", None)
    x = gk.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
    calls = _fake_pair(monkeypatch, triton_ms=1.0, builtin_ms=2.0)
    expected = ops.rmsnorm(x, None).to_numpy()  # no route configured: the built-in op, hook not asked
    assert _route.hook is None
    routing.set_route("softmax", "builtin")  # a builtin setting installs nothing
    assert _route.hook is None
    routing.set_route("rmsnorm", "triton")
    assert _route.hook is routing.route_hook
    assert ops.rmsnorm(x, None) == "triton"  # the op of pygpukit.ops, routed
    assert gk.rmsnorm(x, None) == "triton"  # the same function at the top level
    with routing.route("builtin", "rmsnorm"):
        np.testing.assert_array_equal(ops.rmsnorm(x, None).to_numpy(), expected)  # the real kernel ran
    assert routing.rmsnorm(x, None, backend="builtin") == "builtin"  # the call's backend wins
    # other ops are untouched: softmax stays builtin, swiglu has no setting
    np.testing.assert_array_equal(ops.softmax(x).to_numpy(), ops.softmax(x).to_numpy())
    assert calls == {"builtin": 1, "triton": 2}


def test_a_routed_call_is_not_routed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton side (or auto's measurement) may call the built-in op: it runs the kernel, not the route."""
    from pygpukit.ops import _route

    monkeypatch.setattr(_route, "hook", None)
    x = gk.from_numpy(rng.standard_normal((3, 16)).astype(np.float32))
    w = gk.from_numpy(rng.standard_normal(16).astype(np.float32))
    seen: list[Any] = []

    def triton_side(*args: Any, **kwargs: Any) -> Any:
        inner = ops.rmsnorm(*args, **kwargs)  # would recurse for ever if the route applied here
        seen.append(type(inner).__name__)
        return inner

    monkeypatch.setitem(routing._IMPLS, "rmsnorm", (routing._builtin("rmsnorm"), triton_side))
    monkeypatch.setattr(routing, "triton_available", lambda: True)
    with routing.route("triton"):
        got = ops.rmsnorm(x, w, 1e-5)
    assert seen == ["GPUArray"]
    xs = x.to_numpy().astype(np.float64)
    ref = xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-5) * w.to_numpy()
    np.testing.assert_allclose(got.to_numpy(), ref, rtol=2e-6, atol=2e-6)


def test_operands_the_triton_kernel_does_not_take_run_the_builtin_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.ops import _route

    monkeypatch.setattr(_route, "hook", None)
    triton_calls: list[str] = []

    def fake(op: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            triton_calls.append(op)
            return "triton"

        return run

    for op in ("matmul", "softmax", "rmsnorm"):
        monkeypatch.setitem(routing._IMPLS, op, (routing._builtin(op), fake(op)))
    monkeypatch.setattr(routing, "triton_available", lambda: True)
    a4 = gk.from_numpy(rng.standard_normal((2, 2, 3, 5)).astype(np.float32))
    b4 = gk.from_numpy(rng.standard_normal((2, 2, 5, 4)).astype(np.float32))
    s = gk.from_numpy(rng.standard_normal((6, 5, 4)).astype(np.float32))
    ints = gk.from_numpy(rng.integers(-3, 3, (3, 4)).astype(np.int8))
    with routing.route("triton"):
        ref = np.matmul(a4.to_numpy().astype(np.float64), b4.to_numpy())
        np.testing.assert_allclose((a4 @ b4).to_numpy(), ref, rtol=1e-5, atol=1e-5)  # 4-D: built-in
        strided = s[:, ::2, :]  # softmax along an inner axis of a strided view: built-in
        e = np.exp(strided.to_numpy().astype(np.float64))
        np.testing.assert_allclose(ops.softmax(strided, axis=1).to_numpy(), e / e.sum(1, keepdims=True), rtol=1e-6)
        assert ops.matmul(ints, ints.T).dtype == gk.int32  # int8: built-in
        assert triton_calls == []
        assert ops.softmax(s, axis=1) == "triton"  # contiguous: the Triton kernel takes it
        assert a4[0] @ b4[0] == "triton"  # 3-D
    assert triton_calls == ["softmax", "matmul"]


def test_environment_variable_routes_builtin_ops_without_importing_pygpukit_triton(tmp_path: Path) -> None:
    """PYGPUKIT_TRITON_ROUTE alone (the program imports only pygpukit.ops) routes the built-in ops: the
    first routed call loads the router; on the CPU backend the routed call runs the built-in kernel."""
    import os
    import subprocess
    import sys

    code = """
import sys, warnings
import numpy as np
warnings.simplefilter("ignore")
import pygpukit as gk
from pygpukit import ops
from pygpukit.ops import _route
assert "pygpukit.triton.routing" not in sys.modules
assert _route.hook is _route._from_environment, _route.hook
x = gk.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
got = ops.rmsnorm(x, None).to_numpy()
from pygpukit.triton import routing
assert _route.hook is routing.route_hook
assert routing.get_route("rmsnorm") == "triton" and routing.get_route("matmul") == "builtin"
xs = np.arange(12, dtype=np.float64).reshape(3, 4)
np.testing.assert_allclose(got, xs / np.sqrt((xs**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-6)
print("ok")
"""
    env = dict(os.environ, PYGPUKIT_TRITON_ROUTE="rmsnorm=triton", PYGPUKIT_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok"), done.stdout[-2000:]
    env["PYGPUKIT_TRITON_ROUTE"] = "builtin"  # only builtin named: nothing installed once the router loads
    code_builtin = "from pygpukit.triton import routing\nfrom pygpukit.ops import _route\nassert _route.hook is None\n"
    done = subprocess.run([sys.executable, "-c", code_builtin], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_triton_failures_become_typed_errors() -> None:
    """What Triton raises (its exception classes, its launcher's "Triton Error" RuntimeError) is turned
    into TritonKernelError naming the kernel; anything else passes through unchanged."""
    from pygpukit.core.errors import PyGPUkitError, ShapeError
    from pygpukit.triton import TritonKernelError
    from pygpukit.triton._interop import triton_error

    class OutOfResources(Exception):  # noqa: N818 - Triton's class name
        pass

    OutOfResources.__module__ = "triton.runtime.errors"
    typed = triton_error(OutOfResources("out of resource: shared memory, Required: 300000"), "matmul")
    assert isinstance(typed, TritonKernelError)
    assert isinstance(typed, PyGPUkitError)
    assert isinstance(typed, RuntimeError)
    assert typed.kernel == "matmul"
    assert "pygpukit.triton.kernels.matmul" in str(typed)
    assert "300000" in str(typed)
    launch = triton_error(RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"), "softmax")
    assert isinstance(launch, TritonKernelError)
    assert "illegal memory access" in str(launch)
    assert triton_error(RuntimeError("something else")) is None
    assert triton_error(ShapeError("bad shape")) is None
    assert triton_error(KeyError("x")) is None
