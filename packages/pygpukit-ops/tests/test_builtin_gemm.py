"""The built-in GEMM (gemm_mma: mma.sync, wgmma on SM 90), GEMV and CUDA-core kernels against float64 NumPy.

GPU tests (``-m gpu``) draw fresh random data per test, poison every output with NaN first and bound the
relative Frobenius error ||out - ref|| / ||ref|| per dtype. The reference is computed in float64 from
the same (already rounded) fp16/bf16 inputs, so the error is the output rounding plus float32
accumulation: fp16 out <= 2^-11 relative per element, bf16 out <= 2^-8, float32 out about 1e-6 for K up
to ~2e4. CPU tests compile every instantiation with NVRTC (no GPU needed), check that bad input raises
the typed errors without touching the output, and run the NumPy path of the CPU simulation backend.
"""

from __future__ import annotations

import functools
import math
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.abi import offsets_checked, static_asserts_for
from pygpukit.core.backend import backend_state
from pygpukit.core.compiler import compile_source
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError, NvrtcError, ShapeError
from pygpukit.ops import _kernels
from pygpukit.ops.gemm import gemv_kernels as gk
from pygpukit.ops.gemm import mma as mk
from pygpukit.ops.gemm import simt
from pygpukit.ops.gemm._base import PLANS, device_props

Array = np.ndarray[Any, Any]

BOUND = {
    ("float16", "float16"): 1e-3,
    ("float16", "float32"): 2e-5,
    ("bfloat16", "bfloat16"): 6e-3,
    ("bfloat16", "float32"): 2e-5,
    ("float32", "float32"): 2e-5,
}
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
_erf = np.vectorize(math.erf, otypes=[np.float64])


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    # Fresh data per test, reproducible from the test's name.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Array:
    return rng.standard_normal(shape, dtype=np.float32).astype(NUMPY[dtype.name])


def _activation(values: Array, name: str | None) -> Array:
    if name == "relu":
        return np.maximum(values, 0.0)
    if name == "gelu_tanh":
        return 0.5 * values * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (values + 0.044715 * values**3)))
    if name == "gelu":
        return 0.5 * values * (1.0 + _erf(values / math.sqrt(2.0)))
    if name == "silu":
        return values / (1.0 + np.exp(-values))
    return values


def _relative_error(got: Array, ref: Array) -> float:
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN in the result: an output element was not written"
    return float(np.linalg.norm(got64 - ref)) / (float(np.linalg.norm(ref)) or 1.0)


def _poisoned(shape: tuple[int, ...], dtype: DType) -> gp.GPUArray:
    return gp.full(shape, np.nan, dtype)


def _on_gpu() -> bool:
    return backend_state().name == "cuda"


# -- GEMM on the GPU ----------------------------------------------------------------------------------
def _check_gemm(
    rng: np.random.Generator,
    m: int,
    n: int,
    k: int,
    dtype: DType,
    out_dtype: DType,
    trans_a: bool,
    trans_b: bool,
    *,
    bias: bool = False,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    tile: mk.GemmTile | None = None,
) -> None:
    a = _random(rng, (k, m) if trans_a else (m, k), dtype)
    b = _random(rng, (n, k) if trans_b else (k, n), dtype)
    ref = alpha * ((a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64))
    out = _poisoned((m, n), out_dtype)
    if beta != 0.0:
        old = _random(rng, (m, n), out_dtype)
        out.copy_(old)
        ref = ref + beta * old.astype(np.float64)
    bias_array = None
    if bias:
        values = _random(rng, (n,), out_dtype)
        bias_array = gp.from_numpy(values)
        ref = ref + values.astype(np.float64)
    ref = _activation(ref, activation)
    mk.gemm_mma(gp.from_numpy(a), gp.from_numpy(b), out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta,
                bias=bias_array, activation=activation, tile=tile)  # fmt: skip
    error = _relative_error(out.to_numpy(), ref)
    bound = BOUND[(dtype.name, out_dtype.name)]
    assert error <= bound, f"{m}x{n}x{k} {dtype}->{out_dtype} trans=({trans_a},{trans_b}) tile={tile}: {error:.2e}"


