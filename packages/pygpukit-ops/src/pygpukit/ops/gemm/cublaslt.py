"""The cuBLASLt route: one native ``GemmArgs`` per call shape, filled once and prepared (cuBLASLt's
heuristic run for it, the algorithm kept) before anything launches; a repeated call passes only the
pointers and the stream (native/runtime/gemm.cpp).

Python speaks pygpukit's codes only: dtype codes (pygpukit.core.codes.DTYPE_CODES), an activation code
and flags. The mapping to cudaDataType, compute types and epilogues lives in C++ alone. Whether cuBLASLt
has an algorithm for a problem (int8 takes only some sizes and layouts) is asked up front by
``gemm_prepare``, which runs the heuristic without launching; the dispatcher then takes the next route.
"""

from __future__ import annotations

from pygpukit.core._native import NativeGemmArgs, NativeModule
from pygpukit.core.backend import backend_state, env_flag
from pygpukit.core.codes import ACTIVATION_CODES, DTYPE_CODES
from pygpukit.core.cublaslt import is_cublaslt_available
from pygpukit.core.dtypes import DType
from pygpukit.core.stream import Stream, current_stream

__all__ = ["EPILOGUE_ACTIVATIONS", "CublasLtLaunch", "cublaslt_launch", "enabled", "supports"]

# The activations cuBLASLt's epilogues compute (its GELU is the tanh form).
EPILOGUE_ACTIVATIONS = frozenset({ACTIVATION_CODES["none"], ACTIVATION_CODES["relu"], ACTIVATION_CODES["gelu_tanh"]})
_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "int8", "float8_e4m3fn", "float8_e5m2"})


def enabled() -> bool:
    """cuBLASLt is found and not turned off with ``PYGPUKIT_NO_CUBLASLT=1`` (read when a call shape is
    planned)."""
    return not env_flag("PYGPUKIT_NO_CUBLASLT", False) and is_cublaslt_available()


def supports(dtype: DType) -> bool:
    return dtype.name in _DTYPES


class CublasLtLaunch:
    """A prepared cuBLASLt call shape: ``run`` passes the addresses (row-major terms: a @ b) and the
    stream handle to the native ``gemm`` with the args object made once."""

    __slots__ = ("args", "native")

    def __init__(self, native: NativeModule, args: NativeGemmArgs) -> None:
        self.native = native
        self.args = args

    def run(self, a_ptr: int, b_ptr: int, d_ptr: int, bias_ptr: int, stream: Stream | None,
            a_scale: int = 0, b_scale: int = 0, d_scale: int = 0) -> None:  # fmt: skip
        # Row-major D (m x n) is column-major D^T (n x m) = B^T A^T: cuBLASLt's A is our b, its B our a.
        handle = stream.handle if stream is not None else current_stream().handle
        if d_scale:
            self.native.gemm(self.args, b_ptr, a_ptr, d_ptr, bias_ptr, b_scale, a_scale, handle, d_scale)
        else:
            self.native.gemm(self.args, b_ptr, a_ptr, d_ptr, bias_ptr, b_scale, a_scale, handle)


def cublaslt_launch(
    dtypes: tuple[DType, DType, DType],
    m: int,
    n: int,
    k: int,
    count: int,
    a: tuple[bool, int, int],
    b: tuple[bool, int, int],
    pointers: tuple[int, int, int],
    *,
    bias: DType | None = None,
    activation: int = 0,
    tf32: bool = False,
    scales: bool = False,
    scale_modes: tuple[int, int] = (0, 0),
    d_scale: bool = False,
    scale_pointers: tuple[int, int] = (0, 0),
) -> CublasLtLaunch | None:
    """The launch of ``d (count, m, n) row-major = act(a @ b + bias)`` for operands described as
    (row-major?, leading dimension, batch stride) in elements, column-major otherwise, prepared with
    the alignment of ``pointers`` (a, b, d of the call being planned) and, with scales, the scale
    pointers of that call (a's, b's: cuBLASLt's heuristic wants them set). None when cuBLASLt has no
    algorithm for it."""
    native = backend_state().native
    assert native is not None  # the CUDA backend (the caller plans only there)
    a_dtype, b_dtype, d_dtype = dtypes
    a_row_major, lda, stride_a = a
    b_row_major, ldb, stride_b = b
    args = native.GemmArgs()
    # cuBLASLt computes D^T (n x m) = op(B') op(A') with B' = our a and A' = our b; op(A') must be
    # n x k, which b's memory is (column-major) exactly when b is row-major, so no transpose then.
    args.a_dtype = DTYPE_CODES[b_dtype.name]
    args.b_dtype = DTYPE_CODES[a_dtype.name]
    args.d_dtype = DTYPE_CODES[d_dtype.name]
    args.trans_a, args.trans_b = not b_row_major, not a_row_major
    args.m, args.n, args.k = n, m, k
    args.lda, args.ldb, args.ldd = ldb, lda, n
    args.batch, args.stride_a, args.stride_b, args.stride_d = count, stride_b, stride_a, m * n
    args.tf32 = tf32
    args.activation = activation
    if bias is not None:
        args.bias, args.bias_dtype = True, DTYPE_CODES[bias.name]
    args.scales = scales or scale_modes != (0, 0) or d_scale
    if scale_modes != (0, 0) or d_scale:  # cuBLASLt's A is our b, its B our a
        args.scale_mode_a, args.scale_mode_b = scale_modes[1], scale_modes[0]
        args.d_scale = d_scale
    a_ptr, b_ptr, d_ptr = pointers
    if not native.gemm_prepare(args, b_ptr, a_ptr, d_ptr, scale_pointers[1], scale_pointers[0]):
        return None
    return CublasLtLaunch(native, args)
