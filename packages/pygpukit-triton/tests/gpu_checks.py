"""GPU checks of pygpukit.triton, each run in a fresh process by test_gpu.py (or by hand:
``python packages/pygpukit-triton/tests/gpu_checks.py [name ...]``).

Importing torch is made impossible first (as on a machine without torch), and every check ends by
asserting that torch was never imported. Each check compares with float64 NumPy references on random
data with odd shapes, within the built-in op's tolerances.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is blocked: pygpukit.triton must work without torch")
        return


sys.meta_path.insert(0, _NoTorch())

import pygpukit as gk  # noqa: E402
from pygpukit import ops  # noqa: E402
from pygpukit.core import dtypes  # noqa: E402
from pygpukit.core.errors import DTypeError, InvalidPointerError, ShapeError  # noqa: E402

rng = np.random.default_rng(2020)
F64 = np.float64
# rounding of one float32-computed result to the dtype (half an ulp) plus float32 arithmetic
TOL = {"float32": 2e-5, "float16": 1e-3, "bfloat16": 8e-3}
FLOATS = (gk.float32, gk.float16, gk.bfloat16)


def _rand(shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> Any:
    return gk.from_numpy((rng.standard_normal(shape) * scale).astype(dtype.numpy))


def _close(got: Any, want: np.ndarray, dtype: Any, what: str, factor: float = 1.0) -> None:
    got64 = got.to_numpy().astype(F64) if hasattr(got, "to_numpy") else np.asarray(got, F64)
    tol = TOL[dtype.name] * factor
    np.testing.assert_allclose(got64, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))) * 1e-2,
                               err_msg=what)  # fmt: skip


def _host(a: Any) -> np.ndarray:
    return np.asarray(a.to_numpy(), dtype=F64)


# -- interop -------------------------------------------------------------------------------------------


def check_user_kernel_every_dtype() -> None:
    """A plain @triton.jit kernel takes GPUArrays (and TritonArrays) directly, every dtype, on the
    current pygpukit stream."""
    import triton
    import triton.language as tl

    from pygpukit.triton import from_gpuarray, use_triton_backend

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + i, tl.load(src + i, mask=i < n), mask=i < n)

    use_triton_backend()
    n = 1000
    for dtype in dtypes.all_dtypes():
        bits = rng.integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
        host = bits.view(dtype.numpy) if dtype.name != "bool" else bits.astype(bool)
        src = gk.from_numpy(host)
        dst = gk.zeros((n,), dtype)
        stream = gk.Stream()
        with stream:
            copy[(triton.cdiv(n, 256),)](src, from_gpuarray(dst), n, BLOCK=256)
        stream.synchronize()
        assert dst.to_numpy().tobytes() == src.to_numpy().tobytes(), dtype.name

    @triton.jit
    def axpy(x, y, out, a, n, BLOCK: tl.constexpr):  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        r = a * tl.load(x + i, mask=m).to(tl.float32) + tl.load(y + i, mask=m).to(tl.float32)
        tl.store(out + i, r.to(out.dtype.element_ty), mask=m)

    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float8_e4m3fn": 2.0**-3,
           "float8_e5m2": 2.0**-2}  # fmt: skip
    for dtype in (gk.float32, gk.float16, gk.bfloat16, gk.float8_e4m3fn, gk.float8_e5m2):
        x, y = _rand((777,), dtype), _rand((777,), dtype)
        out = gk.empty((777,), dtype)
        axpy[(4,)](x, y, out, 0.5, 777, BLOCK=256)
        want = 0.5 * _host(x) + _host(y)  # exact; the kernel rounds once (subnormal spacing: atol)
        tiny = {"float16": 2.0**-24, "float8_e4m3fn": 2.0**-9, "float8_e5m2": 2.0**-16}.get(dtype.name, 0.0)
        np.testing.assert_allclose(_host(out), want, rtol=ulp[dtype.name], atol=tiny, err_msg=dtype.name)


def check_stream_order_and_context() -> None:
    """Triton work is ordered with pygpukit work on the same non-default stream."""
    import triton
    import triton.language as tl

    from pygpukit.triton import use_triton_backend

    @triton.jit
    def add_one(x, n, BLOCK: tl.constexpr):  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1.0, mask=i < n)

    with use_triton_backend():
        stream = gk.Stream()
        n = 1 << 22
        with stream:
            x = gk.zeros((n,), gk.float32, stream=stream)
            for _ in range(20):
                add_one[(n // 1024,)](x, n, BLOCK=1024)
                x = ops.multiply(x, 2.0)
        got = x.to_numpy(stream=stream)
    expected = 0.0
    for _ in range(20):
        expected = (expected + 1.0) * 2.0
    assert np.all(got == expected), (got[:4], expected)


def check_graph_capture_replay_bitwise() -> None:
    """Built-in and Triton kernels captured together replay bitwise like eager runs."""
    from pygpukit.triton import kernels

    x = _rand((37, 513), gk.bfloat16)
    w = _rand((513,), gk.bfloat16)
    up = _rand((37, 513), gk.bfloat16)
    a = _rand((64, 37), gk.float16)

    def step(x: Any) -> tuple[Any, Any]:
        h = kernels.rmsnorm(x, w, 1e-6)
        g = kernels.swiglu(h, ops.add(up, 0.0))
        s = kernels.softmax(g.astype(gk.float32))
        m = kernels.matmul(a, h.astype(gk.float16))
        return s, m

    stream = gk.Stream()
    static_x = gk.empty(x.shape, x.dtype, stream=stream)
    static_x.copy_(x)
    with stream:  # compiles every kernel and fills the capture stream's pool cache
        eager = [r.to_numpy() for r in step(static_x)]
    graph = gk.CudaGraph()
    with graph.capture(stream=stream):
        results = step(static_x)
    assert graph.num_nodes >= 4, graph.num_nodes
    for _ in range(3):
        graph.replay()
        graph.synchronize()
        for r, e in zip(results, eager, strict=True):
            assert r.to_numpy().tobytes() == e.tobytes()
    fresh = _rand(x.shape, x.dtype)
    static_x.copy_(fresh)
    graph.replay()
    graph.synchronize()
    for r, e in zip(results, step(fresh), strict=True):
        assert r.to_numpy().tobytes() == e.to_numpy().tobytes()


def check_user_kernel_in_graph() -> None:
    import triton
    import triton.language as tl

    from pygpukit.triton import use_triton_backend

    @triton.jit
    def scale(x, out, a, n, BLOCK: tl.constexpr):  # noqa: N803
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, mask=i < n) * a, mask=i < n)

    use_triton_backend()
    x = _rand((5000,), gk.float32)
    out = gk.empty((5000,), gk.float32)
    scale[(5,)](x, out, 3.0, 5000, BLOCK=1024)
    eager = out.to_numpy()
    out2 = gk.zeros((5000,), gk.float32)
    graph = gk.CudaGraph()
    with graph.capture():
        scale[(5,)](x, out2, 3.0, 5000, BLOCK=1024)
    assert out2.to_numpy().tobytes() == np.zeros(5000, np.float32).tobytes()  # captured, not run
    graph.replay()
    graph.synchronize()
    assert out2.to_numpy().tobytes() == eager.tobytes()


def check_typed_errors() -> None:
    from pygpukit.triton import TritonArray, kernels

    x = _rand((8, 16), gk.float32)
    dead = _rand((8, 16), gk.float32)
    dead.buffer.free()
    for call in (lambda: kernels.rmsnorm(dead, None), lambda: TritonArray(dead), lambda: kernels.softmax(dead)):
        try:
            call()
        except InvalidPointerError:
            pass
        else:
            raise AssertionError("a freed array was accepted")
    for call, error in (
        (lambda: kernels.rmsnorm(x.T, None), ShapeError),
        (lambda: kernels.softmax(x.T, axis=0), ShapeError),
        (lambda: kernels.matmul(x, gk.zeros((16, 4), gk.float16)), DTypeError),
        (lambda: kernels.layernorm(gk.zeros((4, 4), gk.int32), None), DTypeError),
        (lambda: kernels.swiglu(x, x[:, :8]), ShapeError),
    ):
        try:
            call()
        except error:
            pass
        else:
            raise AssertionError(f"expected {error.__name__}")


# -- parity of the kernels -----------------------------------------------------------------------------


def _norm_ref(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float, layer: bool) -> np.ndarray:
    if layer:
        y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    else:
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def check_norms() -> None:
    from pygpukit.triton import kernels

    for dtype in FLOATS:
        for shape in ((1, 1), (3, 7), (5, 1000), (2, 3, 4097), (33, 8192 + 5)):
            x = _rand(shape, dtype, 2.0)
            for wdt in (dtype, gk.float32):
                w = _rand(shape[-1:], wdt)
                b = _rand(shape[-1:], wdt)
                want = _norm_ref(_host(x), _host(w), None, 1e-6, False)
                _close(kernels.rmsnorm(x, w, 1e-6), want, dtype, f"rmsnorm {dtype} {shape}", 2)
                _close(ops.rmsnorm(x, w, 1e-6), want, dtype, f"builtin rmsnorm {dtype} {shape}", 2)
                want = _norm_ref(_host(x), _host(w), _host(b), 1e-5, True)
                _close(kernels.layernorm(x, w, b, 1e-5), want, dtype, f"layernorm {dtype} {shape}", 2)
            want = _norm_ref(_host(x), None, None, 1e-5, True)
            out = gk.empty(shape, dtype)
            assert kernels.layernorm(x, None, None, 1e-5, out=out) is out
            _close(out, want, dtype, f"layernorm no affine {dtype} {shape}", 2)
            # in place, and rows of a strided view
            view = _rand((shape[0], shape[-1] * 2), dtype)[:, : shape[-1]]
            want = _norm_ref(_host(view), None, None, 1e-6, False)
            _close(kernels.rmsnorm(view, None), want, dtype, f"rmsnorm strided {dtype}", 2)
            y = x.clone()
            kernels.rmsnorm(y, None, out=y)
            _close(y, _norm_ref(_host(x), None, None, 1e-6, False), dtype, "rmsnorm in place", 2)


def check_softmax() -> None:
    from pygpukit.triton import kernels

    for dtype in (*FLOATS, gk.float64):
        for shape, axis in (((1,), 0), ((7, 33), -1), ((4, 5000), 1), ((3, 17, 5), 1), ((6, 3, 129), 0)):
            x = _rand(shape, dtype, 4.0)
            h = _host(x)
            e = np.exp(h - h.max(axis, keepdims=True))
            want = e / e.sum(axis, keepdims=True)
            got = kernels.softmax(x, axis)
            tol = 1e-12 if dtype == gk.float64 else TOL[dtype.name]
            np.testing.assert_allclose(_host(got), want, rtol=tol, atol=tol * 1e-2, err_msg=f"{dtype} {shape} {axis}")
            builtin = ops.softmax(x, axis)
            np.testing.assert_allclose(_host(got), _host(builtin), rtol=2 * tol, atol=tol * 1e-2)


def check_rotary() -> None:
    from pygpukit.triton import kernels

    for dtype in FLOATS:
        for style in ("neox", "gptj"):
            for batch, seq, hq, hk, dim, rot in ((1, 1, 1, 1, 8, 8), (2, 13, 5, 1, 64, 64), (3, 7, 4, 2, 96, 32)):
                cos, sin = ops.rope_cos_sin(dim, 64, rotary_dim=rot, dtype=dtype)
                q = _rand((batch, seq, hq, dim), dtype)
                k = _rand((batch, seq, hk, dim), dtype)
                positions = gk.from_numpy(rng.integers(0, 60, size=(batch, seq)).astype(np.int32))
                q2, k2 = q.clone(), k.clone()
                kernels.rotary(q, k, cos, sin, positions, style, rot, 1)
                ops.apply_rope(q2, k2, cos, sin, positions, style, rot, 1)
                for got, ref, what in ((q, q2, "q"), (k, k2, "k")):
                    tol = 2 * TOL[dtype.name]
                    what = f"rotary {what} {dtype} {style} {dim}/{rot}"
                    np.testing.assert_allclose(_host(got), _host(ref), rtol=tol, atol=tol, err_msg=what)
                # positions of shape (seq,), k None
                p1 = gk.from_numpy(np.arange(seq, dtype=np.int32))
                q3, q4 = q.clone(), q.clone()
                kernels.apply_rope(q3, None, cos, sin, p1, style, rot)
                ops.apply_rope(q4, None, cos, sin, p1, style, rot)
                np.testing.assert_allclose(_host(q3), _host(q4), rtol=2 * TOL[dtype.name], atol=2 * TOL[dtype.name])


def check_swiglu() -> None:
    from pygpukit.triton import kernels

    for dtype in FLOATS:
        for shape in ((1, 1), (5, 77), (3, 4, 1111), (2, 6000)):
            g, u = _rand(shape, dtype, 3.0), _rand(shape, dtype)
            hg, hu = _host(g), _host(u)
            want = hg / (1 + np.exp(-hg)) * hu
            _close(kernels.swiglu(g, u), want, dtype, f"swiglu {dtype} {shape}", 2)
            both = _rand((*shape[:-1], 2 * shape[-1]), dtype, 3.0)
            hb = _host(both)
            half = shape[-1]
            want = hb[..., :half] / (1 + np.exp(-hb[..., :half])) * hb[..., half:]
            out = gk.empty(shape, dtype)
            assert kernels.swiglu(both, out=out) is out
            _close(out, want, dtype, f"swiglu fused {dtype} {shape}", 2)
            _close(ops.swiglu(both), want, dtype, f"builtin swiglu {dtype} {shape}", 2)


MATMUL_SHAPES = [
    ((1, 1), (1, 1)),
    ((7, 33), (33, 5)),
    ((129, 257), (257, 65)),
    ((3, 50, 70), (70, 90)),
    ((2, 17, 31), (2, 31, 19)),
    ((31,), (31, 40)),
    ((40, 31), (31,)),
    ((1, 4096), (4096, 300)),
]


def check_matmul() -> None:
    from pygpukit.triton import kernels

    tolerance = {"float32": 2e-6, "tf32": 5e-3, "float16": 2e-3, "bfloat16": 1e-2}
    for dtype in FLOATS:
        for ashape, bshape in MATMUL_SHAPES:
            a, b = _rand(ashape, dtype), _rand(bshape, dtype)
            want = np.matmul(_host(a), _host(b))
            for tf32 in (False, True) if dtype == gk.float32 else (None,):
                got = _host(kernels.matmul(a, b, use_tf32=tf32))
                assert got.shape == want.shape, (got.shape, want.shape)
                key = "tf32" if tf32 else dtype.name
                err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
                # float32 rounding grows with the depth K of the sums (as sqrt(K) for random signs):
                # 2e-6 up to K = 256 (measured on the H100: 2.3e-6 at K = 4096, within 8e-6).
                depth = max(1.0, (ashape[-1] / 256) ** 0.5) if key == "float32" else 1.0
                assert err <= tolerance[key] * depth, (dtype.name, ashape, bshape, tf32, err)
        a, b = _rand((64, 48), dtype), _rand((80, 48), dtype)
        out = gk.empty((64, 80), dtype)
        stream = gk.Stream()
        assert kernels.matmul(a, b.T, out=out, stream=stream) is out  # transposed operand: strides, no copy
        stream.synchronize()
        err = np.abs(_host(out) - _host(a) @ _host(b).T).max() / np.abs(_host(a) @ _host(b).T).max()
        assert err <= tolerance[dtype.name if dtype != gk.float32 else "tf32"], err


def check_routing_auto_on_gpu() -> None:
    from pygpukit.triton import routing

    os.environ["PYGPUKIT_CACHE_DIR"] = tempfile.mkdtemp()
    x = _rand((64, 4096), gk.bfloat16)
    w = _rand((4096,), gk.bfloat16)
    with routing.route("auto"):
        first = routing.rmsnorm(x, w)
        again = routing.rmsnorm(x, w)
        y = _rand((300, 5000), gk.float32)
        s = routing.softmax(y)
    want = _norm_ref(_host(x), _host(w), None, 1e-6, False)
    _close(first, want, gk.bfloat16, "routed rmsnorm", 2)
    assert first.to_numpy().tobytes() == again.to_numpy().tobytes()
    np.testing.assert_allclose(_host(s).sum(-1), 1.0, rtol=1e-5)
    assert routing.auto_cache_path().exists()
    winners = json.loads(routing.auto_cache_path().read_text())["winners"]
    assert {json.loads(key)[0] for key in winners} == {"rmsnorm", "softmax"}, winners
    assert all(entry["winner"] in ("builtin", "triton") for entry in winners.values())
    t = routing.rmsnorm(x, w, backend="triton")
    _close(t, want, gk.bfloat16, "triton-routed rmsnorm", 2)


def check_builtin_ops_follow_routes() -> None:
    """With set_route("triton"), the ops of pygpukit.ops (and a @ b) run the Triton kernels: each
    Triton side is called once and the results are bitwise those of pygpukit.triton.kernels; under
    route("builtin") they are bitwise the built-in kernels'; a routed op captured in a CUDA graph
    replays bitwise equal to eager."""
    from pygpukit.ops import _route
    from pygpukit.triton import kernels, routing

    calls: dict[str, int] = {}
    for op in routing.OPS:
        builtin, triton_fn = routing._IMPLS[op]

        def counted(*args: Any, _fn: Any = triton_fn, _op: str = op, **kw: Any) -> Any:
            calls[_op] = calls.get(_op, 0) + 1
            return _fn(*args, **kw)

        routing._IMPLS[op] = (builtin, counted)
    dtype = gk.bfloat16
    x, w, b = _rand((37, 700), dtype), _rand((700,), dtype), _rand((700,), dtype)
    gate = _rand((19, 2 * 333), dtype)
    a, m = _rand((45, 96), dtype), _rand((96, 130), dtype)
    q0, k0 = _rand((2, 9, 4, 64), dtype), _rand((2, 9, 2, 64), dtype)
    cos, sin = ops.rope_cos_sin(64, 128)
    pos = gk.from_numpy(rng.integers(0, 128, (2, 9)).astype(np.int32))

    def run_all() -> list[Any]:
        q, k = q0.clone(), k0.clone()
        ops.apply_rope(q, k, cos, sin, pos)
        return [ops.rmsnorm(x, w), ops.layernorm(x, w, b), ops.softmax(x), ops.swiglu(gate), a @ m, q, k]

    routing.set_route("triton")
    try:
        assert _route.hook is routing.route_hook
        routed = run_all()
        assert calls == dict.fromkeys(routing.OPS, 1), calls
        q, k = q0.clone(), k0.clone()
        kernels.rotary(q, k, cos, sin, pos)
        direct = [kernels.rmsnorm(x, w), kernels.layernorm(x, w, b), kernels.softmax(x), kernels.swiglu(gate),
                  kernels.matmul(a, m), q, k]  # fmt: skip
        for got, want in zip(routed, direct, strict=True):
            assert got.to_numpy().tobytes() == want.to_numpy().tobytes()
        with routing.route("builtin"):
            builtin = run_all()
        assert calls == dict.fromkeys(routing.OPS, 1), calls  # the block ran no Triton kernel
        _close(builtin[0], _norm_ref(_host(x), _host(w), None, 1e-6, False), dtype, "builtin rmsnorm", 2)
        _close(routed[0], _norm_ref(_host(x), _host(w), None, 1e-6, False), dtype, "routed rmsnorm", 2)
        # capture: the routed ops (warmed up above) recorded and replayed
        out = gk.empty((37, 700), dtype)
        graph = gk.CudaGraph()
        with graph.capture():
            ops.rmsnorm(x, w, out=out)
        graph.replay()
        graph.synchronize()
        assert out.to_numpy().tobytes() == routed[0].to_numpy().tobytes()
    finally:
        routing.set_route("*", None)


def check_triton_failure_is_typed() -> None:
    """A real Triton compilation error inside pygpukit's launch scope comes out as TritonKernelError."""
    import triton
    import triton.language as tl

    from pygpukit.triton import TritonKernelError
    from pygpukit.triton._interop import pygpukit_launches

    @triton.jit
    def bad_kernel(x_ptr, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.arange(0, BLOCK)  # BLOCK must be a power of two: 3 does not compile
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1.0)

    x = _rand((16,), gk.float32)
    caught: list[TritonKernelError] = []
    try:
        with pygpukit_launches("bad_kernel"):
            bad_kernel[(1,)](x, BLOCK=3)
    except TritonKernelError as error:
        caught.append(error)
    assert len(caught) == 1, "a Triton compilation error was not turned into TritonKernelError"
    assert caught[0].kernel == "bad_kernel"
    assert caught[0].__cause__ is not None


CHECKS: dict[str, Callable[[], None]] = {
    name[len("check_") :]: fn for name, fn in sorted(globals().items()) if name.startswith("check_") and callable(fn)
}


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    for name in names:
        CHECKS[name]()
        gk.synchronize()
        assert "torch" not in sys.modules, f"{name} imported torch"
        print(f"OK {name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