GEMM_SHAPES = [(1, 7, 33), (33, 1, 7), (7, 3, 1), (127, 129, 64), (257, 513, 1000), (1000, 33, 4097), (64, 4097, 127)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("trans", [(False, False), (False, True), (True, False), (True, True)], ids=str)
@pytest.mark.parametrize("out_kind", ["same", "float32"])
@pytest.mark.parametrize("dtype", [gp.bfloat16, gp.float16], ids=str)
def test_gemm_matches_float64(
    rng: np.random.Generator, shape: tuple[int, int, int], trans: tuple[bool, bool], out_kind: str, dtype: DType
) -> None:
    out_dtype = dtype if out_kind == "same" else gp.float32
    _check_gemm(rng, *shape, dtype, out_dtype, *trans)


def _tiles() -> list[mk.GemmTile]:
    return [*mk.GEMM_MMA_TILES, *mk.GEMM_WGMMA_TILES]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", _tiles(), ids=lambda t: f"{t.kernel}-{t.bm}x{t.bn}x{t.bk}")
@pytest.mark.parametrize("trans", [(False, False), (False, True), (True, False), (True, True)], ids=str)
def test_gemm_every_tile(rng: np.random.Generator, tile: mk.GemmTile, trans: tuple[bool, bool]) -> None:
    info = gp.get_device_info(gp.get_device())
    if tile.shared_bytes > info.max_shared_memory_per_block_optin:
        pytest.skip(f"{tile} needs {tile.shared_bytes} bytes of shared memory per block")
    if tile.kernel == "wgmma" and not device_props(gp.get_device()).wgmma:
        pytest.skip("wgmma needs SM 90 and an NVRTC that targets sm_90a")
    # Several tiles in each direction, ragged edges and a K tail.
    for m, n, k in [(300, 520, 200), (129, 257, 4096), (2 * tile.bm, 2 * tile.bn, 64)]:
        _check_gemm(rng, m, n, k, gp.bfloat16, gp.bfloat16, *trans, bias=True, activation="gelu_tanh", alpha=0.5,
                    beta=0.25, tile=tile)  # fmt: skip
        _check_gemm(rng, m, n, k, gp.float16, gp.float32, *trans, tile=tile)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu_tanh", "gelu", "silu"], ids=str)
@pytest.mark.parametrize("out_kind", ["same", "float32"])
def test_gemm_epilogue(rng: np.random.Generator, activation: str | None, out_kind: str) -> None:
    out_dtype = gp.bfloat16 if out_kind == "same" else gp.float32
    _check_gemm(rng, 200, 300, 320, gp.bfloat16, out_dtype, False, True, bias=True, activation=activation)
    _check_gemm(rng, 65, 70, 96, gp.bfloat16, out_dtype, False, False, activation=activation, alpha=-1.5, beta=0.5)


@pytest.mark.gpu
def test_gemm_bias_in_input_dtype_with_float32_out(rng: np.random.Generator) -> None:
    a, b, bias = (
        _random(rng, (70, 90), gp.bfloat16),
        _random(rng, (90, 50), gp.bfloat16),
        _random(rng, (50,), gp.bfloat16),
    )
    out = _poisoned((70, 50), gp.float32)
    mk.gemm_mma(gp.from_numpy(a), gp.from_numpy(b), out, bias=gp.from_numpy(bias), activation="relu")
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64), 0.0)
    assert _relative_error(out.to_numpy(), ref) <= BOUND[("bfloat16", "float32")]


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_gemm_views_without_copies(rng: np.random.Generator, aligned: bool) -> None:
    # a: the transpose of a contiguous array; b: columns of a wider array (leading stride > N, and
    # not a multiple of 8 elements when unaligned); out: a column slice of a wider result.
    m, n, k = 150, 97, 130
    extra = 8 if aligned else 3
    a_store = _random(rng, (k, m), gp.bfloat16)
    b_wide = _random(rng, (k, n + extra), gp.bfloat16)
    out_wide = _poisoned((m, n + extra), gp.float32)
    a = gp.from_numpy(a_store).T
    b = gp.from_numpy(b_wide)[:, :n]
    out = out_wide[:, :n]
    mk.gemm_mma(a, b, out)
    ref = a_store.T.astype(np.float64) @ b_wide[:, :n].astype(np.float64)
    assert _relative_error(out.to_numpy(), ref) <= BOUND[("bfloat16", "float32")]
    assert np.isnan(out_wide.to_numpy()[:, n:]).all(), "columns outside the out view were written"


