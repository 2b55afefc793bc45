"""Out of memory in the middle of work (issue 21, item 3): with the pool full, a GEMM, attention with a
split-K workspace, KV-cache growth, a weights upload (what a model load does) and a CUDA graph capture
each either work or raise OutOfMemoryError (never another exception, never a crash); afterwards
everything is freed, the pool's in-use bytes are back at the baseline and the process still computes
correct results.

The unmarked test fills the pool up to a memory limit (``set_memory_limit``), so it runs on every
backend; the gpu-marked test fills the whole device, with no limit."""

from __future__ import annotations

import gc
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core import backend as _backend
from pygpukit.core.errors import CudaError, OutOfMemoryError
from pygpukit.core.memory import DeviceBuffer, allocation_scope

Array = np.ndarray[Any, Any]
MiB = 1 << 20


def in_use() -> int:
    return int(gp.memory_stats()["in_use_bytes"])


def fill(chunk: int, floor: int = MiB) -> list[gp.GPUArray]:
    """Allocate blocks of ``chunk`` bytes, halving the size after each refusal down to ``floor``,
    until nothing more fits; returns the blocks (the pool is then full)."""
    held: list[gp.GPUArray] = []
    while chunk >= floor:
        try:
            held.append(gp.empty(chunk, gp.uint8))
        except OutOfMemoryError:
            chunk //= 2
    assert held, "not even one block could be allocated"
    return held


def attempt(what: str, work: Callable[[], None], outcomes: dict[str, str]) -> None:
    """Run ``work``: it may finish or raise OutOfMemoryError; anything else fails the test."""
    requested = 0
    try:
        work()
    except OutOfMemoryError as error:
        requested = error.requested
        outcomes[what] = f"OutOfMemoryError: {error}"
    else:
        outcomes[what] = "ok"
    if outcomes[what] != "ok":
        assert requested > 0, (what, outcomes[what])  # the error names the refused request
    # The traceback (and the arrays its frames hold) must go before the pool is checked.


def matmul_check(rng: np.random.Generator, n: int) -> None:
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    got = gp.matmul(gp.from_numpy(a), gp.from_numpy(b)).to_numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3 * np.sqrt(n))


