"""NumPy transfers: large ones are staged through pinned buffers (native/runtime/staging.cpp)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import native_module


def _config() -> dict[str, int]:
    return dict(native_module().staging_config())


@pytest.mark.gpu
def test_staging_configuration_is_sane() -> None:
    config = _config()
    assert config["min_bytes"] >= 0
    assert config["chunk_bytes"] >= 1 << 16
    assert config["buffers"] >= 2
    assert config["threads"] >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["below", "at", "chunks_plus_odd"])
def test_round_trips_around_the_staging_threshold_are_bitwise(which: str) -> None:
    config = _config()
    nbytes = {
        "below": max(config["min_bytes"] - 1, 1),
        "at": max(config["min_bytes"], 1),
        "chunks_plus_odd": 3 * config["chunk_bytes"] + 12345,
    }[which]
    rng = np.random.default_rng(nbytes)
    host = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    device = gp.from_numpy(host)
    back = device.to_numpy()
    assert back.tobytes() == host.tobytes()
    # A second pass through the same staging buffers, in the other order of sizes.
    host2 = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    device2 = gp.from_numpy(host2)
    assert device2.to_numpy().tobytes() == host2.tobytes()
    assert device.to_numpy().tobytes() == host.tobytes()


INCREMENT = r"""
extern "C" __global__ void spin_then_add(float* x, long long n, long long spins) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long t0 = clock64();
    while (clock64() - t0 < spins) { }
    if (i < n) x[i] += 1.0f;
}
"""


@pytest.mark.gpu
def test_staged_transfers_are_ordered_on_the_stream() -> None:
    n = 3 * _config()["chunk_bytes"] // 4 + 1001  # staged: above the threshold
    kernel = gp.jit(INCREMENT, "spin_then_add")
    host = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    with gp.Stream() as stream:
        x = gp.from_numpy(host, stream=stream)
        kernel(x, n, 2_000_000, grid=(n + 255) // 256, block=256)  # slow kernel queued on `stream`
        out = x.to_numpy(stream=stream)  # must wait for it
    np.testing.assert_array_equal(out, host + np.float32(1.0))


@pytest.mark.gpu
def test_transfers_of_non_contiguous_sources_and_views() -> None:
    rng = np.random.default_rng(11)
    host = rng.standard_normal((1500, 1300)).astype(np.float64)  # 15.6 MB: staged
    strided = host[::2, ::3]
    np.testing.assert_array_equal(gp.from_numpy(strided).to_numpy(), strided)
    device = gp.from_numpy(host)
    np.testing.assert_array_equal(device[100:1400:7, 5:].to_numpy(), host[100:1400:7, 5:])


@pytest.mark.gpu
def test_raw_async_copies_of_large_pageable_buffers_are_staged_and_exact() -> None:
    nbytes = 2 * _config()["chunk_bytes"] + 777
    rng = np.random.default_rng(3)
    host = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    back = np.zeros(nbytes, dtype=np.uint8)
    device = gp.empty(nbytes, gp.uint8)
    with gp.Stream() as stream:
        gp.memcpy_host_to_device_async(device.device_ptr, host.ctypes.data, nbytes, stream)
        gp.memcpy_device_to_host_async(back.ctypes.data, device.device_ptr, nbytes, stream)
        stream.synchronize()
    assert back.tobytes() == host.tobytes()
    pinned = gp.pinned_malloc(nbytes)  # pinned memory keeps the driver's asynchronous path
    try:
        view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pinned))
        view[:] = host[::-1]
        gp.memcpy_host_to_device_async(device.device_ptr, pinned, nbytes)
        gp.synchronize()
        assert device.to_numpy().tobytes() == host[::-1].tobytes()
    finally:
        gp.pinned_free(pinned)


COPY_KERNEL = r"""
extern "C" __global__ void copy_f32(const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


@pytest.mark.gpu
def test_small_uploads_are_ordered_on_a_non_blocking_stream() -> None:
    """An upload below the staging threshold on a non-blocking stream, consumed at once by a kernel on
    that stream, must be complete first: the copy's DMA is ordered on the stream (it once went to the
    legacy stream, which a non-blocking stream does not wait for, and a kernel read stale data under
    load on the H100)."""
    copy = gp.jit(COPY_KERNEL, "copy_f32")
    stream = gp.Stream()
    rng = np.random.default_rng(11)
    n = (3 << 20) // 4  # 3 MiB: the driver's pageable path, its DMA the longest
    with stream:
        y = gp.empty(n, gp.float32)
        for round_ in range(50):
            host = rng.standard_normal(n).astype(np.float32)
            x = gp.from_numpy(host)  # on `stream`; the kernel follows with no host sync in between
            copy(x, y, n, grid=(n + 255) // 256, block=256)
            stream.synchronize()
            np.testing.assert_array_equal(y.to_numpy(), host, err_msg=f"round {round_}")
            del x