@pytest.mark.gpu
def test_gemm_repeated_call_shape_reads_each_calls_alignment(rng: np.random.Generator) -> None:
    # gemm_mma keeps its launch per call shape; a repeat whose a starts one element into its buffer
    # (the same shape and strides, not 16-byte aligned) must take the element-wise loads.
    m, n, k = 70, 90, 64
    buffer = _random(rng, (m * k + 1,), gp.bfloat16)
    device_buffer = gp.from_numpy(buffer)
    b_host = _random(rng, (k, n), gp.bfloat16)
    b = gp.from_numpy(b_host)
    for start in (0, 1, 0):
        out = _poisoned((m, n), gp.float32)
        mk.gemm_mma(device_buffer[start : start + m * k].reshape(m, k), b, out)
        ref = buffer[start : start + m * k].reshape(m, k).astype(np.float64) @ b_host.astype(np.float64)
        assert _relative_error(out.to_numpy(), ref) <= BOUND[("bfloat16", "float32")], start


@pytest.mark.gpu
def test_gemm_large_k(rng: np.random.Generator) -> None:
    _check_gemm(rng, 1024, 2048, 4096, gp.bfloat16, gp.bfloat16, False, True)
    _check_gemm(rng, 1024, 1024, 4096, gp.float16, gp.float32, False, False)


@pytest.mark.gpu
def test_gemm_is_deterministic(rng: np.random.Generator) -> None:
    a = gp.from_numpy(_random(rng, (512, 768), gp.bfloat16))
    b = gp.from_numpy(_random(rng, (768, 640), gp.bfloat16))
    results = []
    for _ in range(3):
        out = _poisoned((512, 640), gp.bfloat16)
        mk.gemm_mma(a, b, out)
        results.append(out.to_numpy().view(np.uint16))
    assert all(np.array_equal(results[0], r) for r in results[1:])


# -- GEMV on the GPU ----------------------------------------------------------------------------------
def _gemv_reference(x: Array, w: Array, layout: str) -> Array:
    """float64 x @ W, K in chunks to keep the float64 copies of large W small."""
    k = x.shape[-1]
    ref = np.zeros((x.shape[0], w.shape[0] if layout == "nk" else w.shape[1]))
    for k0 in range(0, k, 2048):
        xs = x[:, k0 : k0 + 2048].astype(np.float64)
        ws = (w[:, k0 : k0 + 2048].T if layout == "nk" else w[k0 : k0 + 2048]).astype(np.float64)
        ref += xs @ ws
    return ref


def _check_gemv(
    rng: np.random.Generator,
    x: Array,
    w: Array,
    layout: str,
    dtype: DType,
    *,
    w_device: gp.GPUArray | None = None,
    bias: bool = False,
    activation: str | None = None,
) -> None:
    n = w.shape[0] if layout == "nk" else w.shape[1]
    ref = _gemv_reference(x, w, layout)
    bias_array = None
    if bias:
        values = _random(rng, (n,), dtype)
        bias_array = gp.from_numpy(values)
        ref = ref + values.astype(np.float64)
    ref = _activation(ref, activation)
    out = _poisoned((x.shape[0], n), dtype)
    gk.gemv(gp.from_numpy(x), w_device if w_device is not None else gp.from_numpy(w), out, w_layout=layout,
            bias=bias_array, activation=activation)  # fmt: skip
    error = _relative_error(out.to_numpy(), ref)
    assert error <= BOUND[(dtype.name, dtype.name)], f"M={x.shape[0]} {w.shape} {layout} {dtype}: {error:.2e}"


DECODE_SHAPES = [(4096, 4096), (3584, 18944), (18944, 3584), (8192, 29568)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: f"K{s[0]}-N{s[1]}")
def test_gemv_decode_shapes(rng: np.random.Generator, shape: tuple[int, int], layout: str) -> None:
    k, n = shape
    w = _random(rng, (n, k) if layout == "nk" else (k, n), gp.bfloat16)
    w_device = gp.from_numpy(w)
    for m in (1, 2, 3, 8):
        _check_gemv(rng, _random(rng, (m, k), gp.bfloat16), w, layout, gp.bfloat16, w_device=w_device)


