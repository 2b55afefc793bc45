"""CUDA graphs: replay is bitwise identical to eager execution; update, reset, errors. Devices. On the CPU
backend: the recorded calls replay equal to eager runs."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError, PyGPUkitError
from pygpukit.testing import assert_bitwise_equal

AXPBY = r"""
extern "C" __global__ void axpby(float a, const float* x, float b, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i];
}
"""


def run_pipeline(kernel: gp.JITKernel, x: gp.GPUArray, y: gp.GPUArray, out: gp.GPUArray) -> None:
    n = x.size
    kernel(1.5, x, 0.25, y, n, grid=(n + 255) // 256, block=256)
    kernel(-0.5, y, 2.0, x, n, grid=(n + 255) // 256, block=256)
    out.copy_(x.reshape(-1, 7).T.astype(gp.float64).T.reshape(-1))  # strided copies and a cast


@pytest.mark.gpu
def test_replay_is_bitwise_identical_to_eager() -> None:
    rng = np.random.default_rng(3)
    n = 7 * 4099
    kernel = gp.jit(AXPBY, "axpby")
    hx, hy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)

    x, y, out = gp.from_numpy(hx), gp.from_numpy(hy), gp.full(n, np.nan, gp.float64)
    run_pipeline(kernel, x, y, out)
    eager = out.to_numpy()

    gx, gy, gout = gp.from_numpy(hx), gp.from_numpy(hy), gp.full(n, np.nan, gp.float64)
    # Warm up so that every kernel is compiled and every temporary block exists in the pool.
    run_pipeline(kernel, gp.from_numpy(hx), gp.from_numpy(hy), gp.empty(n, gp.float64))
    graph = gp.CudaGraph()
    with graph.capture(mode="relaxed"):
        run_pipeline(kernel, gx, gy, gout)
    assert graph.is_ready
    assert graph.num_nodes >= 3
    for _ in range(3):  # replays start from fresh inputs each time
        gx.copy_(hx)
        gy.copy_(hy)
        gout.copy_(np.full(n, np.nan))
        graph.replay()
        graph.synchronize()
        assert_bitwise_equal(gout.to_numpy(), eager)


SLOW_FILL = r"""
extern "C" __global__ void slow_fill(float* x, float value, long long n, long long spin) {
    long long start = clock64();
    while (clock64() - start < spin) {
    }
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
"""


@pytest.mark.gpu
def test_replay_is_ordered_after_and_before_the_current_stream() -> None:
    """Work issued on the current stream before a replay (new inputs) is seen by the graph, and work
    issued after it (reading outputs) sees the graph's results, although the graph runs on its own
    capture stream: a slow kernel writing the input makes a missing order show."""
    n = 4099
    fill = gp.jit(SLOW_FILL, "slow_fill")
    axpby = gp.jit(AXPBY, "axpby")
    x, y = gp.full(n, 1.0, gp.float32), gp.full(n, 0.0, gp.float32)
    graph = gp.CudaGraph()
    with graph.capture():
        axpby(2.0, x, 0.0, y, n, grid=(n + 255) // 256, block=256)  # y = 2 x
    for round_, value in enumerate((3.0, -5.0, 7.25)):
        # about 50 ms on the current (default) stream before x holds `value`
        fill(x, value, n, 100_000_000, grid=(n + 255) // 256, block=256)
        graph.replay()
        np.testing.assert_array_equal(y.to_numpy(), np.full(n, 2 * value, np.float32), err_msg=f"round {round_}")


@pytest.mark.gpu
def test_recapture_updates_in_place_and_reset() -> None:
    kernel = gp.jit(AXPBY, "axpby")
    x, y = gp.ones(256), gp.zeros(256)
    graph = gp.CudaGraph()
    with graph.capture():
        kernel(2.0, x, 0.0, y, 256, grid=1, block=256)
    with graph.capture():  # same topology, new scalar: updated without re-instantiation
        kernel(3.0, x, 0.0, y, 256, grid=1, block=256)
    graph.replay()
    graph.synchronize()
    np.testing.assert_array_equal(y.to_numpy(), np.full(256, 3.0, np.float32))
    graph.reset()
    assert not graph.is_ready
    with pytest.raises(PyGPUkitError, match="nothing captured yet"):
        graph.replay()


@pytest.mark.gpu
def test_temporaries_freed_inside_a_capture_stay_the_graphs() -> None:
    """A block the captured work allocates and frees (a temporary) is written at every replay, so no
    array allocated after the capture may get it (the capture's hold in the pool): before, an array
    allocated on the capture stream after the capture took the temporary's cached block and each replay
    overwrote it. The capture still reuses its own temporaries (four here, one block), and destroying
    the graph gives them back to the pool."""
    n = 4099
    kernel = gp.jit(AXPBY, "axpby")
    x, out = gp.full(n, 1.0, gp.float32), gp.zeros(n, gp.float32)
    grid = (n + 255) // 256

    def body(scale: float) -> None:
        tmp = gp.full(n, 7.0, gp.float32)  # finite: axpby reads it (0 * 7), where NaN would stay NaN
        kernel(scale, x, 0.0, tmp, n, grid=grid, block=256)  # tmp = scale x
        kernel(1.0, tmp, 1.0, out, n, grid=grid, block=256)  # out += tmp
        del tmp

    stream = gp.Stream()
    with stream:
        body(0.0)  # warm-up: the kernel compiled, the temporary's block cached for the capture stream
    stream.synchronize()
    graph = gp.CudaGraph()
    with graph.capture(stream):
        for scale in (1.0, 2.0, 3.0, 4.0):
            body(scale)
    in_use = gp.memory_stats()["in_use_bytes"]
    with stream:
        after = gp.full(n, -3.0, gp.float32)
        out.copy_(np.zeros(n, np.float32))
    graph.replay()
    graph.synchronize()
    np.testing.assert_array_equal(out.to_numpy(), np.full(n, 10.0, np.float32))
    np.testing.assert_array_equal(after.to_numpy(), np.full(n, -3.0, np.float32))
    del graph
    gc.collect()
    assert gp.memory_stats()["in_use_bytes"] < in_use + after.nbytes


@pytest.mark.gpu
def test_failed_capture_leaves_the_stream_usable() -> None:
    graph = gp.CudaGraph()
    with pytest.raises(RuntimeError, match="boom"), graph.capture() as stream:
        raise RuntimeError("boom")
    assert not graph.is_capturing
    with stream:
        assert gp.ones(4).to_numpy().sum() == 4


def test_default_stream_cannot_be_captured() -> None:
    with pytest.raises(PyGPUkitError, match="legacy default stream"), gp.CudaGraph().capture(gp.Stream.null()):
        pass


def test_set_device_validates() -> None:
    assert gp.get_device() == 0
    gp.set_device(0)
    with pytest.raises(DeviceError, match="device 99 does not exist"):
        gp.set_device(99)
    assert gp.get_device() == 0


# -- the CPU backend: recorded calls, replayed ---------------------------------------------------------
cpu_only = pytest.mark.skipif(gp.is_cuda_available(), reason="the CPU backend's recording (the GPU captures kernels)")


def _pipeline(x: gp.GPUArray, y: gp.GPUArray, out: gp.GPUArray, acc: gp.GPUArray) -> gp.GPUArray:
    """Ops, operators, in-place updates, views, conversions and a constructor, as a decode step would."""
    t = gp.add(x, y.T.T)  # a temporary made inside the capture
    u = t * 0.5 - y
    gp.exp(u, out=out)
    acc += out  # in place
    h = out.astype(gp.bfloat16).astype(gp.float32)
    z = gp.zeros(x.shape)
    z.copy_(h)
    s = gp.sum(z, axis=1)
    return gp.softmax(s.reshape(1, -1), axis=-1)


@cpu_only
def test_cpu_replay_equals_eager_on_new_inputs() -> None:
    rng = np.random.default_rng(11)
    shape = (3, 17)
    x, y = gp.from_numpy(np.zeros(shape, np.float32)), gp.from_numpy(np.zeros(shape, np.float32))
    out, acc = gp.empty(shape), gp.zeros(shape)
    graph = gp.CudaGraph()
    with graph.capture() as stream:
        assert gp.core.graph.is_capturing(stream)
        assert gp.core.graph.is_capturing_on_cpu()
        result = _pipeline(x, y, out, acc)
    assert not gp.core.graph.is_capturing_on_cpu()
    assert graph.is_ready
    assert graph.num_nodes >= 9
    eager_acc = gp.from_numpy(acc.to_numpy())  # the capture ran the block once (it runs eagerly on the CPU)
    for step in range(3):
        hx, hy = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
        x.copy_(hx)
        y.copy_(hy)
        graph.replay()
        graph.synchronize()
        expected = _pipeline(gp.from_numpy(hx), gp.from_numpy(hy), gp.empty(shape), eager_acc)
        assert_bitwise_equal(result.to_numpy(), expected.to_numpy())
        assert_bitwise_equal(acc.to_numpy(), eager_acc.to_numpy())
        # and against float64 NumPy (the one rounding of each op allowed for)
        ref = np.exp((hx.astype(np.float64) + hy) * 0.5 - hy)
        np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-6, atol=1e-6, err_msg=str(step))


@cpu_only
def test_cpu_custom_kernels_raise_inside_a_capture() -> None:
    kernel = gp.jit(AXPBY, "axpby")
    x, y = gp.ones(8), gp.ones(8)
    graph = gp.CudaGraph()
    with pytest.raises(DeviceError, match=r"cannot run custom kernels.*inside a CudaGraph capture"), graph.capture():
        kernel(1.0, x, 2.0, y, 8, grid=1, block=8)
    assert not graph.is_ready
    assert not gp.core.graph.is_capturing_on_cpu()
    with pytest.raises(PyGPUkitError, match="nothing captured yet"):
        graph.replay()


@cpu_only
def test_cpu_recapture_reset_and_replay_into_another_graph() -> None:
    x, y = gp.ones(4), gp.zeros(4)
    inner = gp.CudaGraph()
    with inner.capture():
        gp.add(y, x, out=y)
    outer = gp.CudaGraph()
    with outer.capture():
        inner.replay()  # replaying a graph inside a capture records the replay
        y *= 2.0
    assert y.to_numpy().tolist() == [4.0] * 4  # each capture ran its block once: (1 + 1) * 2
    outer.replay()
    assert y.to_numpy().tolist() == [10.0] * 4  # (4 + 1) * 2
    with inner.capture():  # capturing again replaces the recording (and runs it once)
        gp.sub(y, x, out=y)
    inner.replay()
    assert y.to_numpy().tolist() == [8.0] * 4
    inner.reset()
    assert not inner.is_ready
    assert inner.num_nodes == 0


@cpu_only
def test_cpu_captures_that_cannot_be_recorded_raise() -> None:
    from pygpukit.core import _recording

    graph, other = gp.CudaGraph(), gp.CudaGraph()
    with graph.capture(), pytest.raises(PyGPUkitError, match="already open on this thread"), other.capture():
        pass
    recorder = _recording.CpuRecorder()
    recorder.start()
    try:
        gp.ones(2)
        gp.core.array.GPUArray._view  # noqa: B018 - a plain attribute: nothing recorded
    finally:
        recorder.stop()
    assert [step.label for step in recorder.steps] == ["pygpukit.core.array.ones"]
    recorder.problems.append("a test problem")
    with pytest.raises(PyGPUkitError, match="cannot be replayed on the CPU simulation backend: a test problem"):
        recorder.check()


@cpu_only
def test_cpu_a_failed_capture_leaves_nothing_recorded() -> None:
    x = gp.ones(3)
    graph = gp.CudaGraph()

    def fail() -> None:
        gp.add(x, x, out=x)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), graph.capture():
        fail()
    assert not graph.is_ready
    assert x.to_numpy().tolist() == [2.0] * 3
    with graph.capture():
        gp.add(x, x, out=x)
    graph.replay()
    assert x.to_numpy().tolist() == [8.0] * 3