def decode_check(rng: np.random.Generator, max_len: int) -> None:
    batch, heads, kv_heads, d = 4, 8, 2, 64
    q = gp.from_numpy(rng.standard_normal((batch, heads, d)).astype(np.float16))
    kc = gp.from_numpy(rng.standard_normal((batch, kv_heads, max_len, d)).astype(np.float16))
    out = gp.decode_attention(q, kc, kc, [max_len, 1, max_len // 2, 7]).to_numpy()
    assert np.isfinite(out.astype(np.float32)).all()


def kv_growth(max_seq: int) -> None:
    cache = gp.KVCache(4, 1, 8, max_seq, 128, gp.float16)
    k = gp.zeros((1, 1, 8, 128), gp.float16)
    cache.append(0, k, k, gp.zeros(1, gp.int32))
    assert cache.nbytes == 2 * 4 * 8 * max_seq * 128 * 2


def weights_upload(n: int) -> None:
    """What a model load does: host weights copied into a new device array, then used."""
    host = np.full((n, n), 0.5, np.float16)
    weights = gp.from_numpy(host)
    assert float(gp.sum(weights[:8].astype(gp.float32)).to_numpy()) == 0.5 * 8 * n


def capture_check(rng: np.random.Generator) -> None:
    x_host = rng.standard_normal((64, 256)).astype(np.float32)
    x = gp.from_numpy(x_host)
    out = gp.empty((64, 64))
    w = gp.from_numpy(rng.standard_normal((64, 256)).astype(np.float32))
    stream = gp.Stream()
    with stream:
        # The captured body once eagerly on the capture stream: kernels and plans exist, and the pool
        # caches the stream's blocks for its temporaries (the driver allocates nothing during a capture).
        gp.exp(gp.matmul(x, w.T) * 0.01, out=out)
        stream.synchronize()
    graph = gp.CudaGraph()
    with graph.capture(stream):
        gp.exp(gp.matmul(x, w.T) * 0.01, out=out)
    with stream:
        out.copy_(np.full((64, 64), np.nan, np.float32))
        graph.replay()
        stream.synchronize()
    want = np.exp((x_host.astype(np.float64) @ w.to_numpy().T.astype(np.float64)) * 0.01)
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-4, atol=1e-4)


def exercise(rng: np.random.Generator, held: list[gp.GPUArray], sizes: dict[str, int]) -> dict[str, str]:
    """The four kinds of work with the pool full, then again after freeing a quarter of ``held``."""
    outcomes: dict[str, str] = {}
    for phase in ("full", "quarter freed"):
        attempt(f"{phase}: matmul", lambda: matmul_check(rng, sizes["gemm"]), outcomes)
        attempt(f"{phase}: decode attention", lambda: decode_check(rng, sizes["decode"]), outcomes)
        attempt(f"{phase}: KV cache growth", lambda: kv_growth(sizes["kv"]), outcomes)
        attempt(f"{phase}: weights upload", lambda: weights_upload(sizes["gemm"]), outcomes)
        attempt(f"{phase}: graph capture", lambda: capture_check(rng), outcomes)
        del held[: len(held) // 4 + 1]
    return outcomes


def warm_up(rng: np.random.Generator, sizes: dict[str, int]) -> int:
    """Run the work once with memory to spare (kernels compiled, plans and any workspace an op keeps for
    its shapes made), and return the pool's in-use bytes afterwards: the baseline."""
    matmul_check(rng, sizes["gemm"])
    decode_check(rng, sizes["decode"])
    capture_check(rng)
    kv_growth(sizes["kv"])
    weights_upload(sizes["gemm"])
    gc.collect()
    gp.synchronize()
    return in_use()


def recover(baseline: int, held: list[gp.GPUArray], rng: np.random.Generator, sizes: dict[str, int]) -> None:
    """Free everything: the pool is back at the baseline, and the same work computes correct results."""
    held.clear()
    gc.collect()
    gp.synchronize()
    assert in_use() == baseline, f"in_use_bytes {in_use()} after freeing everything, {baseline} before"
    gp.empty_cache()
    stats = gp.memory_stats()
    # The pool's books balance: every successful request freed or still held, nothing cached after
    # empty_cache.
    assert stats["requests"] - stats["frees"] == stats["in_use_blocks"], stats
    assert stats["cached_bytes"] == stats["cached_blocks"] == 0, stats
    assert warm_up(rng, sizes) == baseline, f"in_use_bytes {in_use()} after the work again, {baseline} before"


def test_work_under_a_full_memory_limit_then_recovery() -> None:
    rng = np.random.default_rng(21)
    sizes = {"gemm": 1024, "decode": 4096, "kv": 4096}
    baseline = warm_up(rng, sizes)
    gp.set_memory_limit(baseline + 96 * MiB)
    try:
        held = fill(16 * MiB, floor=64 << 10)
        assert in_use() > baseline + 90 * MiB
        with pytest.raises(OutOfMemoryError):
            gp.empty(1 * MiB, gp.uint8)
        outcomes = exercise(rng, held, sizes)
        assert outcomes["full: KV cache growth"].startswith("OutOfMemoryError")  # 64 MiB cannot fit in a full pool
        assert outcomes["quarter freed: matmul"] == "ok"  # 12 MiB in at least 24 MiB freed
        assert in_use() <= baseline + 96 * MiB
    finally:
        gp.set_memory_limit(None)
    recover(baseline, held, rng, sizes)


@pytest.mark.gpu
def test_gpu_filled_to_the_last_block_then_recovery() -> None:
    rng = np.random.default_rng(22)
    # The model-sized requests: a 4096 x 4096 GEMM (64 MiB of operands), decode over 32k keys, a KV
    # cache of 512 MiB; first with the device full, then with a quarter of the blocks freed.
    sizes = {"gemm": 4096, "decode": 32768, "kv": 32768}
    baseline = warm_up(rng, sizes)
    free_before, total = gp.get_memory_info()
    held = fill(1 << 30, floor=MiB)
    assert in_use() - baseline > free_before // 2, (in_use(), baseline, free_before, total)
    outcomes = exercise(rng, held, sizes)
    assert outcomes["full: KV cache growth"].startswith("OutOfMemoryError")
    # A quarter of the device is many GiB: everything fits again.
    assert all(result == "ok" for what, result in outcomes.items() if what.startswith("quarter")), outcomes
    recover(baseline, held, rng, sizes)


@pytest.mark.gpu
def test_gpu_allocation_with_no_cached_block_inside_a_capture() -> None:
    """An op that needs new device memory inside a capture, on a stream whose pool cache is empty: an
    OutOfMemoryError naming the request, the stream and the fix, raised by the allocator before any
    driver call (the driver would refuse cuMemAlloc and invalidate the capture: compute-sanitizer then
    reports two API errors), the capture ends cleanly, the pool's in-use bytes are unchanged, and the
    same stream then captures and replays after an eager run of the body."""
    host = np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32)
    x = gp.from_numpy(host)
    gp.exp(x).to_numpy()  # the kernel is loaded before any capture
    stream = gp.Stream()
    graph = gp.CudaGraph()
    gc.collect()
    gp.synchronize()
    before = in_use()
    with pytest.raises(OutOfMemoryError, match="before capturing") as caught, graph.capture(stream):
        _ = gp.exp(x) * 2.0  # a new stream has no cached block: its result needs new device memory
    assert caught.value.requested == x.nbytes
    assert f"{stream.handle:#x}" in str(caught.value)
    assert caught.value.__cause__ is None  # refused by the allocator: no driver error behind it
    assert not graph.is_capturing
    assert not graph.is_ready
    del caught
    gc.collect()
    gp.synchronize()
    assert in_use() == before
    out = gp.empty(host.shape, gp.float32)
    with stream:
        gp.multiply(gp.exp(x), 2.0, out=out)  # eagerly: the stream's pool caches the temporary's block
        stream.synchronize()
    with graph.capture(stream):
        gp.multiply(gp.exp(x), 2.0, out=out)
    with stream:
        out.copy_(np.full(host.shape, np.nan, np.float32))
        graph.replay()
        stream.synchronize()
    np.testing.assert_allclose(out.to_numpy(), 2.0 * np.exp(host.astype(np.float64)), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_cublaslt_workspace_inside_a_capture_on_a_new_stream() -> None:
    """A GEMM captured on a stream that never ran one: its output exists, but the cuBLASLt workspace of
    the stream (allocated by the native runtime, not through DeviceBuffer) is new device memory. The
    capture either needs none (a kernel without workspace was chosen) and replays the right result, or
    raises OutOfMemoryError, never CudaError, and the stream then captures after an eager run."""
    rng = np.random.default_rng(23)
    a_host = rng.standard_normal((512, 512)).astype(np.float16)
    b_host = rng.standard_normal((512, 512)).astype(np.float16)
    a, b = gp.from_numpy(a_host), gp.from_numpy(b_host)
    gp.matmul(a, b).to_numpy()  # kernels and plans exist; the default stream has its workspace
    stream = gp.Stream()
    with stream:
        out = gp.empty((512, 512), gp.float16)  # on the capture stream, before the capture
        stream.synchronize()
    want = a_host.astype(np.float64) @ b_host.astype(np.float64)
    graph = gp.CudaGraph()
    refused = ""
    try:
        with graph.capture(stream):
            gp.matmul(a, b, out=out)
    except OutOfMemoryError as error:
        refused = str(error)
    if refused:
        assert "during a CUDA graph capture" in refused
        assert not graph.is_capturing
        with stream:
            gp.matmul(a, b, out=out)  # eagerly: the stream gets its workspace
            stream.synchronize()
        with graph.capture(stream):
            gp.matmul(a, b, out=out)
    with stream:
        out.copy_(np.full((512, 512), np.nan, np.float16))
        graph.replay()
        stream.synchronize()
    np.testing.assert_allclose(out.to_numpy().astype(np.float64), want, rtol=2e-2, atol=0.25)


class _Scope:
    def __init__(self) -> None:
        self.charged = 0

    def charge(self, nbytes: int) -> None:
        self.charged += nbytes

    def refund(self, nbytes: int) -> None:
        self.charged -= nbytes


def _refusing_native(code: int, name: str) -> types.SimpleNamespace:
    def mem_alloc(nbytes: int, stream: int = 0) -> int:
        raise CudaError(f"cuMemAlloc failed with {name} ({code})", code=code, name=name, call="cuMemAlloc")

    return types.SimpleNamespace(name="cuda", native=types.SimpleNamespace(mem_alloc=mem_alloc))


def test_allocation_refused_by_a_capture_is_an_out_of_memory_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver refuses new device memory while a stream captures (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    what cuMemAlloc gets for a capture begun outside pygpukit, which the native allocator cannot see):
    DeviceBuffer raises an OutOfMemoryError naming the bytes, the stream and the fix, and refunds the
    allocation scope. The native module is simulated (this runs on every backend); for pygpukit's own
    captures the allocator refuses before the driver (the gpu test above)."""
    nbytes = int(np.random.default_rng(5).integers(1, 1 << 30))
    stream = gp.Stream()
    scope = _Scope()
    monkeypatch.setattr(_backend, "_state", _refusing_native(900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"))
    with allocation_scope(scope), pytest.raises(OutOfMemoryError) as caught:
        DeviceBuffer(nbytes, stream=stream)
    monkeypatch.undo()
    error = caught.value
    assert error.requested == nbytes
    for part in (f"{nbytes} bytes", f"{stream.handle:#x}", "before capturing", "eagerly"):
        assert part in str(error), str(error)
    assert isinstance(error.__cause__, CudaError)
    assert error.__cause__.code == 900
    assert scope.charged == 0


def test_other_driver_refusals_keep_their_cuda_error(monkeypatch: pytest.MonkeyPatch) -> None:
    scope = _Scope()
    monkeypatch.setattr(_backend, "_state", _refusing_native(1, "CUDA_ERROR_INVALID_VALUE"))
    with allocation_scope(scope), pytest.raises(CudaError) as caught:
        DeviceBuffer(4096)
    monkeypatch.undo()
    assert not isinstance(caught.value, OutOfMemoryError)
    assert caught.value.code == 1
    assert scope.charged == 0