SMALL_GEMV_SHAPES = [(1, 1), (7, 3), (33, 65), (1000, 1001), (4097, 33), (130, 4096), (18944, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("shape", SMALL_GEMV_SHAPES, ids=lambda s: f"K{s[0]}-N{s[1]}")
@pytest.mark.parametrize("dtype", [gp.float32, gp.float16, gp.bfloat16], ids=str)
def test_gemv_rows_1_to_8(rng: np.random.Generator, shape: tuple[int, int], layout: str, dtype: DType) -> None:
    k, n = shape
    w = _random(rng, (n, k) if layout == "nk" else (k, n), dtype)
    w_device = gp.from_numpy(w)
    for m in range(1, 9):
        _check_gemv(rng, _random(rng, (m, k), dtype), w, layout, dtype, w_device=w_device, bias=m % 2 == 1)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh", "gelu", "silu"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemv_bias_and_activation(rng: np.random.Generator, activation: str, layout: str) -> None:
    for m, k, n in [(1, 4096, 512), (5, 1000, 300)]:
        w = _random(rng, (n, k) if layout == "nk" else (k, n), gp.bfloat16)
        _check_gemv(rng, _random(rng, (m, k), gp.bfloat16), w, layout, gp.bfloat16, bias=True, activation=activation)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemv_vectors_and_views(rng: np.random.Generator, layout: str) -> None:
    k, n = 515, 260
    # 1-D x and out; W as rows of a wider array (unaligned leading stride: element-wise loads).
    x = _random(rng, (k,), gp.float16)
    w_shape = (n, k) if layout == "nk" else (k, n)
    w_wide = _random(rng, (w_shape[0], w_shape[1] + 5), gp.float16)
    w = w_wide[:, : w_shape[1]]
    out = _poisoned((n,), gp.float16)
    gk.gemv(gp.from_numpy(x), gp.from_numpy(w_wide)[:, : w_shape[1]], out, w_layout=layout)
    ref = _gemv_reference(x[None, :], np.ascontiguousarray(w), layout)[0]
    assert _relative_error(out.to_numpy(), ref) <= BOUND[("float16", "float16")]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemv_repeated_calls_follow_their_operands(rng: np.random.Generator, layout: str) -> None:
    # gemv keeps the launch of a call shape (shapes, strides, dtypes, devices, layout, bias, activation);
    # what it does not key on must still be read per call: the addresses, and with them whether rows
    # start on 16-byte boundaries (an x one element into its buffer has the same shape and strides).
    k, n = 1024, 96
    buffer = _random(rng, (1, k + 1), gp.bfloat16)
    w_host = _random(rng, (n, k) if layout == "nk" else (k, n), gp.bfloat16)
    w = gp.from_numpy(w_host)
    device_buffer = gp.from_numpy(buffer)
    for x_view, x_host in ((device_buffer[:, :k], buffer[:, :k]), (device_buffer[:, 1:], buffer[:, 1:]),
                           (device_buffer[:, :k], buffer[:, :k])):  # fmt: skip
        out = _poisoned((1, n), gp.bfloat16)
        gk.gemv(x_view, w, out, w_layout=layout)
        assert _relative_error(out.to_numpy(), _gemv_reference(x_host, w_host, layout)) <= BOUND[("bfloat16",) * 2]
    bias = _random(rng, (n,), gp.bfloat16)
    out = _poisoned((1, n), gp.bfloat16)
    gk.gemv(device_buffer[:, 1:], w, out, w_layout=layout, bias=gp.from_numpy(bias), activation="relu")
    ref = np.maximum(_gemv_reference(buffer[:, 1:], w_host, layout) + bias.astype(np.float64), 0.0)
    assert _relative_error(out.to_numpy(), ref) <= BOUND[("bfloat16",) * 2]
    with pytest.raises(ShapeError):  # a cached call shape does not skip the checks of a new one
        gk.gemv(device_buffer[:, 1:], w, gp.empty((1, n + 1), gp.bfloat16), w_layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("m", [1, 4])
def test_gemv_split_k_is_deterministic(rng: np.random.Generator, layout: str, m: int) -> None:
    # N = 64 gives a handful of blocks, so K is split; repeated runs must agree bitwise and leave the
    # split counters ready for the next launch (a stale counter would finish too early).
    k, n = 18944, 64
    x = gp.from_numpy(_random(rng, (m, k), gp.bfloat16))
    w_host = _random(rng, (n, k) if layout == "nk" else (k, n), gp.bfloat16)
    w = gp.from_numpy(w_host)
    ref = _gemv_reference(x.to_numpy(), w_host, layout)
    results = []
    for _ in range(5):
        out = _poisoned((m, n), gp.bfloat16)
        gk.gemv(x, w, out, w_layout=layout)
        results.append(out.to_numpy())
    assert _relative_error(results[0], ref) <= BOUND[("bfloat16", "bfloat16")]
    assert all(np.array_equal(results[0].view(np.uint16), r.view(np.uint16)) for r in results[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("u", gk._GEMV_CLUSTER_LOADS)
@pytest.mark.parametrize("cluster", gk._GEMV_CLUSTER_SIZES)
@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=str)
def test_gemv_cluster_split(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, cluster: int, u: int,
                            dtype: DType) -> None:  # fmt: skip
    # SM 90+: K split over the blocks of a thread-block cluster, forced for every cluster size on
    # shapes with K tails (splits with no rows at all for K = 130), N tails (N = 7 is all tail),
    # unaligned x (element-wise loads), bias and activation; bitwise repeatable and graph-replayable.
    if not device_props(0).clusters:
        pytest.skip("thread-block clusters need SM 90 or newer")
    plan = gk._gemv_cluster_expression_plan(dtype, cluster, u=u)
    monkeypatch.setattr(gk, "_gemv_cluster_plan", lambda *args: plan)
    monkeypatch.setattr(PLANS, "_plans", {})  # plans made before the patch are not this plan
    for k, n in ((1000, 2500), (4096, 4096), (130, 7), (777, 1029)):
        w_host = _random(rng, (k, n), dtype)
        w = gp.from_numpy(w_host)
        _check_gemv(rng, _random(rng, (1, k), dtype), w_host, "kn", dtype, w_device=w)
        _check_gemv(rng, _random(rng, (1, k), dtype), w_host, "kn", dtype, w_device=w, bias=True, activation="silu")
        buffer = _random(rng, (1, k + 1), dtype)
        out = _poisoned((1, n), dtype)
        gk.gemv(gp.from_numpy(buffer)[:, 1:], w, out, w_layout="kn")
        error = _relative_error(out.to_numpy(), _gemv_reference(buffer[:, 1:], w_host, "kn"))
        assert error <= BOUND[(dtype.name, dtype.name)], f"unaligned x, K={k} N={n}: {error:.2e}"
    launches = [value[0] for key, value in PLANS._plans.items() if key[0] == "gemv"]
    assert launches
    assert all(launch.grid[1] == cluster and not launch.workspace for launch in launches)
    x = gp.from_numpy(_random(rng, (1, 4096), dtype))
    w = gp.from_numpy(_random(rng, (4096, 4096), dtype))
    with gp.Stream() as stream:
        results = []
        for _ in range(3):
            out = _poisoned((1, 4096), dtype)
            gk.gemv(x, w, out, w_layout="kn", stream=stream)
            results.append(out.to_numpy().tobytes())
        assert results[0] == results[1] == results[2]
        graph = gp.CudaGraph()
        with graph.capture(stream):
            gk.gemv(x, w, out, w_layout="kn", stream=stream)
        out.copy_(gp.full((1, 4096), float("nan"), dtype))
        graph.replay(stream)
        stream.synchronize()
    assert out.to_numpy().tobytes() == results[0]


def test_gemv_cluster_choice() -> None:
    # Column groups of 128 on 132 SMs: the largest cluster within two blocks per SM; none where the
    # grid would leave more than a tenth of the SMs idle, for other dtypes, several rows or "nk".
    sizes = {groups: gk._gemv_cluster_plan(gp.bfloat16, 1, "kn", groups, 132) for groups in (8, 15, 32, 33, 64, 100)}
    assert {g: p.cluster if p else None for g, p in sizes.items()} == {8: None, 15: 8, 32: 8, 33: 8, 64: 4, 100: 2}
    assert all(p is None or p.expression.endswith(f", {8 if g * p.cluster <= 132 else 4}, 16, {p.cluster}>")
               for g, p in sizes.items())  # fmt: skip
    assert gk._gemv_cluster_plan(gp.float16, 1, "kn", 32, 132) is not None
    assert gk._gemv_cluster_plan(gp.float32, 1, "kn", 32, 132) is None
    assert gk._gemv_cluster_plan(gp.bfloat16, 2, "kn", 32, 132) is None
    assert gk._gemv_cluster_plan(gp.bfloat16, 1, "nk", 32, 132) is None
    assert gk._gemv_plan(gp.bfloat16, 1, "kn", True).per_block == 128


@pytest.mark.gpu
def test_gemv_on_streams(rng: np.random.Generator) -> None:
    # Each stream has its own split-K scratch, so launches on two streams may overlap.
    k, n = 8192, 128
    x = gp.from_numpy(_random(rng, (2, k), gp.bfloat16))
    w_host = _random(rng, (n, k), gp.bfloat16)
    w = gp.from_numpy(w_host)
    ref = _gemv_reference(x.to_numpy(), w_host, "nk")
    streams = [gp.Stream(), gp.Stream()]
    outs = [_poisoned((2, n), gp.bfloat16) for _ in streams]
    for _ in range(10):
        for stream, out in zip(streams, outs, strict=True):
            gk.gemv(x, w, out, w_layout="nk", stream=stream)
    for stream, out in zip(streams, outs, strict=True):
        stream.synchronize()
        assert _relative_error(out.to_numpy(stream=stream), ref) <= BOUND[("bfloat16", "bfloat16")]


# -- CPU: compile checks, errors, the NumPy path ------------------------------------------------------
def _compile_all(file: str, arch: str) -> None:
    expressions = mk.name_expressions_for(file)
    assert expressions
    make = gk._kernel if file == "gemv/gemv.cu" else functools.partial(mk._kernel, file)
    with ThreadPoolExecutor(max_workers=4) as pool:
        programs = list(pool.map(lambda e: make(e).compile(arch), expressions))
    for expression, program in zip(expressions, programs, strict=True):
        assert program.binary[:4] == b"\x7fELF", expression
        assert expression in program.lowered_names


@pytest.mark.nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("file", ["gemm/gemm_mma.cu", "gemm/gemm_wgmma.cu", "gemv/gemv.cu"])
def test_every_instantiation_compiles(file: str, arch: str) -> None:
    # gemm_wgmma.cu's kernels compile to empty bodies except for sm_90a (the next test).
    _compile_all(file, arch)


@pytest.mark.nvrtc
@pytest.mark.slow
def test_wgmma_compiles_for_sm90a() -> None:
    _compile_all("gemm/gemm_wgmma.cu", "90a")
    # The runtime's kernel object asks for sm_90a when given the device's plain sm_90.
    expression = mk.name_expressions_for("gemm/gemm_wgmma.cu")[0]
    assert mk._kernel("gemm/gemm_wgmma.cu", expression).compile("90").arch == "90a"


@pytest.mark.nvrtc
def test_simt_gemm_shape_struct_matches_its_kernel() -> None:
    # GemmShape is declared once in Python (simt.GEMM_SHAPE); the C++ struct must agree on its size
    # and every offset: the static_asserts the kernel compile check appends compile only if it does.
    assert simt.GEMM_SHAPE.size == 96
    checks = static_asserts_for("gemm/gemm_simt.cu")
    assert "pygpukit::ops::gemm::GemmShape" in checks
    path = _kernels.kernel_root() / "gemm" / "gemm_simt.cu"
    program = compile_source(path.read_text() + checks, arch="80", name="gemm_simt.cu", include_dirs=[path.parent],
                             name_expressions=simt.name_expressions())  # fmt: skip
    assert program.binary[:4] == b"\x7fELF"
    if not offsets_checked():
        pytest.skip("this NVRTC has no __builtin_offsetof (12.x, 13.0): only sizes are checked here")
    offset = simt.GEMM_SHAPE.offsets["alpha"]
    broken = checks.replace(f"GemmShape, alpha) == {offset}", f"GemmShape, alpha) == {offset - 4}")
    assert broken != checks
    with pytest.raises(NvrtcError, match="alpha"):  # a field moved on one side only fails the compile
        compile_source(path.read_text() + broken, arch="80", name="gemm_simt.cu", include_dirs=[path.parent],
                       name_expressions=simt.name_expressions())  # fmt: skip


def test_name_expressions_are_registered() -> None:
    counts = {"gemm/gemm_mma.cu": 48, "gemm/gemm_wgmma.cu": 32, "gemv/gemv.cu": 30}
    for file, count in counts.items():
        expressions = mk.name_expressions_for(file)
        assert len(expressions) == len(set(expressions)) == count
        assert set(expressions) <= set(_kernels.name_expressions(file))
    assert mk.name_expressions_for("elementwise/binary.cu") == []
    assert set(simt.name_expressions()) == set(_kernels.name_expressions("gemm/gemm_simt.cu"))
    assert len(simt.name_expressions()) == 5


def test_tile_choice() -> None:
    h100 = {"sms": 132, "shared_per_block": 232448, "shared_per_sm": 233472}
    rtx = {"sms": 84, "shared_per_block": 101376, "shared_per_sm": 102400}
    big = mk.gemm_tile_for(8192, 8192, **h100, wgmma=True)
    assert (big.kernel, big.bm, big.bn) == ("wgmma", 128, 256)
    assert mk.gemm_tile_for(8192, 8192, **h100).bn == 256  # mma.sync, large tile
    assert mk.gemm_tile_for(8192, 8192, **rtx).shared_bytes <= rtx["shared_per_block"]
    small = mk.gemm_tile_for(16, 1024, **h100, wgmma=True)
    assert (small.bm, small.bn) == (64, 64)  # a 128-row tile would waste most of its rows
    for tile in mk.GEMM_WGMMA_TILES:
        assert tile.threads == 256
    for tile in mk.GEMM_MMA_TILES:
        assert tile.threads in (128, 256)


def _arrays(rng: np.random.Generator, *shapes_and_dtypes: tuple[tuple[int, ...], DType]) -> list[gp.GPUArray]:
    return [gp.from_numpy(_random(rng, shape, dtype)) if dtype.name in NUMPY else gp.zeros(shape, dtype)
            for shape, dtype in shapes_and_dtypes]  # fmt: skip


BF = gp.bfloat16


@pytest.mark.parametrize(
    ("case", "error", "words"),
    [
        ({"a": ((4, 5), BF), "b": ((6, 3), BF), "out": ((4, 3), BF)}, ShapeError, ["(4, 5)", "(6, 3)"]),
        ({"a": ((4, 5), BF), "b": ((5, 3), BF), "out": ((4, 4), BF)}, ShapeError, ["(4, 4)"]),
        ({"a": ((4, 5), BF), "b": ((5, 3), gp.float16), "out": ((4, 3), BF)}, DTypeError, ["bfloat16", "float16"]),
        ({"a": ((4, 5), gp.float32), "b": ((5, 3), gp.float32), "out": ((4, 3), gp.float32)}, DTypeError, ["float32"]),
        ({"a": ((4, 5), BF), "b": ((5, 3), BF), "out": ((4, 3), gp.float16)}, DTypeError, ["float16"]),
        ({"a": ((4, 5), BF), "b": ((5, 3), BF), "out": ((4, 3), BF), "bias": ((4,), BF)}, ShapeError, ["(4,)"]),
        ({"a": ((4, 5), BF), "b": ((5, 3), BF), "out": ((4, 3), BF), "bias": ((3,), gp.float32)}, DTypeError,
         ["float32"]),
        ({"a": ((2, 4, 5), BF), "b": ((5, 3), BF), "out": ((4, 3), BF)}, ShapeError, ["2-D"]),
    ],
)  # fmt: skip
def test_gemm_bad_input(
    rng: np.random.Generator, case: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    arrays = {name: _arrays(rng, spec)[0] for name, spec in case.items()}
    before = arrays["out"].to_numpy().copy()
    with pytest.raises(error) as raised:
        mk.gemm_mma(arrays["a"], arrays["b"], arrays["out"], bias=arrays.get("bias"))
    for word in words:
        assert word in str(raised.value)
    assert np.array_equal(arrays["out"].to_numpy().view(np.uint8), before.view(np.uint8))


def test_gemm_bad_arguments(rng: np.random.Generator) -> None:
    a, b, out = _arrays(rng, ((4, 5), BF), ((5, 3), BF), ((4, 3), BF))
    with pytest.raises(ValueError, match="activation"):
        mk.gemm_mma(a, b, out, activation="tanh")
    with pytest.raises(DTypeError, match="GPUArray"):
        mk.gemm_mma(np.zeros((4, 5)), b, out)
    with pytest.raises(ShapeError, match="row-major"):
        mk.gemm_mma(b.T, a.T, out.T)  # out as a transposed view
    with pytest.raises(ShapeError, match="stride"):
        mk.gemm_mma(gp.from_numpy(_random(rng, (4, 10), BF))[:, ::2], b, out)


@pytest.mark.parametrize(
    ("x", "w", "out", "layout", "error", "words"),
    [
        (((2, 5), BF), ((5, 3), BF), ((2, 4), BF), "kn", ShapeError, ["(2, 4)"]),
        (((2, 5), BF), ((5, 3), BF), ((2, 3), BF), "nk", ShapeError, ["(5, 3)"]),
        (((9, 5), BF), ((5, 3), BF), ((9, 3), BF), "kn", ShapeError, ["9 rows"]),
        (((2, 5), BF), ((5, 3), gp.float16), ((2, 3), BF), "kn", DTypeError, ["float16", "bfloat16"]),
        (((2, 5), gp.int32), ((5, 3), gp.int32), ((2, 3), gp.int32), "kn", DTypeError, ["int32"]),
        (((5,), BF), ((5, 3), BF), ((1, 3), BF), "kn", ShapeError, ["(1, 3)"]),
    ],
)  # fmt: skip
def test_gemv_bad_input(
    rng: np.random.Generator, x: Any, w: Any, out: Any, layout: str, error: type[Exception], words: list[str]
) -> None:
    xs, ws = _arrays(rng, x, w)
    outs = gp.full(out[0], 3.0, out[1]) if out[1].is_floating else gp.zeros(out[0], out[1])
    before = outs.to_numpy().copy()
    with pytest.raises(error) as raised:
        gk.gemv(xs, ws, outs, w_layout=layout)
    for word in words:
        assert word in str(raised.value)
    assert np.array_equal(outs.to_numpy(), before)


def test_gemv_bad_arguments(rng: np.random.Generator) -> None:
    x, w, out, bias = _arrays(rng, ((2, 5), BF), ((5, 3), BF), ((2, 3), BF), ((4,), BF))
    with pytest.raises(ValueError, match="w_layout"):
        gk.gemv(x, w, out, w_layout="kk")
    with pytest.raises(ShapeError, match=r"\(4,\)"):
        gk.gemv(x, w, out, bias=bias)
    with pytest.raises(ShapeError, match="row-major"):
        gk.gemv(x, gp.from_numpy(_random(rng, (3, 5), BF)).T, out)  # W as a transposed view
    with pytest.raises(ValueError, match="activation"):
        gk.gemv(x, w, out, activation="softplus")


@pytest.mark.parametrize("trans", [(False, False), (True, True)], ids=str)
def test_gemm_small_any_backend(rng: np.random.Generator, trans: tuple[bool, bool]) -> None:
    # On the CPU simulation backend this runs the NumPy path, on a GPU the kernels: same results.
    _check_gemm(rng, 9, 11, 13, BF, gp.float32, *trans, bias=True, activation="silu", alpha=2.0, beta=-1.0)
    _check_gemm(rng, 5, 3, 70, gp.float16, gp.float16, *trans, activation="gelu")


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_gemv_small_any_backend(rng: np.random.Generator, layout: str) -> None:
    for dtype in (gp.float32, BF):
        w = _random(rng, (12, 40) if layout == "nk" else (40, 12), dtype)
        _check_gemv(rng, _random(rng, (3, 40), dtype), w, layout, dtype, bias=True, activation="relu")


def test_zero_sized_outputs_are_left_alone(rng: np.random.Generator) -> None:
    a, b = _arrays(rng, ((0, 5), BF), ((5, 3), BF))
    out = gp.empty((0, 3), BF)
    assert mk.gemm_mma(a, b, out) is out
    x, w = _arrays(rng, ((2, 5), BF), ((0, 5), BF))
    y = gp.empty((2, 0), BF)
    assert gk.gemv(x, w, y, w_layout="nk") is y
    if not _on_gpu():
        return
    # K = 0 computes the epilogue of an empty sum.
    a, b = _arrays(rng, ((4, 0), BF), ((0, 3), BF))
    out = _poisoned((4, 3), gp.float32)
    bias = gp.from_numpy(np.arange(3, dtype=np.float32))
    mk.gemm_mma(a, b, out, bias=bias)
    assert np.array_equal(out.to_numpy(), np.tile(np.arange(3, dtype=np.float32), (4, 1)))
