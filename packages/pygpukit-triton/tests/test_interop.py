"""What runs without a GPU: the pointer protocol Triton reads, typed errors, the CPU backend's refusal,
and compile-only checks of every kernel with triton.compile for a GPUTarget (no device needed)."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gk
from pygpukit.core import dtypes
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import BackendUnavailableError, DTypeError, InvalidPointerError, ShapeError
from pygpukit.triton import TritonArray, from_gpuarray, kernels, triton_available, triton_version

CPU = backend_state().name != "cuda"
needs_cpu_backend = pytest.mark.skipif(not CPU, reason="checks the CPU backend's behaviour")
rng = np.random.default_rng(20)


def _triton() -> object:
    return pytest.importorskip("triton")


def test_version_and_availability_agree() -> None:
    version = triton_version()
    if version is None:
        assert not triton_available()
    else:
        assert version.split(".")[0].isdigit()
        assert int(version.split(".")[0]) >= 3
        assert triton_available() == (not CPU)


@pytest.mark.parametrize("dtype", list(dtypes.all_dtypes()), ids=lambda d: d.name)
def test_gpuarray_specializes_to_the_triton_pointer_type(dtype: dtypes.DType) -> None:
    """Triton's binder reads data_ptr() and str(dtype): every pygpukit dtype maps to its pointer type."""
    _triton()
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    expected = {"float64": "*fp64", "float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16",
                "float8_e4m3fn": "*fp8e4nv", "float8_e5m2": "*fp8e5", "int8": "*i8", "int16": "*i16",
                "int32": "*i32", "int64": "*i64", "uint8": "*u8", "uint16": "*u16", "uint32": "*u32",
                "uint64": "*u64", "bool": "*u1"}  # fmt: skip
    array = gk.zeros((4,), dtype)
    kind, _ = native_specialize_impl(BaseBackend, array, False, True, True)
    assert kind == expected[dtype.name]
    assert array.data_ptr() == array.device_ptr


def test_freed_array_raises_invalid_pointer_everywhere() -> None:
    a = gk.zeros((8,), gk.float32)
    a.buffer.free()
    with pytest.raises(InvalidPointerError, match="freed"):
        a.data_ptr()
    with pytest.raises(InvalidPointerError, match="freed"):
        from_gpuarray(a)
    for call in (
        lambda: kernels.rmsnorm(a, None),
        lambda: kernels.softmax(a),
        lambda: kernels.swiglu(a),
        lambda: kernels.matmul(a, a),
    ):
        with pytest.raises(InvalidPointerError, match="freed"):
            call()


