"""JIT kernels: signature parsing and argument packing (anywhere), launches (GPU), the kernel cache."""

from __future__ import annotations

import importlib
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import DeviceError, DTypeError, InvalidPointerError, NvrtcError, ShapeError
from pygpukit.core.jit import JITKernel, KernelArgumentError, parse_signature
from pygpukit.core.kernel_cache import KernelCache

jit_module = importlib.import_module("pygpukit.core.jit")  # the name `jit` is also the function

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def test_signature_parsing() -> None:
    params = parse_signature(SAXPY, "saxpy")
    assert params is not None
    assert [(p.name, p.kind, p.format) for p in params] == [
        ("a", "scalar", "f"), ("x", "pointer", "Q"), ("y", "pointer", "Q"), ("n", "scalar", "q"),
    ]  # fmt: skip
    source = "struct L { int a; }; __global__ void __launch_bounds__(128) k(L layout, unsigned short s, __half h) {}"
    params = parse_signature(source, "k")
    assert params is not None
    assert [p.kind for p in params] == ["opaque", "scalar", "scalar"]
    assert parse_signature(SAXPY, "missing") is None


def test_argument_packing_uses_c_layout() -> None:
    kernel = JITKernel(SAXPY, "saxpy")
    buffer, offsets = kernel.pack_arguments([2.0, 0x1000, 0x2000, 7])
    assert list(struct.unpack("4I", offsets)) == [0, 8, 16, 24]
    assert struct.unpack_from("@f", buffer, 0)[0] == 2.0
    assert struct.unpack_from("@Q", buffer, 8)[0] == 0x1000
    assert struct.unpack_from("@q", buffer, 24)[0] == 7
    with pytest.raises(DTypeError, match="parameter 'n'"):
        kernel.pack_arguments([2.0, 0, 0, 1.5])
    with pytest.raises(DTypeError, match="parameter 'x' is a pointer"):
        kernel.pack_arguments([2.0, "x", 0, 1])
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel.pack_arguments([2.0])


def test_unknown_signature_needs_numpy_scalars() -> None:
    kernel = JITKernel("template <typename T> __global__ void k(T v) {}", "k<int>", name_expressions=["k<int>"])
    buffer, _ = kernel.pack_arguments([np.int32(5)])
    assert struct.unpack_from("@i", buffer)[0] == 5
    with pytest.raises(DTypeError, match="pass a NumPy scalar"):
        kernel.pack_arguments([5])


@pytest.mark.nvrtc
def test_kernel_cache_cold_warm_and_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = KernelCache(tmp_path)
    monkeypatch.setattr(jit_module, "kernel_cache", cache)
    kernel = JITKernel(SAXPY, "saxpy")
    first = kernel.compile("sm_90")
    assert cache.stats.misses == 1
    assert cache.stats.writes == 1
    (entry,) = tmp_path.glob("*.cubin")
    assert kernel.compile("sm_90") is first
    assert cache.stats.memory_hits == 1
    cache.clear_memory()
    assert kernel.compile("sm_90").binary == first.binary
    assert cache.stats.disk_hits == 1
    entry.write_bytes(entry.read_bytes()[:-10] + b"corrupted!")
    cache.clear_memory()
    again = kernel.compile("sm_90")  # the bad entry is detected, deleted, recompiled and rewritten
    assert again.binary == first.binary
    assert cache.stats.corrupt_entries == 1
    assert cache.stats.writes == 2
    assert kernel.compile("sm_80").binary != first.binary  # the arch is part of the key


@pytest.mark.nvrtc
def test_compile_only_works_without_a_gpu() -> None:
    program = JITKernel(SAXPY, "saxpy").compile("sm_120")
    assert program.binary[:4] == b"\x7fELF"


def test_launch_needs_the_cuda_backend() -> None:
    if gp.is_cuda_available():
        pytest.skip("the CUDA backend is available here")
    kernel = gp.jit(SAXPY, "saxpy")
    with pytest.raises(DeviceError, match="needs the CUDA backend"):
        kernel(1.0, 0, 0, 0, grid=1, block=1)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3, 1023, 2**20 + 7])
