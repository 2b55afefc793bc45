"""GPUArray on the active backend (CPU in CI, CUDA on the GPU machine): construction, transfers,
views, copies and dtype conversion, each against NumPy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import DTypeError, InvalidPointerError, ShapeError
from pygpukit.testing import assert_bitwise_equal, random_array

DTYPES = list(gp.dtypes.all_dtypes())
SIZES = [1, 3, 1023, 2**20 + 7]


same = assert_bitwise_equal


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", SIZES)
def test_round_trip_is_bitwise(rng: np.random.Generator, dtype: gp.DType, size: int) -> None:
    host = random_array(rng, size, dtype)
    array = gp.from_numpy(host)
    assert (array.shape, array.dtype, array.nbytes) == ((size,), dtype, host.nbytes)
    same(array.to_numpy(), host)


def test_a_0d_array_keeps_its_shape() -> None:
    for host in (np.array(2.5, np.float32), np.int64(7)):
        array = gp.from_numpy(host)
        assert array.shape == ()
        assert array.size == 1
        same(array.to_numpy(), np.asarray(host))


def test_uint16_is_never_bfloat16() -> None:
    host = np.arange(5, dtype=np.uint16)
    array = gp.from_numpy(host)
    assert array.dtype == gp.uint16
    same(array.to_numpy(), host)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factories(dtype: gp.DType) -> None:
    shape = (3, 17)
    same(gp.zeros(shape, dtype).to_numpy(), np.zeros(shape, dtype.numpy))
    same(gp.ones(shape, dtype).to_numpy(), np.ones(shape, dtype.numpy))
    value = True if dtype.kind == "b" else 7
    same(gp.full(shape, value, dtype).to_numpy(), np.full(shape, value, dtype.numpy))
    assert gp.empty(shape, dtype).shape == shape
    like = gp.full_like(gp.empty(shape, dtype), value)
    same(like.to_numpy(), np.full(shape, value, dtype.numpy))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d.kind != "b"], ids=str)
def test_arange(dtype: gp.DType) -> None:
    same(gp.arange(3, 40, 3, dtype=dtype).to_numpy(), np.arange(3, 40, 3).astype(dtype.numpy))


def test_arange_defaults_follow_numpy() -> None:
    same(gp.arange(5).to_numpy(), np.arange(5))
    np.testing.assert_allclose(gp.arange(0.5, 2.0, 0.25).to_numpy(), np.arange(0.5, 2.0, 0.25))
    assert gp.arange(10, 0).size == 0
    with pytest.raises(ValueError, match="step must not be zero"):
        gp.arange(0, 5, 0)


def test_fill_value_out_of_range_is_rejected() -> None:
    with pytest.raises(DTypeError, match="cannot be represented as int8"):
        gp.full(4, 1000, gp.int8)


def test_views_share_memory_and_match_numpy(rng: np.random.Generator) -> None:
    host = random_array(rng, (6, 7, 5), gp.float32)
    array = gp.from_numpy(host)
    cases = {
        "T": (array.T, host.T),
        "transpose": (array.transpose(1, 0, 2), host.transpose(1, 0, 2)),
        "slice": (array[1:5, ::2, -1], host[1:5, ::2, -1]),
        "negative step": (array[::-1, 3], host[::-1, 3]),
        "ellipsis/newaxis": (array[..., None, 2], host[..., None, 2]),
        "int": (array[-1], host[-1]),
        "empty": (array[4:2], host[4:2]),
    }
    for name, (view, expected) in cases.items():
        assert view.shape == expected.shape, name
        assert view.buffer is array.buffer, name
        same(view.to_numpy(), expected)
    assert array.T.strides == host.T.strides


def test_reshape_view_and_contiguous(rng: np.random.Generator) -> None:
    host = random_array(rng, (4, 6), gp.int32)
    array = gp.from_numpy(host)
    same(array.reshape(3, -1).to_numpy(), host.reshape(3, -1))
    assert array.reshape(24).buffer is array.buffer
    transposed = array.T
    assert not transposed.is_contiguous
    with pytest.raises(ShapeError, match="view\\(\\) needs contiguous data"):
        transposed.view(24)
    same(transposed.reshape(24).to_numpy(), host.T.reshape(24))
    compact = transposed.contiguous()
    assert compact.is_contiguous
    assert compact.buffer is not array.buffer
    same(compact.to_numpy(), np.ascontiguousarray(host.T))
    with pytest.raises(ShapeError, match="cannot reshape 24 elements"):
        array.reshape(5, 5)


def test_copy_between_strided_views(rng: np.random.Generator) -> None:
    source = random_array(rng, (9, 8), gp.float64)
    target = np.full((8, 9), -1.0)
    dst = gp.from_numpy(target)
    dst[::2].copy_(gp.from_numpy(source).T[::2])
    target[::2] = source.T[::2]
    same(dst.to_numpy(), target)
    clone = dst.clone()
    dst.copy_(np.zeros((8, 9)))
    same(clone.to_numpy(), target)
    with pytest.raises(ShapeError, match="does not match"):
        dst.copy_(gp.zeros((3, 3), gp.float64))
    with pytest.raises(DTypeError, match="use astype first"):
        dst.copy_(gp.zeros((8, 9), gp.float32))


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(DTYPES, DTYPES)), ids=str)
def test_astype_every_pair(rng: np.random.Generator, src: gp.DType, dst: gp.DType) -> None:
    host = random_array(rng, (33, 5), src, nonnegative=dst.kind == "u")
    array = gp.from_numpy(host).T  # strided on purpose
    converted = array.astype(dst)
    assert converted.dtype == dst
    expected = host.T.astype(np.float64).astype(dst.numpy) if src.kind == "f" and dst.kind == "f" else host.T.astype(
        dst.numpy
    )  # fmt: skip
    same(converted.to_numpy(), expected)


CAST_PAIRS = [(gp.float32, gp.bfloat16), (gp.bfloat16, gp.float16), (gp.float16, gp.float8_e4m3fn),
              (gp.float64, gp.float32), (gp.int64, gp.float16), (gp.uint8, gp.float32)]  # fmt: skip


@pytest.mark.parametrize(("src", "dst"), CAST_PAIRS, ids=str)
def test_astype_long_and_offset_arrays(rng: np.random.Generator, src: gp.DType, dst: gp.DType) -> None:
    # Whole 16-byte chunks and a ragged tail, from aligned and from misaligned starts.
    host = random_array(rng, (4099,), src)
    array = gp.from_numpy(host)
    for start in (0, 1, 3):
        expected = (
            host[start:].astype(np.float64).astype(dst.numpy) if src.kind == "f" else host[start:].astype(dst.numpy)
        )
        same(array[start:].astype(dst).to_numpy(), expected)


def test_astype_to_e4m3_saturates_like_the_kernel() -> None:
    values = gp.from_numpy(np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 3.0, 464.0, 470.0], np.float32))
    got = values.astype(gp.float8_e4m3fn).to_numpy().astype(np.float32)
    assert got[:4].tolist() == [448.0, -448.0, 448.0, -448.0]
    assert np.isnan(got[4])
    assert got[5:].tolist() == [3.0, 448.0, 448.0]


def test_freed_memory_is_refused() -> None:
    array = gp.zeros(10)
    array.buffer.free()
    with pytest.raises(InvalidPointerError, match="freed"):
        array.to_numpy()
    with pytest.raises(InvalidPointerError, match="already freed"):
        array.buffer.free()
    assert gp.ones(3).to_numpy().tolist() == [1, 1, 1]  # the runtime stays usable


def test_implicit_numpy_conversion_is_refused() -> None:
    with pytest.raises(TypeError, match=r"call \.to_numpy\(\) explicitly"):
        np.asarray(gp.zeros(3))


def test_bad_indices() -> None:
    array = gp.zeros((2, 3))
    with pytest.raises(IndexError, match="out of bounds for axis 1"):
        array[0, 3]
    with pytest.raises(IndexError, match="too many indices"):
        array[0, 0, 0]
    with pytest.raises(TypeError, match="only integers, slices"):
        array[[0, 1]]


def test_memory_stats_track_allocations() -> None:
    before = gp.memory_stats()
    array = gp.empty(1 << 20, gp.uint8)
    during = gp.memory_stats()
    assert during["in_use_bytes"] >= before["in_use_bytes"] + (1 << 20)
    array.buffer.free()
    assert gp.memory_stats()["in_use_bytes"] == before["in_use_bytes"]


def test_memory_limit_raises_out_of_memory_with_numbers() -> None:
    base = gp.memory_stats()["in_use_bytes"]  # what earlier tests in this process still hold
    gp.set_memory_limit(base + (8 << 20))
    try:
        keep = gp.empty(4 << 20, gp.uint8)
        with pytest.raises(gp.OutOfMemoryError) as caught:
            gp.empty(16 << 20, gp.uint8)
        error = caught.value
        assert error.requested == 16 << 20
        assert error.limit == base + (8 << 20)
        assert error.in_use >= base + (4 << 20)
        assert "limit" in str(error)
        del keep
    finally:
        gp.set_memory_limit(None)
    assert gp.empty(16 << 20, gp.uint8).nbytes == 16 << 20  # recovered


def test_all_device_memory_limit_applies_on_top_of_the_device_limit() -> None:
    gp.empty_cache()  # what is left is in use: new allocations below cannot be served from the cache
    base = gp.memory_stats()["all_devices_reserved_bytes"]
    gp.set_memory_limit(base + (8 << 20), all_devices=True)
    try:
        assert gp.memory_stats()["all_devices_limit"] == base + (8 << 20)
        keep = gp.empty(4 << 20, gp.uint8)
        assert gp.memory_stats()["all_devices_reserved_bytes"] >= base + (4 << 20)
        with pytest.raises(gp.OutOfMemoryError, match="all-device limit") as caught:
            gp.empty(16 << 20, gp.uint8)
        assert caught.value.limit == base + (8 << 20)
        assert keep.nbytes == 4 << 20  # untouched
        del keep
    finally:
        gp.set_memory_limit(None, all_devices=True)
    assert gp.memory_stats()["all_devices_limit"] is None
    assert gp.empty(16 << 20, gp.uint8).nbytes == 16 << 20  # recovered
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            gp.set_memory_limit(bad, all_devices=True)  # type: ignore[arg-type]


def test_events_time_host_or_device_work() -> None:
    start, end = gp.Event(), gp.Event()
    start.record()
    gp.arange(1 << 16, dtype=gp.float32)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert end.query()


def test_streams_order_work_and_are_current_in_a_with_block(rng: np.random.Generator) -> None:
    host = random_array(rng, 4096, gp.float32)
    stream = gp.Stream(priority=0)
    with stream:
        assert gp.current_stream() == stream
        array = gp.from_numpy(host)
        doubled = array.astype(gp.float64)
    assert gp.current_stream() != stream
    stream.synchronize()
    assert stream.query()
    same(doubled.to_numpy(stream=stream), host.astype(np.float64))
    assert stream.__cuda_stream__()[1] == stream.handle


def test_pinned_memory_and_raw_async_copies(rng: np.random.Generator) -> None:
    host = random_array(rng, 1000, gp.int64)
    pinned = gp.PinnedBuffer(host.nbytes)
    pinned.numpy(np.int64)[:] = host
    device = gp.empty(1000, gp.int64)
    stream = gp.Stream()
    gp.memcpy_host_to_device_async(device.device_ptr, pinned.ptr, host.nbytes, stream)
    back = gp.PinnedBuffer(host.nbytes)
    gp.memcpy_device_to_host_async(back.ptr, device.device_ptr, host.nbytes, stream)
    stream.synchronize()
    same(back.numpy(np.int64), host)
    ptr = gp.pinned_malloc(64)
    gp.pinned_free(ptr)


class _Budget:
    """A test AllocationScope: refuses beyond `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.refunds = limit, 0, 0

    def charge(self, nbytes: int) -> None:
        if self.used + nbytes > self.limit:
            raise gp.OutOfMemoryError(f"budget: {self.used} + {nbytes} > {self.limit}")
        self.used += nbytes

    def refund(self, nbytes: int) -> None:
        self.used -= nbytes
        self.refunds += 1


def test_allocation_scope_charges_refunds_and_refuses() -> None:
    from pygpukit.core.memory import allocation_scope, current_allocation_scope

    budget = _Budget(1 << 20)
    outside = gp.empty(2 << 20, gp.uint8)  # not charged: no scope
    with allocation_scope(budget):
        assert current_allocation_scope() is budget
        a = gp.empty(1000, gp.uint8)
        assert budget.used == 1000
        with pytest.raises(gp.OutOfMemoryError, match="budget"):
            gp.empty(1 << 20, gp.uint8)
        assert budget.used == 1000  # the refused allocation left nothing behind
        with allocation_scope(None):
            gp.empty(4 << 20, gp.uint8)  # an inner None suspends the scope
        assert budget.used == 1000
    assert current_allocation_scope() is None
    a.buffer.free()  # refunded wherever it is freed
    assert budget.used == 0
    assert budget.refunds == 1
    del outside


def test_allocation_scopes_are_per_asyncio_task() -> None:
    import asyncio

    from pygpukit.core.memory import allocation_scope

    first, second = _Budget(1 << 30), _Budget(1 << 30)

    async def work(budget: _Budget, nbytes: int) -> gp.GPUArray:
        with allocation_scope(budget):
            await asyncio.sleep(0)
            array = gp.empty(nbytes, gp.uint8)
            await asyncio.sleep(0)
            return array

    async def both() -> list[gp.GPUArray]:
        return list(await asyncio.gather(work(first, 100), work(second, 300)))

    arrays = asyncio.run(both())
    assert (first.used, second.used) == (100, 300)
    del arrays


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
def test_zero_dimensional_factories(dtype: str) -> None:
    one = gp.ones((), dtype)
    assert one.shape == ()
    assert one.size == 1
    assert one.to_numpy().item() == 1
    assert gp.full((), 0, dtype).to_numpy().item() == 0


def test_current_stream_is_per_asyncio_task_and_per_thread() -> None:
    import asyncio
    import threading

    first, second = gp.Stream(), gp.Stream()
    seen: dict[str, list[gp.Stream]] = {"a": [], "b": []}

    async def task(name: str, stream: gp.Stream) -> None:
        with stream:
            for _ in range(3):
                await asyncio.sleep(0)  # the other task runs inside its own `with` meanwhile
                seen[name].append(gp.current_stream())

    async def both() -> None:
        await asyncio.gather(task("a", first), task("b", second))

    asyncio.run(both())
    assert seen == {"a": [first] * 3, "b": [second] * 3}
    assert gp.current_stream() is not first
    inner: list[gp.Stream] = []
    with first:
        worker = threading.Thread(target=lambda: inner.append(gp.current_stream()))
        worker.start()
        worker.join()
        assert gp.current_stream() is first
    assert inner[0] is not first  # a new thread starts on the default stream


def test_datatype_is_the_dtype_class() -> None:
    """``DataType`` (the product description's name) is DType itself: every dtype is one."""
    assert gp.DataType is gp.DType
    assert all(isinstance(d, gp.DataType) for d in (*gp.dtypes.all_dtypes(), gp.int4))
    assert gp.as_dtype("bfloat16") == gp.bfloat16
    assert gp.zeros(2, gp.float16).dtype == gp.float16
    assert isinstance(gp.zeros(2, gp.float16).dtype, gp.DataType)
