"""pygpukit.reset_device(): recovering a device after a kernel fault (core/recovery.py).

A reset invalidates every object of the device in the whole process, so each scenario runs in a
fresh interpreter: the objects other tests keep (fixtures, module-level caches) stay untouched. The
CPU-backend scenarios check the API and the invalidation bookkeeping. On the GPU, a reset of a healthy
device must recover everything (old objects raise; new arrays, a kernel loaded before the reset, a
matmul, streams, events, graphs and another thread's work are correct), and real faults (a JIT kernel
writing through a bad pointer, a device-side assert) must be reported as sticky, typed errors, after
which reset_device() either recovers in the same way or, when the driver refuses a new context (an
H100 with driver 580 does after an illegal address, as NVIDIA documents for memory faults), says that
the process must be restarted, here and in every later call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError, DeviceResetError, InvalidPointerError, PyGPUkitError


def _run(code: str, backend: str) -> str:
    """Run ``code`` in a fresh interpreter on ``backend``; it prints OK when every check passed."""
    prelude = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "unraisable = []\n"
        "sys.unraisablehook = unraisable.append  # a finalizer failing during GC would land here\n"
    )
    env = {**os.environ, "PYGPUKIT_BACKEND": backend}
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stdout.strip().endswith("OK"), result.stdout
    return result.stdout


def test_reset_device_is_exported_and_documented() -> None:
    assert gp.reset_device is gp.core.reset_device
    assert issubclass(DeviceResetError, InvalidPointerError)
    assert issubclass(DeviceResetError, PyGPUkitError)
    assert "kernel fault" in (gp.reset_device.__doc__ or "")
    error = DeviceResetError.of("this stream (handle 0x10)", 3)
    assert error.device == 3
    assert "cuda:3" in str(error)
    assert "pygpukit.reset_device()" in str(error)


def test_reset_device_refuses_a_device_that_does_not_exist() -> None:
    # Checked before anything is invalidated, so this runs in the test process itself.
    with pytest.raises(DeviceError, match=r"device 999 does not exist"):
        gp.reset_device(999)
    with pytest.raises(DeviceError, match=r"device -1 does not exist"):
        gp.reset_device(-1)
    with pytest.raises(TypeError, match=r"device must be an int or None, got str"):
        gp.reset_device("0")  # type: ignore[arg-type]


def test_cpu_reset_invalidates_every_object_and_new_work_runs() -> None:
    _run(
        """
        import gc
        import numpy as np
        import pygpukit as gp
        from pygpukit.core.errors import DeviceResetError, InvalidPointerError
        from pygpukit.core.plans import PlanCache, plan_cache_stats

        rng = np.random.default_rng(7)
        x = rng.standard_normal((5, 7)).astype(np.float32)
        a = gp.from_numpy(x)
        view = a.T[1:, ::2]                     # a non-contiguous view of the same buffer
        b = gp.zeros(13, gp.int64)
        raw_buffer = gp.DeviceBuffer(100)
        pinned = gp.PinnedBuffer(64)
        raw_pinned = gp.pinned_malloc(32)
        stream = gp.Stream()
        event = gp.Event().record(stream)
        other_event = gp.Event().record()
        cache = PlanCache("test.reset")
        cache.put(("shape", 5), "plan")
        before = gp.memory_stats()
        assert before["in_use_bytes"] == x.nbytes + 13 * 8 + 100, before

        report = gp.reset_device()

        assert report.device == 0 and report.sync_error is None, report
        assert (report.buffers, report.buffer_bytes) == (3, x.nbytes + 13 * 8 + 100), report
        assert (report.pinned_buffers, report.streams, report.events) == (2, 1, 2), report
        assert (report.graphs, report.kernel_modules, report.gemm_plans) == (0, 0, 0), report
        assert report.plan_cache_entries >= 1 and len(cache) == 0, report
        assert (report.pool_blocks, report.pool_bytes) == (3, report.buffer_bytes), report
        assert report.generation == 1
        assert gp.memory_stats()["in_use_bytes"] == 0

        uses = {
            "to_numpy": lambda: a.to_numpy(),
            "device_ptr": lambda: a.device_ptr,
            "view": lambda: view.to_numpy(),
            "copy into": lambda: b.copy_(np.arange(13)),
            "copy from": lambda: gp.empty((5, 7)).copy_(a),
            "astype": lambda: a.astype(gp.float64),
            "buffer.free": lambda: raw_buffer.free(),
            "host_view": lambda: raw_buffer.host_view(),
            "pinned.numpy": lambda: pinned.numpy(),
            "pinned.free": lambda: pinned.free(),
            "pinned_free": lambda: gp.pinned_free(raw_pinned),
            "stream.handle": lambda: stream.handle,
            "stream.synchronize": lambda: stream.synchronize(),
            "stream.query": lambda: stream.query(),
            "with stream": lambda: stream.__enter__(),
            "alloc on stream": lambda: gp.empty(4, stream=stream),
            "record on stream": lambda: gp.Event().record(stream),
            "event.record": lambda: event.record(),
            "event.synchronize": lambda: event.synchronize(),
            "elapsed_time": lambda: other_event.elapsed_time(event),
            "wait_event": lambda: gp.Stream().wait_event(event),
        }
        for name, use in uses.items():
            try:
                use()
            except DeviceResetError as exc:
                assert "pygpukit.reset_device()" in str(exc), (name, str(exc))
                assert exc.device == -1, (name, exc.device)  # the CPU backend's objects
            else:
                raise AssertionError(f"{name}: no DeviceResetError after the reset")
        assert a.buffer.freed and raw_buffer.freed and pinned.freed
        # A raw copy through a stale pointer is refused like one through a freed buffer.
        try:
            gp.memcpy_device_to_device_async(gp.empty(2).device_ptr, a.buffer.ptr, 8)
        except InvalidPointerError:
            pass
        else:
            raise AssertionError("raw copy from a reset buffer was not refused")
        # A reset stream equals only itself, still hashes, and says what happened.
        assert stream == stream and stream != gp.Stream() and hash(stream) == hash(stream)
        assert "invalidated by reset_device" in repr(stream) and "invalidated" in repr(event)

        # New work: arrays, streams, events, ops, with the same numbers as NumPy in float64.
        fresh = gp.from_numpy(x)
        with gp.Stream() as s:
            y = gp.from_numpy(rng.standard_normal((7, 3)).astype(np.float32))
            done = gp.Event().record(s)
        done.synchronize()
        out = (fresh @ y).to_numpy()
        expected = x.astype(np.float64) @ y.to_numpy().astype(np.float64)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(gp.arange(6).to_numpy(), np.arange(6))
        p = gp.PinnedBuffer(16)
        p.numpy()[:] = 3
        assert p.numpy().sum() == 48
        assert gp.memory_stats()["in_use_bytes"] == fresh.nbytes + y.nbytes  # only the new arrays

        # The old objects go quietly: nothing is freed twice, no finalizer fails.
        del a, view, b, raw_buffer, pinned, stream, event, other_event, uses
        gc.collect()
        assert not unraisable, [u.exc_value for u in unraisable]
        assert gp.reset_device().generation == 2   # a second reset is fine too
        print("OK")
        """,
        "cpu",
    )


def test_cpu_reset_refunds_allocation_scopes_once() -> None:
    _run(
        """
        import gc
        import pygpukit as gp

        class Budget:
            def __init__(self):
                self.used = 0
            def charge(self, nbytes):
                self.used += nbytes
            def refund(self, nbytes):
                self.used -= nbytes

        budget = Budget()
        with gp.allocation_scope(budget):
            kept = [gp.empty(100, gp.uint8), gp.empty(28, gp.uint8)]
            freed = gp.empty(50, gp.uint8)
        freed.buffer.free()
        assert budget.used == 128
        gp.reset_device(0)
        assert budget.used == 0           # the memory died with the device
        del kept
        gc.collect()
        assert budget.used == 0           # and is not refunded again when the objects go
        assert not unraisable
        print("OK")
        """,
        "cpu",
    )


_SCENARIO = """
    import gc, queue, threading
    import numpy as np
    import pygpukit as gp
    from pygpukit.core.errors import CudaError, DeviceResetError

    FAULT = {fault!r}
    EXPECTED = {{"illegal_address": {{"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"}},
                "device_assert": {{"CUDA_ERROR_ASSERT"}}}}.get(FAULT, set())
    rng = np.random.default_rng(2024)
    axpb = gp.jit('extern "C" __global__ void axpb(const float* x, float* y, float a, float b, long long n) {{'
                  '  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;'
                  '  if (i < n) y[i] = a * x[i] + b; }}',
                  "axpb")

    # A thread that uses the device before the reset and again after it (its cached context must be
    # refreshed, native/runtime/context.cpp).
    todo, results = queue.Queue(), queue.Queue()
    def worker():
        while (job := todo.get()) is not None:
            try:
                results.put(job())
            except BaseException as exc:
                results.put(exc)
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    todo.put(lambda: float(gp.from_numpy(np.arange(3, dtype=np.float32)).to_numpy().sum()))
    assert results.get(timeout=60) == 3.0

    x = rng.standard_normal(1001).astype(np.float32)
    old = gp.from_numpy(x)
    old_view = old[::3]
    out = gp.empty(1001)
    axpb(old, out, 2.0, 0.5, 1001, grid=4, block=256)
    np.testing.assert_allclose(out.to_numpy(), 2.0 * x.astype(np.float64) + 0.5, rtol=1e-6, atol=1e-6)
    stream = gp.Stream()
    event = gp.Event().record(stream)
    pinned = gp.PinnedBuffer(4096)
    graph = gp.CudaGraph()
    with graph.capture():
        axpb(old, out, 3.0, 0.0, 1001, grid=4, block=256)
    graph.replay()
    graph.synchronize()
    square = rng.standard_normal((96, 96)).astype(np.float32)
    before = (gp.from_numpy(square) @ gp.from_numpy(square)).to_numpy()   # matmul state exists
    np.testing.assert_allclose(before, square.astype(np.float64) @ square, rtol=2e-3, atol=2e-3)

    if FAULT != "none":
        if FAULT == "illegal_address":  # a write through a pointer no allocation covers
            poke = gp.jit('extern "C" __global__ void poke(float* p) {{ p[threadIdx.x] = 1.0f; }}', "poke")
            poke(0x10, grid=1, block=32)
        else:
            boom = gp.jit('extern "C" __global__ void boom(const float* p) {{ assert(p == nullptr); }}', "boom")
            boom(out, grid=1, block=1)
        try:
            gp.synchronize()
        except CudaError as exc:
            fault = exc
        else:
            raise AssertionError("the faulting kernel did not report an error")
        assert fault.name in EXPECTED and fault.context_lost, (fault.name, fault.context_lost)
        message = str(fault)
        assert "is lost" in message and "pygpukit.reset_device(0)" in message, message
        assert ("process restart" in message) == (FAULT != "device_assert"), message
        try:  # sticky: later work on the device fails the same way, saying so
            gp.zeros(8).to_numpy()
        except CudaError as exc:
            assert exc.context_lost and "pygpukit.reset_device(0)" in str(exc), str(exc)
        else:
            raise AssertionError("the context was not lost after the fault")

    old_uses = {{
        "array": lambda: old.to_numpy(),
        "view": lambda: old_view.to_numpy(),
        "kernel on an old array": lambda: axpb(old, out, 1.0, 0.0, 1001, grid=4, block=256),
        "stream": lambda: stream.synchronize(),
        "event": lambda: event.synchronize(),
        "graph": lambda: graph.replay(),
        "pinned": lambda: pinned.numpy(),
        "free": lambda: old.buffer.free(),
    }}

    def check_old_objects_raise(refused=False):
        for name, use in old_uses.items():
            try:
                use()
            except DeviceResetError as exc:
                assert "reset_device" in str(exc) and exc.device == 0, (name, str(exc))
            except CudaError as exc:
                # After a refused reset, what needs the driver again (loading the old kernel's module
                # anew) meets the dead device: the same "restart the process" error.
                assert refused and "restart the process" in str(exc), (name, str(exc))
            else:
                raise AssertionError(f"{{name}}: no DeviceResetError after the reset")

    try:
        report = gp.reset_device()
    except CudaError as exc:
        # The driver refused a new context: NVIDIA documents memory faults as needing a restart.
        assert FAULT != "none", f"a reset of a healthy device failed: {{exc}}"
        assert exc.context_lost and exc.call == "cuDevicePrimaryCtxRetain", (exc.call, str(exc))
        assert "restart the process" in str(exc), str(exc)
        check_old_objects_raise(refused=True)
        todo.put(lambda: gp.zeros(4))
        later = [results.get(timeout=60)]
        for use in (lambda: gp.zeros(4), lambda: gp.Stream(), lambda: gp.reset_device()):
            try:
                use()
            except CudaError as exc:
                later.append(exc)
        assert len(later) == 4, later
        for exc in later:
            assert isinstance(exc, CudaError) and "restart the process" in str(exc), repr(exc)
        print("REFUSED")
    else:
        assert report.device == 0 and report.generation >= 1, report
        assert (report.sync_error is None) if FAULT == "none" else (report.sync_error in EXPECTED), report
        assert report.buffers >= 2 and report.pool_blocks >= report.buffers, report
        assert report.streams >= 1 and report.events >= 1 and report.pinned_buffers >= 1, report
        assert report.graphs == 1 and report.kernel_modules >= 1, report
        check_old_objects_raise()
        try:
            axpb(gp.zeros(4), gp.zeros(4), 1.0, 0.0, 4, grid=1, block=32, stream=stream)
        except DeviceResetError:
            pass
        else:
            raise AssertionError("a launch on a stream of the old context was not refused")

        # New work is correct: arrays, the kernel loaded before the reset (loaded again), a matmul with
        # odd shapes and a transposed operand, a stream with events, graphs, pinned memory, the thread.
        y = rng.standard_normal(777).astype(np.float32)
        fresh, result = gp.from_numpy(y), gp.empty(777)
        axpb(fresh, result, -1.5, 2.0, 777, grid=4, block=256)
        np.testing.assert_allclose(result.to_numpy(), -1.5 * y.astype(np.float64) + 2.0, rtol=1e-6, atol=1e-6)
        a = rng.standard_normal((67, 45)).astype(np.float32)
        b = rng.standard_normal((29, 45)).astype(np.float32)
        product = (gp.from_numpy(a) @ gp.from_numpy(b).T).to_numpy()
        np.testing.assert_allclose(product, a.astype(np.float64) @ b.T.astype(np.float64), rtol=2e-3, atol=2e-3)
        again = (gp.from_numpy(square) @ gp.from_numpy(square)).to_numpy()
        np.testing.assert_allclose(again, square.astype(np.float64) @ square, rtol=2e-3, atol=2e-3)
        with gp.Stream() as s:
            start = gp.Event().record(s)
            doubled = gp.from_numpy(y) * 2
            end = gp.Event().record(s)
        end.synchronize()
        assert start.elapsed_time(end) >= 0
        np.testing.assert_allclose(doubled.to_numpy(), 2.0 * y.astype(np.float64), rtol=1e-6)
        new_graph = gp.CudaGraph()
        with new_graph.capture():
            axpb(fresh, result, 1.0, 1.0, 777, grid=4, block=256)
        new_graph.replay()
        new_graph.synchronize()
        np.testing.assert_allclose(result.to_numpy(), y.astype(np.float64) + 1.0, rtol=1e-6)
        with graph.capture():  # the old graph can be captured again
            axpb(fresh, result, 0.5, 0.0, 777, grid=4, block=256)
        graph.replay()
        graph.synchronize()
        np.testing.assert_allclose(result.to_numpy(), 0.5 * y.astype(np.float64), rtol=1e-6)
        p = gp.PinnedBuffer(64)
        p.numpy(np.float32)[:] = 4.0
        assert float(p.numpy(np.float32).sum()) == 64.0
        todo.put(lambda: float((gp.from_numpy(y) + 1).to_numpy().astype(np.float64).sum()))
        np.testing.assert_allclose(results.get(timeout=60), (y.astype(np.float64) + 1).sum(), rtol=1e-4)
        print("RECOVERED")
    todo.put(None)
    thread.join()
    del old, old_view, out, stream, event, pinned, old_uses
    gc.collect()
    assert not unraisable, [u.exc_value for u in unraisable]
    print("OK")
"""


@pytest.mark.gpu
def test_reset_of_a_healthy_device_recovers_everything() -> None:
    """The recovery itself: every old object raises, every kind of new work is correct."""
    assert "RECOVERED" in _run(_SCENARIO.format(fault="none"), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fault", ["illegal_address", "device_assert"])
def test_kernel_fault_is_reported_and_reset_device_recovers_or_says_to_restart(fault: str) -> None:
    """A real fault: the sticky error is typed and explained; reset_device() then either recovers as in
    the healthy case or, when the driver refuses a new context (documented for memory faults), says
    that the process must be restarted, here and in every later call, with the old objects refused."""
    output = _run(_SCENARIO.format(fault=fault), "cuda")
    assert ("RECOVERED" in output) != ("REFUSED" in output), output
