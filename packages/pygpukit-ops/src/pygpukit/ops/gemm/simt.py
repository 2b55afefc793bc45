"""The CUDA-core GEMM (native/kernels/gemm/gemm_simt.cu): any element strides, batches walked by one
stride per operand, bias and activation, accumulating in double (float64), int (int8) or float. The
last route of the dispatch table: it takes every dtype and layout the other routes do not."""

from __future__ import annotations

from pygpukit.core.abi import KernelStruct
from pygpukit.core.dtypes import DType
from pygpukit.core.jit import JITKernel, Param
from pygpukit.core.stream import Stream

from .. import _kernels

__all__ = ["GEMM_SHAPE", "SimtLaunch", "name_expressions", "simt_launch"]

_FILE = "gemm/gemm_simt.cu"
_TILE = 64

# gemm_simt.cu's GemmShape, declared once here; the kernel compile check asserts that the C++ struct
# has this size and these offsets.
GEMM_SHAPE = KernelStruct(
    "pygpukit::ops::gemm::GemmShape",
    _FILE,
    [("m", "long long"), ("n", "long long"), ("k", "long long"),
     ("sa_m", "long long"), ("sa_k", "long long"), ("sa_batch", "long long"),
     ("sb_k", "long long"), ("sb_n", "long long"), ("sb_batch", "long long"),
     ("sd_batch", "long long"), ("activation", "int"), ("has_bias", "int"), ("alpha", "double")],
)  # fmt: skip

_PAIRS = (("float64", "float64"), ("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16"),
          ("int8", "int32"))  # fmt: skip
_CTYPE = {"float64": "double", "float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16",
          "int8": "signed char", "int32": "int"}  # fmt: skip
_ACC = {"float64": "double", "int8": "int"}  # everything else accumulates in float
_POINTER = Param("p", "void*", "pointer", "Q")
_PARAMS = [_POINTER, _POINTER, _POINTER, _POINTER, GEMM_SHAPE.param("shape")]


def _expression(in_dtype: str, out_dtype: str) -> str:
    acc = _ACC.get(in_dtype, "float")
    return f"pygpukit::ops::gemm::gemm_simt<{_CTYPE[in_dtype]}, {_CTYPE[out_dtype]}, {acc}>"


def name_expressions() -> list[str]:
    """Every instantiation gemm_simt.cu is used with (for the compile checks and precompile)."""
    return [_expression(i, o) for i, o in _PAIRS]


def supports(in_dtype: DType, out_dtype: DType) -> bool:
    return (in_dtype.name, out_dtype.name) in _PAIRS


def _kernel(in_dtype: str, out_dtype: str) -> JITKernel:
    return _kernels.group(_FILE, name_expressions()).kernel(_expression(in_dtype, out_dtype), _PARAMS)


_kernels.register_enumerator(lambda: {_FILE: name_expressions()})


class SimtLaunch:
    """One call shape on gemm_simt: the packed GemmShape and the grid; ``run`` takes the addresses."""

    __slots__ = ("grid", "kernel", "shape")

    def __init__(self, kernel: JITKernel, shape: bytes, grid: tuple[int, int, int]) -> None:
        self.kernel = kernel
        self.shape = shape
        self.grid = grid

    def run(self, a_ptr: int, b_ptr: int, d_ptr: int, bias_ptr: int, stream: Stream | None) -> None:
        # Raw addresses: the kernel reads A and B through their strides, so views need no copy.
        self.kernel(a_ptr, b_ptr, d_ptr, bias_ptr, self.shape, grid=self.grid, block=256, stream=stream)


def simt_launch(dtype: DType, out_dtype: DType, count: int, m: int, n: int, k: int, a_strides: tuple[int, int],
                b_strides: tuple[int, int], batch_strides: tuple[int, int], has_bias: bool, code: int,
                alpha: float = 1.0) -> SimtLaunch:  # fmt: skip
    """d (count, m, n) row-major = act(alpha * a @ b + bias) for a (.., m, k) and b (.., k, n) with
    the element strides ``a_strides`` / ``b_strides`` in their last two dims and one element stride
    per batch entry each (``batch_strides``)."""
    shape = GEMM_SHAPE.pack_flat(m, n, k, a_strides[0], a_strides[1], batch_strides[0], b_strides[0], b_strides[1],
                                 batch_strides[1], m * n, code, int(has_bias), float(alpha))  # fmt: skip
    grid = (-(-n // _TILE), -(-m // _TILE), max(count, 1))
    return SimtLaunch(_kernel(dtype.name, out_dtype.name), shape, grid)
