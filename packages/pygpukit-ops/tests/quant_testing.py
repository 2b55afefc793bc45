"""Helpers shared by the tests of the weight-only quantized types (test_quant_weight_only.py,
test_quant_int4.py, test_quant_fp8_block.py, test_quant_nvf4.py): the activation dtypes, ``linear``
against a float64 product of the weight the tensor stands for, and the checks of a kernel file's
enumerated name expressions and their NVRTC compile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from ops_testing import Array, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType

DTYPES = [gp.float32, gp.float16, gp.bfloat16]
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
ULP = {"float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.9e-3}
linear: Any = gp.ops.linear  # annotated for the other weight kinds; takes every quantized weight


def check(got: Array, x: Array, w: Array, dtype: DType, bias: Array | None = None, *, prefill: bool = False) -> None:
    """Within float32 accumulation of the dot products plus one rounding of the result; with ``prefill``
    (more than 8 rows) also half an ulp of ``dtype`` per weight: the prefill GEMM reads W dequantized to
    x's dtype (the decode GEMV keeps it in float32)."""
    xs = x.astype(np.float64)
    ref = xs @ w.T + (0.0 if bias is None else bias.astype(np.float64))
    weight_rounding = ULP[dtype.name] / 2 if prefill and dtype != gp.float32 else 0.0
    bound = (2e-5 + weight_rounding) * (np.abs(xs) @ np.abs(w).T) + ULP[dtype.name] * np.abs(ref) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= bound), float(np.max(err / bound))


def product_case(rng: np.random.Generator, weight: Any, w64: Array, dtype: DType, rows: int, *, bias: bool = False,
                 round_prefill: bool = False) -> None:  # fmt: skip
    """``linear(x, weight[, b])`` for random x (rows, K) and bias in ``dtype`` against the float64 weight
    ``w64`` (N, K). Prefill (more than 8 rows) multiplies W rounded to x's dtype: with ``round_prefill``
    the reference weight is rounded the same way (the float32 value, then ``dtype``), else the bound
    allows it (:func:`check`'s ``prefill``)."""
    n, k = weight.shape
    x = rng.standard_normal((rows, k)).astype(np.float32).astype(NP[dtype.name])
    b = rng.standard_normal(n).astype(np.float32).astype(NP[dtype.name]) if bias else None
    got = linear(upload(x), weight, None if b is None else upload(b)).to_numpy()
    assert got.shape == (rows, n)
    prefill = rows > 8 and dtype != gp.float32
    if prefill and round_prefill:
        w64 = w64.astype(np.float32).astype(NP[dtype.name]).astype(np.float64)
    check(got, x, w64, dtype, b, prefill=prefill and not round_prefill)


def gpu_gemv_cases(case: Callable[..., None], rng: np.random.Generator, scalar_k: int) -> None:
    """``case(rng, n, k, rows, dtype, bias=...)`` for every dtype and 1 .. 8 rows: K = 512 (the 16-byte
    loads) and K = ``scalar_k`` (not a multiple of the vector width: element by element)."""
    for dtype in DTYPES:
        for rows in range(1, 9):
            case(rng, 37 + 8 * rows, 512, rows, dtype, bias=rows % 2 == 0)
            case(rng, 45, scalar_k, rows, dtype)


def gpu_unaligned_and_prefill(rng: np.random.Generator, quantize: Callable[[Array], Any],
                              decode: Callable[[Any], Array], case: Callable[..., None]) -> None:  # fmt: skip
    """A (1000, 4096) weight ``quantize``d: linear of x rows not 16-byte aligned against ``decode``; then
    per dtype a prefill ``case`` and ``dequantize`` against the decoded weight rounded once."""
    q = quantize(rng.standard_normal((1000, 4096)).astype(np.float32))
    x = rng.standard_normal((4, 4097)).astype(np.float16)
    got = gp.ops.linear(upload(x)[:, 1:], q).to_numpy()  # x rows not 16-byte aligned
    check(got, x[:, 1:], decode(q), gp.float16)
    for dtype in DTYPES:
        case(rng, 300, 1024, 40, dtype, bias=True)
        np.testing.assert_array_equal(
            q.dequantize(dtype).to_numpy().astype(np.float32),
            decode(q).astype(np.float32).astype(NP[dtype.name]).astype(np.float32),
        )


def enumerated(file: str, count: int, *members: str) -> list[str]:
    """The name expressions enumerated for the kernel file ``file`` (under native/kernels): ``count`` of
    them, ``members`` among them."""
    from pygpukit.ops._kernels import name_expressions

    expressions = name_expressions(file)
    for member in members:
        assert member in expressions
    assert len(expressions) == count
    return expressions


def assert_compiles(file: str, count: int, *, only: str = "") -> None:
    """NVRTC compiles the ``count`` enumerated name expressions of ``file`` (those containing ``only``)
    for SM80 and SM90 with an empty log."""
    from pygpukit.core.compiler import compile_source

    chosen = [e for e in enumerated(file, count) if only in e]
    source = Path(__file__).resolve().parents[3] / "native" / "kernels" / file
    for arch in ("80", "90"):
        program = compile_source(source.read_text(), arch=arch, name=source.name, include_dirs=[source.parent],
                                 name_expressions=chosen)  # fmt: skip
        assert program.log.strip() == "", program.log
