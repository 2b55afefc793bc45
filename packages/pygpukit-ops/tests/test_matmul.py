"""matmul, linear and scaled_matmul against float64 NumPy references (CPU backend in CI, the GPU with
-m gpu: cuBLASLt and the built-in fallback). Error bounds are relative Frobenius norms per dtype."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import backend_state
from pygpukit.core.cublaslt import is_cublaslt_available
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.ops import linalg as mm

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


def test_tf32_switches() -> None:
    assert mm.get_tf32() is False or mm.get_tf32() is True
    previous = mm._tf32
    try:
        mm.set_tf32(True)
        assert mm.get_tf32()
        mm.set_tf32(False)
        assert not mm.get_tf32()
    finally:
        mm._tf32 = previous


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_with_fused_bias_and_activation(dtype: str, activation: str | None) -> None:
    rng = np.random.default_rng(17)
    x = _random(rng, (2, 9, 64), dtype)
    w = _random(rng, (48, 64), dtype)
    bias = _random(rng, (48,), dtype)
    got = mm.linear(gp.from_numpy(x), gp.from_numpy(w), gp.from_numpy(bias), activation).to_numpy()
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
    ref = mm._cpu_activation(ref, activation)
    assert got.shape == (2, 9, 48)
    assert _relative_error(got, ref) <= 2 * TOLERANCE[dtype]
    assert _relative_error(mm.linear(gp.from_numpy(x), gp.from_numpy(w)).to_numpy(),
                           x.astype(np.float64) @ w.astype(np.float64).T) <= 2 * TOLERANCE[dtype]  # fmt: skip


def test_linear_bad_input() -> None:
    x, w = gp.ones((4, 8)), gp.ones((5, 8))
    with pytest.raises(ShapeError, match="x has 7 features, w expects 8"):
        mm.linear(gp.ones((4, 7)), w)
    with pytest.raises(ShapeError, match=r"b must have shape \(5,\)"):
        mm.linear(x, w, gp.ones(4))
    with pytest.raises(ValueError, match="activation"):
        mm.linear(x, w, None, "swish")


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
    with pytest.raises(DTypeError, match="float32 GPUArray with one element"):
        mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, gp.ones(2), sb)
    with pytest.raises(DTypeError, match="must be float8"):
        mm.scaled_matmul(gp.ones((32, 64)), gp.from_numpy(w).T, sa, sb)


# -- GPU: larger problems, every path -----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (7, 3, 1023), (127, 255, 64), (1000, 1024, 4096),
                                           (4097, 33, 512)])  # fmt: skip
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
    # matmul and linear keep the GEMV launch of a small-M call shape (mm._SmallRoute). A repeated call
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