def test_saxpy_matches_float64(n: int) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    kernel = gp.jit(SAXPY, "saxpy")
    assert kernel.is_compiled
    dx, dy = gp.from_numpy(x), gp.from_numpy(y)
    kernel(2.5, dx, dy, n, grid=(n + 255) // 256, block=256)
    expected = 2.5 * x.astype(np.float64) + y
    np.testing.assert_allclose(dy.to_numpy(), expected, rtol=1e-6, atol=1e-6)


SCALARS = r"""
extern "C" __global__ void scalars(double* out, signed char a, unsigned char b, short c, unsigned short d, int e,
                                   unsigned int f, long long g, unsigned long long h, float i, double j, bool k,
                                   __half l, __nv_bfloat16 m, size_t n, char o, int p, int q, int r, int s, int t) {
    out[0] = a; out[1] = b; out[2] = c; out[3] = d; out[4] = e; out[5] = f; out[6] = (double)g; out[7] = (double)h;
    out[8] = i; out[9] = j; out[10] = k; out[11] = __half2float(l); out[12] = __bfloat162float(m);
    out[13] = (double)n; out[14] = o; out[15] = p + q + r + s + t;
}
"""


@pytest.mark.gpu
def test_every_scalar_type_and_many_arguments() -> None:
    kernel = gp.jit("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + SCALARS, "scalars")
    out = gp.full(16, -1.0, gp.float64)
    args = [-5, 250, -300, 60000, -70000, 4000000000, -(2**40), 2**50, 1.5, 2.25, True, 0.5, 3.0, 123456789, 65,
            1, 2, 3, 4, 5]  # fmt: skip
    kernel(out, *args, grid=1, block=1)
    expected = [-5, 250, -300, 60000, -70000, 4000000000, -(2**40), 2**50, 1.5, 2.25, 1, 0.5, 3.0, 123456789, 65, 15]
    np.testing.assert_array_equal(out.to_numpy(), np.array(expected, dtype=np.float64))
    with pytest.raises(DTypeError, match="parameter 'a'"):
        kernel(out, 300, *args[1:], grid=1, block=1)  # 300 does not fit a signed char
    # NumPy scalars take the same (native) packing path and give the same bytes.
    numpy_args = [np.int8(-5), np.uint8(250), np.int16(-300), np.uint16(60000), np.int32(-70000),
                  np.uint32(4000000000), np.int64(-(2**40)), np.uint64(2**50), np.float32(1.5), np.float64(2.25),
                  np.bool_(True), np.float16(0.5), 3.0, np.int64(123456789), np.uint8(65),
                  *map(np.int32, (1, 2, 3, 4, 5))]  # fmt: skip
    out = gp.full(16, -1.0, gp.float64)
    kernel(out, *numpy_args, grid=1, block=1)
    np.testing.assert_array_equal(out.to_numpy(), np.array(expected, dtype=np.float64))
    with pytest.raises(DTypeError, match="parameter 'e'"):
        kernel(out, *args[:4], 1.5, *args[5:], grid=1, block=1)  # a float for an int parameter
    with pytest.raises(DTypeError, match="parameter 'i'"):
        kernel(out, *args[:8], "1.5", *args[9:], grid=1, block=1)  # a string for a float parameter
    with pytest.raises(DTypeError, match="parameter 'e'"):
        kernel(out, *args[:4], np.bool_(True), *args[5:], grid=1, block=1)  # NumPy bool for an int


DYNAMIC_SHARED = r"""
extern "C" __global__ void reverse_block(const int* in, int* out, int n) {
    extern __shared__ int tile[];
    int i = threadIdx.x;
    if (i < n) tile[i] = in[blockIdx.x * n + i];
    __syncthreads();
    if (i < n) out[blockIdx.x * n + i] = tile[n - 1 - i];
}
"""


@pytest.mark.gpu
def test_dynamic_shared_memory_and_limits() -> None:
    kernel = gp.jit(DYNAMIC_SHARED, "reverse_block")
    n, blocks = 1024, 7
    host = np.arange(n * blocks, dtype=np.int32)
    src, dst = gp.from_numpy(host), gp.zeros(n * blocks, gp.int32)
    kernel(src, dst, n, grid=blocks, block=n, shared_mem=n * 4)
    np.testing.assert_array_equal(dst.to_numpy(), host.reshape(blocks, n)[:, ::-1].reshape(-1))
    with pytest.raises(ShapeError, match="allows at most"):
        kernel(src, dst, n, grid=1, block=2048)
    with pytest.raises(ShapeError, match="dynamic shared memory limit"):
        kernel(src, dst, n, grid=1, block=32, shared_mem=200 * 1024)
    kernel.set_max_dynamic_shared_memory(200 * 1024)
    kernel(src, dst, n, grid=blocks, block=n, shared_mem=200 * 1024)  # now allowed
    np.testing.assert_array_equal(dst.to_numpy(), host.reshape(blocks, n)[:, ::-1].reshape(-1))


@pytest.mark.gpu
def test_templates_through_name_expressions() -> None:
    source = (
        "template <typename T> __global__ void scale(T* x, T s, int n) { int i = threadIdx.x; if (i < n) x[i] *= s; }"
    )
    kernel = gp.jit(source, "scale<double>", name_expressions=["scale<double>"])
    x = gp.from_numpy(np.arange(10, dtype=np.float64))
    kernel(x, np.float64(3.0), np.int32(10), grid=1, block=32)
    np.testing.assert_array_equal(x.to_numpy(), np.arange(10) * 3.0)


@pytest.mark.gpu
def test_errors_leave_the_runtime_usable() -> None:
    with pytest.raises(NvrtcError, match="undeclared_thing"):
        gp.jit('extern "C" __global__ void k() { undeclared_thing(); }', "k")
    kernel = gp.jit(SAXPY, "saxpy")
    freed = gp.zeros(4)
    freed.buffer.free()
    with pytest.raises(InvalidPointerError):
        kernel(1.0, freed, freed, 4, grid=1, block=4)
    with pytest.raises(ShapeError, match="grid dimensions must be >= 1"):
        kernel(1.0, 0, 0, 0, grid=0, block=1)
    x, y = gp.ones(4), gp.ones(4)
    kernel(1.0, x, y, 4, grid=1, block=4)
    np.testing.assert_array_equal(y.to_numpy(), [2, 2, 2, 2])


@pytest.mark.gpu
def test_wrong_dtype_layout_or_device_at_launch() -> None:
    kernel = gp.jit(SAXPY, "saxpy")
    y = gp.ones(8)
    with pytest.raises(DTypeError, match="parameter 'x' is float\\*, but the array passed has dtype float64"):
        kernel(1.0, gp.ones(8, gp.float64), y, 8, grid=1, block=8)
    with pytest.raises(ShapeError, match="not contiguous"):
        kernel(1.0, gp.ones((4, 4)).T, y, 8, grid=1, block=8)
    other = gp.ones(8)
    other.buffer.device = 1  # as if it lived on a second GPU (this machine may have one)
    try:
        with pytest.raises(DeviceError, match="parameter 'x': the array lives on cuda:1, the kernel runs on cuda:0"):
            kernel(1.0, other, y, 8, grid=1, block=8)
    finally:
        other.buffer.device = 0
    kernel(1.0, gp.ones(8), y, 8, grid=1, block=8)
    np.testing.assert_array_equal(y.to_numpy(), np.full(8, 2.0, np.float32))


@pytest.mark.gpu
def test_real_out_of_memory_then_recovery() -> None:
    total = gp.get_memory_info()[1]
    with pytest.raises(gp.OutOfMemoryError) as caught:
        gp.empty(total * 2, gp.uint8)
    assert caught.value.requested == total * 2
    assert "no more free memory" in str(caught.value)
    assert gp.memory_stats()["pending_bytes"] == 0
    assert gp.ones(1 << 20).to_numpy().sum() == 1 << 20


@pytest.mark.gpu
def test_pool_reuses_blocks_per_stream() -> None:
    stream = gp.Stream()
    a = gp.empty(3 << 20, gp.uint8, stream=stream)
    ptr = a.device_ptr
    a.buffer.free()
    hits = gp.memory_stats()["reuse_hits"]
    b = gp.empty(3 << 20, gp.uint8, stream=stream)
    assert b.device_ptr == ptr
    assert gp.memory_stats()["reuse_hits"] == hits + 1
    b.buffer.free()
    assert gp.empty_cache() >= 3 << 20


@pytest.mark.gpu
def test_allocation_churn_with_random_sizes() -> None:
    rng = np.random.default_rng(7)
    live = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            live.pop(int(rng.integers(len(live)))).buffer.free()
        else:
            size = int(rng.integers(1, 8 << 20))
            array = gp.empty(size, gp.uint8)
            live.append(array)
    pointers = [a.device_ptr for a in live]
    assert len(set(pointers)) == len(pointers)
    stats = gp.memory_stats()
    assert stats["in_use_blocks"] >= len(live)
    assert stats["reuse_hits"] > 0


def test_native_launcher_is_constructible_and_declines_unusual_arguments() -> None:
    """The C fast path (native/bindings/launcher.cpp) builds without a GPU; it returns NotImplemented
    (the general Python path then validates) for anything it does not handle, before touching CUDA."""
    native = pytest.importorskip("pygpukit.core._native_cu13")
    from pygpukit.core.array import GPUArray
    from pygpukit.core.stream import _local, current_streams

    launcher = native.Launcher(1, 0, 1024, 48 * 1024, "pqf", ("float", None, None), GPUArray, _local, current_streams)
    assert launcher.kinds == "pqf"
    assert launcher.launch((1, 2), 1, 32, 0, None) is NotImplemented  # wrong count
    assert launcher.launch((1, 2, 3.0), 1, 2048, 0, None) is NotImplemented  # too many threads
    assert launcher.launch((1, 2, 3.0), (1, 1, 1, 1), 32, 0, None) is NotImplemented  # bad grid
    assert launcher.launch((1, 2, 3.0), 1, 32, 10**6, None) is NotImplemented  # too much shared memory
    assert launcher.launch(("x", 2, 3.0), 1, 32, 0, None) is NotImplemented  # not a pointer
    assert launcher.launch((1, 2**70, 3.0), 1, 32, 0, None) is NotImplemented  # out of range
    with pytest.raises(TypeError, match="argument 9"):
        native.Launcher(1, 0, 1024, 0, "p", (None,), GPUArray, _local, _local)


# -- arguments by name and the default launch configuration ---------------------------------------
SCALE = r"""
extern "C" __global__
void scale(float* x, float factor, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] *= factor;
}
"""


def test_arguments_bind_by_name() -> None:
    kernel = JITKernel(SAXPY, "saxpy")
    assert kernel.bind_arguments((2.0,), {"x": 0x10, "n": 5, "y": 0x20}) == (2.0, 0x10, 0x20, 5)
    assert kernel.bind_arguments((), {"n": 1, "a": 1.5, "y": 2, "x": 3}) == (1.5, 3, 2, 1)
    assert kernel.bind_arguments((1.0, 2, 3, 4), {}) == (1.0, 2, 3, 4)


@pytest.mark.parametrize(
    ("args", "named", "message"),
    [
        ((2.0,), {"x": 1, "y": 2, "m": 3}, r"kernel saxpy has no parameter 'm'; its parameters: a, x, y, n"),
        ((2.0, 1), {"x": 1, "y": 2, "n": 3}, r"parameter 'x' was given twice \(as positional argument 1"),
        ((2.0,), {"y": 2}, r"no argument for parameter\(s\) 'x', 'n'"),
        ((1.0, 2, 3, 4, 5), {"n": 1}, r"takes 4 arguments \(a, x, y, n\), got 5 positional ones"),
    ],
)
def test_bad_names_raise_typed_errors(args: tuple[object, ...], named: dict[str, object], message: str) -> None:
    kernel = JITKernel(SAXPY, "saxpy")
    with pytest.raises(KernelArgumentError, match=message) as caught:
        kernel.bind_arguments(args, named)
    assert isinstance(caught.value, gp.ArgumentError)
    assert isinstance(caught.value, TypeError)


def test_calls_bind_before_anything_else() -> None:
    """Binding errors are raised by the call itself, on any backend, before a launch is attempted."""
    kernel = JITKernel(SAXPY, "saxpy")
    with pytest.raises(KernelArgumentError, match="has no parameter 'count'"):
        kernel(2.0, 0, 0, count=4)
    with pytest.raises(KernelArgumentError, match="takes 4 arguments"):
        kernel.pack_arguments([2.0, 0, 0])
    template = JITKernel(
        "template <typename T> __global__ void k(T* x, int n) {}", "k<float>", name_expressions=["k<float>"]
    )
    with pytest.raises(KernelArgumentError, match="pass the arguments positionally"):
        template(0, n=3)


def test_default_launch_configuration() -> None:
    kernel = JITKernel(SCALE, "scale")
    assert kernel.launch_config((0, 0.5, 1000)) == (4, 256)  # ceil(1000 / 256) blocks of DEFAULT_BLOCK
    assert kernel.launch_config((0, 0.5, 256)) == (1, 256)
    assert kernel.launch_config((0, 0.5, 257)) == (2, 256)
    assert kernel.launch_config((0, 0.5, 0)) == (1, 256)  # at least one block
    assert kernel.launch_config((0, 0.5, 1000), block=(16, 4)) == (16, (16, 4))  # 64 threads per block
    assert kernel.launch_config((0, 0.5, 1000), grid=3) == (3, 256)
    assert kernel.launch_config((0, 0.5, 1000), grid=(2, 2), block=32) == ((2, 2), 32)
    assert jit_module.DEFAULT_BLOCK == 256


def test_default_grid_from_the_largest_array_without_a_count_parameter() -> None:
    kernel = JITKernel('extern "C" __global__ void copy(const float* src, float* dst, int width) {}', "copy")
    src, dst = gp.empty(300), gp.empty(1000)
    assert kernel.element_count((src, dst, 7)) == 1000  # "width" is not a count name
    assert kernel.launch_config((src, dst, 7)) == (4, 256)
    with pytest.raises(KernelArgumentError, match="no grid given and none can be derived"):
        kernel.launch_config((0x10, 0x20, 7))
    with pytest.raises(ShapeError, match="exceed the grid limit"):
        JITKernel(SCALE, "scale").launch_config((0, 0.5, 2**31 * 256 + 1), block=1)


def test_kernels_with_declared_parameters_take_positional_arguments_only() -> None:
    params = parse_signature(SAXPY, "saxpy")
    declared = JITKernel(SAXPY, "saxpy", params=params)
    assert isinstance(declared, JITKernel)
    assert type(declared) is not JITKernel  # the lean class, without keyword handling
    with pytest.raises(TypeError, match="unexpected keyword argument 'n'"):
        declared(1.0, 0, 0, n=4)
    assert declared.launch_config((1.0, 0, 0, 600)) == (3, 256)
    assert type(JITKernel(SAXPY, "saxpy")) is JITKernel
    assert type(gp.jit(SAXPY, "saxpy")) is JITKernel


def test_the_seeds_guarded_example_runs_on_every_backend() -> None:
    """On the CPU backend is_nvrtc_available() is False (kernels cannot launch there), so the guard
    takes the fallback; with a GPU the kernel runs with arguments by name and a derived grid."""
    x = gp.from_numpy(np.arange(1000, dtype=np.float32))
    if gp.is_nvrtc_available():
        kernel = gp.jit(SCALE, func="scale")
        kernel(x, factor=0.5, n=x.size)
    else:
        assert not gp.is_cuda_available()
        x = x * 0.5
    np.testing.assert_array_equal(x.to_numpy(), np.arange(1000, dtype=np.float32) * 0.5)


def test_nvrtc_availability_means_kernels_can_launch() -> None:
    if gp.is_cuda_available():
        assert gp.is_nvrtc_available() == (gp.get_nvrtc_version() is not None)
        return
    assert gp.is_nvrtc_available() is False
    kernel = gp.jit(SCALE, "scale")  # compiles (where NVRTC is installed) but cannot launch
    with pytest.raises(DeviceError, match="needs the CUDA backend; the CPU simulation backend is in use"):
        kernel(gp.ones(4), factor=2.0, n=4)


@pytest.mark.nvrtc
def test_nvrtc_version_is_reported_on_either_backend() -> None:
    assert gp.get_nvrtc_version() is not None
    assert gp.get_nvrtc_path() is not None


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003])
def test_gpu_keywords_and_default_grid_match_float64(n: int) -> None:
    rng = np.random.default_rng(n)
    host = rng.standard_normal(n).astype(np.float32)
    kernel = gp.jit(SCALE, func="scale")
    x = gp.from_numpy(host)
    kernel(x, factor=0.5, n=x.size)  # the seeds' call: grid ceil(n / 256), block 256
    np.testing.assert_array_equal(x.to_numpy(), (host.astype(np.float64) * 0.5).astype(np.float32))
    kernel(x, 2.0, n=n, block=128)  # mixed positional and named, grid derived from the given block
    kernel(n=n, factor=2.0, x=x, grid=(n + 63) // 64, block=64)
    np.testing.assert_array_equal(x.to_numpy(), (host.astype(np.float64) * 2.0).astype(np.float32))
    y = gp.from_numpy(rng.standard_normal(n).astype(np.float32))
    saxpy = gp.jit(SAXPY, "saxpy")
    expected = 1.5 * x.to_numpy().astype(np.float64) + y.to_numpy()
    saxpy(1.5, x, y, n)  # positional, default grid from n
    np.testing.assert_allclose(y.to_numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_default_grid_from_array_sizes_and_declared_kernels() -> None:
    source = r"""
extern "C" __global__ void fill_index(float* out, long long length_without_count_name) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < length_without_count_name) out[i] = (float)i;
}"""
    out = gp.zeros(5000)
    gp.jit(source, "fill_index")(out, 5000)  # no count name: the grid covers out.size
    np.testing.assert_array_equal(out.to_numpy(), np.arange(5000, dtype=np.float32))
    declared = JITKernel(SCALE, "scale", params=parse_signature(SCALE, "scale"))
    declared(out, 2.0, 5000)  # the library's kind of kernel: positional, default grid
    np.testing.assert_array_equal(out.to_numpy(), 2.0 * np.arange(5000, dtype=np.float32))


def test_native_launcher_init_again_releases_the_previous_references() -> None:
    """Calling Launcher.__init__ a second time drops the references the first settings held (they
    leaked before: the old settings were deleted without releasing their objects)."""
    native = pytest.importorskip("pygpukit.core._native_cu13")
    from pygpukit.core.array import GPUArray
    from pygpukit.core.stream import _local, current_streams

    element = "float-" + "marker"  # a fresh object whose count only the launcher changes
    before = sys.getrefcount(element)
    launcher = native.Launcher(1, 0, 1024, 0, "pf", (element, None), GPUArray, _local, current_streams)
    assert sys.getrefcount(element) == before + 1
    for _ in range(5):
        launcher.__init__(1, 0, 1024, 0, "pf", (element, None), GPUArray, _local, current_streams)
    assert sys.getrefcount(element) == before + 1
    del launcher
    assert sys.getrefcount(element) == before
