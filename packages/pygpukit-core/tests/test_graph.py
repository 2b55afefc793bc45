"""CUDA graphs: replay is bitwise identical to eager execution; update, reset, errors. Devices."""

from __future__ import annotations

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
