"""matmul, linear and scaled_matmul against float64 NumPy references (CPU backend in CI, the GPU with
-m gpu: every route of the dispatch table). Error bounds are relative Frobenius norms per dtype."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import backend_state
from pygpukit.core.cublaslt import is_cublaslt_available
from pygpukit.core.errors import CublasLtError, DTypeError, PyGPUkitError, ShapeError
from pygpukit.core.plans import clear_plan_caches
from pygpukit.ops.gemm import api as mm
from pygpukit.ops.gemm import dispatch
from pygpukit.ops.gemm._base import PLANS, swap_last

# ||result - float64 reference||_F / ||reference||_F bounds, from the output rounding (fp16 2^-11,
# bf16 2^-8) and fp32 accumulation over K <= 4096.
TOLERANCE = {"float64": 1e-12, "float32": 2e-6, "tf32": 5e-3, "float16": 2e-3, "bfloat16": 1e-2, "int8": 0.0}
NP_DTYPES: dict[str, Any] = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
                             "bfloat16": ml_dtypes.bfloat16, "int8": np.int8}  # fmt: skip


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    if dtype == "int8":
        return rng.integers(-8, 8, size=shape).astype(np.int8)
    return rng.standard_normal(shape).astype(NP_DTYPES[dtype])


def _reference(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    wide = np.int64 if a.dtype == np.int8 else np.float64
    result: np.ndarray[Any, Any] = np.matmul(a.astype(wide), b.astype(wide))
    return result


def _relative_error(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any]) -> float:
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    denominator = float(np.linalg.norm(ref64)) or 1.0
    return float(np.linalg.norm(got64 - ref64)) / denominator


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _activation(x: np.ndarray[Any, Any], name: str | None) -> np.ndarray[Any, Any]:
    """float64 references: "gelu" is the exact erf form, "gelu_tanh" the tanh approximation."""
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    return x


@pytest.fixture(autouse=True)
def _fresh_plans() -> Any:
    # Environment switches (PYGPUKIT_NO_CUBLASLT, ...) are read when a call shape is planned.
    clear_plan_caches()
    yield
    clear_plan_caches()


def _poisoned(shape: tuple[int, ...], dtype: Any) -> gp.GPUArray:
    """An output filled with garbage, so a kernel that skips elements cannot pass."""
    out = gp.empty(shape, dtype)
    if out.dtype.is_floating:
        out.copy_(np.full(shape, np.nan, dtype=out.dtype.numpy))
    else:
        out.copy_(np.full(shape, 77, dtype=out.dtype.numpy))
    return out


def _check(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], dtype: str, **kwargs: Any) -> None:
    ga, gb = gp.from_numpy(a), gp.from_numpy(b)
    result = mm.matmul(ga, gb, **kwargs).to_numpy()
    ref = _reference(a, b)
    assert result.shape == ref.shape
    key = "tf32" if kwargs.get("use_tf32") else dtype
    if dtype == "int8":
        assert result.dtype == np.int32
        np.testing.assert_array_equal(result, ref)
    else:
        assert _relative_error(result, ref) <= TOLERANCE[key], (dtype, a.shape, b.shape)


# -- semantics (every backend) -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize(
    ("sa", "sb"),
    [
        ((3, 5), (5, 7)),
        ((1, 1), (1, 1)),
        ((33, 64), (64, 17)),
        ((5,), (5, 4)),
        ((4, 5), (5,)),
        ((6,), (6,)),
        ((2, 3, 4), (4, 5)),
        ((3, 1, 4, 8), (2, 8, 3)),
    ],
)
def test_matmul_shapes_dtypes_and_broadcasting(dtype: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(sa) * 100 + sum(sa) + sum(sb))
    _check(_random(rng, sa, dtype), _random(rng, sb, dtype), dtype)


def test_matmul_of_transposed_and_strided_views() -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 30)).astype(np.float32)
    b = rng.standard_normal((50, 40)).astype(np.float32)
    ga, gb = gp.from_numpy(a), gp.from_numpy(b)
    got = mm.matmul(ga.T, gb.T).to_numpy()  # (30, 40) @ (40, 50)
    assert _relative_error(got, a.T.astype(np.float64) @ b.T.astype(np.float64)) <= TOLERANCE["float32"]
    got = mm.matmul(ga[::2, 1:], gb[1:30, ::3]).to_numpy()  # strided in both dimensions: copied
    ref = a[::2, 1:].astype(np.float64) @ b[1:30, ::3].astype(np.float64)
    assert _relative_error(got, ref) <= TOLERANCE["float32"]


def test_matmul_out_and_empty_dimensions() -> None:
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    out = _poisoned((4, 3), gp.float32)
    result = mm.matmul(gp.from_numpy(a), gp.from_numpy(b), out=out)
    assert result.buffer is out.buffer
    assert _relative_error(out.to_numpy(), a.astype(np.float64) @ b) <= TOLERANCE["float32"]
    zero_k = mm.matmul(gp.ones((3, 0)), gp.ones((0, 2))).to_numpy()
    np.testing.assert_array_equal(zero_k, np.zeros((3, 2), np.float32))
    assert mm.matmul(gp.ones((0, 4)), gp.ones((4, 2))).shape == (0, 2)


def test_matmul_bad_input_raises_typed_errors_naming_shapes_and_dtypes() -> None:
    a, b = gp.ones((3, 4)), gp.ones((5, 6))
    with pytest.raises(ShapeError, match=r"\(3, 4\) and \(5, 6\) do not align"):
        mm.matmul(a, b)
    with pytest.raises(ShapeError, match="do not broadcast"):
        mm.matmul(gp.ones((2, 3, 4)), gp.ones((3, 4, 5)))
    with pytest.raises(DTypeError, match="float32 and float64"):
        mm.matmul(gp.ones((3, 4)), gp.ones((4, 2), gp.float64))
    with pytest.raises(DTypeError, match="needs scales"):
        mm.matmul(gp.ones((16, 16), gp.float8_e4m3fn), gp.ones((16, 16), gp.float8_e4m3fn))
    with pytest.raises(DTypeError, match="supports"):
        mm.matmul(gp.ones((2, 2), gp.int32), gp.ones((2, 2), gp.int32))
    with pytest.raises(ShapeError, match="out must have shape"):
        mm.matmul(gp.ones((3, 4)), gp.ones((4, 2)), out=gp.empty((2, 3)))
    with pytest.raises(ShapeError, match="scalar"):
        mm.matmul(gp.ones(()), gp.ones((2, 2)))
    assert a.shape == (3, 4)
    assert b.shape == (5, 6)


def test_tf32_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYGPUKIT_NO_TF32", raising=False)
    monkeypatch.delenv("PYGPUKIT_ALLOW_TF32", raising=False)
    monkeypatch.setattr(mm, "_tf32", None)
    assert mm.get_tf32() is False
    monkeypatch.setenv("PYGPUKIT_ALLOW_TF32", "1")
    assert mm.get_tf32() is True
    mm.set_tf32(False)
    assert not mm.get_tf32()
    mm.set_tf32(True)
    assert mm.get_tf32()
    # PYGPUKIT_NO_TF32=1 forbids TF32 whatever set_tf32, PYGPUKIT_ALLOW_TF32 or use_tf32 say.
    monkeypatch.setenv("PYGPUKIT_NO_TF32", "1")
    assert mm.get_tf32() is False
    assert mm._tf32_for(True) is False
    monkeypatch.setenv("PYGPUKIT_NO_TF32", "0")
    assert mm._tf32_for(True) is True


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_with_fused_bias_and_activation(dtype: str, activation: str | None) -> None:
    rng = np.random.default_rng(17)
    x = _random(rng, (2, 9, 64), dtype)
    w = _random(rng, (48, 64), dtype)
    bias = _random(rng, (48,), dtype)
    got = mm.linear(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(bias), activation).to_numpy()
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    ref = _activation(ref, activation)
    assert got.shape == (2, 9, 48)
    assert _relative_error(got, ref) <= 2 * TOLERANCE[dtype]
    assert _relative_error(mm.linear(gp.from_numpy(x), gp.from_numpy(w)).to_numpy(),
                           x.astype(np.float64) @ w.astype(np.float64).T) <= 2 * TOLERANCE[dtype]  # fmt: skip


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_linear_into_out(activation: str | None) -> None:
    """``out=`` receives the result (poisoned first), is returned, and a second call with the same shapes (the
    cached plan) writes fresh inputs' result into it too; a wrong out raises and leaves it as it was."""
    rng = np.random.default_rng()
    w, bias = _random(rng, (24, 40), "float32"), _random(rng, (24,), "float32")
    gw, gb = gp.from_numpy(w), gp.from_numpy(bias)
    out = gp.from_numpy(np.full((3, 5, 24), np.nan, np.float32))
    for _ in range(2):
        x = _random(rng, (3, 5, 40), "float32")
        got = mm.linear(gp.from_numpy(x), gw, gb, activation, out=out)
        assert got is out
        ref = _activation(x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64), activation)
        assert _relative_error(out.to_numpy(), ref) <= 2 * TOLERANCE["float32"]
    before = out.to_numpy()
    with pytest.raises(ShapeError, match=r"out must have shape \(3, 5, 24\)"):
        mm.linear(gp.from_numpy(x), gw, gb, activation, out=gp.zeros((3, 24)))
    with pytest.raises(DTypeError, match="out must have dtype float32"):
        mm.linear(gp.from_numpy(x), gw, gb, activation, out=gp.zeros((3, 5, 24), gp.float16))
    with pytest.raises(ShapeError, match="contiguous"):
        mm.linear(gp.from_numpy(x), gw, gb, activation, out=gp.zeros((3, 5, 48))[..., ::2])
    np.testing.assert_array_equal(out.to_numpy(), before)