def test_bad_arguments_give_typed_errors() -> None:
    with pytest.raises(DTypeError, match="ndarray"):
        from_gpuarray(np.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(DTypeError, match="int4"):
        from_gpuarray(gk.from_numpy(np.zeros(4, dtype=dtypes.int4.numpy)))
    x = gk.from_numpy(rng.standard_normal((4, 6)).astype(np.float32))
    with pytest.raises(DTypeError, match="int32"):
        kernels.rmsnorm(gk.zeros((4, 6), gk.int32), None)
    with pytest.raises(ShapeError, match="weight"):
        kernels.rmsnorm(x, gk.zeros((5,), gk.float32))
    with pytest.raises(ShapeError, match="unit stride"):
        kernels.layernorm(x.T, None)
    with pytest.raises(DTypeError, match="float8"):
        kernels.softmax(gk.zeros((4,), gk.float8_e4m3fn))
    with pytest.raises(ShapeError, match="contiguous"):
        kernels.softmax(gk.zeros((4, 6, 2), gk.float32)[:, :, :1], axis=1)
    with pytest.raises(DTypeError, match="int8"):
        kernels.matmul(gk.zeros((2, 2), gk.int8), gk.zeros((2, 2), gk.int8))
    with pytest.raises(ShapeError, match="inner"):
        kernels.matmul(x, x)
    with pytest.raises(ShapeError, match="even"):
        kernels.swiglu(gk.zeros((2, 3), gk.float32))
    with pytest.raises(DTypeError, match="up"):
        kernels.swiglu(x, gk.zeros((4, 6), gk.float16))


@needs_cpu_backend
def test_cpu_backend_refuses_with_a_typed_error() -> None:
    x = gk.from_numpy(rng.standard_normal((3, 5)).astype(np.float32))
    with pytest.raises(BackendUnavailableError, match="CUDA backend"):
        from_gpuarray(x)
    with pytest.raises(BackendUnavailableError, match="CUDA backend"):
        TritonArray(x)
    for call in (
        lambda: kernels.rmsnorm(x, None),
        lambda: kernels.layernorm(x, None),
        lambda: kernels.softmax(x),
        lambda: kernels.swiglu(x[:, :4]),
        lambda: kernels.matmul(x, x.T),
    ):
        with pytest.raises(BackendUnavailableError, match="CPU simulation"):
            call()


# -- compile-only: the kernels build for real targets without a device ----------------------------------


def _compile(fn: object, signature: dict[str, str], constexprs: dict[str, object], arch: int) -> bytes:
    triton = _triton()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),  # type: ignore[attr-defined]
                              target=GPUTarget("cuda", arch, 32))  # fmt: skip
    cubin: bytes = compiled.asm["cubin"]
    assert len(cubin) > 0
    return cubin


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_every_kernel_compiles_for_the_target(arch: int, dtype: str) -> None:
    _triton()
    import triton.language as tl

    from pygpukit.triton import _triton_kernels as k

    def sig(names: str, kind: str) -> dict[str, str]:
        return dict.fromkeys(names.split(), kind)

    ptr = f"*{dtype}"
    _compile(
        k.rmsnorm_kernel,
        {
            **sig("x_ptr w_ptr out_ptr", ptr),
            **sig("x_stride out_stride n", "i32"),
            "eps": "fp32",
            **sig("HAS_WEIGHT BLOCK", "constexpr"),
        },
        {"HAS_WEIGHT": True, "BLOCK": 2048},
        arch,
    )
    _compile(
        k.layernorm_kernel,
        {
            **sig("x_ptr w_ptr b_ptr out_ptr", ptr),
            **sig("x_stride out_stride n", "i32"),
            "eps": "fp32",
            **sig("HAS_WEIGHT HAS_BIAS BLOCK", "constexpr"),
        },
        {"HAS_WEIGHT": True, "HAS_BIAS": True, "BLOCK": 256},
        arch,
    )
    _compile(
        k.softmax_kernel,
        {**sig("x_ptr out_ptr", ptr), **sig("n inner x_stride out_stride", "i32"), **sig("ACC BLOCK", "constexpr")},
        {"ACC": tl.float32, "BLOCK": 1024},
        arch,
    )
    _compile(
        k.rope_kernel,
        {
            "x_ptr": ptr,
            **sig("cos_ptr sin_ptr", "*fp32"),
            "pos_ptr": "*i32",
            **sig("sb ss sh pb ps seq heads half max_positions offset", "i32"),
            **sig("NEOX BLOCK", "constexpr"),
        },
        {"NEOX": dtype != "bf16", "BLOCK": 64},
        arch,
    )
    _compile(
        k.swiglu_kernel,
        {
            **sig("gate_ptr up_ptr out_ptr", ptr),
            **sig("gate_stride up_stride out_stride n", "i32"),
            "BLOCK": "constexpr",
        },
        {"BLOCK": 1024},
        arch,
    )
    constexprs = {"PRECISION": "ieee" if dtype == "fp32" else "tf32", "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
                  "GROUP_M": 8}  # fmt: skip
    _compile(
        k.matmul_kernel,
        {
            **sig("a_ptr b_ptr c_ptr", ptr),
            **sig("m n k sab sam sak sbb sbk sbn scb scm scn", "i32"),
            **sig("PRECISION BLOCK_M BLOCK_N BLOCK_K GROUP_M", "constexpr"),
        },
        constexprs,
        arch,
    )


def test_float64_softmax_compiles() -> None:
    _triton()
    import triton.language as tl

    from pygpukit.triton import _triton_kernels as k

    sig = {"x_ptr": "*fp64", "out_ptr": "*fp64", "n": "i32", "inner": "i32", "x_stride": "i32", "out_stride": "i32",
           "ACC": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    _compile(k.softmax_kernel, sig, {"ACC": tl.float64, "BLOCK": 512}, 90)


@pytest.mark.parametrize("alignment", [1, 16, 128, 1024])
def test_scratch_allocator_gives_aligned_memory_of_the_size(alignment: int) -> None:
    from pygpukit.triton import scratch_allocator

    buffer = scratch_allocator(1000, alignment, None)
    assert buffer.shape == (1000,)
    assert buffer.dtype == gk.uint8
    assert buffer.data_ptr() % alignment == 0