def test_gelu_is_the_erf_form_and_gelu_tanh_the_approximation() -> None:
    # Inputs where the two forms differ by far more than float32 rounding (about 1e-3 near |x| = 2).
    x = np.array([[2.0, -2.0, 1.5, -1.0]], np.float32)
    w = np.eye(4, dtype=np.float32)
    gx, gw = gp.from_numpy(x), gp.from_numpy(w)
    exact = _activation(x.astype(np.float64), "gelu")
    approx = _activation(x.astype(np.float64), "gelu_tanh")
    assert np.abs(exact - approx).max() > 1e-4
    for got in (mm.linear(gx, gw, None, "gelu"), mm.linear_bias_gelu(gx, gw, gp.zeros(4))):
        np.testing.assert_allclose(got.to_numpy(), exact, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(mm.linear(gx, gw, None, "gelu_tanh").to_numpy(), approx, rtol=2e-6, atol=1e-7)


def test_linear_bad_input() -> None:
    x, w = gp.ones((4, 8)), gp.ones((5, 8))
    with pytest.raises(ShapeError, match="x has 7 features, w expects 8"):
        mm.linear(gp.ones((4, 7)), w)
    with pytest.raises(ShapeError, match=r"b must have shape \(5,\)"):
        mm.linear(x, w, gp.ones(4))
    with pytest.raises(ValueError, match="activation"):
        mm.linear(x, w, None, "swish")
    with pytest.raises(ShapeError, match="contiguous"):
        mm.linear(x, w, gp.ones(10)[::2])


def test_cublaslt_error_carries_the_status_and_operation() -> None:
    status = "CUBLAS_STATUS_NOT_SUPPORTED"
    error = CublasLtError(f"cuBLASLt cublasLtMatmul failed with {status}", status=status, operation="cublasLtMatmul")
    assert isinstance(error, PyGPUkitError)
    assert (error.status, error.operation) == ("CUBLAS_STATUS_NOT_SUPPORTED", "cublasLtMatmul")


# -- the dispatch table's operand descriptions (no GPU needed) -----------------------------------------
def test_describe_takes_views_without_copies_and_copies_what_no_stride_walks() -> None:
    a = gp.zeros((4, 6, 8), gp.float16)
    row = dispatch.describe(a, (4,), 6, 8)
    assert (row.row_major, row.ld, row.batch_stride, row.copy) == (True, 8, 48, None)
    col = dispatch.describe(swap_last(a), (4,), 8, 6)  # a transposed view: column-major, no copy
    assert (col.row_major, col.ld, col.batch_stride, col.copy) == (False, 8, 48, None)
    wide = gp.zeros((6, 20), gp.float16)[:, :8]  # rows 20 apart
    assert (dispatch.describe(wide, (), 6, 8).ld, dispatch.describe(wide, (), 6, 8).copy) == (20, None)
    broadcast = dispatch.describe(gp.zeros((6, 8), gp.float16), (3,), 6, 8)  # one matrix for every batch entry
    assert (broadcast.batch_stride, broadcast.copy) == (0, None)
    # Strided in both dimensions: copied for the layout routes, walked as it is by the SIMT kernel.
    both = gp.zeros((12, 16), gp.float32)[::2, ::2]
    copied = dispatch.describe(both, (), 6, 8)
    assert copied.copy is not None
    assert (copied.row_major, copied.ld) == (True, 8)
    strided = dispatch.describe(both, (), 6, 8, "strided")
    assert strided.copy is None
    assert strided.strides == (32, 2)
    # A partial broadcast (batch (2, 3) of an operand (2, 1, ...)) has no single batch stride: copied.
    partial = dispatch.describe(gp.zeros((2, 1, 6, 8), gp.float16), (2, 3), 6, 8, "strided")
    assert partial.copy is not None
    assert partial.batch_stride == 48
    # cuBLASLt's int8 form: a row-major with ld = K, b column-major with ld = K; anything else is copied.
    b = gp.zeros((8, 5), gp.int8)
    need_col = dispatch.describe(b, (), 8, 5, "col")
    assert need_col.copy is not None
    assert (need_col.row_major, need_col.ld) == (False, 8)
    copy = need_col.copy(b, None)
    assert copy.shape == (8, 5)
    assert copy.strides == (1, 8)
    assert dispatch.describe(swap_last(gp.zeros((5, 8), gp.int8)), (), 8, 5, "col").copy is None
    assert dispatch.describe(gp.zeros((6, 20), gp.int8)[:, :8], (), 6, 8, "row").copy is not None


def test_materialized_copies_hold_the_operand_values() -> None:
    rng = np.random.default_rng(3)
    host = rng.standard_normal((2, 1, 5, 7)).astype(np.float32)
    operand = dispatch.describe(gp.from_numpy(host)[..., ::1, :], (2, 3), 5, 7)
    assert operand.copy is not None
    copied = operand.copy(gp.from_numpy(host), None)
    np.testing.assert_array_equal(copied.to_numpy(), np.broadcast_to(host, (2, 3, 5, 7)))


def test_scaled_matmul_fp8_semantics() -> None:
    rng = np.random.default_rng(23)
    a = rng.standard_normal((32, 64)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.standard_normal((48, 64)).astype(ml_dtypes.float8_e4m3fn)  # (N, K): pass w.T
    sa, sb = gp.from_numpy(np.array([0.5], np.float32)), gp.from_numpy(np.array([2.0], np.float32))
    state = backend_state()
    if state.name == "cuda":
        from pygpukit.core.device import get_device, get_device_info

        if tuple(get_device_info(get_device()).compute_capability) < (8, 9):
            pytest.skip("fp8 needs compute capability 8.9")
    got = mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, sa, sb).to_numpy()
    ref = a.astype(np.float64) @ w.astype(np.float64).T  # scales 0.5 * 2.0 = 1
    assert got.dtype == ml_dtypes.bfloat16
    assert _relative_error(got, ref) <= TOLERANCE["bfloat16"]
    with pytest.raises(ShapeError, match="column-major"):
        mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w.T.copy()), sa, sb)
    with pytest.raises(ShapeError, match="fit none of the kinds"):
        mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, gp.ones(2), sb)
    with pytest.raises(DTypeError, match="must be a float32 GPUArray"):
        mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, gp.ones(1, "float16"), sb)
    with pytest.raises(DTypeError, match="must be float8"):
        mm.scaled_matmul(gp.ones((32, 64)), gp.from_numpy(w).T, sa, sb)


# -- GPU: larger problems, every path -----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (7, 3, 1023), (127, 255, 64), (1000, 1024, 4096),
                                           (4097, 33, 512), (64, 96, 130)])  # fmt: skip
@pytest.mark.parametrize("path", ["cublaslt", "builtin"])
def test_gpu_matmul_against_float64(dtype: str, m: int, n: int, k: int, path: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if path == "builtin":
        monkeypatch.setenv("PYGPUKIT_NO_CUBLASLT", "1")
    elif not is_cublaslt_available():
        pytest.skip("cuBLASLt not found")
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a, b = _random(rng, (m, k), dtype), _random(rng, (k, n), dtype)
    out = _poisoned((m, n), gp.int32 if dtype == "int8" else getattr(gp, dtype))
    mm.matmul(gp.from_numpy(a), gp.from_numpy(b), out=out)
    ref = _reference(a, b)
    if dtype == "int8":
        np.testing.assert_array_equal(out.to_numpy(), ref)
    else:
        assert _relative_error(out.to_numpy(), ref) <= TOLERANCE[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_gpu_transposed_operands(layout: str) -> None:
    rng = np.random.default_rng(31)
    m, n, k = 300, 200, 136
    a = rng.standard_normal((k, m) if layout[0] == "t" else (m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, k) if layout[1] == "t" else (k, n)).astype(ml_dtypes.bfloat16)
    ga, gb = gp.from_numpy(a), gp.from_numpy(b)
    ga, a = (ga.T, a.T) if layout[0] == "t" else (ga, a)
    gb, b = (gb.T, b.T) if layout[1] == "t" else (gb, b)
    assert _relative_error(mm.matmul(ga, gb).to_numpy(), _reference(a, b)) <= TOLERANCE["bfloat16"]


@pytest.mark.gpu
def test_gpu_tf32_is_used_only_when_asked() -> None:
    rng = np.random.default_rng(41)
    a, b = rng.standard_normal((512, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
    ref = _reference(a, b)
    exact = mm.matmul(gp.from_numpy(a), gp.from_numpy(b)).to_numpy()
    fast = mm.matmul(gp.from_numpy(a), gp.from_numpy(b), use_tf32=True).to_numpy()
    assert _relative_error(exact, ref) <= TOLERANCE["float32"]
    assert TOLERANCE["float32"] < _relative_error(fast, ref) <= TOLERANCE["tf32"]  # TF32 rounds inputs


@pytest.mark.gpu
def test_gpu_batched_broadcast_and_plan_cache() -> None:
    rng = np.random.default_rng(43)
    a = rng.standard_normal((4, 1, 64, 32)).astype(np.float16)
    b = rng.standard_normal((3, 32, 48)).astype(np.float16)
    got = mm.matmul(gp.from_numpy(a), gp.from_numpy(b)).to_numpy()
    assert got.shape == (4, 3, 64, 48)
    assert _relative_error(got, _reference(a, b)) <= TOLERANCE["float16"]
    native = backend_state().native
    plans = native.gemm_plan_count()  # type: ignore[union-attr]
    mm.matmul(gp.from_numpy(a), gp.from_numpy(b))
    assert native.gemm_plan_count() == plans  # type: ignore[union-attr]


@pytest.mark.gpu
def test_gpu_matmul_replays_in_a_graph_bitwise() -> None:
    rng = np.random.default_rng(47)
    a = gp.from_numpy(rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16))
    b = gp.from_numpy(rng.standard_normal((128, 64)).astype(ml_dtypes.bfloat16))
    out = gp.empty((256, 64), gp.bfloat16)
    with gp.Stream() as stream:
        mm.matmul(a, b, out=out)  # warm: plan and workspace exist before capture
        eager = out.to_numpy()
        graph = gp.CudaGraph()
        with graph.capture(stream):
            mm.matmul(a, b, out=out, stream=stream)
        out.copy_(np.zeros((256, 64), ml_dtypes.bfloat16))
        graph.replay(stream)
        stream.synchronize()
    assert out.to_numpy().tobytes() == eager.tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_small_m_repeats_follow_their_operands(dtype: str) -> None:
    # matmul and linear keep the GEMV plan of a small-M call shape (the plan cache). A repeated call
    # must give the first call's bits, read new addresses (x one element into its buffer has the same
    # shape and strides but is not 16-byte aligned) and use out= when given.
    rng = np.random.default_rng(53)
    k, n = 515, 300
    buffer = _random(rng, (3, k + 1), dtype)
    gbuffer = gp.from_numpy(buffer)
    w = _random(rng, (k, n), dtype)
    gw = gp.from_numpy(w)
    gwt = gp.from_numpy(np.ascontiguousarray(w.T))  # (N, K): the linear-layer weight
    bias = _random(rng, (n,), dtype)
    gbias = gp.from_numpy(bias)
    calls = {
        "a @ w": (lambda x: mm.matmul(x, gw), lambda x: _reference(x, w)),
        "a @ w_nk.T": (lambda x: mm.matmul(x, gwt.T), lambda x: _reference(x, w)),
        "linear + relu": (lambda x: mm.linear(x, gwt, gbias, "relu"),
                          lambda x: np.maximum(_reference(x, w) + bias.astype(np.float64), 0.0)),
    }  # fmt: skip
    flat = buffer.reshape(-1)
    gflat = gp.from_numpy(flat)
    xs = [
        (buffer[:, :k], gbuffer[:, :k]),  # rows k + 1 apart
        (buffer[:1, 1:], gbuffer[:1, 1:]),
        (np.ascontiguousarray(buffer[:, :k]), gp.from_numpy(np.ascontiguousarray(buffer[:, :k]))),
        (flat[1 : 1 + 3 * k].reshape(3, k), gflat[1 : 1 + 3 * k].reshape(3, k)),  # contiguous, unaligned
        (np.ascontiguousarray(buffer[:, :k]), gp.from_numpy(np.ascontiguousarray(buffer[:, :k]))),
    ]
    for name, (call, reference) in calls.items():
        for x_host, x in xs:
            first = call(x).to_numpy()
            again = call(x).to_numpy()
            assert first.tobytes() == again.tobytes(), name
            assert _relative_error(again, reference(x_host)) <= TOLERANCE[dtype], (name, x.shape, x.strides)
        vector = call(gbuffer[0, :k]).to_numpy()  # 1-D x: a 1-D result
        assert vector.shape == (n,)
        assert _relative_error(call(gbuffer[0, :k]).to_numpy(), reference(buffer[:1, :k])[0]) <= TOLERANCE[dtype]
    out = _poisoned((3, n), getattr(gp, dtype))
    for _ in range(2):
        assert mm.matmul(gbuffer[:, :k], gw, out=out) is out
        assert _relative_error(out.to_numpy(), _reference(buffer[:, :k], w)) <= TOLERANCE[dtype]
        out.copy_(np.full((3, n), np.nan, dtype=out.dtype.numpy))


# -- GPU: the dispatch table ----------------------------------------------------------------------------
def _routes(op: str = "matmul") -> list[str]:
    return [plan.route for key, plan in PLANS._plans.items() if key[0] == op]


@pytest.mark.gpu
def test_gpu_routes_are_decided_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.ops.gemm._base import device_props

    rng = np.random.default_rng(59)
    a_host = _random(rng, (1024, 1024), "bfloat16")
    b_host = _random(rng, (1024, 1024), "bfloat16")
    a, b = gp.from_numpy(a_host), gp.from_numpy(b_host)
    ref = _reference(a_host, b_host)
    native = backend_state().native
    if is_cublaslt_available():
        first = mm.matmul(a, b).to_numpy()
        assert _routes() == ["cublaslt"]
        native_plans = native.gemm_plan_count()  # type: ignore[union-attr]
        again = mm.matmul(a, b).to_numpy()  # one plan lookup, one native call with the prepared args
        assert len(PLANS) == 1
        assert native.gemm_plan_count() == native_plans
        assert first.tobytes() == again.tobytes()
        assert _relative_error(again, ref) <= TOLERANCE["bfloat16"]
    clear_plan_caches()
    mm.matmul(a[:3], b)  # small M: the GEMV, whatever else is available
    assert _routes() == ["gemv"]
    clear_plan_caches()
    monkeypatch.setenv("PYGPUKIT_NO_CUBLASLT", "1")
    got = mm.matmul(a, b).to_numpy()
    assert _routes() == ["wgmma" if device_props(gp.get_device()).wgmma else "mma"]
    assert _relative_error(got, ref) <= TOLERANCE["bfloat16"]
    clear_plan_caches()
    wide = mm.matmul(
        gp.from_numpy(a_host[:64, :96].astype(np.float64)), gp.from_numpy(b_host[:96, :80].astype(np.float64))
    )
    assert _routes() == ["simt"]
    assert _relative_error(wide.to_numpy(), _reference(a_host[:64, :96], b_host[:96, :80])) <= TOLERANCE["float64"]


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(7, 3, 1023), (5, 9, 13), (127, 255, 64), (33, 17, 4), (300, 200, 100)])
def test_gpu_int8_takes_cublaslt_only_where_it_has_an_algorithm(m: int, n: int, k: int) -> None:
    # Whether cuBLASLt has an int8 algorithm is asked before anything runs; where it has none the
    # CUDA-core kernel is planned instead. Either way the result is exact, repeats included, and an
    # operand whose address is not 16-byte aligned (a row further into its buffer) too.
    rng = np.random.default_rng(m + n + k)
    a = _random(rng, (m + 1, k), "int8")
    b = _random(rng, (k, n), "int8")
    ga, gb = gp.from_numpy(a), gp.from_numpy(b)
    for start in (0, 1, 0):
        got = mm.matmul(ga[start : start + m], gb).to_numpy()
        np.testing.assert_array_equal(got, _reference(a[start : start + m], b))
    assert set(_routes()) <= {"cublaslt", "simt"}
    assert _routes()


@pytest.mark.gpu
def test_gpu_cublaslt_failures_raise_cublaslt_error() -> None:
    from pygpukit.core.codes import DTYPE_CODES

    if not is_cublaslt_available():
        pytest.skip("cuBLASLt not found")
    native = backend_state().native
    args = native.GemmArgs()  # type: ignore[union-attr]
    args.a_dtype = args.b_dtype = DTYPE_CODES["int8"]
    args.d_dtype = DTYPE_CODES["int32"]
    # int8 with 1-byte aligned pointers, non-"TN" layouts or leading dimensions that are not multiples
    # of 4: cuBLASLt's heuristic finds nothing for at least one of them.
    candidates = [(7, 3, 1023, False, False, 7, 1023), (5, 9, 13, True, False, 13, 13), (33, 17, 5, True, True, 5, 17)]
    for m, n, k, trans_a, trans_b, lda, ldb in candidates:
        args.m, args.n, args.k, args.trans_a, args.trans_b, args.lda, args.ldb, args.ldd = (
            m,
            n,
            k,
            trans_a,
            trans_b,
            lda,
            ldb,
            m,
        )
        if not native.gemm_prepare(args, 1, 1, 1):  # type: ignore[union-attr]
            break
    else:
        pytest.skip("cuBLASLt has an int8 algorithm for every candidate")
    assert not args.prepared
    with pytest.raises(CublasLtError) as raised:
        native.gemm(args, 1, 1, 1, 0, 0, 0, 0)  # type: ignore[union-attr]
    assert raised.value.status == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert raised.value.operation == "cublasLtMatmulAlgoGetHeuristic"
    args.activation = 4  # exact GELU: no cuBLASLt epilogue; refused before cuBLASLt is asked
    with pytest.raises(PyGPUkitError, match="no epilogue"):
        native.gemm_prepare(args, 0, 0, 0)  # type: ignore[union-attr]


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu"])
@pytest.mark.parametrize("path", ["cublaslt", "builtin"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_linear_activations_on_every_route(activation: str, path: str, dtype: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # "gelu" is the erf form on every route: the built-in epilogues compute it, after cuBLASLt (whose
    # GELU epilogue is the tanh form) one fused device kernel does. Rows 1 (GEMV) and 300 (GEMM).
    if path == "builtin":
        monkeypatch.setenv("PYGPUKIT_NO_CUBLASLT", "1")
    elif not is_cublaslt_available():
        pytest.skip("cuBLASLt not found")
    rng = np.random.default_rng(61)
    w = _random(rng, (200, 136), dtype)
    bias = _random(rng, (200,), dtype)
    for rows in (1, 300):
        x = 2.0 * _random(rng, (rows, 136), dtype).astype(np.float32)
        x = x.astype(NP_DTYPES[dtype])
        with gp.Stream() as stream:
            got = mm.linear(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(bias), activation, stream=stream)
            stream.synchronize()
        ref = _activation(x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64), activation)
        assert _relative_error(got.to_numpy(), ref) <= 2 * TOLERANCE[dtype], (rows, activation, path)
